"""Fixtures for the ascend-ops tests: the reference kernels and a vLLM config context.

vLLM's layers read the current vLLM config when they are constructed (``CustomOp`` picks
its forward method then), so layers are built inside ``set_current_vllm_config``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def reference_kernels() -> None:
    """``torch.ops.npu.*`` served by the platform's CPU reference kernels."""
    from ascend_platform.kernels import register_reference_kernels

    assert register_reference_kernels()


@pytest.fixture(scope="session", autouse=True)
def ascend_ops_registered(reference_kernels: None) -> None:
    """The plugin registered, as vLLM's plugin loader would do on the Ascend platform."""
    import ascend_ops

    ascend_ops.register()
    assert ascend_ops.registered()
