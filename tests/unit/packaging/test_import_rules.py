"""Import rules of the suite, checked on the source.

- No distribution imports another (they meet through entry points, hooks and op names).
- No distribution imports torch_npu at module level except through the kernel accessor;
  the kernel layer's core modules import neither vLLM nor torch_npu (they must load in any
  process, before and without vLLM).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
MODULES = {src.name: src for src in PACKAGES.glob("*/src/*") if (src / "__init__.py").exists()}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_all_distributions_found() -> None:
    expected = {"ascend_platform", "ascend_ops", "ascend_connectors", "ascend_patches"}
    assert set(MODULES) == expected


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_distribution_imports_another(module: str) -> None:
    others = set(MODULES) - {module}
    for path in MODULES[module].rglob("*.py"):
        crossing = imported_roots(path) & others
        assert not crossing, f"{path.relative_to(PACKAGES)} imports {sorted(crossing)}"


def test_ascend_ops_imports_no_torch_npu() -> None:
    for path in MODULES["ascend_ops"].rglob("*.py"):
        assert "torch_npu" not in imported_roots(path), path.name


@pytest.mark.parametrize("name", ["__init__.py", "library.py", "reference.py"])
def test_kernel_layer_imports_neither_vllm_nor_torch_npu(name: str) -> None:
    roots = imported_roots(MODULES["ascend_platform"] / "kernels" / name)
    assert not roots & {"vllm", "torch_npu"}, name
