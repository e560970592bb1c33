"""In-process engines with the suite active, and a record of the attention states they ran.

The generation tests run vLLM's engine core in the test process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that they can observe the attention backend:
:func:`recording_states` wraps the metadata builder and collects the batch state of every
step, which proves which code path served the tokens.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

from tiny_models import ensure_tiny_model


@contextlib.contextmanager
def in_process_engine() -> Iterator[None]:
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def make_llm(model: str, **overrides: Any):
    """A vLLM engine (in this process) on a tiny model, fp32."""
    from vllm import LLM

    kwargs: dict[str, Any] = dict(
        model=str(ensure_tiny_model(model)),
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    kwargs.update(overrides)
    with in_process_engine():
        return LLM(**kwargs)


def shutdown(llm: Any) -> None:
    """Stop the engine of ``llm``."""
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if engine_core is not None:
        engine_core.shutdown()
    gc.collect()


@contextlib.contextmanager
def recording_states() -> Iterator[list]:
    """Collect the AscendAttentionState of every metadata build in this process."""
    from ascend_platform.attention import backend

    states: list = []
    original = backend.AscendAttentionMetadataBuilder.build

    def build(self, *args: Any, **kwargs: Any):
        metadata = original(self, *args, **kwargs)
        states.append(metadata.attn_state)
        return metadata

    backend.AscendAttentionMetadataBuilder.build = build
    try:
        yield states
    finally:
        backend.AscendAttentionMetadataBuilder.build = original


def greedy(llm: Any, prompts: list[list[int]], new_tokens: int):
    """Greedy token ids (EOS ignored) and the RequestOutputs."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outputs], outputs


def metric_total(llm: Any, name: str) -> float:
    """Sum of the values of metric ``name`` across its label sets."""
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)
