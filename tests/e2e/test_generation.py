"""Greedy generation with the suite on the reference device equals HF Transformers.

For the tiny Llama (GQA) and Qwen2 (qkv bias, tied embeddings) models, a batch of eight
prompts of 1 to 300 tokens, 32 new tokens each, fp32, under: default settings; chunked
prefill forced by a small token budget; prefix caching over a shared 200-token prefix;
and a KV cache small enough that requests are preempted and recomputed.
"""

from __future__ import annotations

import pytest
import torch
from ascend_platform.attention.backend import AscendAttentionState as State
from engine import greedy, make_llm, metric_total, recording_states, shutdown
from references import NEW_TOKENS, PROMPT_LENGTHS, batch_prompts, hf_greedy, prefix_prompts

pytestmark = pytest.mark.slow

MODELS = ["llama", "qwen2"]


def kv_block_bytes(model: str, block_size: int = 128) -> int:
    from tiny_models import ensure_tiny_model
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(ensure_tiny_model(model))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_layer = 2 * block_size * cfg.num_key_value_heads * head_dim * 4  # K and V, fp32
    return per_layer * cfg.num_hidden_layers


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def default_engine(model: str):
    llm = make_llm(model)
    yield llm
    shutdown(llm)


def test_default_settings_match_transformers(model: str, default_engine) -> None:
    prompts = batch_prompts(model)
    with recording_states() as states:
        tokens, _ = greedy(default_engine, prompts, NEW_TOKENS)
    assert tokens == hf_greedy(model, prompts)
    assert State.PREFILL_NO_CACHE in states and State.DECODE_ONLY in states
    # The engine ran in this process: the reference device never initialised CUDA.
    assert not torch.cuda.is_initialized()


def test_prefix_cache_hit_matches_transformers(model: str, default_engine) -> None:
    prompts = prefix_prompts(model)
    expected = hf_greedy(model, prompts)
    first, _ = greedy(default_engine, prompts, NEW_TOKENS)
    with recording_states() as states:
        second, outputs = greedy(default_engine, prompts, NEW_TOKENS)
    assert first == expected
    assert second == expected
    cached = [o.num_cached_tokens for o in outputs]
    assert all(c and c >= 128 for c in cached), cached  # the prefix's full 128-token block
    assert State.PREFILL_CACHE_HIT in states


def test_chunked_prefill_matches_transformers(model: str) -> None:
    llm = make_llm(model, max_num_batched_tokens=64, enable_chunked_prefill=True)
    try:
        prompts = batch_prompts(model)
        with recording_states() as states:
            tokens, _ = greedy(llm, prompts, NEW_TOKENS)
    finally:
        shutdown(llm)
    assert tokens == hf_greedy(model, prompts)
    # A 300-token prompt under a 64-token budget is prefilled in chunks, next to decodes.
    assert State.PREFILL_CACHE_HIT in states or State.CHUNKED_PREFILL in states
    assert State.CHUNKED_PREFILL in states


def test_preemption_matches_transformers(model: str) -> None:
    # Six 128-token blocks: the batch needs 14, so requests are preempted and recomputed.
    llm = make_llm(
        model,
        max_model_len=512,
        kv_cache_memory_bytes=6 * kv_block_bytes(model),
        enable_prefix_caching=False,
        disable_log_stats=False,
    )
    try:
        prompts = batch_prompts(model)
        tokens, _ = greedy(llm, prompts, NEW_TOKENS)
        preemptions = metric_total(llm, "vllm:num_preemptions")
    finally:
        shutdown(llm)
    assert preemptions > 0
    assert tokens == hf_greedy(model, prompts)


def test_batch_shape() -> None:
    assert len(PROMPT_LENGTHS) == 8 and min(PROMPT_LENGTHS) == 1 and max(PROMPT_LENGTHS) == 300


def test_tensor_parallel_two_workers_match_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes (gloo standing in for HCCL) through the Ascend communicator."""
    from vllm import LLM

    # collective_rpc of a test function needs pickle; local processes only.
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from tiny_models import ensure_tiny_model

    llm = LLM(
        model=str(ensure_tiny_model("llama")),
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=32 << 20,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=True,
        seed=0,
    )
    try:
        prompts = batch_prompts("llama")
        tokens, _ = greedy(llm, prompts, NEW_TOKENS)
        communicators = llm.collective_rpc(_communicator_class)
    finally:
        shutdown(llm)
    assert tokens == hf_greedy("llama", prompts)
    assert communicators == ["AscendCommunicator", "AscendCommunicator"]


def _communicator_class(worker) -> str:
    from vllm.distributed.parallel_state import get_tp_group

    return type(get_tp_group().device_communicator).__name__
