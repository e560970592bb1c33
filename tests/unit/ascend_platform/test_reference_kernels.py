"""Reference kernels against independent closed-form formulas.

Every expected value here is computed from the *logical* inputs (per-sequence queries, keys
and values) in float64 with explicit loops, never through the kernel's own helpers: paged
caches and block tables are built by hand and the reference reads the unpaged data.

Tolerances (kernel output vs float64 formula, |a - b| <= atol + rtol * |b|):
fp32 1e-5 / 1e-5, fp16 2e-3 / 2e-3, bf16 1.6e-2 / 1.6e-2 (about two ulps of the output
type; the kernels compute in float32 and round once).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from ascend_platform import kernels
from ascend_platform.kernels import library, reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

OPS = torch.ops.npu  # populated by the module fixture below

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}
CAUSAL_MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    assert kernels.register_reference_kernels()


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype])


# ============================================================================================
# attention: independent reference
# ============================================================================================


def ref_attention_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mode: str,
    user_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [s, N, D], k [L, KV_N, D], v [L, KV_N, Dv] -> out [s, N, Dv], lse [s, N].

    mode: "full", "left_up" (j <= i), "right_down" (j <= i + L - s). user_mask [s, L] True =
    masked. Rows that see nothing: out 0, lse -inf. All in float64, one head at a time.
    """
    s, n, _ = q.shape
    length, kv_n, dv = v.shape
    group = n // kv_n
    out = torch.zeros(s, n, dv, dtype=torch.float64)
    lse = torch.full((s, n), -math.inf, dtype=torch.float64)
    for h in range(n):
        kh = h // group
        for i in range(s):
            allowed = []
            for j in range(length):
                if mode == "left_up" and j > i:
                    continue
                if mode == "right_down" and j > i + length - s:
                    continue
                if user_mask is not None and bool(user_mask[i, j]):
                    continue
                allowed.append(j)
            if not allowed:
                continue
            idx = torch.tensor(allowed)
            scores = (k[idx, kh].double() @ q[i, h].double()) * scale  # [n_allowed]
            m = scores.max()
            w = torch.exp(scores - m)
            out[i, h] = (w / w.sum()) @ v[idx, kh].double()
            lse[i, h] = m + torch.log(w.sum())
    return out, lse


