"""The Ascend platform class, and its CPU reference-device variant.

:class:`AscendPlatform` describes the NPU (device ``npu``, dispatch key ``PrivateUse1``,
``ASCEND_RT_VISIBLE_DEVICES``, HCCL). :class:`AscendReferencePlatform` is the same platform
with the device facts of the CPU (device ``cpu``, gloo): everything above the kernels is
shared, and the torch_npu kernels are served by the reference implementations in
:mod:`ascend_platform.kernels`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from ascend_platform.config import AscendConfig

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger("vllm.ascend_platform")

DEFAULT_BLOCK_SIZE = 128
"""The NPU paged-attention kernel wants blocks of 128 tokens (a multiple of 128)."""

WORKER_CLS = "ascend_platform.worker.worker.AscendWorker"
ATTENTION_BACKEND_CLS = "ascend_platform.attention.backend.AscendAttentionBackend"
COMMUNICATOR_CLS = "ascend_platform.distributed.communicator.AscendCommunicator"


class AscendPlatform(Platform):
    """vLLM platform for Ascend NPUs."""

    _enum = PlatformEnum.OOT
    is_ascend_platform: ClassVar[bool] = True
    """The suite's marker: general plugins act only when the active platform carries it."""
    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "NPU"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    dist_backend: str = "hccl"
    # No inductor for the NPU in this suite: helpers vLLM compiles run through dynamo only.
    simple_compile_backend: str = "eager"

    # --- device facts -------------------------------------------------------------------

    # npu_fused_infer_attention_score takes float16 / bfloat16 queries.
    _dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return list(self._dtypes)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in cls._dtypes:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in cls._dtypes)
            raise ValueError(
                f"--dtype {str(dtype).removeprefix('torch.')} is not supported on "
                f"{cls.device_name}; supported: {allowed}."
            )

    @classmethod
    def is_reference(cls) -> bool:
        return cls.device_type == "cpu"

    @classmethod
    def _device_module(cls) -> Any:
        return torch.npu  # type: ignore[attr-defined]  # provided by torch_npu

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls._device_module().get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return cls._device_module().get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        module = cls._device_module()
        module.reset_peak_memory_stats(device)
        return module.max_memory_allocated(device)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        cls._device_module().set_device(device)

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        properties = cls._device_module().get_device_properties(device_id)
        for name in ("multi_processor_count", "cube_core_num"):
            if getattr(properties, name, None):
                return int(getattr(properties, name))
        raise NotImplementedError("torch_npu reports no compute-unit count for this NPU.")

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        cls._device_module().manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def is_sleep_mode_available(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR_CLS

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError("LoRA is not supported by the Ascend platform yet.")

    @classmethod
    def import_kernels(cls) -> None:
        from ascend_platform.kernels import npu_kernels

        npu_kernels()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:
            from ascend_platform.kernels.vllm_triton import register_overrides

            register_overrides()

    # --- attention ----------------------------------------------------------------------

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        if attn_selector_config.use_mla:
            raise NotImplementedError(
                "Multi-head latent attention (MLA) is not supported by the Ascend platform "
                "yet; supported: standard multi-head / grouped-query attention."
            )
        if attn_selector_config.use_sparse:
            raise NotImplementedError(
                "Sparse attention is not supported by the Ascend platform yet."
            )
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        if not AttentionBackendEnum.CUSTOM.is_overridden():
            register_backend(AttentionBackendEnum.CUSTOM, ATTENTION_BACKEND_CLS)
        if selected_backend is not None and selected_backend.name != "CUSTOM":
            logger.warning(
                "Attention backend %s is not available on the Ascend platform; using %s.",
                selected_backend.name,
                ATTENTION_BACKEND_CLS,
            )
        return ATTENTION_BACKEND_CLS

    # --- configuration ------------------------------------------------------------------

    @classmethod
    def pre_register_and_update(cls, parser: FlexibleArgumentParser | None = None) -> None:
        from ascend_platform.hooks import plugin_manager

        plugin_manager().hook.ascend_platform_stage(platform_cls=cls)
        if parser is not None:
            _require_json_object(parser, "--additional-config")

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        raise ValueError(
            f"--quantization {quant!r} is not supported by the Ascend platform yet; "
            "supported: none (unquantized models)."
        )

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: VllmConfig) -> None:
        # Runs before vLLM derives defaults from the backend (e.g. custom_ops "none" for
        # inductor), so the backend must be final here. The NPU has no inductor backend in
        # this suite: compile with dynamo only.
        compilation_config = vllm_config.compilation_config
        if compilation_config.backend == "inductor":
            logger.warning(
                "The inductor compile backend is not supported on Ascend; using 'eager' "
                "(dynamo graph capture without inductor code generation)."
            )
        if compilation_config.backend in ("", "inductor"):
            compilation_config.backend = "eager"

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CUDAGraphMode

        from ascend_platform.hooks import plugin_manager

        plugin_manager().hook.ascend_platform_stage(platform_cls=cls)
        ascend_config = AscendConfig.from_additional_config(vllm_config.additional_config)
        logger.info(
            "Ascend platform active on %s (%s)",
            "the CPU reference device" if cls.is_reference() else "NPU",
            cls.__name__,
        )

        _reject_unsupported_features(vllm_config)

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER_CLS
        if parallel_config.enable_dbo:
            logger.warning("Dual-batch overlap is not supported on Ascend; disabled.")
            parallel_config.enable_dbo = False

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE
        if ascend_config.check_block_size and cache_config.block_size % DEFAULT_BLOCK_SIZE:
            raise ValueError(
                f"--block-size {cache_config.block_size} is not supported by the NPU "
                f"paged-attention kernel; use a multiple of {DEFAULT_BLOCK_SIZE} (or set "
                '--additional-config \'{"ascend": {"check_block_size": false}}\' on the '
                "reference device only)."
            )

        compilation_config = vllm_config.compilation_config
        # vLLM's fusion passes rewrite graphs into CUDA kernels; none applies on Ascend.
        pass_config = compilation_config.pass_config
        for field in dataclasses.fields(pass_config):
            if field.name.startswith("fuse_") or field.name == "enable_qk_norm_rope_fusion":
                setattr(pass_config, field.name, False)
        if compilation_config.cudagraph_mode not in (None, CUDAGraphMode.NONE):
            logger.info("NPU graph capture (ACL graph) is not supported yet; running without.")
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []
        if compilation_config.compile_sizes is None:
            compilation_config.compile_sizes = []

        # Asynchronous scheduling overlaps steps with device streams and events; the
        # runner does not implement that yet.
        vllm_config.scheduler_config.async_scheduling = False

        # The Ascend worker runs vLLM's V1 model runner; keep the scheduler on the same
        # runner even where Triton is available (vLLM would otherwise choose V2).
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        # torch_npu cannot be used in a forked child once initialised; the reference
        # device keeps the same process model.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        if cls.is_reference() and ascend_config.reference_num_threads is not None:
            os.environ["ASCEND_REFERENCE_NUM_THREADS"] = str(ascend_config.reference_num_threads)


