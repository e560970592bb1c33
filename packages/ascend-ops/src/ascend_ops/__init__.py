"""Out-of-tree vLLM custom ops (RMSNorm, SiluAndMul, rotary embedding) on torch_npu kernels.

The ``vllm.general_plugins`` entry point :func:`register` replaces vLLM's generic layers by
subclasses whose ``forward_oot`` calls torch_npu kernels (:mod:`ascend_ops.ops`), but only
when the active vLLM platform is the Ascend one. The kernels are reached by op name through
the PyTorch dispatcher (``torch.ops.npu.<name>``): torch_npu registers them on an NPU host,
the Ascend platform registers its CPU reference kernels under the same names on the
reference device. This package imports neither torch_npu nor the platform.
"""

from __future__ import annotations

import threading

__all__ = ["register", "registered"]

_REGISTERED = False
_LOCK = threading.Lock()


def registered() -> bool:
    """True once :func:`register` has installed the ops in this process."""
    return _REGISTERED


def register() -> None:
    """vLLM general-plugin entry point; a no-op unless the Ascend platform is active.

    vLLM calls general plugins in every process (API server, engine core, workers), and
    sometimes more than once in one: after the first successful call this returns at
    once. On any platform whose class lacks the suite's marker ``is_ascend_platform`` it
    registers nothing, because ``CustomOp.register_oot`` swaps vLLM's classes for the
    whole process.
    """
    if _REGISTERED:
        return
    from vllm.platforms import current_platform

    if not getattr(type(current_platform), "is_ascend_platform", False):
        return
    _register_once()


def _register_once() -> None:
    global _REGISTERED
    with _LOCK:
        if _REGISTERED:
            return
        from ascend_ops.ops import register_ops

        register_ops()
        _REGISTERED = True
