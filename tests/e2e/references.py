"""Prompts and the independent reference: greedy decoding by HF Transformers in fp32."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

import torch
from tiny_models import ensure_tiny_model

PROMPT_LENGTHS = (1, 7, 33, 127, 128, 129, 200, 300)
"""Eight prompts of 1 to 300 tokens, ending before, on and after a 128-token block."""
NEW_TOKENS = 32
PREFIX_LENGTH = 200
FIRST_ORDINARY_TOKEN = 5  # ids 0-4 are special or chat tokens in the tiny tokenizers


@functools.cache
def vocab_size(model: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(ensure_tiny_model(model)).vocab_size


def random_prompts(model: str, lengths: Sequence[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    top = vocab_size(model) - 1
    return [[rng.randint(FIRST_ORDINARY_TOKEN, top) for _ in range(n)] for n in lengths]


def batch_prompts(model: str) -> list[list[int]]:
    """The standard batch: eight random prompts of PROMPT_LENGTHS tokens."""
    return random_prompts(model, PROMPT_LENGTHS, seed=1)


def prefix_prompts(model: str) -> list[list[int]]:
    """Eight prompts sharing one 200-token prefix, with suffixes of 1 to 100 tokens."""
    (prefix,) = random_prompts(model, [PREFIX_LENGTH], seed=2)
    suffixes = random_prompts(model, [1, 5, 17, 31, 50, 64, 77, 100], seed=3)
    return [prefix + s for s in suffixes]


@functools.cache
def _hf_model(model: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(model), dtype=torch.float32)
    return hf.eval()


@functools.cache
def _hf_greedy_one(model: str, prompt: tuple[int, ...], new_tokens: int) -> tuple[int, ...]:
    """Greedy continuation by Transformers in fp32: an explicit argmax loop over its own
    KV cache, so no generation-config default (EOS, penalties) can interfere."""
    hf = _hf_model(model)
    out: list[int] = []
    with torch.no_grad():
        result = hf(torch.tensor([prompt]), use_cache=True)
        for _ in range(new_tokens):
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            result = hf(
                torch.tensor([[token]]), past_key_values=result.past_key_values, use_cache=True
            )
    return tuple(out)


def hf_greedy(model: str, prompts: Sequence[Sequence[int]], new_tokens: int = NEW_TOKENS):
    return [list(_hf_greedy_one(model, tuple(p), new_tokens)) for p in prompts]
