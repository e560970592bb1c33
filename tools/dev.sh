#!/usr/bin/env bash
# The two commands of the README, on a machine that has only python3 and pip:
#   bash tools/dev.sh demo   set up, then generate text from a tiny model through vLLM with
#                            the suite on the CPU reference device
#   bash tools/dev.sh test   set up, then run the whole test suite (what CI runs) against
#                            vLLM 0.32 (.venv) and again against vLLM 0.31 (.venv-vllm031)
# Set-up installs uv (pinned) when it is missing and builds .venv with `uv sync`.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.8

setup() {
    if ! command -v uv >/dev/null 2>&1; then
        python3 -m pip install --quiet --user "uv==${UV_VERSION}"
        export PATH="$(python3 -m site --user-base)/bin:${PATH}"
    fi
    uv sync --quiet
}

case "${1:-}" in
    demo)
        setup
        VLLM_ASCEND_DEVICE=cpu uv run --no-sync python tools/demo.py "${@:2}"
        ;;
    test)
        setup
        uv run --no-sync ruff check packages tools tests benchmarks
        uv run --no-sync ruff format --check packages tools tests benchmarks
        uv run --no-sync ascend-patches docs --check
        echo "=== vLLM 0.32 ==="
        uv run --no-sync pytest "${@:2}"
        echo "=== vLLM 0.31 ==="
        export UV_PROJECT_ENVIRONMENT=.venv-vllm031
        uv sync --quiet --no-default-groups --group dev --group vllm031
        uv run --no-sync pytest "${@:2}"
        ;;
    *)
        echo "usage: bash tools/dev.sh demo|test [args...]" >&2
        exit 2
        ;;
esac
