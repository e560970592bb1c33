"""Generation with the platform and ascend-ops on the reference device.

The tiny Llama and Qwen2 models, the standard batch (eight prompts of 1 to 300 tokens, 32
new tokens, fp32), in vLLM's default mode on this platform (VLLM_COMPILE with the dynamo
``eager`` backend): the greedy tokens equal Transformers', and the platform's kernel
call counters prove that every RMSNorm, SiluAndMul and RotaryEmbedding of the model ran
on its torch_npu kernel. One eager engine checks compiled == eager; one engine with
``custom_ops=["-rms_norm"]`` checks that the excluded op's kernels are never called.
Four engine starts in all.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ascend_platform.kernels.library import call_counts, fake_call_counts, reset_call_counts
from engine import greedy, make_llm, shutdown
from references import NEW_TOKENS, batch_prompts, hf_greedy

pytestmark = pytest.mark.slow

MODELS = ["llama", "qwen2"]
NUM_LAYERS = 2  # both tiny models
OP_KERNELS = ("npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_rotary_mul")


@dataclasses.dataclass
class Run:
    tokens: list[list[int]]
    counts: dict[str, int]
    traced: dict[str, int]  # fake-implementation calls from engine start to the end
    compilation_mode: Any
    backend: str
    enabled_ops: set[str]
    disabled_ops: set[str]


def generate(model: str, **overrides: Any) -> Run:
    """Start an engine, run the standard batch counting kernel calls, stop the engine."""
    reset_call_counts()
    llm = make_llm(model, **overrides)  # compiles (traces) the model, if it compiles
    try:
        compilation = llm.llm_engine.vllm_config.compilation_config
        traced_at_start = fake_call_counts()
        reset_call_counts()
        tokens, _ = greedy(llm, batch_prompts(model), NEW_TOKENS)
        counts = call_counts()
        traced = fake_call_counts()
        for name, n in traced_at_start.items():
            traced[name] = traced.get(name, 0) + n
        return Run(
            tokens=tokens,
            counts=counts,
            traced=traced,
            compilation_mode=compilation.mode,
            backend=compilation.backend,
            enabled_ops=set(compilation.enabled_custom_ops),
            disabled_ops=set(compilation.disabled_custom_ops),
        )
    finally:
        shutdown(llm)


def assert_every_op_on_its_kernel(counts: dict[str, int]) -> None:
    """Per forward pass of an L-layer model: one plain norm (the first layer's input norm),
    2L norms with residual (the other 2L - 1 layer norms and the final norm), L SwiGLUs
    and 2L rotary calls (query and key): exact multiples of the number of passes."""
    steps = counts.get("npu_rms_norm", 0)
    assert steps > 0, counts
    assert counts.get("npu_add_rms_norm", 0) == 2 * NUM_LAYERS * steps, counts
    assert counts.get("npu_swiglu", 0) == NUM_LAYERS * steps, counts
    assert counts.get("npu_rotary_mul", 0) == 2 * NUM_LAYERS * steps, counts


@pytest.fixture(scope="module")
def compiled_llama() -> Run:
    return generate("llama")


@pytest.fixture(scope="module")
def compiled_qwen2() -> Run:
    return generate("qwen2")


@pytest.mark.parametrize("model", MODELS)
def test_default_mode_matches_transformers_on_npu_kernels(
    model: str, request: pytest.FixtureRequest
) -> None:
    from vllm.config import CompilationMode

    run: Run = request.getfixturevalue(f"compiled_{model}")
    assert run.compilation_mode == CompilationMode.VLLM_COMPILE
    assert run.backend == "eager"
    assert {"rms_norm", "silu_and_mul", "rotary_embedding"} <= run.enabled_ops
    assert run.tokens == hf_greedy(model, batch_prompts(model))
    assert_every_op_on_its_kernel(run.counts)
    # dynamo traced the ops through their fake implementations
    assert all(run.traced.get(k, 0) > 0 for k in OP_KERNELS), run.traced


def test_compiled_equals_eager(compiled_llama: Run) -> None:
    eager = generate("llama", enforce_eager=True)
    assert eager.tokens == compiled_llama.tokens
    assert_every_op_on_its_kernel(eager.counts)
    assert not any(eager.traced.get(k, 0) for k in OP_KERNELS), eager.traced  # no tracing
    # The same forward passes ran on the same kernels, compiled or not.
    assert eager.counts == compiled_llama.counts


def test_custom_ops_exclusion_runs_native_rms_norm() -> None:
    run = generate("llama", compilation_config={"custom_ops": ["-rms_norm"]})
    assert "rms_norm" in run.disabled_ops and "rms_norm" not in run.enabled_ops
    assert run.counts.get("npu_rms_norm", 0) == 0, run.counts
    assert run.counts.get("npu_add_rms_norm", 0) == 0, run.counts
    assert run.counts.get("npu_swiglu", 0) > 0 and run.counts.get("npu_rotary_mul", 0) > 0
    assert run.tokens == hf_greedy("llama", batch_prompts("llama"))
