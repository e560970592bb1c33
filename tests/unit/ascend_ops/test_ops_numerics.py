"""Each op's ``forward_oot`` (reference kernels) against vLLM's ``forward_native``.

Property tests over generated shapes, dtypes (fp32, fp16, bf16), magnitudes and memory
layouts (contiguous, rows of a wider buffer as left by splitting a fused projection,
column-major, 3-d), with the bounds explained in ``op_checks.py``. Every test also checks
that the kernel it is about was really called, and that the inputs were left unchanged.
"""

from __future__ import annotations

import pytest
import torch
from ascend_ops.ops import AscendRMSNorm, AscendRotaryEmbedding, AscendSiluAndMul
from ascend_platform.kernels.library import call_counts
from hypothesis import given, settings
from hypothesis import strategies as st
from op_checks import DTYPES, assert_within, vllm_config

LAYOUTS = ("contiguous", "row_strided", "column_major", "3d")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def activation(
    gen: torch.Generator,
    tokens: int,
    width: int,
    dtype: torch.dtype,
    layout: str,
    magnitude: float,
) -> torch.Tensor:
    """A [tokens, width] activation (or [2, tokens, width] for "3d") in the given layout."""
    if layout == "contiguous":
        t = randn(gen, tokens, width)
    elif layout == "row_strided":  # e.g. q out of a fused qkv projection
        t = randn(gen, tokens, width + 24)[:, 3 : 3 + width]
    elif layout == "column_major":
        t = randn(gen, width, tokens).t()
    elif layout == "3d":
        t = randn(gen, 2, tokens, width)
    else:  # pragma: no cover
        raise ValueError(layout)
    out = (t * magnitude).to(dtype)
    if layout == "row_strided":
        out = torch.empty(tokens, width + 24, dtype=dtype)[:, 3 : 3 + width].copy_(out)
    elif layout == "column_major":
        out = out.t().contiguous().t()
    if tokens > 1 and width > 1:
        assert out.is_contiguous() == (layout in ("contiguous", "3d"))
    return out


def calls(name: str) -> int:
    return call_counts().get(name, 0)


