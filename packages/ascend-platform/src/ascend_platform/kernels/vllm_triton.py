"""Torch implementations of the Triton kernels vLLM's runner launches itself.

vLLM's model runner computes slot mappings with a Triton kernel. Where Triton has no
backend for the device (the CPU reference device; an NPU host without triton-ascend),
the platform registers these implementations in its place through vLLM's kernel
dispatcher (``Platform.register_triton_kernel_overrides``).

The dispatcher calls an implementation with the kernel's own launch arguments, whose
names and order changed between vLLM releases (0.31 passes ``block_size`` and
``BLOCKS_PER_KV_BLOCK``, 0.32 does not). The implementation therefore binds the arguments
to the installed kernel's parameter names (a feature probe, not a version check).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

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
    block_size: int,
    pad_id: int = -1,
) -> None:
    """slot = block_table[req, pos // block_size] * block_size + pos % block_size for every
    token of every request; slots from ``num_tokens`` to ``max_num_tokens`` get ``pad_id``."""
    starts = query_start_loc.to(torch.long)
    begin, end = int(starts[0]), int(starts[-1])
    num_reqs = starts.numel() - 1
    request = torch.repeat_interleave(
        torch.arange(num_reqs, device=positions.device), starts[1:] - starts[:-1]
    )
    pos = positions[begin:end].to(torch.long)
    block_ids = block_table.reshape(-1)[request * block_table_stride + pos // block_size]
    slot_mapping[begin:end] = block_ids.to(torch.long) * block_size + pos % block_size
    slot_mapping[num_tokens:max_num_tokens] = pad_id


def slot_mapping_override(kernel_params: list[str]) -> Callable[..., None]:
    """An implementation taking the launch arguments of a kernel with ``kernel_params``."""

    def launch(*args: Any, **kwargs: Any) -> None:
        arg = dict(zip(kernel_params, args, strict=False))
        arg.update(kwargs)
        if arg.get("TOTAL_CP_WORLD_SIZE", 1) != 1:
            raise NotImplementedError("Context parallelism is not supported on Ascend yet.")
        if arg.get("BLOCKS_PER_KV_BLOCK", 1) != 1:
            raise NotImplementedError("Split KV-cache blocks are not supported on Ascend.")
        compute_slot_mapping(
            num_tokens=arg["num_tokens"],
            max_num_tokens=arg["max_num_tokens"],
            query_start_loc=arg["query_start_loc_ptr"],
            positions=arg["positions_ptr"],
            block_table=arg["block_table_ptr"],
            block_table_stride=arg["block_table_stride"],
            slot_mapping=arg["slot_mapping_ptr"],
            block_size=arg.get("block_size", arg.get("KV_CACHE_BLOCK_SIZE")),
            pad_id=arg.get("PAD_ID", -1),
        )

    # Present the kernel's own signature, so the dispatcher forwards launch arguments by name.
    launch.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in kernel_params]
    )
    return launch


def _parameters(kernel: Any) -> list[str]:
    names = getattr(kernel, "arg_names", None)  # a Triton JITFunction, or an override
    if names is None:
        names = inspect.signature(getattr(kernel, "fn", kernel)).parameters
    return list(names)


_registered = False


def register_overrides() -> None:
    """Route vLLM's Triton kernels to the implementations above (once per process)."""
    global _registered
    if _registered:
        return
    from vllm.triton_utils.dispatcher import register_kernels
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    params = _parameters(ComputeSlotMappingKernel.kernel)
    register_kernels({SLOT_MAPPING_KERNEL: slot_mapping_override(params)})
    _registered = True
