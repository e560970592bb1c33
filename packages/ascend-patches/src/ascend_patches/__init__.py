"""Versioned, self-describing patches to vLLM for the Ascend platform.

No patch is applied yet.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """vLLM general-plugin entry point; a no-op unless the Ascend platform is active."""
    from vllm.platforms import current_platform

    if not getattr(type(current_platform), "is_ascend_platform", False):
        return
