"""Each distribution builds a wheel with ``uv build`` and declares its entry points."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

EXPECTED = {
    "ascend-platform": {"vllm.platform_plugins": {"ascend": "ascend_platform:register"}},
    "ascend-ops": {"vllm.general_plugins": {"ascend_ops": "ascend_ops:register"}},
    "ascend-connectors": {
        "vllm.general_plugins": {"ascend_connectors": "ascend_connectors:register"}
    },
    "ascend-patches": {
        "vllm.general_plugins": {"ascend_patches": "ascend_patches:register"},
        "ascend.hooks": {"ascend_patches": "ascend_patches.hooks"},
        "console_scripts": {"ascend-patches": "ascend_patches.cli:main_exit"},
    },
    "ascend-vllm": {},
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the wheels (the README's setup installs it)"
    out = tmp_path_factory.mktemp("wheels")
    for dist in EXPECTED:
        subprocess.run(
            [uv, "build", "--wheel", "--out-dir", str(out), str(REPO / "packages" / dist)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return {dist: next(out.glob(dist.replace("-", "_") + "-*.whl")) for dist in EXPECTED}


@pytest.mark.parametrize("dist", sorted(EXPECTED))
def test_wheel_entry_points(wheels: dict[str, Path], dist: str) -> None:
    with zipfile.ZipFile(wheels[dist]) as wheel:
        names = wheel.namelist()
        entry_file = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        groups: dict[str, dict[str, str]] = {}
        if entry_file:
            parser = configparser.ConfigParser(delimiters=("=",))
            parser.optionxform = str  # type: ignore[assignment, method-assign]
            parser.read_string(wheel.read(entry_file).decode())
            groups = {s: dict(parser[s]) for s in parser.sections()}
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert groups == EXPECTED[dist]
    if dist == "ascend-vllm":
        for part in ("ascend-platform", "ascend-ops", "ascend-connectors", "ascend-patches"):
            assert f"Requires-Dist: {part}==0.1.0".encode() in metadata
        assert b"Requires-Dist: torch-npu==2.13.0; extra == 'npu'" in metadata
    else:
        module = dist.replace("-", "_")
        assert f"{module}/__init__.py" in names
