"""Batch-state classification of the attention metadata builder."""

from __future__ import annotations

import pytest
from ascend_platform.attention.backend import AscendAttentionState as State
from ascend_platform.attention.backend import causal_mask, classify_batch


@pytest.mark.parametrize(
    ("query_lens", "kv_lens", "causal", "state"),
    [
        ([5, 3], [5, 3], True, State.PREFILL_NO_CACHE),
        ([1, 1], [9, 130], True, State.DECODE_ONLY),
        ([1, 40], [9, 40], True, State.CHUNKED_PREFILL),
        ([40], [168], True, State.PREFILL_CACHE_HIT),  # later chunk or prefix-cache hit
        ([7, 2], [7, 130], True, State.PREFILL_CACHE_HIT),
        ([1], [1], True, State.PREFILL_NO_CACHE),  # a one-token prompt is a prefill
        ([4, 6], [4, 6], False, State.ENCODER),
    ],
)
def test_classify_batch(query_lens, kv_lens, causal, state) -> None:
    assert classify_batch(query_lens, kv_lens, causal) is state


def test_causal_mask_is_the_documented_compressed_mask() -> None:
    import torch

    mask = causal_mask(torch.device("cpu"))
    assert mask.shape == (2048, 2048) and mask.dtype == torch.bool
    i, j = 5, 6
    assert bool(mask[i, j]) and not bool(mask[j, i]) and not bool(mask[i, i])
    assert int(mask.sum()) == 2048 * 2047 // 2
