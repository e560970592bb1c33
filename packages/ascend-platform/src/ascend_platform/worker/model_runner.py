"""The Ascend model runner.

It extends vLLM's GPU model runner (input preparation, scheduling state, sampling are the
same) and replaces what is device specific:

- streams and events are the NPU's (or inert on the synchronous reference device);
- the KV cache is allocated in the Ascend layout: per attention layer one tensor
  ``[2, num_blocks, block_size, num_kv_heads, head_size]`` whose ``[0]`` and ``[1]`` are
  the contiguous key and value caches that ``npu_scatter_pa_kv_cache`` and
  ``npu_fused_infer_attention_score`` take;
- device synchronisation goes to the device module, never to CUDA; on the reference
  device ``torch.accelerator`` calls become host operations
  (:func:`ascend_platform.worker.device_shims.host_accelerator_calls`).

The same class serves ``npu`` and the CPU reference device; only ``device.type`` differs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.model_executor.model_loader import get_model
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, UniformTypeKVCacheSpecs
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from ascend_platform.worker.device_shims import device_stream_classes, host_accelerator_calls

logger = init_logger(f"vllm.{__name__}")


class AscendModelRunner(GPUModelRunner):
    """vLLM's GPU model runner, adapted to the NPU and to the CPU reference device."""

    def __init__(self, vllm_config: Any, device: torch.device) -> None:
        if device.type == "cpu":
            host_accelerator_calls()
        with device_stream_classes(device.type):
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False

    # --- device ------------------------------------------------------------------------

    def _sync_device(self) -> None:
        if self.device.type == "npu":
            torch.npu.synchronize(self.device)  # type: ignore[attr-defined]

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()

    def load_model(self, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("Loading dummy weights is not supported on the Ascend platform.")
        logger.info("Loading model %s on %s", self.model_config.model, self.device)
        self.model = get_model(vllm_config=self.vllm_config)

    def get_model(self) -> torch.nn.Module:
        return self.model

    def capture_model(self) -> int:
        return 0  # no graph capture yet (the platform sets cudagraph_mode NONE)

    # --- KV cache ----------------------------------------------------------------------

    def _attention_spec(self, kv_cache_config: KVCacheConfig, layer_name: str) -> AttentionSpec:
        for group in kv_cache_config.kv_cache_groups:
            if layer_name in group.layer_names:
                spec = group.kv_cache_spec
                if isinstance(spec, UniformTypeKVCacheSpecs):
                    spec = spec.kv_cache_specs[layer_name]
                if not isinstance(spec, AttentionSpec):
                    raise NotImplementedError(
                        f"layer {layer_name}: KV cache of type {type(spec).__name__} is not "
                        "supported by the Ascend platform yet (attention layers only)."
                    )
                if spec.head_size_v != spec.head_size:
                    raise NotImplementedError(
                        f"layer {layer_name}: different key and value head sizes are not "
                        "supported by the Ascend platform yet."
                    )
                return spec
        raise KeyError(f"layer {layer_name} is in no KV cache group")

    def initialize_kv_cache_tensors(
        self,
        kv_cache_config: KVCacheConfig,
        kernel_block_sizes: list[int],
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> dict[str, torch.Tensor]:
        """Allocate one ``[2, blocks, block_size, kv_heads, head_size]`` tensor per layer."""
        kv_caches: dict[str, torch.Tensor] = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            # A KVCacheTensor describes one backing allocation for several layers; on
            # Ascend every layer gets its own pair of contiguous caches instead.
            num_blocks = kv_cache_config.num_blocks_of(tensor)
            for name in tensor.layers:
                spec = self._attention_spec(kv_cache_config, name)
                kv_caches[name] = torch.zeros(
                    (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size),
                    dtype=spec.dtype,
                    device=self.device,
                )
        for layer_name, target in self.shared_kv_cache_layers.items():
            kv_caches[layer_name] = kv_caches[target]
        bind_kv_cache(
            kv_caches,
            self.compilation_config.static_forward_context,
            self.kv_caches,
            kv_cache_groups=kv_cache_config.kv_cache_groups,
        )
        return kv_caches

    def _init_kv_zero_meta(self) -> None:
        pass  # _zero_block_ids works on the Ascend layout directly

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids:
            return
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        seen: set[int] = set()
        for cache in self.kv_caches:
            if cache.data_ptr() in seen:
                continue
            seen.add(cache.data_ptr())
            cache.index_fill_(1, index, 0)