def write_paged(
    seqs: list[torch.Tensor],
    table: torch.Tensor,
    num_blocks: int,
    block_size: int,
    cache_layout: str,
    dtype: torch.dtype,
    gen: torch.Generator,
) -> torch.Tensor:
    """A cache of large garbage holding seqs[b] ([kv_len, KV_N, D]) where `table` says.

    cache_layout "BSH" gives (num_blocks, block_size, KV_N*D), "BNSD" gives
    (num_blocks, KV_N, block_size, D).
    """
    kv_n, d = seqs[0].shape[1], seqs[0].shape[2]
    cache = (1000.0 * torch.randn(num_blocks, block_size, kv_n, d, generator=gen)).to(dtype)
    for b, seq in enumerate(seqs):
        for pos in range(seq.shape[0]):
            cache[int(table[b, pos // block_size]), pos % block_size] = seq[pos]
    if cache_layout == "BSH":
        return cache.reshape(num_blocks, block_size, kv_n * d)
    return cache.permute(0, 2, 1, 3).contiguous()


def paged_kv(
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    block_size: int,
    cache_layout: str,
    dtype: torch.dtype,
    gen: torch.Generator,
    extra_blocks: int = 3,
    extra_columns: int = 2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paged key/value caches holding ks/vs, and their int32 block table.

    Physical blocks come from a random permutation; every unused position (other blocks,
    tails of half-filled blocks) holds large garbage; unused block-table entries hold garbage
    ids (negative or far out of range), which the kernel must never read.
    """
    need = [math.ceil(k.shape[0] / block_size) for k in ks]
    num_blocks = sum(need) + extra_blocks
    width = max(need, default=0) + extra_columns
    table = torch.randint(-(10**6), 10**6, (len(ks), width), generator=gen, dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    for b in range(len(ks)):
        for col in range(need[b]):
            table[b, col] = perm.pop()
    k_cache = write_paged(ks, table, num_blocks, block_size, cache_layout, dtype, gen)
    v_cache = write_paged(vs, table, num_blocks, block_size, cache_layout, dtype, gen)
    return k_cache, v_cache, table


def make_seqs(
    q_kv_lens: list[tuple[int, int]],
    n: int,
    kv_n: int,
    d: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    dv: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    dv = d if dv is None else dv
    qs = [torch.randn(q, n, d, generator=gen).to(dtype) for q, _ in q_kv_lens]
    ks = [torch.randn(kv, kv_n, d, generator=gen).to(dtype) for _, kv in q_kv_lens]
    vs = [torch.randn(kv, kv_n, dv, generator=gen).to(dtype) for _, kv in q_kv_lens]
    return qs, ks, vs


def cumsum(xs: list[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def expected_tnd(
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    scale: float,
    mode: str,
    pad_rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    outs, lses = [], []
    for q, k, v in zip(qs, ks, vs, strict=True):
        o, lse = ref_attention_seq(q, k, v, scale, mode)
        outs.append(o)
        lses.append(lse)
    n, dv = qs[0].shape[1], vs[0].shape[2]
    outs.append(torch.zeros(pad_rows, n, dv, dtype=torch.float64))
    lses.append(torch.full((pad_rows, n), -math.inf, dtype=torch.float64))
    return torch.cat(outs), torch.cat(lses)


# decode rows (q_len 1), prefills (q_len == kv_len) and chunked prefills (q_len < kv_len);
# sequences ending mid-block and exactly on a block boundary.
MIXED_16 = [(1, 37), (23, 23), (5, 40), (1, 16), (7, 7), (3, 33), (1, 1)]
MIXED_128 = [(1, 300), (130, 130), (9, 256), (1, 129)]
HEADS = [(4, 4), (4, 2), (8, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_layout", ["BSH", "BNSD"])
@pytest.mark.parametrize(("n", "kv_n"), HEADS)
def test_fia_tnd_paged_mixed_batch_causal(
    dtype: torch.dtype, cache_layout: str, n: int, kv_n: int
) -> None:
    """The vLLM call: TND, paged, sparse_mode 3, mixed decode/prefill/chunked-prefill rows."""
    gen = torch.Generator().manual_seed(1000 * n + kv_n)
    d, block_size, pad = 16, 16, 3
    qs, ks, vs = make_seqs(MIXED_16, n, kv_n, d, dtype, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, cache_layout, dtype, gen)
    query = torch.cat([*qs, 50 * torch.randn(pad, n, d, generator=gen).to(dtype)])
    scale = 1 / math.sqrt(d)

    out, lse = OPS.npu_fused_infer_attention_score(
        query,
        k_cache,
        v_cache,
        atten_mask=CAUSAL_MASK,
        block_table=table,
        actual_seq_lengths=cumsum([q for q, _ in MIXED_16]),
        actual_seq_lengths_kv=[kv for _, kv in MIXED_16],
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=scale,
        input_layout="TND",
        sparse_mode=3,
        block_size=block_size,
        softmax_lse_flag=True,
    )
    exp_out, exp_lse = expected_tnd(qs, ks, vs, scale, "right_down", pad)
    assert out.shape == query.shape
    _close(out, exp_out, dtype)
    assert lse.shape == (query.shape[0], n, 1) and lse.dtype == torch.float32
    torch.testing.assert_close(lse[..., 0].double(), exp_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_layout", ["BSH", "BNSD"])
def test_fia_tnd_paged_block_size_128_gqa(dtype: torch.dtype, cache_layout: str) -> None:
    gen = torch.Generator().manual_seed(7)
    n, kv_n, d, block_size = 4, 2, 8, 128
    qs, ks, vs = make_seqs(MIXED_128, n, kv_n, d, dtype, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, cache_layout, dtype, gen)
    scale = 0.25
    out, lse = OPS.npu_fused_infer_attention_score(
        torch.cat(qs),
        k_cache,
        v_cache,
        atten_mask=CAUSAL_MASK.view(1, 1, 2048, 2048),
        block_table=table,
        actual_seq_lengths=cumsum([q for q, _ in MIXED_128]),
        actual_seq_lengths_kv=[kv for _, kv in MIXED_128],
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=scale,
        input_layout="TND",
        sparse_mode=3,
        block_size=block_size,
    )
    exp_out, _ = expected_tnd(qs, ks, vs, scale, "right_down", 0)
    _close(out, exp_out, dtype)
    assert lse.shape == (1,) and lse.dtype == torch.float32 and float(lse[0]) == 0.0


@pytest.mark.parametrize(("sparse_mode", "mode"), [(0, "full"), (2, "left_up"), (3, "right_down")])
def test_fia_tnd_paged_sparse_modes(sparse_mode: int, mode: str) -> None:
    gen = torch.Generator().manual_seed(11 + sparse_mode)
    n, kv_n, d, block_size = 2, 1, 8, 16
    lens = [(4, 20), (6, 6), (1, 9)]
    qs, ks, vs = make_seqs(lens, n, kv_n, d, torch.float32, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, "BSH", torch.float32, gen)
    out, _ = OPS.npu_fused_infer_attention_score(
        torch.cat(qs),
        k_cache,
        v_cache,
        atten_mask=None if sparse_mode == 0 else CAUSAL_MASK,
        block_table=table,
        actual_seq_lengths=cumsum([q for q, _ in lens]),
        actual_seq_lengths_kv=[kv for _, kv in lens],
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=0.5,
        input_layout="TND",
        sparse_mode=sparse_mode,
        block_size=block_size,
    )
    exp_out, _ = expected_tnd(qs, ks, vs, 0.5, mode, 0)
    _close(out, exp_out, torch.float32)


def test_fia_right_down_rows_without_keys_are_zero() -> None:
    """q_len > kv_len with sparse_mode 3: the first q_len - kv_len rows see no key."""
    gen = torch.Generator().manual_seed(3)
    n, d, block_size = 2, 8, 16
    lens = [(5, 3), (2, 0), (1, 4)]
    qs, ks, vs = make_seqs(lens, n, n, d, torch.float32, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, "BNSD", torch.float32, gen)
    out, lse = OPS.npu_fused_infer_attention_score(
        torch.cat(qs),
        k_cache,
        v_cache,
        atten_mask=CAUSAL_MASK,
        block_table=table,
        actual_seq_lengths=cumsum([q for q, _ in lens]),
        actual_seq_lengths_kv=[kv for _, kv in lens],
        num_heads=n,
        scale=0.3,
        input_layout="TND",
        sparse_mode=3,
        block_size=block_size,
        softmax_lse_flag=True,
    )
    exp_out, exp_lse = expected_tnd(qs, ks, vs, 0.3, "right_down", 0)
    _close(out, exp_out, torch.float32)
    assert torch.all(out[:2] == 0) and torch.all(out[5:7] == 0)
    assert torch.all(torch.isneginf(lse[:2])) and torch.all(torch.isneginf(lse[5:7]))
    torch.testing.assert_close(lse[..., 0].double(), exp_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fia_tnd_unpaged_varlen(dtype: torch.dtype, causal: bool) -> None:
    """Encoder (non-causal) and causal prefill without a cache: both lengths cumulative."""
    gen = torch.Generator().manual_seed(5)
    n, kv_n, d = 4, 2, 16
    lens = [(9, 9), (1, 1), (17, 17), (4, 4)]
    qs, ks, vs = make_seqs(lens, n, kv_n, d, dtype, gen)
    cu = cumsum([q for q, _ in lens])
    out, lse = OPS.npu_fused_infer_attention_score(
        torch.cat(qs),
        torch.cat(ks),
        torch.cat(vs),
        atten_mask=CAUSAL_MASK if causal else None,
        actual_seq_lengths=cu,
        actual_seq_lengths_kv=cu,
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=1 / math.sqrt(d),
        input_layout="TND",
        sparse_mode=3 if causal else 0,
        softmax_lse_flag=True,
    )
    exp_out, exp_lse = expected_tnd(
        qs, ks, vs, 1 / math.sqrt(d), "right_down" if causal else "full", 0
    )
    _close(out, exp_out, dtype)
    torch.testing.assert_close(lse[..., 0].double(), exp_lse, atol=1e-4, rtol=1e-4)


def test_fia_tnd_unpaged_value_head_dim_differs() -> None:
    gen = torch.Generator().manual_seed(9)
    lens = [(3, 5), (2, 2)]
    qs, ks, vs = make_seqs(lens, 2, 2, 12, torch.float32, gen, dv=8)
    out, _ = OPS.npu_fused_infer_attention_score(
        torch.cat(qs),
        torch.cat(ks),
        torch.cat(vs),
        actual_seq_lengths=cumsum([3, 2]),
        actual_seq_lengths_kv=cumsum([5, 2]),
        num_heads=2,
        scale=0.2,
        input_layout="TND",
    )
    assert out.shape == (5, 2, 8)
    exp_out, _ = expected_tnd(qs, ks, vs, 0.2, "full", 0)
    _close(out, exp_out, torch.float32)


# ---------------------------------------------------------------- BSH / BSND / BNSD -----------


def _to_layout(x_bsnd: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSND":
        return x_bsnd.contiguous()
    if layout == "BNSD":
        return x_bsnd.transpose(1, 2).contiguous()
    b, s, n, d = x_bsnd.shape
    return x_bsnd.reshape(b, s, n * d)


def _expected_batched(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_lens: list[int],
    kv_lens: list[int],
    scale: float,
    mode: str,
    masks: list[torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected (out [B, S, N, Dv], lse [B, S, N]) of BSND inputs; padding rows 0 / -inf."""
    b_, s, n, _ = q.shape
    out = torch.zeros(b_, s, n, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b_, s, n), -math.inf, dtype=torch.float64)
    for b in range(b_):
        ql, kl = q_lens[b], kv_lens[b]
        mask = None if masks is None else masks[b]
        o, ls = ref_attention_seq(q[b, :ql], k[b, :kl], v[b, :kl], scale, mode, mask)
        out[b, :ql] = o
        lse[b, :ql] = ls
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
@pytest.mark.parametrize(("sparse_mode", "mode"), [(0, "full"), (2, "left_up"), (3, "right_down")])
def test_fia_batched_layouts(dtype: torch.dtype, layout: str, sparse_mode: int, mode: str) -> None:
    gen = torch.Generator().manual_seed(17)
    b, s_q, s_kv, n, kv_n, d = 3, 6, 9, 4, 2, 8
    q = torch.randn(b, s_q, n, d, generator=gen).to(dtype)
    k = torch.randn(b, s_kv, kv_n, d, generator=gen).to(dtype)
    v = torch.randn(b, s_kv, kv_n, d, generator=gen).to(dtype)
    q_lens, kv_lens = [6, 2, 4], [9, 5, 4]
    in_layout = "BNSD" if layout == "BNSD_BSND" else layout
    out, lse = OPS.npu_fused_infer_attention_score(
        _to_layout(q, in_layout),
        _to_layout(k, in_layout),
        _to_layout(v, in_layout),
        atten_mask=None if sparse_mode == 0 else CAUSAL_MASK,
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=0.35,
        input_layout=layout,
        sparse_mode=sparse_mode,
        softmax_lse_flag=True,
    )
    exp_out, exp_lse = _expected_batched(q, k, v, q_lens, kv_lens, 0.35, mode)
    out_layout = "BSND" if layout == "BNSD_BSND" else layout
    _close(out, _to_layout(exp_out, out_layout), dtype)
    assert lse.shape == (b, n, s_q, 1)
    torch.testing.assert_close(lse[..., 0].double(), exp_lse.transpose(1, 2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mask_shape", ["QK", "1QK", "B1QK", "11QK"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int8, torch.uint8])
def test_fia_user_mask(mask_shape: str, mask_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(23)
    b, s_q, s_kv, n, d = 2, 5, 7, 2, 8
    q = torch.randn(b, s_q, n, d, generator=gen)
    k = torch.randn(b, s_kv, n, d, generator=gen)
    v = torch.randn(b, s_kv, n, d, generator=gen)
    # padded up to (16, 16), as the doc allows; True = masked; row 1 fully masked
    base = torch.rand(b, 16, 16, generator=gen) < 0.4
    base[:, 1, :] = True
    if mask_shape in ("QK", "1QK", "11QK"):
        base = base[:1].expand(b, 16, 16)
    per_batch = [base[i, :s_q, :s_kv] for i in range(b)]
    mask = {
        "QK": base[0],
        "1QK": base[:1],
        "B1QK": base.unsqueeze(1),
        "11QK": base[:1].unsqueeze(1),
    }[mask_shape].to(mask_dtype)
    out, _ = OPS.npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask, num_heads=n, scale=0.4, input_layout="BSND", sparse_mode=0
    )
    exp_out, _ = _expected_batched(q, k, v, [s_q] * b, [s_kv] * b, 0.4, "full", per_batch)
    _close(out, exp_out, torch.float32)
    assert torch.all(out[:, 1] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fia_incremental_bsh_paged_with_batch_mask(dtype: torch.dtype) -> None:
    """Q_S = 1 (IncreFlashAttention): BSH query, paged (nb, bs, H) cache, (B, KV_S) mask."""
    gen = torch.Generator().manual_seed(29)
    n, kv_n, d, block_size = 4, 1, 16, 16
    kv_lens = [33, 1, 16, 20]
    lens = [(1, kv) for kv in kv_lens]
    qs, ks, vs = make_seqs(lens, n, kv_n, d, dtype, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, "BSH", dtype, gen)
    width = table.shape[1] * block_size
    mask = torch.rand(len(lens), width, generator=gen) < 0.3
    mask[:, 0] = False
    query = torch.stack(qs).reshape(len(lens), 1, n * d)
    out, _ = OPS.npu_fused_infer_attention_score(
        query,
        k_cache,
        v_cache,
        atten_mask=mask,
        block_table=table,
        actual_seq_lengths=[1] * len(lens),
        actual_seq_lengths_kv=kv_lens,
        num_heads=n,
        num_key_value_heads=kv_n,
        scale=0.25,
        input_layout="BSH",
        block_size=block_size,
    )
    expected = []
    for b in range(len(lens)):
        o, _ = ref_attention_seq(qs[b], ks[b], vs[b], 0.25, "full", mask[b : b + 1, : kv_lens[b]])
        expected.append(o.reshape(1, n * d))
    _close(out, torch.stack(expected), dtype)


def test_fia_bnsd_paged_both_cache_layouts_agree() -> None:
    gen = torch.Generator().manual_seed(31)
    n, kv_n, d, block_size = 4, 2, 8, 16
    kv_lens = [20, 40]
    b, s = 2, 3
    q = torch.randn(b, n, s, d, generator=gen)
    ks = [torch.randn(kv, kv_n, d, generator=gen) for kv in kv_lens]
    vs = [torch.randn(kv, kv_n, d, generator=gen) for kv in kv_lens]
    outs = []
    for cache_layout in ("BSH", "BNSD"):
        k_cache, v_cache, table = paged_kv(ks, vs, block_size, cache_layout, q.dtype, gen)
        out, _ = OPS.npu_fused_infer_attention_score(
            q, k_cache, v_cache, atten_mask=CAUSAL_MASK, block_table=table,
            actual_seq_lengths_kv=kv_lens, num_heads=n, num_key_value_heads=kv_n, scale=0.3,
            input_layout="BNSD", sparse_mode=3, block_size=block_size,
        )  # fmt: skip
        outs.append(out)
    for i in range(b):
        o, _ = ref_attention_seq(q[i].transpose(0, 1), ks[i], vs[i], 0.3, "right_down")
        _close(outs[0][i], o.transpose(0, 1), torch.float32)
    torch.testing.assert_close(outs[0], outs[1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 40)).map(lambda t: (min(t), t[1])),
        min_size=1,
        max_size=5,
    ),
    heads=st.sampled_from(HEADS),
    block_size=st.sampled_from([4, 16]),
    cache_layout=st.sampled_from(["BSH", "BNSD"]),
    seed=st.integers(0, 2**16),
)
def test_fia_tnd_paged_property(
    lens: list[tuple[int, int]],
    heads: tuple[int, int],
    block_size: int,
    cache_layout: str,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    n, kv_n = heads
    qs, ks, vs = make_seqs(lens, n, kv_n, 4, torch.float32, gen)
    k_cache, v_cache, table = paged_kv(ks, vs, block_size, cache_layout, torch.float32, gen)
    out, _ = OPS.npu_fused_infer_attention_score(
        torch.cat(qs), k_cache, v_cache, atten_mask=CAUSAL_MASK, block_table=table,
        actual_seq_lengths=cumsum([q for q, _ in lens]),
        actual_seq_lengths_kv=[kv for _, kv in lens], num_heads=n, num_key_value_heads=kv_n,
        scale=0.5, input_layout="TND", sparse_mode=3, block_size=block_size,
    )  # fmt: skip
    exp_out, _ = expected_tnd(qs, ks, vs, 0.5, "right_down", 0)
    _close(out, exp_out, torch.float32)


# ---------------------------------------------------------------- errors ------------------------


def _small_tnd_args() -> dict[str, object]:
    return {
        "query": torch.randn(3, 2, 8),
        "key": torch.randn(3, 2, 8),
        "value": torch.randn(3, 2, 8),
        "actual_seq_lengths": [3],
        "actual_seq_lengths_kv": [3],
        "num_heads": 2,
        "input_layout": "TND",
    }


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"pse_shift": torch.zeros(1, 2, 3, 3)}, "pse_shift is not supported"),
        ({"query_rope": torch.zeros(3, 2, 4)}, "query_rope is not supported"),
        ({"sparse_mode": 4, "atten_mask": CAUSAL_MASK}, "sparse_mode=4"),
        ({"input_layout": "NTD"}, "input_layout 'NTD'"),
        ({"atten_mask": torch.zeros(3, 3, dtype=torch.bool)}, "user atten_mask"),
    ],
)
def test_fia_not_implemented(extra: dict[str, object], match: str) -> None:
    args = _small_tnd_args() | extra
    with pytest.raises(NotImplementedError, match=match):
        OPS.npu_fused_infer_attention_score(**args)
    with pytest.raises(NotImplementedError, match=match):
        reference.npu_fused_infer_attention_score(**args)


def test_fia_invalid_arguments() -> None:
    args = _small_tnd_args()
    with pytest.raises(ValueError, match="requires the optimized atten_mask"):
        OPS.npu_fused_infer_attention_score(**(args | {"sparse_mode": 3}))
    with pytest.raises(ValueError, match="2048"):
        OPS.npu_fused_infer_attention_score(
            **(args | {"sparse_mode": 2, "atten_mask": CAUSAL_MASK[:100, :100]})
        )
    with pytest.raises(ValueError, match="requires actual_seq_lengths"):
        OPS.npu_fused_infer_attention_score(**(args | {"actual_seq_lengths": None}))
    with pytest.raises(ValueError, match="non-decreasing"):
        OPS.npu_fused_infer_attention_score(
            **(args | {"actual_seq_lengths": [2, 1], "actual_seq_lengths_kv": [2, 3]})
        )
    with pytest.raises(ValueError, match="divisible"):
        OPS.npu_fused_infer_attention_score(**(args | {"num_key_value_heads": 3}))
    too_short_table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="columns"):
        OPS.npu_fused_infer_attention_score(
            torch.randn(3, 2, 8), torch.randn(4, 4, 16), torch.randn(4, 4, 16),
            block_table=too_short_table, actual_seq_lengths=[3], actual_seq_lengths_kv=[5],
            num_heads=2, input_layout="TND", block_size=4,
        )  # fmt: skip


