"""register(): which platform vLLM gets, and that it stays cheap and quiet."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import ascend_platform
import pytest
from ascend_platform import device


@pytest.fixture
def platform_log(caplog: pytest.LogCaptureFixture):
    """Capture the platform's log even after vLLM stopped its loggers' propagation."""
    logger = logging.getLogger("vllm.ascend_platform")
    level = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def fresh_resolution():
    device.resolve_platform.cache_clear()
    yield
    device.resolve_platform.cache_clear()


def test_reference_device_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "cpu")
    assert ascend_platform.register() == "ascend_platform.platform.AscendReferencePlatform"


@pytest.mark.parametrize("value", [None, "", "auto", "npu"])
def test_no_npu_means_inactive(
    monkeypatch: pytest.MonkeyPatch, platform_log: pytest.LogCaptureFixture, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("VLLM_ASCEND_DEVICE", raising=False)
    else:
        monkeypatch.setenv("VLLM_ASCEND_DEVICE", value)
    assert ascend_platform.register() is None
    assert "torch_npu is not installed" in platform_log.text
    # Asked for explicitly, the refusal is an error; otherwise it is only a debug note.
    levels = {r.levelno for r in platform_log.records}
    assert (logging.ERROR in levels) == (value == "npu")


def test_unknown_device_value_is_named(
    monkeypatch: pytest.MonkeyPatch, platform_log: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "gpu")
    assert ascend_platform.register() is None
    assert "VLLM_ASCEND_DEVICE='gpu' is not allowed; use one of auto, npu, cpu" in platform_log.text


def test_register_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "cpu")
    first = ascend_platform.register()
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "auto")  # later changes do not flip a process
    assert ascend_platform.register() == first


def _run(code: str, **env: str | None) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in env}
    environ.update({k: v for k, v in env.items() if v is not None})
    result = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_register_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, json, ascend_platform; ascend_platform.register(); "
        "print(json.dumps(sorted(m for m in ('vllm', 'torch', 'torch_npu') if m in sys.modules)))"
    )
    assert json.loads(_run(code, VLLM_ASCEND_DEVICE=None)) == []
    assert json.loads(_run(code, VLLM_ASCEND_DEVICE="cpu")) == []


CURRENT_PLATFORM = (
    "from vllm.platforms import current_platform; print(type(current_platform).__name__)"
)


@pytest.mark.slow
def test_vllm_keeps_its_cpu_platform_without_the_request() -> None:
    assert _run(CURRENT_PLATFORM, VLLM_ASCEND_DEVICE=None) == "CpuPlatform"


@pytest.mark.slow
def test_vllm_resolves_the_ascend_platform_on_request() -> None:
    assert _run(CURRENT_PLATFORM, VLLM_ASCEND_DEVICE="cpu") == "AscendReferencePlatform"
