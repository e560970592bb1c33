"""Ascend NPU platform plugin for vLLM.

vLLM calls :func:`register` (entry point ``vllm.platform_plugins: ascend``) in every
process, sometimes twice, so it only inspects the environment: it imports neither vLLM
nor torch_npu unless an NPU is plausibly present.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> str | None:
    """Return the platform class path when the Ascend platform should be active, else None.

    Active for a usable NPU (torch_npu importable and a device present) or when
    ``VLLM_ASCEND_DEVICE=cpu`` asks for the CPU reference device. The reason for a None is
    logged at debug level.
    """
    from ascend_platform.device import resolve_platform

    return resolve_platform()
