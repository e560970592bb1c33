"""``torch.accelerator`` memory and synchronisation calls routed to the NPU.

vLLM's device-generic code (the model loader, the GPU model runner the Ascend runner
extends, memory profiling) calls ``torch.accelerator.synchronize``, ``empty_cache`` and
the memory queries. With torch_npu these do not reach the NPU's caching allocator, so
cache release and memory accounting are wrong. On an NPU host each is replaced by its
``torch.npu`` counterpart. (On the CPU reference device the platform itself makes these
calls host operations: there is no accelerator to route to.)
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_patches.core import PATCHES

DESCRIPTION = dict(
    stage="worker",
    versions=">=0.31,<0.33",
    devices=("npu",),
    why=(
        "vLLM's generic code synchronises and frees device memory through torch.accelerator, "
        "which torch_npu does not route to the NPU's caching allocator."
    ),
    how="Replace the torch.accelerator function by the torch.npu function of the same job.",
    upstream=(
        "None in vLLM: the gap is torch_npu's torch.accelerator integration; to be raised "
        "with torch_npu."
    ),
    removal="Remove when torch_npu implements the torch.accelerator device hooks.",
)


def _npu() -> Any:
    return torch.npu  # type: ignore[attr-defined]  # provided by torch_npu


@PATCHES.declare(target="torch.accelerator.synchronize", **DESCRIPTION)
def synchronize(original: Any) -> Any:
    return _npu().synchronize


@PATCHES.declare(target="torch.accelerator.empty_cache", **DESCRIPTION)
def empty_cache(original: Any) -> Any:
    return _npu().empty_cache


@PATCHES.declare(target="torch.accelerator.get_memory_info", **DESCRIPTION)
def get_memory_info(original: Any) -> Any:
    return _npu().mem_get_info


@PATCHES.declare(target="torch.accelerator.max_memory_allocated", **DESCRIPTION)
def max_memory_allocated(original: Any) -> Any:
    return _npu().max_memory_allocated
