"""Embeddings from the BERT-style tiny model with the suite equal Transformers'."""

from __future__ import annotations

import pytest
import torch
from ascend_platform.attention.backend import AscendAttentionState as State
from engine import make_llm, recording_states, shutdown
from tiny_models import ensure_tiny_model, reference_embeddings

pytestmark = pytest.mark.slow

TEXTS = [
    "a",
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "embedding models pool the hidden states of every token " * 6,
    "short",
    "numbers 1 2 3 and punctuation, too!",
]


def test_embeddings_match_transformers() -> None:
    llm = make_llm("bert", runner="pooling", max_model_len=512)
    try:
        with recording_states() as states:
            outputs = llm.embed(TEXTS, use_tqdm=False)
    finally:
        shutdown(llm)
    got = torch.tensor([o.outputs.embedding for o in outputs])
    expected = reference_embeddings(ensure_tiny_model("bert"), TEXTS)
    cosine = torch.nn.functional.cosine_similarity(got, expected.to(got.dtype), dim=-1)
    assert cosine.min().item() >= 0.9999, cosine.tolist()
    assert states and all(s is State.ENCODER for s in states)
