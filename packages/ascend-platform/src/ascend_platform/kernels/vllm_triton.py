"""Torch implementations of the Triton kernels vLLM's runner launches itself.

vLLM's model runner computes slot mappings with a Triton kernel. Where Triton has no
backend for the device (the CPU reference device; an NPU host without triton-ascend),
the platform registers these implementations in its place through vLLM's kernel
dispatcher (``Platform.register_triton_kernel_overrides``). Each takes the kernel's own
launch arguments, in the kernel's parameter order.
"""

from __future__ import annotations

import torch

SLOT_MAPPING_KERNEL = "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel"


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_table_stride: int,
    slot_mapping: torch.Tensor,
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int = 1,
    TOTAL_CP_RANK: int = 0,
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
    PAD_ID: int = -1,
    BLOCK_SIZE: int = 1024,
) -> None:
    """slot = block_table[req, pos // block_size] * block_size + pos % block_size for every
    token of every request; slots from ``num_tokens`` to ``max_num_tokens`` get ``PAD_ID``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("Context parallelism is not supported on Ascend yet.")
    starts = query_start_loc.to(torch.long)
    begin, end = int(starts[0]), int(starts[-1])
    num_reqs = starts.numel() - 1
    request = torch.repeat_interleave(
        torch.arange(num_reqs, device=positions.device), starts[1:] - starts[:-1]
    )
    pos = positions[begin:end].to(torch.long)
    block_ids = block_table.reshape(-1)[request * block_table_stride + pos // KV_CACHE_BLOCK_SIZE]
    slot_mapping[begin:end] = block_ids.to(torch.long) * KV_CACHE_BLOCK_SIZE + (
        pos % KV_CACHE_BLOCK_SIZE
    )
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


def register_overrides() -> None:
    """Route vLLM's Triton kernels to the implementations above."""
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({SLOT_MAPPING_KERNEL: compute_slot_mapping})
