"""Each real patch changes behaviour; each test fails when its patch is removed."""

from __future__ import annotations

import types

import pytest
import torch
from ascend_patches.core import PatchRegistry, load_patches
from packaging.version import Version

VLLM = Version("0.32.0")


@pytest.fixture
def registry():
    """The suite's patches, none applied during the test (restored afterwards)."""
    registry = load_patches()
    applied = [name for name in registry.patches if registry.is_applied(name)]
    registry.undo_all()
    yield registry
    for stage in {registry.patches[name].stage for name in applied}:
        registry.apply_stage(stage, "cpu")


def _only(registry: PatchRegistry, *names: str) -> PatchRegistry:
    subset = PatchRegistry()
    for name in names:
        subset.add(registry.patches[name])
    return subset


def test_suite_variables_pass_strict_environment_validation(
    registry: PatchRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "cpu")
    monkeypatch.setenv("VLLM_VERSION", "0.32.0")
    patch = _only(registry, "envs.declare_suite_variables")
    with pytest.raises(ValueError, match="Unknown vLLM environment variable"):
        current_platform.validate_environ(hard_fail=True)
    patch.apply_stage("platform", "cpu", VLLM)
    try:
        current_platform.validate_environ(hard_fail=True)
    finally:
        patch.undo_all()


def test_host_buffers_are_aliased_on_the_reference_device(registry: PatchRegistry) -> None:
    from vllm.v1.utils import CpuGpuBuffer

    def staged_value() -> int:
        buffer = CpuGpuBuffer(4, dtype=torch.int32, device=torch.device("cpu"), pin_memory=False)
        buffer.cpu[0] = 12345  # filled on the host, as the runner does, and not copied
        return int(buffer.gpu[0])

    assert staged_value() != 12345
    patch = _only(registry, "cpu_gpu_buffer.host_buffer_alias")
    patch.apply_stage("worker", "cpu", VLLM)
    try:
        assert staged_value() == 12345
    finally:
        patch.undo_all()


def test_copy_to_device_does_not_re_pin(
    registry: PatchRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.v1.utils as vllm_utils
    from vllm.v1.utils import CpuGpuBuffer

    pins = []
    monkeypatch.setattr(vllm_utils, "PIN_MEMORY", True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pins.append(1) or self)
    buffer = CpuGpuBuffer(8, dtype=torch.float32, device=torch.device("cpu"), pin_memory=False)
    buffer.cpu.fill_(3.0)
    buffer.copy_to_gpu(4)
    assert pins  # upstream pins again on every copy
    pins.clear()
    patch = _only(registry, "cpu_gpu_buffer.copy_without_repin")
    patch.apply_stage("worker", "npu", VLLM)
    try:
        buffer.gpu.zero_()
        buffer.copy_to_gpu(4)
    finally:
        patch.undo_all()
    assert not pins
    assert buffer.gpu.tolist() == [3.0] * 4 + [0.0] * 4


def test_accelerator_calls_reach_the_npu_module(
    registry: PatchRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    fake_npu = types.SimpleNamespace(
        synchronize=lambda *a: calls.append("synchronize"),
        empty_cache=lambda: calls.append("empty_cache"),
        mem_get_info=lambda *a: (calls.append("mem_get_info"), (1, 2))[1],
        max_memory_allocated=lambda *a: (calls.append("max_memory_allocated"), 7)[1],
    )
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    names = [n for n in registry.patches if n.startswith("accelerator.")]
    patch = _only(registry, *names)
    report = patch.apply_stage("worker", "npu", VLLM)
    try:
        torch.accelerator.synchronize()
        torch.accelerator.empty_cache()
        assert torch.accelerator.get_memory_info() == (1, 2)
        assert torch.accelerator.max_memory_allocated() == 7
    finally:
        patch.undo_all()
    assert sorted(report.applied) == sorted(names)
    assert calls == ["synchronize", "empty_cache", "mem_get_info", "max_memory_allocated"]
    # Not on the reference device: there the platform makes these host operations.
    assert patch.select("worker", VLLM, "cpu") == []


def test_process_stage_is_applied_by_the_general_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    import textwrap

    import ascend_patches
    from ascend_patches import core

    fixture = PatchRegistry()
    fixture.declare(
        target="textwrap.shorten", stage="process", versions=">=0", name="fixture",
        why="w", how="h", upstream="u", removal="r",
    )(lambda original: lambda *a, **k: "patched")  # fmt: skip
    monkeypatch.setattr(core, "load_patches", lambda: fixture)
    try:
        ascend_patches.register()  # the Ascend reference platform is active in this process
        assert textwrap.shorten("hello world", 5) == "patched"
    finally:
        fixture.undo_all()
