"""The Ascend attention backend: paged KV cache in the Ascend layout, torch_npu kernels.

KV cache, per layer: ``kv_cache[0]`` and ``kv_cache[1]`` are the key and value caches,
each ``[num_blocks, block_size, num_kv_heads, head_size]`` and contiguous (allocated by
:class:`ascend_platform.worker.model_runner.AscendModelRunner`).

Kernels (through :func:`ascend_platform.kernels.npu_kernels`):

- new keys and values are written with ``npu_scatter_pa_kv_cache`` (ND layout,
  ``cache_mode="Norm"``) at the slots of the slot mapping;
- decoder attention, for every batch state (prefill, decode, chunked prefill, prefill
  with a prefix-cache hit, and mixtures), is one ``npu_fused_infer_attention_score`` call
  in ``TND`` layout with page attention: ``actual_seq_lengths`` the cumulative query
  lengths, ``actual_seq_lengths_kv`` each request's KV length, ``sparse_mode=3``
  (right-down causal, so a request's queries are the last ``q_len`` positions of its
  ``kv_len`` keys) with the 2048x2048 mask the kernel documents;
- encoder (non-causal) attention runs the same kernel per request on the request's own
  keys and values in ``BSND`` layout with no mask, and touches no cache.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, EncoderOnlyAttentionSpec

from ascend_platform.kernels import npu_kernels
from ascend_platform.platform import DEFAULT_BLOCK_SIZE

MASK_SIZE = 2048
"""``sparse_mode`` 2/3/4 take a fixed 2048x2048 causal mask (upper triangle masked)."""


class AscendAttentionState(enum.Enum):
    """What the batch holds; all states run through the same paged kernel call."""

    PREFILL_NO_CACHE = "prefill_no_cache"
    """Every request computes its whole sequence (nothing cached)."""
    PREFILL_CACHE_HIT = "prefill_cache_hit"
    """Only prefills, some starting after cached tokens (prefix hit or a later chunk)."""
    DECODE_ONLY = "decode_only"
    """Every request computes one new token after cached ones."""
    CHUNKED_PREFILL = "chunked_prefill"
    """Decodes and prefills in one batch."""
    ENCODER = "encoder"
    """Non-causal attention over each request's own tokens, no cache."""


def classify_batch(query_lens: list[int], kv_lens: list[int], causal: bool) -> AscendAttentionState:
    """The state of a batch from its per-request query and KV lengths."""
    if not causal:
        return AscendAttentionState.ENCODER
    decode = [q == 1 and k > 1 for q, k in zip(query_lens, kv_lens, strict=True)]
    if all(decode):
        return AscendAttentionState.DECODE_ONLY
    if any(decode):
        return AscendAttentionState.CHUNKED_PREFILL
    if all(q == k for q, k in zip(query_lens, kv_lens, strict=True)):
        return AscendAttentionState.PREFILL_NO_CACHE
    return AscendAttentionState.PREFILL_CACHE_HIT


@dataclass
class AscendAttentionMetadata:
    """Per-batch inputs of the attention kernels."""

    num_actual_tokens: int
    attn_state: AscendAttentionState
    query_start_loc: list[int]
    """Cumulative query lengths with a leading 0 (host), ``[num_reqs + 1]``."""
    kv_lens: list[int]
    """Each request's KV length (cached + new tokens), host."""
    block_table: torch.Tensor
    """``[num_reqs, max_blocks]`` int32 block ids (device)."""
    slot_mapping: torch.Tensor
    """``[num_actual_tokens]`` cache slot of each new token (device)."""
    causal: bool = True


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder[AscendAttentionMetadata]):
    """Builds :class:`AscendAttentionMetadata` from vLLM's common metadata."""

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.is_encoder_only = isinstance(kv_cache_spec, EncoderOnlyAttentionSpec)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendAttentionMetadata:
        cm = common_attn_metadata
        num_reqs = cm.num_reqs
        query_start_loc = cm.query_start_loc_cpu[: num_reqs + 1].tolist()
        seq_lens = cm.seq_lens_cpu_upper_bound
        if seq_lens is None:
            seq_lens = cm.seq_lens
        kv_lens = seq_lens[:num_reqs].tolist()
        query_lens = [b - a for a, b in itertools.pairwise(query_start_loc)]
        if isinstance(cm.causal, torch.Tensor):
            raise NotImplementedError(
                "Per-request causality (bidirectional multimodal prefixes) is not supported "
                "by the Ascend attention backend yet."
            )
        causal = bool(cm.causal) and not self.is_encoder_only
        return AscendAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            attn_state=classify_batch(query_lens, kv_lens, causal),
            query_start_loc=query_start_loc,
            kv_lens=kv_lens,
            block_table=cm.block_table_tensor[:num_reqs],
            slot_mapping=cm.slot_mapping[: cm.num_actual_tokens],
            causal=causal,
        )


