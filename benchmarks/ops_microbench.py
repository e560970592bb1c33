"""Per-op microbenchmark on CPU: ascend-ops' forward_oot (reference kernels) vs vLLM native.

For each op of ascend-ops, the time of ``forward_oot`` on the Ascend reference device (the
torch_npu kernels served by ``ascend_platform.kernels.reference`` through the dispatcher,
``torch.ops.npu.*``) against vLLM's own ``forward_native`` of the same layer, in one
process, for 1 to 2048 tokens at hidden size 4096:

* ``rms_norm``: x [T, 4096]; ``rms_norm+residual``: x, residual [T, 4096];
* ``silu_and_mul``: x [T, 2 * 4096] -> [T, 4096];
* ``rotary neox`` / ``rotary gptj``: 32 query heads and 8 KV heads of 128 (hidden 4096,
  GQA), query and key as views into one fused qkv tensor, as in a model.

    uv run python benchmarks/ops_microbench.py [--dtypes float32,bfloat16] [--out FILE]
        [--system-malloc]

Reported: microseconds per call, the best over ``--rounds`` rounds (ours and native
alternate within a round, so slow phases of a shared machine hit both) of the median of a
``torch.utils.benchmark`` blocked autorange, and the ratio ours / native. This measures
the CPU reference path only; it says nothing about the NPU kernels.

The script re-executes itself with glibc malloc tunables that keep freed memory in the
process (mmap and trim thresholds of 4 GiB). With the defaults, tensors of a few MiB are
returned to the OS after each call and page-faulted back in on the next, which made the
timings of the same computation vary by up to 10x on the dev VM; ``--system-malloc``
keeps the defaults.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296"
if "--system-malloc" not in sys.argv and os.environ.get("GLIBC_TUNABLES") != MALLOC_TUNABLES:
    os.execve(
        sys.executable,
        [sys.executable, *sys.argv],
        {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES},
    )
os.environ.setdefault("VLLM_ASCEND_DEVICE", "cpu")

import torch  # noqa: E402  (after the re-exec above: no import before it)
import torch.utils.benchmark as benchmark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOKENS = (1, 4, 16, 64, 256, 1024, 2048)
HIDDEN = 4096
HEAD, Q_HEADS, KV_HEADS = 128, 32, 8
MAX_POSITION = 4096


def build_cases(dtype: torch.dtype) -> dict[str, Callable[[int], tuple[Callable, Callable]]]:
    """op name -> (tokens -> (ours, native)) closures over prepared inputs."""
    from ascend_ops.ops import AscendRMSNorm, AscendRotaryEmbedding, AscendSiluAndMul
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))
    with set_current_vllm_config(config):
        norm = AscendRMSNorm(HIDDEN, eps=1e-6, dtype=dtype)
        act = AscendSiluAndMul()
        ropes = {
            style: AscendRotaryEmbedding(HEAD, HEAD, MAX_POSITION, 10000.0, style == "neox", dtype)
            for style in ("neox", "gptj")
        }
    norm.weight.data.normal_(1.0, 0.1)

    def rms(tokens: int):
        x = torch.randn(tokens, HIDDEN).to(dtype)
        return lambda: norm.forward_oot(x), lambda: norm.forward_native(x)

    def rms_residual(tokens: int):
        x, r = torch.randn(tokens, HIDDEN).to(dtype), torch.randn(tokens, HIDDEN).to(dtype)
        return lambda: norm.forward_oot(x, r), lambda: norm.forward_native(x, r)

    def silu(tokens: int):
        x = torch.randn(tokens, 2 * HIDDEN).to(dtype)
        return lambda: act.forward_oot(x), lambda: act.forward_native(x)

    def rotary(style: str):
        rope = ropes[style]

        def case(tokens: int):
            q_size, k_size = Q_HEADS * HEAD, KV_HEADS * HEAD
            qkv = torch.randn(tokens, q_size + 2 * k_size).to(dtype)
            q, k, _ = qkv.split([q_size, k_size, k_size], dim=-1)
            pos = torch.randint(0, MAX_POSITION, (tokens,))
            return lambda: rope.forward_oot(pos, q, k), lambda: rope.forward_native(pos, q, k)

        return case

    return {
        "rms_norm": rms,
        "rms_norm+residual": rms_residual,
        "silu_and_mul": silu,
        "rotary neox": rotary("neox"),
        "rotary gptj": rotary("gptj"),
    }


def median_us(fn: Callable, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def compare_us(ours: Callable, native: Callable, rounds: int, min_run_time: float):
    """(ours, native): best over rounds of the median time, the two alternating."""
    ours(), native()  # warm-up (first-call conversions, allocator)
    best_ours = best_native = float("inf")
    for _ in range(rounds):
        best_ours = min(best_ours, median_us(ours, min_run_time))
        best_native = min(best_native, median_us(native, min_run_time))
    return best_ours, best_native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--min-run-time", type=float, default=0.1, help="seconds per timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's defaults")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/ops_microbench.md"))
    args = parser.parse_args()

    import ascend_ops
    import vllm
    from ascend_platform.kernels import register_reference_kernels

    assert register_reference_kernels(), "torch_npu is installed: this measures the CPU path"
    ascend_ops.register()

    rows = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for op, make in build_cases(dtype).items():
                for tokens in TOKENS:
                    ours, native = make(tokens)
                    t_ours, t_native = compare_us(ours, native, args.rounds, args.min_run_time)
                    rows.append((op, dtype_name, tokens, t_ours, t_native))
                    print(
                        f"{op:18s} {dtype_name:8s} T={tokens:5d}  ours {t_ours:10.1f} us  "
                        f"native {t_native:10.1f} us  ratio {t_ours / t_native:5.2f}",
                        flush=True,
                    )

    header = (
        "# Op microbenchmark: ascend-ops forward_oot (reference kernels) vs vLLM native, CPU\n\n"
        f"Recorded {datetime.date.today()} with `uv run python benchmarks/ops_microbench.py` "
        f"on {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), vLLM {vllm.__version__}. Hidden size "
        f"{HIDDEN}; rotary: {Q_HEADS} query / {KV_HEADS} KV heads of {HEAD}, full rotary "
        "dim, q and k views into a fused qkv tensor. Time per call: best of "
        f"{args.rounds} rounds (ours and native alternating) of the median of a "
        "`torch.utils.benchmark` blocked autorange, one process. ratio = ours / native "
        "(below 1: ours faster). glibc malloc: "
        + ("defaults" if args.system_malloc else f"`GLIBC_TUNABLES={MALLOC_TUNABLES}`")
        + ".\n\n"
        "| op | dtype | tokens | ours (us) | vLLM native (us) | ratio |\n"
        "|---|---|---:|---:|---:|---:|\n"
    )
    table = "".join(
        f"| {op} | {dt} | {t} | {a:.1f} | {b:.1f} | {a / b:.2f} |\n" for op, dt, t, a, b in rows
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