# ============================================================================================
# npu_scatter_pa_kv_cache
# ============================================================================================


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_scatter_pa_kv_cache_random_slots(dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(41)
    num_blocks, block_size, kv_n, dk, dv, t = 6, 16, 2, 8, 4, 37
    key = torch.randn(t, kv_n, dk, generator=gen).to(dtype)
    value = torch.randn(t, kv_n, dv, generator=gen).to(dtype)
    key_cache = torch.randn(num_blocks, block_size, kv_n, dk, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, kv_n, dv, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t].to(slot_dtype)
    exp_k, exp_v = key_cache.clone(), value_cache.clone()
    for i in range(t):
        s = int(slots[i])
        exp_k[s // block_size, s % block_size] = key[i]
        exp_v[s // block_size, s % block_size] = value[i]

    result = OPS.npu_scatter_pa_kv_cache(
        key, value, key_cache, value_cache, slots, cache_mode="Norm"
    )
    assert result is None
    assert torch.equal(key_cache, exp_k)
    assert torch.equal(value_cache, exp_v)


def test_scatter_pa_kv_cache_errors() -> None:
    key = torch.randn(2, 1, 4)
    kc, vc = torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 4)
    ok = torch.tensor([0, 5])
    with pytest.raises(NotImplementedError, match="PA_NZ"):
        OPS.npu_scatter_pa_kv_cache(key, key, kc, vc, ok)  # default cache_mode='PA_NZ'
    with pytest.raises(NotImplementedError, match="seq_lens"):
        OPS.npu_scatter_pa_kv_cache(key, key, kc, vc, ok, seq_lens=ok, cache_mode="Norm")
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        OPS.npu_scatter_pa_kv_cache(key, key, kc, vc, torch.tensor([-1, 3]), cache_mode=None)
    with pytest.raises(ValueError, match="duplicate"):
        OPS.npu_scatter_pa_kv_cache(key, key, kc, vc, torch.tensor([3, 3]), cache_mode="Norm")
    with pytest.raises(TypeError, match="dtype"):
        OPS.npu_scatter_pa_kv_cache(key.half(), key.half(), kc, vc, ok, cache_mode="Norm")
    assert torch.all(kc == 0) and torch.all(vc == 0)


# ============================================================================================
# norms, swiglu, rotary
# ============================================================================================

NORM_SHAPES = [((7, 32), (32,)), ((2, 3, 64), (64,)), ((4, 5, 6), (5, 6)), ((1, 1, 128), (128,))]


def _ref_rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xd, gd = x.double(), gamma.double()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    ms = (xd * xd).mean(dim=dims, keepdim=True)
    return xd / torch.sqrt(ms + eps) * gd, 1.0 / torch.sqrt(ms + eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("x_shape", "g_shape"), NORM_SHAPES)
def test_rms_norm(dtype: torch.dtype, x_shape: tuple[int, ...], g_shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(51)
    x = (3 * torch.randn(x_shape, generator=gen)).to(dtype)
    gamma = torch.randn(g_shape, generator=gen).to(dtype)
    y, rstd = OPS.npu_rms_norm(x, gamma, 1e-5)
    exp_y, exp_rstd = _ref_rms(x, gamma, 1e-5)
    _close(y, exp_y, dtype)
    assert rstd.dtype == torch.float32
    assert rstd.shape == x_shape[: len(x_shape) - len(g_shape)] + (1,) * len(g_shape)
    torch.testing.assert_close(rstd.double(), exp_rstd, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("x_shape", "g_shape"), NORM_SHAPES)
def test_add_rms_norm(
    dtype: torch.dtype, x_shape: tuple[int, ...], g_shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(53)
    x1 = torch.randn(x_shape, generator=gen).to(dtype)
    x2 = (2 * torch.randn(x_shape, generator=gen)).to(dtype)
    gamma = torch.randn(g_shape, generator=gen).to(dtype)
    y, rstd, x = OPS.npu_add_rms_norm(x1, x2, gamma)  # default epsilon 1e-6
    total = x1.double() + x2.double()
    exp_y, exp_rstd = _ref_rms(total, gamma, 1e-6)
    _close(y, exp_y, dtype)
    _close(x, total, dtype)
    assert rstd.dtype == torch.float32 and rstd.shape == exp_rstd.shape
    torch.testing.assert_close(rstd.double(), exp_rstd, atol=1e-6, rtol=1e-5)


def test_rms_norm_gamma_dtype_must_match() -> None:
    with pytest.raises(TypeError, match="gamma"):
        OPS.npu_rms_norm(torch.randn(2, 4).half(), torch.randn(4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "dim"), [((5, 16), -1), ((2, 32, 6, 6), -1), ((4, 3), 0), ((3, 8, 2), 1)]
)
def test_swiglu(dtype: torch.dtype, shape: tuple[int, ...], dim: int) -> None:
    gen = torch.Generator().manual_seed(61)
    x = (2 * torch.randn(shape, generator=gen)).to(dtype)
    out = OPS.npu_swiglu(x, dim)
    half = x.shape[dim] // 2
    a = x.double().narrow(dim, 0, half)
    b = x.double().narrow(dim, half, half)
    _close(out, a / (1 + torch.exp(-a)) * b, dtype)
    with pytest.raises(ValueError, match="even"):
        OPS.npu_swiglu(torch.randn(3, 5))


def _rope_angles(s: int, d: int) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    return torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]  # [S, D/2]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_matches_complex_rotation(dtype: torch.dtype, mode: str) -> None:
    """RoPE as a complex rotation: NeoX pairs (k, k + D/2), GPT-J pairs (2k, 2k + 1)."""
    gen = torch.Generator().manual_seed(71)
    b, s, n, d = 2, 5, 3, 16
    x = torch.randn(b, s, n, d, generator=gen).to(dtype)  # BSND
    theta = _rope_angles(s, d)
    if mode == "half":
        cos = torch.cat([theta.cos(), theta.cos()], -1)
        sin = torch.cat([theta.sin(), theta.sin()], -1)
    else:
        cos = theta.cos().repeat_interleave(2, -1)
        sin = theta.sin().repeat_interleave(2, -1)
    r1 = cos.view(1, s, 1, d).to(dtype)  # 1S1D
    r2 = sin.view(1, s, 1, d).to(dtype)
    out = OPS.npu_rotary_mul(x, r1, r2, mode)

    xd = x.double()
    if mode == "half":
        pairs = torch.complex(xd[..., : d // 2], xd[..., d // 2 :])
    else:
        pairs = torch.complex(xd[..., 0::2], xd[..., 1::2])
    # use the rounded cos/sin actually passed in
    c = r1.double()[..., 0::2] if mode == "interleave" else r1.double()[..., : d // 2]
    sn = r2.double()[..., 0::2] if mode == "interleave" else r2.double()[..., : d // 2]
    rot = pairs * torch.complex(c, sn)
    if mode == "half":
        expected = torch.cat([rot.real, rot.imag], -1)
    else:
        expected = torch.stack([rot.real, rot.imag], -1).flatten(-2)
    _close(out, expected, dtype)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_with_rotate_matrix(mode: str) -> None:
    gen = torch.Generator().manual_seed(73)
    x = torch.randn(2, 2, 5, 8, generator=gen)  # BNSD
    r1 = torch.rand(1, 1, 5, 8, generator=gen)
    r2 = torch.rand(1, 1, 5, 8, generator=gen)
    rotate = torch.randn(8, 8, generator=gen)
    out = OPS.npu_rotary_mul(x, r1, r2, mode, rotate)
    expected = r1.double() * x.double() + r2.double() * (x.double() @ rotate.double())
    _close(out, expected, torch.float32)
    # the doc's "half" rotate matrix reproduces half mode
    half = torch.zeros(8, 8)
    half[:4, 4:] = torch.eye(4)
    half[4:, :4] = -torch.eye(4)
    torch.testing.assert_close(
        OPS.npu_rotary_mul(x, r1, r2, "half", half), OPS.npu_rotary_mul(x, r1, r2, "half")
    )


def test_rotary_mul_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="4-dim"):
        OPS.npu_rotary_mul(torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8))
    with pytest.raises(ValueError, match="broadcast"):
        OPS.npu_rotary_mul(
            torch.randn(1, 2, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(1, 2, 3, 8)
        )


# ============================================================================================
# fake implementations, torch.compile, registration
# ============================================================================================


def _fake_cases() -> list[tuple[str, tuple[object, ...], dict[str, object]]]:
    gen = torch.Generator().manual_seed(81)
    lens = [(1, 20), (4, 4)]
    qs, ks, vs = make_seqs(lens, 4, 2, 8, torch.bfloat16, gen)
    k3, v3, table = paged_kv(ks, vs, 16, "BSH", torch.bfloat16, gen)
    k4, v4, table4 = paged_kv(ks, vs, 16, "BNSD", torch.bfloat16, gen)
    paged = {
        "atten_mask": CAUSAL_MASK, "actual_seq_lengths": [1, 5], "actual_seq_lengths_kv": [20, 4],
        "num_heads": 4, "num_key_value_heads": 2, "input_layout": "TND", "sparse_mode": 3,
        "block_size": 16,
    }  # fmt: skip
    q = torch.cat(qs)
    bsh = torch.randn(2, 3, 32).half()
    half8 = torch.randn(8).half()
    cos_sin = torch.rand(1, 3, 1, 8)
    return [
        ("npu_fused_infer_attention_score", (q, k3, v3), paged | {"block_table": table}),
        (
            "npu_fused_infer_attention_score",
            (q, k4, v4),
            paged | {"block_table": table4, "softmax_lse_flag": True},
        ),
        (
            "npu_fused_infer_attention_score",
            (bsh, bsh, bsh),
            {"num_heads": 4, "input_layout": "BSH", "softmax_lse_flag": True},
        ),
        (
            "npu_fused_infer_attention_score",
            (torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 6)),
            {"num_heads": 4, "input_layout": "BNSD_BSND"},
        ),
        ("npu_rms_norm", (torch.randn(3, 4, 8).bfloat16(), torch.randn(4, 8).bfloat16()), {}),
        ("npu_add_rms_norm", (torch.randn(3, 8).half(), torch.randn(3, 8).half(), half8), {}),
        ("npu_swiglu", (torch.randn(3, 10, 4),), {"dim": 1}),
        ("npu_rotary_mul", (torch.randn(2, 3, 4, 8), cos_sin, cos_sin), {}),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(8))
def test_fake_matches_real(case: int) -> None:
    name, args, kwargs = _fake_cases()[case]
    op = getattr(OPS, name)
    real = op(*args, **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake_kwargs = {
            k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
        }
        fake = op(*fake_args, **fake_kwargs)
    real_t = real if isinstance(real, tuple) else (real,)
    fake_t = fake if isinstance(fake, tuple) else (fake,)
    assert [(t.shape, t.dtype) for t in fake_t] == [(t.shape, t.dtype) for t in real_t]


def test_fake_scatter_and_meta_device() -> None:
    with FakeTensorMode():
        kc = torch.empty(4, 16, 2, 8)
        result = OPS.npu_scatter_pa_kv_cache(
            torch.empty(3, 2, 8),
            torch.empty(3, 2, 8),
            kc,
            torch.empty(4, 16, 2, 8),
            torch.empty(3, dtype=torch.int32),
            cache_mode="Norm",
        )
        assert result is None
    y, rstd = OPS.npu_rms_norm(torch.empty(2, 8, device="meta"), torch.empty(8, device="meta"))
    assert y.device.type == "meta" and rstd.shape == (2, 1)


def test_torch_compile_fullgraph() -> None:
    def step(
        x: torch.Tensor,
        res: torch.Tensor,
        w: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slots: torch.Tensor,
        table: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, _, res_out = torch.ops.npu.npu_add_rms_norm(x, res, w, 1e-6)
        q = torch.ops.npu.npu_rotary_mul(y.view(1, 4, 2, 8), cos, sin).view(4, 2, 8)
        torch.ops.npu.npu_scatter_pa_kv_cache(
            q, q, key_cache, value_cache, slots, cache_mode="Norm"
        )
        out, _ = torch.ops.npu.npu_fused_infer_attention_score(
            q, key_cache.view(3, 4, 16), value_cache.view(3, 4, 16), atten_mask=CAUSAL_MASK,
            block_table=table, actual_seq_lengths=[1, 4], actual_seq_lengths_kv=[5, 3],
            num_heads=2, scale=0.3, input_layout="TND", sparse_mode=3, block_size=4,
        )  # fmt: skip
        return torch.ops.npu.npu_swiglu(out.view(4, 16)), res_out, key_cache

    gen = torch.Generator().manual_seed(91)
    args = [
        torch.randn(4, 16, generator=gen),
        torch.randn(4, 16, generator=gen),
        torch.randn(16, generator=gen),
        torch.rand(1, 4, 1, 8, generator=gen),
        torch.rand(1, 4, 1, 8, generator=gen),
        torch.randn(3, 4, 2, 8, generator=gen),
        torch.randn(3, 4, 2, 8, generator=gen),
        torch.tensor([6, 9, 10, 11]),
        torch.tensor([[0, 1], [2, 0]], dtype=torch.int32),
    ]
    eager_args = [a.clone() for a in args]
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")(*args)
    expected = step(*eager_args)
    for c, e in zip(compiled, expected, strict=True):
        torch.testing.assert_close(c, e)


def test_schemas_match_torch_npu() -> None:
    for name, schema in library.SCHEMAS.items():
        registered = getattr(OPS, name).default._schema
        assert str(registered) == str(torch._C.parse_schema(f"npu::{name}{schema}"))
    sch = OPS.npu_scatter_pa_kv_cache.default._schema
    writes = [a.name for a in sch.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert writes == ["key_cache", "value_cache"]


def test_registration_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert library.register_reference_kernels() is True
    assert kernels.register_reference_kernels() is True
    assert kernels.npu_kernels() is torch.ops.npu
    assert kernels.npu_kernels() is kernels.npu_kernels()
    # forget the flag: ops already defined are skipped, no "already registered" error
    monkeypatch.setattr(library, "_REGISTERED", False)
    assert library.register_reference_kernels() is True
    # torch_npu present and nothing registered yet: register nothing, report False
    monkeypatch.setattr(library, "_REGISTERED", False)
    monkeypatch.setattr(library, "torch_npu_available", lambda: True)
    assert library.register_reference_kernels() is False


def test_fresh_process_registration() -> None:
    """In a new interpreter: cheap import, no torch_npu/vllm, repeated registration is a no-op."""
    code = (
        "import sys\n"
        "import ascend_platform.kernels as k\n"
        "assert 'ascend_platform.kernels.library' not in sys.modules\n"
        "ops = k.npu_kernels()\n"
        "assert k.register_reference_kernels() and k.register_reference_kernels()\n"
        "import torch\n"
        "assert ops is torch.ops.npu\n"
        "y, r = ops.npu_rms_norm(torch.ones(2, 4), torch.ones(4))\n"
        "assert torch.allclose(y, torch.ones(2, 4), atol=1e-5)\n"
        "assert 'torch_npu' not in sys.modules\n"
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules)\n"
        "print('ok')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