# --------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from(DTYPES),
    tokens=st.integers(1, 40),
    hidden=st.integers(1, 160).map(lambda k: 2 * k),
    layout=st.sampled_from(LAYOUTS),
    residual_layout=st.sampled_from(("none", *LAYOUTS)),
    magnitude=st.sampled_from((1e-3, 1.0, 40.0)),
    eps=st.sampled_from((1e-6, 1e-5)),
)
def test_rms_norm_matches_native(
    seed: int,
    dtype: torch.dtype,
    tokens: int,
    hidden: int,
    layout: str,
    residual_layout: str,
    magnitude: float,
    eps: float,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    with vllm_config():
        layer = AscendRMSNorm(hidden, eps=eps, dtype=dtype)
    layer.weight.data.copy_((1 + 0.1 * randn(gen, hidden)).to(dtype))
    x = activation(gen, tokens, hidden, dtype, layout, magnitude)
    residual = None
    if residual_layout != "none":
        if layout == "3d" or residual_layout == "3d":  # shapes must agree
            layout = residual_layout = "3d"
            x = activation(gen, tokens, hidden, dtype, "3d", magnitude)
        residual = activation(gen, tokens, hidden, dtype, residual_layout, magnitude)
    x0 = x.clone()
    r0 = None if residual is None else residual.clone()
    kernel = "npu_rms_norm" if residual is None else "npu_add_rms_norm"
    before = calls(kernel)

    with torch.inference_mode():
        got = layer.forward_oot(x, residual)
        want = layer.forward_native(x, residual)

    assert calls(kernel) == before + 1
    assert torch.equal(x, x0)
    weight = layer.weight.data.expand(x.shape)
    if residual is None:
        assert_within(got, want, dtype, factor=weight)
        return
    assert torch.equal(residual, r0)
    out, added = got
    want_out, want_added = want
    assert_within(out, want_out, dtype, factor=weight)
    # The new residual is x + residual, summed in float32 and rounded once, on both sides.
    assert added.dtype == dtype and torch.equal(added, want_added)
    assert added.data_ptr() not in (x.data_ptr(), residual.data_ptr())


def test_rms_norm_without_kernel_support_falls_back_to_native() -> None:
    """var_hidden_size, no weight, or a weight of another dtype: vLLM's native path."""
    x = torch.randn(3, 64)
    with vllm_config():
        layers = [
            AscendRMSNorm(64, var_hidden_size=32),
            AscendRMSNorm(64, has_weight=False),
            AscendRMSNorm(64, dtype=torch.bfloat16),
        ]
    before = call_counts()
    for layer in layers:
        torch.testing.assert_close(layer.forward_oot(x), layer.forward_native(x), rtol=0, atol=0)
        residual = torch.randn(3, 64)
        got, want = layer.forward_oot(x, residual), layer.forward_native(x, residual)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert call_counts() == before


# --------------------------------------------------------------------------------------------
# SiluAndMul
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from(DTYPES),
    tokens=st.integers(1, 40),
    half=st.integers(1, 256),
    layout=st.sampled_from(LAYOUTS),
    magnitude=st.sampled_from((1e-3, 1.0, 30.0)),
)
def test_silu_and_mul_matches_native(
    seed: int, dtype: torch.dtype, tokens: int, half: int, layout: str, magnitude: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    with vllm_config():
        layer = AscendSiluAndMul()
    x = activation(gen, tokens, 2 * half, dtype, layout, magnitude)
    x0 = x.clone()
    before = calls("npu_swiglu")

    got = layer.forward_oot(x)
    want = layer.forward_native(x)

    assert calls("npu_swiglu") == before + 1
    assert torch.equal(x, x0)
    assert got.shape == (*x.shape[:-1], half)
    assert_within(got, want, dtype, factor=x[..., half:])


# --------------------------------------------------------------------------------------------
# RotaryEmbedding
# --------------------------------------------------------------------------------------------


def rotary_scale(x: torch.Tensor, head_size: int, rotary_dim: int, neox: bool) -> torch.Tensor:
    """|x| + |rotate(x)| on the rotated channels, |x| on the others (see op_checks.py)."""
    shape = x.shape
    xa = x.double().abs().reshape(-1, head_size)
    r = xa[:, :rotary_dim]
    if neox:
        swapped = torch.cat((r[:, rotary_dim // 2 :], r[:, : rotary_dim // 2]), dim=-1)
    else:
        swapped = r.reshape(-1, rotary_dim // 2, 2).flip(-1).reshape(-1, rotary_dim)
    return torch.cat((r + swapped, xa[:, rotary_dim:]), dim=-1).reshape(shape)


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from(DTYPES),
    tokens=st.integers(1, 24),
    head_size=st.sampled_from((16, 32, 64, 80, 128)),
    rotary_fraction=st.sampled_from((1.0, 0.5, 0.25)),
    neox=st.booleans(),
    num_heads=st.integers(1, 8),
    num_kv_heads=st.integers(1, 4),
    layout=st.sampled_from(("fused_qkv", "separate", "3d")),
    with_key=st.booleans(),
    base=st.sampled_from((1e4, 1e6)),
    pos_dtype=st.sampled_from((torch.int64, torch.int32)),
    magnitude=st.sampled_from((1e-2, 1.0, 20.0)),
)
def test_rotary_embedding_matches_native(
    seed: int,
    dtype: torch.dtype,
    tokens: int,
    head_size: int,
    rotary_fraction: float,
    neox: bool,
    num_heads: int,
    num_kv_heads: int,
    layout: str,
    with_key: bool,
    base: float,
    pos_dtype: torch.dtype,
    magnitude: float,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    rotary_dim = max(2, int(head_size * rotary_fraction) // 2 * 2)
    max_position = 512
    with vllm_config():
        layer = AscendRotaryEmbedding(head_size, rotary_dim, max_position, base, neox, dtype)
    q_size, k_size = num_heads * head_size, num_kv_heads * head_size
    if layout == "fused_qkv":  # the model's layout: views into one qkv projection
        qkv = (randn(gen, tokens, q_size + 2 * k_size) * magnitude).to(dtype)
        query, key, _ = qkv.split([q_size, k_size, k_size], dim=-1)
    else:
        query = (randn(gen, tokens, q_size) * magnitude).to(dtype)
        key = (randn(gen, tokens, k_size) * magnitude).to(dtype)
        if layout == "3d":
            query = query.view(tokens, num_heads, head_size)
            key = key.view(tokens, num_kv_heads, head_size)
    if not with_key:
        key = None
    positions = torch.randint(0, max_position, (tokens,), generator=gen).to(pos_dtype)
    q0 = query.clone()
    k0 = None if key is None else key.clone()
    before = calls("npu_rotary_mul")

    got_q, got_k = layer.forward_oot(positions, query, key)
    want_q, want_k = layer.forward_native(positions, query, key)

    assert calls("npu_rotary_mul") == before + (2 if with_key else 1)
    assert torch.equal(query, q0)
    assert_within(got_q, want_q, dtype, rotary_scale(query, head_size, rotary_dim, neox))
    if key is None:
        assert got_k is None and want_k is None
        return
    assert torch.equal(key, k0)
    assert_within(got_k, want_k, dtype, rotary_scale(key, head_size, rotary_dim, neox))


@pytest.mark.parametrize("neox", [True, False])
def test_rotary_tables_layout(neox: bool) -> None:
    """r1/r2 put each frequency's cos/sin at both channels it rotates."""
    with vllm_config():
        layer = AscendRotaryEmbedding(8, 8, 16, 10000.0, neox, torch.float32)
    cos, sin = layer.cos_sin_cache.chunk(2, dim=-1)  # [16, 4] each
    r1, r2 = layer.npu_cos_cache, layer.npu_sin_cache
    assert r1.shape == r2.shape == (16, 8)
    for j in range(4):
        pair = (j, j + 4) if neox else (2 * j, 2 * j + 1)
        for c in pair:
            assert torch.equal(r1[:, c], cos[:, j]) and torch.equal(r2[:, c], sin[:, j])


def test_rotary_tables_follow_query_dtype() -> None:
    """A query in another dtype than the cache: tables converted like vLLM converts its
    cos_sin_cache, so both paths still agree."""
    with vllm_config():
        layer = AscendRotaryEmbedding(32, 32, 64, 10000.0, True, torch.float32)
    positions = torch.arange(5)
    query = torch.randn(5, 64).to(torch.bfloat16)
    got, _ = layer.forward_oot(positions, query)
    want, _ = layer.forward_native(positions, query)
    assert layer.npu_cos_cache.dtype == torch.bfloat16
    assert_within(got, want, torch.bfloat16, rotary_scale(query, 32, 32, True))
