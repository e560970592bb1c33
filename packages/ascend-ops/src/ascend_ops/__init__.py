"""Out-of-tree vLLM custom ops (RMSNorm, SiluAndMul, rotary embedding) on torch_npu kernels.

The custom ops arrive with issue #3; for now the plugin only decides whether it would register.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """vLLM general-plugin entry point; a no-op unless the Ascend platform is active."""
    from vllm.platforms import current_platform

    if not getattr(type(current_platform), "is_ascend_platform", False):
        return
