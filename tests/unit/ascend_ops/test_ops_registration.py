"""The plugin: when it registers, what vLLM then builds, and how custom_ops switches ops.

This process runs the Ascend platform on the reference device (tests/conftest.py); the
cases for other platforms, and for vLLM's own plugin loader, run in subprocesses.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import ascend_ops
import pytest
import torch
from ascend_ops import ops
from ascend_platform.kernels.library import call_counts
from op_checks import vllm_config
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

EXPECTED = {
    "RMSNorm": (ops.AscendRMSNorm, "rms_norm"),
    "SiluAndMul": (ops.AscendSiluAndMul, "silu_and_mul"),
    "RotaryEmbedding": (ops.AscendRotaryEmbedding, "rotary_embedding"),
}


def build_layers() -> dict[str, CustomOp]:
    """vLLM's own classes, constructed as a model would."""
    return {
        "rms_norm": RMSNorm(64, eps=1e-6),
        "silu_and_mul": SiluAndMul(),
        "rotary_embedding": RotaryEmbedding(32, 32, 128, 10000.0, True, torch.float32),
    }


def run_layers(layers: dict[str, CustomOp]) -> None:
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    layers["rms_norm"](x)
    layers["rms_norm"](x, residual)
    layers["silu_and_mul"](x)
    layers["rotary_embedding"](torch.arange(3), torch.randn(3, 64), torch.randn(3, 32))


def test_register_installs_the_classes_under_vllm_names() -> None:
    assert ascend_ops.registered()
    for key, (cls, name) in EXPECTED.items():
        assert op_registry_oot[key] is cls
        assert cls.name == name  # the in-tree custom_ops name, not the registry key


def test_register_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    ascend_ops.register()
    ascend_ops.register()
    # Even with the process flag forgotten, a second registration is a no-op, not
    # register_oot's "Duplicate op name" assertion.
    monkeypatch.setattr(ascend_ops, "_REGISTERED", False)
    ascend_ops.register()
    assert ascend_ops.registered()
    assert ops.register_ops() == list(EXPECTED)
    for key, (cls, name) in EXPECTED.items():
        assert op_registry_oot[key] is cls and cls.name == name


def test_foreign_registration_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class OtherSiluAndMul(SiluAndMul):
        pass

    monkeypatch.setitem(op_registry_oot, "SiluAndMul", OtherSiluAndMul)
    logger = logging.getLogger("vllm.ascend_ops")
    logger.addHandler(caplog.handler)
    try:
        installed = ops.register_ops()
    finally:
        logger.removeHandler(caplog.handler)
    assert "SiluAndMul" not in installed
    assert op_registry_oot["SiluAndMul"] is OtherSiluAndMul
    assert "Not replacing vLLM's SiluAndMul" in caplog.text


def test_vllm_classes_build_ours_and_dispatch_to_forward_oot() -> None:
    with vllm_config():
        layers = build_layers()
    for name, layer in layers.items():
        assert type(layer).name == name
        assert layer._forward_method.__func__ is type(layer).forward_oot
    before = call_counts()
    run_layers(layers)
    after = call_counts()
    for kernel, n in {
        "npu_rms_norm": 1,
        "npu_add_rms_norm": 1,
        "npu_swiglu": 1,
        "npu_rotary_mul": 2,
    }.items():
        assert after.get(kernel, 0) - before.get(kernel, 0) == n, kernel


@pytest.mark.parametrize("disabled", ["rms_norm", "silu_and_mul", "rotary_embedding"])
def test_custom_ops_minus_name_switches_to_native(disabled: str) -> None:
    with vllm_config(f"-{disabled}"):
        layers = build_layers()
    for name, layer in layers.items():
        method = layer._forward_method
        if name == disabled:
            assert method.__name__ == "forward_native"
        else:
            assert method.__func__ is type(layer).forward_oot
    before = call_counts()
    run_layers(layers)
    after = call_counts()
    called = {k for k in after if after[k] != before.get(k, 0)}
    assert called.isdisjoint(ops.KERNELS[disabled])
    others = {k for name, ks in ops.KERNELS.items() if name != disabled for k in ks}
    assert others <= called


def test_custom_ops_none_plus_name_enables_only_that_op() -> None:
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["none", "+rms_norm"]))
    with set_current_vllm_config(config):
        layers = build_layers()
        enabled = set(config.compilation_config.enabled_custom_ops)
        disabled = set(config.compilation_config.disabled_custom_ops)
    assert enabled == {"rms_norm"}
    assert {"silu_and_mul", "rotary_embedding"} <= disabled  # (+ apply_rotary_emb inside)
    assert layers["rms_norm"]._forward_method.__func__ is ops.AscendRMSNorm.forward_oot


def _run(code: str, env_update: dict[str, str | None]) -> str:
    env = dict(os.environ)
    for key, value in env_update.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_other_platform_changes_nothing() -> None:
    """vLLM's own CPU platform, the suite installed: register() and vLLM's plugin loader
    leave the op registry and the layer classes untouched."""
    code = (
        "import sys\n"
        "import ascend_ops\n"
        "from vllm.platforms import current_platform\n"
        "assert type(current_platform).__name__ == 'CpuPlatform', type(current_platform)\n"
        "ascend_ops.register(); ascend_ops.register()\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.model_executor.custom_op import op_registry_oot\n"
        "assert op_registry_oot == {}, op_registry_oot\n"
        "assert not ascend_ops.registered()\n"
        "assert 'ascend_ops.ops' not in sys.modules\n"
        "import torch\n"
        "from vllm.config import VllmConfig, set_current_vllm_config\n"
        "from vllm.model_executor.layers.activation import SiluAndMul\n"
        "from vllm.model_executor.layers.layernorm import RMSNorm\n"
        "from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding\n"
        "with set_current_vllm_config(VllmConfig()):\n"
        "    built = [RMSNorm(8), SiluAndMul(), "
        "RotaryEmbedding(8, 8, 16, 10000.0, True, torch.float32)]\n"
        "assert [type(b) for b in built] == [RMSNorm, SiluAndMul, RotaryEmbedding], built\n"
        "assert RMSNorm.name == 'rms_norm'\n"
        "print('unchanged')\n"
    )
    # Only the suite's platform plugin and this plugin: the loader must run ours.
    env = {"VLLM_ASCEND_DEVICE": None, "VLLM_PLUGINS": "ascend,ascend_ops"}
    assert _run(code, env) == "unchanged"


def test_vllm_plugin_loader_registers_on_the_ascend_platform() -> None:
    """The entry point itself: vLLM's loader calls ascend_ops:register on the platform."""
    code = (
        "from vllm.platforms import current_platform\n"
        "assert type(current_platform).is_ascend_platform\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.model_executor.custom_op import op_registry_oot\n"
        "print(sorted((k, v.__name__, v.name) for k, v in op_registry_oot.items()))\n"
    )
    env = {"VLLM_ASCEND_DEVICE": "cpu", "VLLM_PLUGINS": "ascend,ascend_ops"}
    assert _run(code, env) == str(
        sorted((k, cls.__name__, name) for k, (cls, name) in EXPECTED.items())
    )
