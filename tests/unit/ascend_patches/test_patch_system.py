"""The patch system: declaration rules, selection by vLLM version, apply, undo, check, CLI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ascend_patches import cli
from ascend_patches.core import PatchError, PatchRegistry, load_patches, vllm_version
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
DESCRIPTION = dict(why="w", how="h", upstream="u", removal="r")


def shout(original):
    def replacement(text, *args, **kwargs):
        return original(text, *args, **kwargs).upper()

    return replacement


def test_apply_is_idempotent_and_undo_restores() -> None:
    registry = PatchRegistry()
    registry.declare(target="textwrap.dedent", stage="worker", versions=">=0.31", **DESCRIPTION)(
        shout
    )
    original = textwrap.dedent
    first = registry.apply_stage("worker", "cpu", Version("0.32.0"))
    second = registry.apply_stage("worker", "cpu", Version("0.32.0"))
    try:
        assert textwrap.dedent("  a") == "A"
        assert first.applied == ["test_patch_system.shout"]
        assert second.already_applied == ["test_patch_system.shout"] and not second.applied
    finally:
        registry.undo_all()
    assert textwrap.dedent is original


def test_stage_device_and_version_select() -> None:
    registry = PatchRegistry()
    registry.declare(
        target="textwrap.dedent", stage="worker", versions="<0.32", name="old", **DESCRIPTION
    )(shout)
    registry.declare(
        target="textwrap.indent", stage="worker", versions=">=0.32", name="new", **DESCRIPTION
    )(shout)
    registry.declare(
        target="textwrap.fill", stage="worker", versions=">=0.31", devices=("npu",),
        name="npu_only", **DESCRIPTION,
    )(shout)  # fmt: skip
    names = lambda v, d: [p.name for p in registry.select("worker", Version(v), d)]  # noqa: E731
    assert names("0.31.0", "cpu") == ["old"]
    assert names("0.32.0", "cpu") == ["new"]
    assert names("0.32.0", "npu") == ["new", "npu_only"]
    assert registry.select("platform", Version("0.32.0"), "cpu") == []


def test_vllm_version_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_VERSION", raising=False)
    installed = vllm_version()
    assert installed.release[:2] in ((0, 31), (0, 32))
    monkeypatch.setenv("VLLM_VERSION", "0.31.0")
    assert vllm_version() == Version("0.31.0")
    monkeypatch.setenv("VLLM_VERSION", "banana")
    with pytest.raises(PatchError, match=r"VLLM_VERSION='banana' is not a valid version"):
        vllm_version()


def test_vllm_version_override_selects_the_031_patch_set(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = PatchRegistry()
    registry.declare(
        target="textwrap.dedent", stage="worker", versions="==0.31.*", name="v031", **DESCRIPTION
    )(shout)
    registry.declare(
        target="textwrap.indent", stage="worker", versions="==0.32.*", name="v032", **DESCRIPTION
    )(shout)
    monkeypatch.setenv("VLLM_VERSION", "0.31.0")
    try:
        report = registry.apply_stage("worker", "cpu")
    finally:
        registry.undo_all()
    assert report.applied == ["v031"]


def test_two_patches_on_one_target_are_refused() -> None:
    registry = PatchRegistry()
    registry.declare(
        target="textwrap.dedent", stage="worker", versions=">=0", name="a", **DESCRIPTION
    )(shout)
    with pytest.raises(PatchError, match=r"patches a and b both replace textwrap\.dedent"):
        registry.declare(
            target="textwrap.dedent", stage="platform", versions=">=0", name="b", **DESCRIPTION
        )(shout)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stage", "engine", "stage 'engine' not in"),
        ("versions", "0.32", "is not a PEP 440 specifier"),
        ("why", " ", "the description needs 'why'"),
    ],
)
def test_bad_declarations(field: str, value: str, message: str) -> None:
    kwargs = dict(target="textwrap.dedent", stage="worker", versions=">=0", **DESCRIPTION)
    kwargs[field] = value
    with pytest.raises(PatchError, match=message):
        PatchRegistry().declare(**kwargs)(shout)


def test_missing_target_is_reported_not_raised() -> None:
    registry = PatchRegistry()
    registry.declare(
        target="vllm.v1.worker.no_such_module.Thing.method", stage="worker", versions=">=0",
        name="ghost", **DESCRIPTION,
    )(shout)  # fmt: skip
    report = registry.apply_stage("worker", "cpu", Version("0.32.0"))
    assert report.applied == [] and "ghost" in report.missing_target
    assert "ghost" in registry.check(Version("0.32.0"))


def test_inherited_attribute_is_removed_on_undo() -> None:
    class Base:
        def greet(self) -> str:
            return "hi"

    class Child(Base):
        pass

    registry = PatchRegistry()
    module = sys.modules[__name__]
    module.Child = Child  # type: ignore[attr-defined]
    registry.declare(
        target=f"{__name__}.Child.greet", stage="worker", versions=">=0", name="greet",
        **DESCRIPTION,
    )(lambda original: lambda self: "patched")  # fmt: skip
    registry.apply_stage("worker", "cpu", Version("0.32.0"))
    assert Child().greet() == "patched"
    registry.undo("greet")
    assert Child().greet() == "hi" and "greet" not in vars(Child)


# --- the CLI -----------------------------------------------------------------------------


def test_cli_list_and_check_on_the_installed_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    table = capsys.readouterr().out
    for name in load_patches().patches:
        assert name in table
    assert cli.main(["check"]) == 0
    assert "every target exists" in capsys.readouterr().out


def test_cli_check_names_a_missing_target(capsys: pytest.CaptureFixture[str]) -> None:
    registry = PatchRegistry()
    registry.declare(
        target="vllm.config.NoSuchConfig.field", stage="platform", versions=">=0",
        name="fixture_missing", **DESCRIPTION,
    )(shout)  # fmt: skip
    assert cli.main(["check"], registry=registry) == 1
    assert (
        "MISSING TARGET fixture_missing: vllm.config.NoSuchConfig.field" in capsys.readouterr().err
    )


def test_console_script_check() -> None:
    script = Path(sys.executable).with_name("ascend-patches")
    result = subprocess.run([str(script), "check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_committed_docs_are_current(tmp_path: Path) -> None:
    assert cli.main(["docs", "--check", "--output", str(REPO / "docs" / "patches.md")]) == 0
    stale = tmp_path / "patches.md"
    stale.write_text("old\n")
    assert cli.main(["docs", "--check", "--output", str(stale)]) == 1
    assert cli.main(["docs", "--output", str(stale)]) == 0
    assert stale.read_text() == cli.render_docs(load_patches())