def _require_json_object(parser: Any, option: str) -> None:
    """Make ``option`` accept only a JSON object, so that a typo is an argument error
    naming the option instead of a validation error deep inside vLLM's config."""
    for action in parser._actions:
        if option in action.option_strings:
            action.type = _json_object
            return


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}) in {text!r}"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _reject_unsupported_features(vllm_config: VllmConfig) -> None:
    """Features the platform cannot run yet: a clear error instead of a wrong result."""
    if vllm_config.lora_config is not None:
        raise ValueError("--enable-lora is not supported by the Ascend platform yet.")
    if vllm_config.speculative_config is not None:
        raise ValueError("--speculative-config is not supported by the Ascend platform yet.")
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype != "auto":
        raise ValueError(
            f"--kv-cache-dtype {cache_dtype!r} is not supported by the Ascend platform "
            "yet; supported: auto (the model's dtype)."
        )
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError(
            "--pipeline-parallel-size > 1 is not supported by the Ascend platform yet."
        )


class AscendReferencePlatform(AscendPlatform):
    """The Ascend platform on the CPU reference device (``VLLM_ASCEND_DEVICE=cpu``).

    Same worker, runner, attention backend and communicator; device facts of the CPU, gloo
    for HCCL, reference implementations of the torch_npu kernels. float32 is accepted in
    addition to the NPU's dtypes so that results can be compared with Transformers in fp32.
    """

    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    ray_device_key: str = ""
    dist_backend: str = "gloo"

    _dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)

    @classmethod
    def _device_module(cls) -> Any:
        return torch.cpu

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "Ascend reference device (CPU)"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        import psutil

        return psutil.virtual_memory().total

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        import psutil

        return float(psutil.Process().memory_info().rss)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        pass

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        pass  # torch.manual_seed already seeds the CPU generator

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return torch.get_num_threads()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False
