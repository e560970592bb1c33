"""Versioned, self-describing patches to vLLM for the Ascend platform.

Each patch is a declared record next to its code (``platform/patch_*.py``,
``worker/patch_*.py``): the target it replaces, the stage, the vLLM versions, why, how, the
upstream PR and the removal plan (see :mod:`ascend_patches.core`). ``ascend-patches list``,
``check`` and ``docs`` inspect them; docs/patches.md is generated from them.

Stages reach the processes vLLM starts: the platform stage through the platform's
``ascend_platform_stage`` hook (main process), the worker stage through the
``ascend_worker_stage`` hook (workers), and the process stage through this general
plugin, which vLLM loads in every process (including the engine core).
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """vLLM general-plugin entry point: apply the process stage where Ascend is active."""
    from vllm.platforms import current_platform

    if not getattr(type(current_platform), "is_ascend_platform", False):
        return
    from ascend_patches.core import load_patches

    load_patches().apply_stage("process", current_platform.device_type)
