"""The Ascend worker: one per NPU (or one on the CPU reference device).

It extends vLLM's GPU worker for the parts that are the same on every accelerator
(model loading, KV cache set-up from the engine's config, execution) and replaces device
set-up, memory accounting and warm-up. On the reference device it touches no CUDA API.
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

import torch
from vllm.config import CompilationMode, VllmConfig
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.utils import report_usage_stats
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes
from vllm.v1.worker.workspace import init_workspace_manager

from ascend_platform.hooks import plugin_manager
from ascend_platform.worker.model_runner import AscendModelRunner

logger = init_logger(f"vllm.{__name__}")


class AscendWorker(Worker):
    """A vLLM worker on an Ascend NPU or on the CPU reference device."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        plugin_manager().hook.ascend_worker_stage(
            vllm_config=vllm_config, device_type=current_platform.device_type
        )
        super().__init__(
            vllm_config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
        )
        self.parallel_config.disable_custom_all_reduce = True

    # --- device set-up -----------------------------------------------------------------

    def init_device(self) -> None:
        device_type = current_platform.device_type
        if device_type == "npu":
            self.device = torch.device(f"npu:{self.local_rank}")
            current_platform.set_device(self.device)
        else:
            self.device = torch.device("cpu")
            threads = os.environ.get("ASCEND_REFERENCE_NUM_THREADS")
            if threads:
                torch.set_num_threads(int(threads))
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)
        current_platform.import_kernels()
        # One workspace slot and lane: no dual-batch overlap, no speculative decoding.
        init_workspace_manager(self.device, 1)
        self.model_runner = AscendModelRunner(self.vllm_config, self.device)
        if self.rank == 0:
            report_usage_stats(self.vllm_config)

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # no sleep-mode memory pool on Ascend yet

    # --- memory ------------------------------------------------------------------------

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: the explicit size, or what the budget leaves after a
        profiling forward pass at the largest batch."""
        self.model_runner.profile_run()
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            logger.info("KV cache: %s GiB as set by kv_cache_memory_bytes", format_gib(explicit))
            return explicit
        total = current_platform.get_device_total_memory()
        budget = int(total * self.cache_config.gpu_memory_utilization)
        gc.collect()
        used = int(self._memory_in_use())
        available = budget - used
        if available <= 0:
            raise ValueError(
                f"No memory left for the KV cache: {format_gib(used)} GiB in use, budget "
                f"{format_gib(budget)} GiB (--gpu-memory-utilization "
                f"{self.cache_config.gpu_memory_utilization} of {format_gib(total)} GiB). "
                "Raise --gpu-memory-utilization or set --kv-cache-memory-bytes."
            )
        logger.info(
            "KV cache: %s GiB (budget %s GiB, in use %s GiB)",
            format_gib(available),
            format_gib(budget),
            format_gib(used),
        )
        return available

    def _memory_in_use(self) -> float:
        if current_platform.device_type == "npu":
            torch.npu.empty_cache()  # type: ignore[attr-defined]
            free, total = torch.npu.mem_get_info(self.device)  # type: ignore[attr-defined]
            return total - free
        return current_platform.get_current_memory_usage()

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # The profiling run in determine_available_memory compiled the model for the
        # largest batch; models without a KV cache are warmed up here.
        if not self.model_runner.kv_caches and self.compilation_config.mode != CompilationMode.NONE:
            self.model_runner.profile_run()
        set_random_seed(self.model_config.seed)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("Sleep mode is not supported by the Ascend platform yet.")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("Sleep mode is not supported by the Ascend platform yet.")

    def _get_cudagraph_capture_context(self) -> Any:
        return contextlib.nullcontext()