class AscendAttentionBackend(AttentionBackend):
    """vLLM attention backend of the Ascend platform (registered as ``CUSTOM``)."""

    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.float16,
        torch.bfloat16,
        torch.float32,  # reference device only; the platform refuses it on an NPU
    ]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[AscendAttentionImpl]:
        return AscendAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AscendAttentionMetadataBuilder]:
        return AscendAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # The kernel's paged attention takes blocks of 16-aligned size (128-aligned for
        # prefill; the platform checks that on the configured block size).
        return [MultipleOf(16)]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        return DEFAULT_BLOCK_SIZE

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type in (AttentionType.DECODER, AttentionType.ENCODER_ONLY)


_MASKS: dict[torch.device, torch.Tensor] = {}


def causal_mask(device: torch.device) -> torch.Tensor:
    """The kernel's compressed causal mask: 2048x2048 bool, True above the diagonal."""
    mask = _MASKS.get(device)
    if mask is None:
        mask = torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool, device=device).triu_(1)
        _MASKS[device] = mask
    return mask


class AscendAttentionImpl(AttentionImpl[AscendAttentionMetadata]):
    """Multi-head / grouped-query attention on the torch_npu kernels."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "attention sinks": sinks is not None,
        }
        for feature, used in unsupported.items():
            if used:
                raise NotImplementedError(
                    f"The Ascend attention backend does not support {feature} yet."
                )
        if attn_type not in (AttentionType.DECODER, AttentionType.ENCODER_ONLY):
            raise NotImplementedError(
                f"The Ascend attention backend does not support {attn_type} attention yet; "
                "supported: decoder and encoder-only."
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AscendAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("Fused output quantization is not supported on Ascend.")
        if attn_metadata is None:  # profiling run without metadata
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        query = query[:n].view(n, self.num_heads, self.head_size)
        key = key[:n].view(n, self.num_kv_heads, self.head_size)
        value = value[:n].view(n, self.num_kv_heads, self.head_size)
        out = output[:n].view(n, self.num_heads, self.head_size)
        if attn_metadata.causal:
            out.copy_(self._paged_attention(query, key, value, kv_cache, attn_metadata))
        else:
            self._encoder_attention(query, key, value, attn_metadata, out)
        return output

    def _paged_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AscendAttentionMetadata,
    ) -> torch.Tensor:
        ops = npu_kernels()
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        if self.kv_sharing_target_layer_name is None:
            ops.npu_scatter_pa_kv_cache(
                key.contiguous(),
                value.contiguous(),
                key_cache,
                value_cache,
                meta.slot_mapping,
                cache_mode="Norm",
            )
        num_blocks, block_size = key_cache.shape[:2]
        attn_out, _ = ops.npu_fused_infer_attention_score(
            query.contiguous(),
            key_cache.view(num_blocks, block_size, -1),
            value_cache.view(num_blocks, block_size, -1),
            atten_mask=causal_mask(query.device),
            block_table=meta.block_table,
            actual_seq_lengths=meta.query_start_loc[1:],
            actual_seq_lengths_kv=meta.kv_lens,
            num_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            scale=self.scale,
            input_layout="TND",
            block_size=block_size,
            sparse_mode=3,
        )
        return attn_out

    def _encoder_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: AscendAttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        ops = npu_kernels()
        starts = meta.query_start_loc
        for start, end in itertools.pairwise(starts):
            if end == start:
                continue
            attn_out, _ = ops.npu_fused_infer_attention_score(
                query[start:end].unsqueeze(0).contiguous(),
                key[start:end].unsqueeze(0).contiguous(),
                value[start:end].unsqueeze(0).contiguous(),
                num_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads,
                scale=self.scale,
                input_layout="BSND",
                sparse_mode=0,
            )
            out[start:end].copy_(attn_out[0])
