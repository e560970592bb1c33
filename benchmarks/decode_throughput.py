"""Decode throughput and engine start-up: the suite on the reference device vs vLLM's CPU.

Same script, same environment, same tiny Llama (random weights, compute negligible, so
the numbers measure host overhead per step): each backend runs in its own subprocess
(vLLM's platform is chosen once per process), one after the other, with eager execution,
fp32, greedy decoding of a fixed number of tokens (EOS ignored) at batch sizes 1 and 32.

    uv run python benchmarks/decode_throughput.py [--repeats 3] [--out FILE]

Reported: engine start-up seconds (LLM constructor) and decode tokens/s (generated tokens
over wall time of ``generate``, after one warm-up call), and the ratios suite / vLLM CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

BACKENDS = {
    "ascend (reference device)": {"VLLM_ASCEND_DEVICE": "cpu"},
    "vllm cpu": {"VLLM_ASCEND_DEVICE": None},
}
BATCHES = (1, 32)
PROMPT_TOKENS = 16
NEW_TOKENS = 64


def child(repeats: int) -> None:
    """Measure one backend in this process; print one JSON line."""
    from tiny_models import ensure_tiny_model
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.platforms import current_platform

    model = str(ensure_tiny_model("llama"))
    start = time.perf_counter()
    llm = LLM(
        model=model,
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=256 << 20,
        enforce_eager=True,
        seed=0,
    )
    startup = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    result: dict = {"platform": type(current_platform).__name__, "startup_s": startup}
    for batch in BATCHES:
        prompts = [
            TokensPrompt(prompt_token_ids=[5 + (i * 7 + j) % 1000 for j in range(PROMPT_TOKENS)])
            for i in range(batch)
        ]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
        result[f"tok_s_batch{batch}"] = statistics.median(rates)
    llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeats)
        return

    results = {}
    for name, env_changes in BACKENDS.items():
        env = dict(os.environ)
        for key, value in env_changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--repeats", str(args.repeats)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"{name} failed:\n{proc.stderr[-4000:]}")
        results[name] = json.loads(lines[-1][len("RESULT ") :])

    ours, theirs = results["ascend (reference device)"], results["vllm cpu"]
    rows = [("engine start-up (s)", "startup_s")] + [
        (f"decode tok/s, batch {b}", f"tok_s_batch{b}") for b in BATCHES
    ]
    table = [
        "| measure | ascend (reference device) | vLLM CPU | ratio ascend / vLLM CPU |",
        "|---|---|---|---|",
    ]
    for label, key in rows:
        table.append(
            f"| {label} | {ours[key]:.2f} | {theirs[key]:.2f} | {ours[key] / theirs[key]:.2f} |"
        )
    text = "\n".join(table)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
