"""The kernel layer: torch_npu's API, real or reference.

Code above this layer calls torch_npu's functions (``npu_rms_norm``, ``npu_add_rms_norm``,
``npu_swiglu``, ``npu_rotary_mul``, ``npu_fused_infer_attention_score``,
``npu_scatter_pa_kv_cache``) through one accessor::

    from ascend_platform.kernels import npu_kernels

    y, rstd = npu_kernels().npu_rms_norm(x, weight, epsilon=1e-6)

On an NPU host (torch_npu importable) :func:`npu_kernels` returns the ``torch_npu`` module;
elsewhere it registers the CPU reference kernels (:mod:`ascend_platform.kernels.reference`)
as ``torch.ops.npu.*`` and returns ``torch.ops.npu``. Importing this package is cheap: torch
and the reference kernels are imported on the first call.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

__all__ = ["npu_kernels", "register_reference_kernels", "torch_npu_available"]


def torch_npu_available() -> bool:
    """True if torch_npu can be imported (checked with find_spec, without importing it)."""
    return importlib.util.find_spec("torch_npu") is not None


def register_reference_kernels() -> bool:
    """Register the reference kernels as ``torch.ops.npu.*`` (idempotent).

    True if they are registered (now or before), False when torch_npu is importable (then
    nothing is registered). See :func:`ascend_platform.kernels.library.register_reference_kernels`.
    """
    from ascend_platform.kernels.library import register_reference_kernels as _register

    return _register()


@functools.cache
def npu_kernels() -> Any:
    """The kernel namespace: the ``torch_npu`` module, or ``torch.ops.npu`` (reference).

    The result is cached. Both expose the same names with the same calling convention,
    e.g. ``npu_kernels().npu_fused_infer_attention_score(q, k, v, ...)``.
    """
    if torch_npu_available():
        return importlib.import_module("torch_npu")
    import torch

    if not register_reference_kernels():  # pragma: no cover - torch_npu appeared meanwhile
        return importlib.import_module("torch_npu")
    return torch.ops.npu
