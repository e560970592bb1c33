"""Pure-torch CPU reference implementations of torch_npu kernels.

Each function here has the signature, input layouts and outputs that torch_npu 2.13.0
documents for the function of the same name (``torch_npu/_op_plugin_docs.py``; schemas from
``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``). They are registered as
``torch.ops.npu.<name>`` by :mod:`ascend_platform.kernels.library` when torch_npu is absent,
so the NPU code path of the platform runs, and can be checked number by number, on any
machine.

Conventions shared by all kernels:

* Arithmetic is done in float32 and the result is cast back to the input dtype (the NPU's
  high-precision mode). float16, bfloat16 and float32 inputs are accepted (float32 is an
  extension of the reference: several NPU kernels do not document it).
* A feature that torch_npu documents but the reference does not implement raises
  :class:`NotImplementedError` naming the argument or feature. Violations of documented
  constraints on shapes and values raise :class:`ValueError`, dtype violations
  :class:`TypeError`.
* Hardware tiling constraints (alignment of D, block sizes that are multiples of 128, limits
  on N*D, ...) are not checked: they are not part of the semantics.

Nothing here imports vLLM or torch_npu.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = [
    "INT32_MAX",
    "OPTIMIZED_MASK_SIZE",
    "AttentionShapes",
    "attention_output_shapes",
    "npu_add_rms_norm",
    "npu_fused_infer_attention_score",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_scatter_pa_kv_cache",
    "npu_swiglu",
    "rms_norm_rstd_shape",
    "swiglu_output_shape",
]

INT32_MAX = 2147483647
"""Default of ``pre_tokens`` / ``next_tokens`` ("no band limit")."""

OPTIMIZED_MASK_SIZE = 2048
"""Side of the optimized causal mask that sparse_mode 2/3/4 require."""

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FIA = "npu_fused_infer_attention_score"
_SCATTER = "npu_scatter_pa_kv_cache"

# Layouts torch_npu documents for npu_fused_infer_attention_score -> (query, output) layout.
_SUPPORTED_LAYOUTS: dict[str, tuple[str, str]] = {
    "BSH": ("BSH", "BSH"),
    "BSND": ("BSND", "BSND"),
    "BNSD": ("BNSD", "BNSD"),
    "BNSD_BSND": ("BNSD", "BSND"),
    "TND": ("TND", "TND"),
}
_UNSUPPORTED_LAYOUTS = frozenset(
    {
        "NTD",
        "NSD",
        "TND_NTD",
        "NTD_TND",
        "BSH_BNSD",
        "BSND_BNSD",
        "BSH_NBSD",
        "BSND_NBSD",
        "BNSD_NBSD",
    }
)
_QUERY_DIMS = {"BSH": 3, "BSND": 4, "BNSD": 4, "TND": 3}


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def _check_float(fn: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{fn}: {name} must be float16, bfloat16 or float32 "
            f"(the reference kernel), got {t.dtype}"
        )


def _check_same_dtype(fn: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise TypeError(
                f"{fn}: {name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}"
            )


def _int_list(fn: str, name: str, values: Sequence[int] | torch.Tensor | None) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"{fn}: {name} must not contain negative values, got {out}")
    return out


def _per_batch(fn: str, name: str, values: list[int] | None, batch: int, default: int) -> list[int]:
    """Per-batch lengths, as documented for the non-TND layouts.

    "传入长度为1时, 每个Batch使用相同seqlen; 传入长度大于等于Batch时取seqlen的前Batch个数.
    其他长度不支持": one value applies to every batch, a longer list is cut to B values.
    """
    if values is None:
        return [default] * batch
    if len(values) == 1:
        return values * batch
    if len(values) >= batch:
        return values[:batch]
    raise ValueError(f"{fn}: {name} must have 1 or at least B={batch} entries, got {len(values)}")


def _cumulative_to_spans(
    fn: str, name: str, values: list[int], total: int
) -> list[tuple[int, int]]:
    """(start, end) per batch from a TND cumulative length list ("前b个Batch的S轴累加长度")."""
    spans: list[tuple[int, int]] = []
    prev = 0
    for v in values:
        if v < prev:
            raise ValueError(
                f"{fn}: {name} is cumulative in TND layout and must be non-decreasing, got {values}"
            )
        spans.append((prev, v))
        prev = v
    if prev > total:
        raise ValueError(
            f"{fn}: the last entry of {name} ({prev}) exceeds the token count T={total}"
        )
    return spans


# --------------------------------------------------------------------------------------------
# npu_fused_infer_attention_score
# --------------------------------------------------------------------------------------------


class AttentionShapes(NamedTuple):
    """Output shapes of npu_fused_infer_attention_score (used by the fake implementation)."""

    attention_out: tuple[int, ...]
    softmax_lse: tuple[int, ...]


def _kv_heads(num_heads: int, num_key_value_heads: int) -> int:
    if num_heads <= 0:
        raise ValueError(f"{_FIA}: num_heads must be greater than 0, got {num_heads}")
    kv_n = num_heads if num_key_value_heads == 0 else num_key_value_heads
    if kv_n <= 0 or num_heads % kv_n != 0:
        raise ValueError(
            f"{_FIA}: num_heads ({num_heads}) must be divisible by num_key_value_heads ({kv_n})"
        )
    if num_heads // kv_n > 64:
        raise ValueError(
            f"{_FIA}: num_heads / num_key_value_heads must not exceed 64, got {num_heads}/{kv_n}"
        )
    return kv_n


def _split_layout(input_layout: str) -> tuple[str, str]:
    if input_layout in _SUPPORTED_LAYOUTS:
        return _SUPPORTED_LAYOUTS[input_layout]
    if input_layout in _UNSUPPORTED_LAYOUTS:
        raise NotImplementedError(
            f"{_FIA}: input_layout {input_layout!r} is not supported by the reference kernel "
            f"(supported: {', '.join(_SUPPORTED_LAYOUTS)})"
        )
    raise ValueError(f"{_FIA}: unknown input_layout {input_layout!r}")


def _query_bsnd(query: torch.Tensor, q_layout: str, num_heads: int) -> tuple[int, int, int, int]:
    """(B, S, N, D) of a non-TND query."""
    if q_layout == "BSH":
        b, s, h = query.shape
        if h % num_heads != 0:
            raise ValueError(f"{_FIA}: BSH query H={h} is not divisible by num_heads={num_heads}")
        return b, s, num_heads, h // num_heads
    if q_layout == "BSND":
        b, s, n, d = query.shape
    else:  # BNSD
        b, n, s, d = query.shape
    return b, s, n, d


def _value_head_dim(
    value: torch.Tensor,
    block_table: torch.Tensor | None,
    q_layout: str,
    query: torch.Tensor,
    kv_n: int,
) -> int:
    """D of value, following torch_npu's shape inference (get_value_d)."""
    if block_table is not None:
        if value.dim() == 3:  # (num_blocks, block_size, KV_N*D)
            if value.shape[2] % kv_n != 0:
                raise ValueError(
                    f"{_FIA}: value cache H={value.shape[2]} is not divisible by "
                    f"num_key_value_heads={kv_n}"
                )
            return value.shape[2] // kv_n
        if value.dim() == 4:  # (num_blocks, KV_N, block_size, D)
            return value.shape[3]
        if value.dim() == 5:
            raise NotImplementedError(
                f"{_FIA}: the NZ kv cache format [blockNum, KV_N, D/16, blockSize, 16] is not "
                "supported by the reference kernel"
            )
        raise ValueError(
            f"{_FIA}: with page attention the kv cache must have 3 or 4 dims, got {value.dim()}"
        )
    if value.dim() != query.dim():
        raise ValueError(
            f"{_FIA}: without page attention value must have query's rank ({query.dim()}), "
            f"got {value.dim()}"
        )
    if q_layout == "BSH":
        if value.shape[2] % kv_n != 0:
            raise ValueError(
                f"{_FIA}: BSH value H={value.shape[2]} is not divisible by "
                f"num_key_value_heads={kv_n}"
            )
        return value.shape[2] // kv_n
    if q_layout in ("BSND", "BNSD"):
        return value.shape[3]
    return value.shape[2]  # TND


def attention_output_shapes(
    query: torch.Tensor,
    value: torch.Tensor,
    *,
    block_table: torch.Tensor | None,
    num_heads: int,
    input_layout: str,
    num_key_value_heads: int,
    softmax_lse_flag: bool,
) -> AttentionShapes:
    """Shapes of (attention_out, softmax_lse), as torch_npu's meta function infers them.

    attention_out has the query's layout ("其余情况该参数的shape需要与入参query的shape保持一致";
    BNSD_BSND gives BSND) with D taken from value. softmax_lse is float32 of shape
    (T, Q_N, 1) for TND and (B, Q_N, Q_S, 1) otherwise when softmax_lse_flag is True, else the
    documented "shape为[1]的值为0的Tensor".
    """
    q_layout, out_layout = _split_layout(input_layout)
    if query.dim() != _QUERY_DIMS[q_layout]:
        raise ValueError(
            f"{_FIA}: layout {input_layout} needs a {_QUERY_DIMS[q_layout]}-dim query, "
            f"got {query.dim()} dims"
        )
    kv_n = _kv_heads(num_heads, num_key_value_heads)
    v_d = _value_head_dim(value, block_table, q_layout, query, kv_n)
    if q_layout == "TND":
        t, n, _ = query.shape
        out = (t, n, v_d)
        lse = (t, n, 1)
    else:
        b, s, n, _ = _query_bsnd(query, q_layout, num_heads)
        if out_layout == "BSH":
            out = (b, s, n * v_d)
        elif out_layout == "BSND":
            out = (b, s, n, v_d)
        else:
            out = (b, n, s, v_d)
        lse = (b, n, s, 1)
    return AttentionShapes(out, lse if softmax_lse_flag else (1,))


def _reject_unsupported_attention_args(**kwargs: object) -> None:
    for name, val in kwargs.items():
        if val is not None:
            raise NotImplementedError(f"{_FIA}: {name} is not supported by the reference kernel")


def _optimized_mask_check(atten_mask: torch.Tensor | None, sparse_mode: int) -> None:
    """sparse_mode 2/3/4 need the optimized (2048, 2048) mask, with 1 or 2 leading ones.

    "sparse_mode=2、3、4时, atten_mask的shape需要为(S, S)或(1, S, S)或(1, 1, S, S), 其中S的值需要
    固定为2048 ... 不传入atten_mask或者传入的shape不正确报错".
    """
    if atten_mask is None:
        raise ValueError(
            f"{_FIA}: sparse_mode={sparse_mode} requires the optimized atten_mask of shape "
            f"({OPTIMIZED_MASK_SIZE}, {OPTIMIZED_MASK_SIZE})"
        )
    shape = tuple(atten_mask.shape)
    size = OPTIMIZED_MASK_SIZE
    if shape not in ((size, size), (1, size, size), (1, 1, size, size)):
        raise ValueError(
            f"{_FIA}: sparse_mode={sparse_mode} requires atten_mask of shape (2048, 2048), "
            f"(1, 2048, 2048) or (1, 1, 2048, 2048), got {shape}"
        )


def _check_mask_dtype(atten_mask: torch.Tensor) -> None:
    if atten_mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        raise TypeError(f"{_FIA}: atten_mask must be bool, int8 or uint8, got {atten_mask.dtype}")


def _user_mask_for_batch(
    atten_mask: torch.Tensor, b: int, batch: int, q_len: int, kv_len: int, incremental: bool
) -> torch.Tensor:
    """The [q_len, kv_len] slice of a user mask for batch b (True = masked out).

    Documented shapes: (Q_S, KV_S), (1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S), and
    (B, KV_S) when Q_S is 1. Q_S and KV_S may be padded up ("可以向上取到对齐的S"): only the
    leading [q_len, kv_len] corner is read.
    """
    m = atten_mask
    if m.dim() == 2:
        m2 = m[b : b + 1] if incremental and m.shape[0] == batch and batch > 1 else m
    elif m.dim() == 3:
        if m.shape[0] != 1:
            raise ValueError(f"{_FIA}: a 3-dim atten_mask must be (1, Q_S, KV_S), got {m.shape}")
        m2 = m[0]
    elif m.dim() == 4:
        if m.shape[0] not in (1, batch) or m.shape[1] != 1:
            raise ValueError(
                f"{_FIA}: a 4-dim atten_mask must be (B, 1, Q_S, KV_S) or (1, 1, Q_S, KV_S), "
                f"got {tuple(m.shape)}"
            )
        m2 = m[b if m.shape[0] == batch else 0, 0]
    else:
        raise ValueError(f"{_FIA}: atten_mask must have 2 to 4 dims, got {m.dim()}")
    if m2.shape[0] < q_len or m2.shape[1] < kv_len:
        raise ValueError(
            f"{_FIA}: atten_mask {tuple(atten_mask.shape)} is too small for batch {b} "
            f"(q_len={q_len}, kv_len={kv_len})"
        )
    return m2[:q_len, :kv_len] != 0


def _causal_visible(q_len: int, kv_len: int, right_down: bool) -> torch.Tensor:
    """[q_len, kv_len] bool, True where query i may attend key j.

    leftUpCausal (sparse_mode 2): j <= i. rightDownCausal (sparse_mode 3): j <= i + kv_len - q_len.
    """
    i = torch.arange(q_len).unsqueeze(1)
    j = torch.arange(kv_len).unsqueeze(0)
    offset = kv_len - q_len if right_down else 0
    return j <= i + offset


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one batch in float32.

    q [s, N, D], k [L, KV_N, D], v [L, KV_N, Dv], visible [s, L] (True = attend) or None.
    Returns out [s, N, Dv] (float32) and lse [s, N] (float32). Rows without any visible key
    give out = 0 and lse = -inf.
    """
    n, kv_n = q.shape[1], k.shape[1]
    group = n // kv_n
    qf = q.float().transpose(0, 1)  # [N, s, D]
    kf = k.float().transpose(0, 1)  # [KV_N, L, D]
    vf = v.float().transpose(0, 1)  # [KV_N, L, Dv]
    if group > 1:
        kf = kf.repeat_interleave(group, dim=0)
        vf = vf.repeat_interleave(group, dim=0)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [N, s, L]
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [N, s]; -inf for rows without keys
    row_ok = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(row_ok, lse, 0.0).unsqueeze(-1))
    probs = torch.where(row_ok.unsqueeze(-1), probs, 0.0)
    out = torch.matmul(probs, vf)  # [N, s, Dv]
    return out.transpose(0, 1), lse.transpose(0, 1)


def _gather_pages(
    cache: torch.Tensor, blocks: torch.Tensor, kv_len: int, kv_n: int, block_size: int
) -> torch.Tensor:
    """Keys (or values) of one sequence from a paged cache, as [kv_len, KV_N, D]."""
    pages = cache.index_select(0, blocks)
    if cache.dim() == 3:  # (num_blocks, block_size, KV_N*D)
        seq = pages.reshape(-1, kv_n, cache.shape[2] // kv_n)
    else:  # (num_blocks, KV_N, block_size, D)
        seq = pages.permute(0, 2, 1, 3).reshape(-1, kv_n, cache.shape[3])
    return seq[:kv_len]


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    pse_shift: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    dequant_scale1: torch.Tensor | None = None,
    quant_scale1: torch.Tensor | None = None,
    dequant_scale2: torch.Tensor | None = None,
    quant_scale2: torch.Tensor | None = None,
    quant_offset2: torch.Tensor | None = None,
    antiquant_scale: torch.Tensor | None = None,
    antiquant_offset: torch.Tensor | None = None,
    key_antiquant_scale: torch.Tensor | None = None,
    key_antiquant_offset: torch.Tensor | None = None,
    value_antiquant_scale: torch.Tensor | None = None,
    value_antiquant_offset: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    query_padding_size: torch.Tensor | None = None,
    kv_padding_size: torch.Tensor | None = None,
    key_shared_prefix: torch.Tensor | None = None,
    value_shared_prefix: torch.Tensor | None = None,
    actual_shared_prefix_len: Sequence[int] | None = None,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    key_rope_antiquant_scale: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = INT32_MAX,
    next_tokens: int = INT32_MAX,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_out = softmax(scale * query @ key^T + atten_mask) @ value (torch_npu FIA).

    Implemented (everything else raises NotImplementedError naming the argument):

    * ``input_layout`` BSH, BSND, BNSD, BNSD_BSND and TND. With TND, ``actual_seq_lengths``
      is required and cumulative ("每个元素的值表示当前Batch与之前所有Batch的seqlen和"); its
      length is the batch size B. Query rows after ``actual_seq_lengths[-1]`` belong to no
      batch and are returned as zeros. With the other layouts, ``actual_seq_lengths`` and
      ``actual_seq_lengths_kv`` are optional per-batch valid lengths (one value for all
      batches, or the first B values), rows after a batch's valid query length are zeros,
      and when the query's S is 1 (the IncreFlashAttention branch) ``actual_seq_lengths``,
      ``sparse_mode``, ``pre_tokens`` and ``next_tokens`` are ignored, as documented.
    * Page attention (``block_table`` int32 [B, max_blocks_per_seq], non-zero ``block_size``):
      key/value caches (num_blocks, block_size, KV_N*D) for every layout, or
      (num_blocks, KV_N, block_size, D) for BNSD/TND. ``actual_seq_lengths_kv`` is required
      and holds per-batch KV lengths (with TND: "在PA场景下 ... 代表每个Batch的实际长度", NOT
      cumulative). Sequence b reads blocks ``block_table[b, :ceil(kv_len / block_size)]``;
      later entries are never read, so they may hold any value.
    * TND without paging: key/value [T_kv, KV_N, D] and a cumulative
      ``actual_seq_lengths_kv`` with B entries.
    * GQA: ``num_key_value_heads`` (0 means num_heads); query head h reads KV head
      h // (num_heads / num_key_value_heads).
    * ``sparse_mode`` 0 (no mask: full attention; with a user mask, True/1 = masked out),
      1 (allMask: a user mask is required), 2 (leftUpCausal: query i sees key j <= i) and
      3 (rightDownCausal: query i of a batch with q_len queries and kv_len keys sees key
      j <= i + kv_len - q_len). Modes 2 and 3 require the optimized (2048, 2048) mask
      (upper triangle True) but compute causality from the lengths. User masks are not
      supported with TND (the doc restricts TND to sparse_mode 0 without mask or 3).
    * ``softmax_lse_flag``: softmax_lse = log(sum(exp(scale * q @ k^T + mask))) as float32,
      (T, N, 1) for TND, (B, N, S, 1) otherwise; without the flag, a float32 zero tensor
      of shape [1].

    A query row that sees no key (no keys at all, q_len > kv_len with sparse_mode 3, a
    fully masked row, or a padding row) yields attention_out = 0 and softmax_lse = -inf:
    the "行无效修正" behaviour of inner_precise 2/3, applied for every inner_precise.
    Computation is in float32; attention_out has the query's dtype.
    """
    _reject_unsupported_attention_args(
        pse_shift=pse_shift,
        dequant_scale1=dequant_scale1,
        quant_scale1=quant_scale1,
        dequant_scale2=dequant_scale2,
        quant_scale2=quant_scale2,
        quant_offset2=quant_offset2,
        antiquant_scale=antiquant_scale,
        antiquant_offset=antiquant_offset,
        key_antiquant_scale=key_antiquant_scale,
        key_antiquant_offset=key_antiquant_offset,
        value_antiquant_scale=value_antiquant_scale,
        value_antiquant_offset=value_antiquant_offset,
        query_padding_size=query_padding_size,
        kv_padding_size=kv_padding_size,
        key_shared_prefix=key_shared_prefix,
        value_shared_prefix=value_shared_prefix,
        actual_shared_prefix_len=actual_shared_prefix_len,
        query_rope=query_rope,
        key_rope=key_rope,
        key_rope_antiquant_scale=key_rope_antiquant_scale,
    )
    if query.dtype in (torch.int8, torch.int32) or key.dtype in (torch.int8, torch.int32):
        raise NotImplementedError(
            f"{_FIA}: int8/int4 (quantized) query, key or value are not supported by the "
            "reference kernel"
        )
    _check_float(_FIA, "query", query)
    _check_same_dtype(_FIA, "query", query, key=key, value=value)
    if sparse_mode == 4:
        raise NotImplementedError(
            f"{_FIA}: sparse_mode=4 (band) is not supported by the reference kernel"
        )
    if sparse_mode == 9:
        raise NotImplementedError(
            f"{_FIA}: sparse_mode=9 (treeMask) is not supported by the reference kernel"
        )
    if sparse_mode not in (0, 1, 2, 3):
        raise ValueError(f"{_FIA}: sparse_mode must be one of 0, 1, 2, 3, 4, 9; got {sparse_mode}")
    if inner_precise not in (0, 1, 2, 3):
        raise ValueError(f"{_FIA}: inner_precise must be 0, 1, 2 or 3, got {inner_precise}")

    shapes = attention_output_shapes(
        query,
        value,
        block_table=block_table,
        num_heads=num_heads,
        input_layout=input_layout,
        num_key_value_heads=num_key_value_heads,
        softmax_lse_flag=softmax_lse_flag,
    )
    q_layout, out_layout = _split_layout(input_layout)
    kv_n = _kv_heads(num_heads, num_key_value_heads)
    if key.dim() != value.dim() or key.shape[:-1] != value.shape[:-1]:
        # Only the head size of value may differ from key's (V_D != K_D).
        raise ValueError(
            f"{_FIA}: key {tuple(key.shape)} and value {tuple(value.shape)} must have the "
            "same shape (up to the last dim)"
        )
    v_d = _value_head_dim(value, block_table, q_layout, query, kv_n)
    q_seq_lens = _int_list(_FIA, "actual_seq_lengths", actual_seq_lengths)
    kv_seq_lens = _int_list(_FIA, "actual_seq_lengths_kv", actual_seq_lengths_kv)
    if atten_mask is not None:
        _check_mask_dtype(atten_mask)

    # ---- query: per-batch rows [s, N, D] and where they go -------------------------------
    if q_layout == "TND":
        if q_seq_lens is None:
            raise ValueError(f"{_FIA}: input_layout TND requires actual_seq_lengths")
        t_q, n_q, d_q = query.shape
        if n_q != num_heads:
            raise ValueError(f"{_FIA}: query has N={n_q} heads but num_heads={num_heads}")
        q_spans = _cumulative_to_spans(_FIA, "actual_seq_lengths", q_seq_lens, t_q)
        batch = len(q_spans)
        incremental = False
        q_view = query  # [T, N, D]
    else:
        batch, s_q, n_q, d_q = _query_bsnd(query, q_layout, num_heads)
        if n_q != num_heads:
            raise ValueError(f"{_FIA}: query has N={n_q} heads but num_heads={num_heads}")
        if input_layout == "BNSD_BSND" and s_q == 1:
            raise ValueError(f"{_FIA}: input_layout BNSD_BSND requires a query S greater than 1")
        if q_layout == "BSH":
            q_view = query.reshape(batch, s_q, n_q, d_q)
        elif q_layout == "BNSD":
            q_view = query.transpose(1, 2)
        else:
            q_view = query  # [B, S, N, D]
        incremental = s_q == 1
        if incremental:
            q_lens = [1] * batch
        else:
            q_lens = _per_batch(_FIA, "actual_seq_lengths", q_seq_lens, batch, s_q)
            if any(q > s_q for q in q_lens):
                raise ValueError(f"{_FIA}: actual_seq_lengths {q_lens} exceed the query S={s_q}")
        q_spans = [(0, q) for q in q_lens]

    # ---- key/value: a function giving [kv_len, KV_N, D] for batch b ----------------------
    if block_table is not None:
        if block_table.dtype != torch.int32:
            raise TypeError(f"{_FIA}: block_table must be int32, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(
                f"{_FIA}: block_table must be 2-dim with B={batch} rows, "
                f"got {tuple(block_table.shape)}"
            )
        if kv_seq_lens is None:
            raise ValueError(f"{_FIA}: page attention requires actual_seq_lengths_kv")
        if q_layout == "TND":
            if len(kv_seq_lens) != batch:
                raise ValueError(
                    f"{_FIA}: with page attention and TND, actual_seq_lengths_kv holds one "
                    f"(non-cumulative) KV length per batch: expected {batch} entries, got "
                    f"{len(kv_seq_lens)}"
                )
            kv_lens = kv_seq_lens
        else:
            kv_lens = _per_batch(_FIA, "actual_seq_lengths_kv", kv_seq_lens, batch, 0)
        if block_size <= 0:
            raise ValueError(f"{_FIA}: page attention requires a non-zero block_size")
        if key.dim() == 3:
            num_blocks, cache_bs, h_kv = key.shape
            if h_kv % kv_n != 0:
                raise ValueError(
                    f"{_FIA}: key cache H={h_kv} is not divisible by num_key_value_heads={kv_n}"
                )
            d_k = h_kv // kv_n
        else:
            if q_layout in ("BSH", "BSND"):
                raise ValueError(
                    f"{_FIA}: with input_layout {input_layout} the kv cache must be "
                    "(num_blocks, block_size, H)"
                )
            num_blocks, cache_n, cache_bs, d_k = key.shape
            if cache_n != kv_n:
                raise ValueError(
                    f"{_FIA}: kv cache (num_blocks, KV_N, block_size, D) has KV_N={cache_n}, "
                    f"but num_key_value_heads gives {kv_n}"
                )
        if cache_bs != block_size:
            raise ValueError(
                f"{_FIA}: the kv cache block dimension ({cache_bs}) differs from "
                f"block_size={block_size}"
            )
        max_blocks = max((math.ceil(n / block_size) for n in kv_lens), default=0)
        if max_blocks > block_table.shape[1]:
            raise ValueError(
                f"{_FIA}: block_table has {block_table.shape[1]} columns, fewer than the "
                f"{max_blocks} blocks of the longest sequence"
            )
        table = block_table.to(torch.int64)

        def kv_for(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            kv_len = kv_lens[b]
            blocks = table[b, : math.ceil(kv_len / block_size)]
            if blocks.numel() and (int(blocks.min()) < 0 or int(blocks.max()) >= num_blocks):
                raise ValueError(
                    f"{_FIA}: block_table row {b} references blocks outside "
                    f"[0, {num_blocks}): {blocks.tolist()}"
                )
            return (
                _gather_pages(key, blocks, kv_len, kv_n, block_size),
                _gather_pages(value, blocks, kv_len, kv_n, block_size),
            )

    elif q_layout == "TND":
        if kv_seq_lens is None:
            raise ValueError(f"{_FIA}: input_layout TND requires actual_seq_lengths_kv")
        if key.dim() != 3 or key.shape[1] != kv_n:
            raise ValueError(
                f"{_FIA}: TND key must be [T_kv, KV_N={kv_n}, D], got {tuple(key.shape)}"
            )
        if len(kv_seq_lens) != batch:
            raise ValueError(
                f"{_FIA}: TND actual_seq_lengths_kv must have B={batch} (cumulative) entries, "
                f"got {len(kv_seq_lens)}"
            )
        kv_spans = _cumulative_to_spans(_FIA, "actual_seq_lengths_kv", kv_seq_lens, key.shape[0])
        kv_lens = [e - s for s, e in kv_spans]
        d_k = key.shape[2]

        def kv_for(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            s, e = kv_spans[b]
            return key[s:e], value[s:e]

    else:
        if key.shape[0] != batch:
            raise ValueError(f"{_FIA}: key batch {key.shape[0]} differs from query batch {batch}")
        if q_layout == "BSH":
            s_kv = key.shape[1]
            if key.shape[2] % kv_n != 0:
                raise ValueError(
                    f"{_FIA}: BSH key H={key.shape[2]} is not divisible by "
                    f"num_key_value_heads={kv_n}"
                )
            d_k = key.shape[2] // kv_n
            k_view = key.reshape(batch, s_kv, kv_n, d_k)
            v_view = value.reshape(batch, s_kv, kv_n, -1)
        else:
            if q_layout == "BNSD":
                k_view, v_view = key.transpose(1, 2), value.transpose(1, 2)
            else:
                k_view, v_view = key, value
            s_kv, cache_n, d_k = k_view.shape[1:]
            if cache_n != kv_n:
                raise ValueError(
                    f"{_FIA}: key has {cache_n} heads but num_key_value_heads gives {kv_n}"
                )
        kv_lens = _per_batch(_FIA, "actual_seq_lengths_kv", kv_seq_lens, batch, s_kv)
        if any(n > s_kv for n in kv_lens):
            raise ValueError(f"{_FIA}: actual_seq_lengths_kv {kv_lens} exceed the key S={s_kv}")

        def kv_for(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            return k_view[b, : kv_lens[b]], v_view[b, : kv_lens[b]]

    if d_k != d_q:
        raise ValueError(f"{_FIA}: query D={d_q} differs from key D={d_k}")

    # ---- masks ---------------------------------------------------------------------------
    if incremental:
        mode = 0  # "Q_S为1且不带rope输入时该参数无效"
        user_mask = atten_mask if sparse_mode in (0, 1) else None
    else:
        mode = sparse_mode
        user_mask = atten_mask if sparse_mode in (0, 1) else None
        if sparse_mode in (2, 3):
            _optimized_mask_check(atten_mask, sparse_mode)
        if sparse_mode == 1 and atten_mask is None:
            raise ValueError(f"{_FIA}: sparse_mode=1 (allMask) requires atten_mask")
        if user_mask is not None and q_layout == "TND":
            raise NotImplementedError(
                f"{_FIA}: a user atten_mask (sparse_mode 0/1) with input_layout TND is not "
                "supported by the reference kernel (use sparse_mode 0 without mask, 2 or 3)"
            )
        if user_mask is not None and sparse_mode == 0:
            bound = max((e - s for s, e in q_spans), default=0) + max(kv_lens, default=0)
            if pre_tokens < bound or next_tokens < bound:
                raise NotImplementedError(
                    f"{_FIA}: pre_tokens/next_tokens band limits (sliding window) with a "
                    "user atten_mask are not supported by the reference kernel"
                )

    # ---- compute -------------------------------------------------------------------------
    out_dtype = query.dtype
    if q_layout == "TND":
        out_rows = torch.zeros(query.shape[0], num_heads, v_d, dtype=torch.float32)
        lse_rows = torch.full((query.shape[0], num_heads), float("-inf"), dtype=torch.float32)
    else:
        out_rows = torch.zeros(batch, q_view.shape[1], num_heads, v_d, dtype=torch.float32)
        lse_rows = torch.full(
            (batch, q_view.shape[1], num_heads), float("-inf"), dtype=torch.float32
        )

    for b in range(batch):
        s, e = q_spans[b]
        q_len = e - s
        if q_len == 0:
            continue
        k_b, v_b = kv_for(b)
        kv_len = k_b.shape[0]
        visible: torch.Tensor | None = None
        if mode in (2, 3):
            visible = _causal_visible(q_len, kv_len, right_down=mode == 3)
        if user_mask is not None:
            masked = _user_mask_for_batch(user_mask, b, batch, q_len, kv_len, incremental)
            visible = ~masked if visible is None else visible & ~masked
        q_b = q_view[s:e] if q_layout == "TND" else q_view[b, s:e]
        out_b, lse_b = _attend(q_b, k_b, v_b, scale, visible)
        if q_layout == "TND":
            out_rows[s:e] = out_b
            lse_rows[s:e] = lse_b
        else:
            out_rows[b, s:e] = out_b
            lse_rows[b, s:e] = lse_b

    # ---- back to the output layout ---------------------------------------------------------
    if out_layout == "TND":
        attention_out = out_rows
        lse = lse_rows.unsqueeze(-1)  # [T, N, 1]
    else:
        if out_layout == "BSH":
            attention_out = out_rows.reshape(batch, out_rows.shape[1], -1)
        elif out_layout == "BSND":
            attention_out = out_rows
        else:
            attention_out = out_rows.transpose(1, 2)
        lse = lse_rows.transpose(1, 2).unsqueeze(-1)  # [B, N, S, 1]
    attention_out = attention_out.to(out_dtype).contiguous()
    if tuple(attention_out.shape) != shapes.attention_out:  # pragma: no cover - invariant
        raise AssertionError(f"{_FIA}: inferred {shapes.attention_out}, got {attention_out.shape}")
    # Without the flag: "输出shape为[1]的值为0的Tensor".
    softmax_lse = lse.contiguous() if softmax_lse_flag else torch.zeros(1, dtype=torch.float32)
    return attention_out, softmax_lse


# --------------------------------------------------------------------------------------------
# npu_scatter_pa_kv_cache
# --------------------------------------------------------------------------------------------


def npu_scatter_pa_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    compress_lens: torch.Tensor | None = None,
    compress_seq_offsets: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    cache_mode: str | None = "PA_NZ",
) -> None:
    """Write key/value rows into a paged KV cache in place (torch_npu's scenario 2, ND).

    Scenario 2 of the doc ("场景二"), selected by ``cache_mode`` None or ``'Norm'`` (ND
    layout): key [T, N, Dk], value [T, N, Dv], key_cache [num_blocks, block_size, N, Dk],
    value_cache [num_blocks, block_size, N, Dv], slot_mapping int32/int64 [T]. Token t is
    written to block ``slot_mapping[t] // block_size``, offset ``slot_mapping[t] % block_size``.

    Documented constraints that are checked: equal dtypes of key, value and the caches;
    slot values in [0, num_blocks * block_size - 1] (ValueError otherwise: padding tokens
    with vLLM's PAD_SLOT_ID -1 must be sliced off by the caller) and without duplicates
    ("slot_mapping内的元素值保证不重复"; ValueError here).

    Not implemented (NotImplementedError): the default ``cache_mode='PA_NZ'`` (NZ cache
    layout, scenario 1; callers must pass ``cache_mode="Norm"``), 4-dim key/value
    (scenario 3) and compress_lens / compress_seq_offsets / seq_lens.
    """
    for name, val in (
        ("compress_lens", compress_lens),
        ("compress_seq_offsets", compress_seq_offsets),
        ("seq_lens", seq_lens),
    ):
        if val is not None:
            raise NotImplementedError(
                f"{_SCATTER}: {name} (compression, scenario 3) is not supported by the "
                "reference kernel"
            )
    if cache_mode not in (None, "Norm"):
        if cache_mode == "PA_NZ":
            raise NotImplementedError(
                f"{_SCATTER}: cache_mode='PA_NZ' (the default; NZ cache layout) is not "
                "supported by the reference kernel: pass cache_mode='Norm' with ND caches "
                "[num_blocks, block_size, num_heads, head_size]"
            )
        raise ValueError(
            f"{_SCATTER}: cache_mode must be None, 'Norm' or 'PA_NZ', got {cache_mode!r}"
        )
    if key.dim() == 4 or value.dim() == 4:
        raise NotImplementedError(
            f"{_SCATTER}: 4-dim key/value (scenario 3, compression) are not supported by the "
            "reference kernel"
        )
    _check_same_dtype(
        _SCATTER, "key", key, value=value, key_cache=key_cache, value_cache=value_cache
    )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{_SCATTER}: slot_mapping must be int32 or int64, got {slot_mapping.dtype}"
        )
    if key.dim() != 3 or value.dim() != 3:
        raise ValueError(
            f"{_SCATTER}: key and value must be [T, num_heads, head_size], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            f"{_SCATTER}: key and value must agree in their first two dims, got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key_cache.dim() != 4 or value_cache.dim() != 4:
        raise ValueError(f"{_SCATTER}: key_cache and value_cache must be 4-dim")
    num_tokens, num_kv_heads = key.shape[:2]
    num_blocks, block_size = key_cache.shape[:2]
    if tuple(key_cache.shape[2:]) != (num_kv_heads, key.shape[2]):
        raise ValueError(
            f"{_SCATTER}: key_cache {tuple(key_cache.shape)} must be "
            f"[num_blocks, block_size, {num_kv_heads}, {key.shape[2]}]"
        )
    if tuple(value_cache.shape) != (num_blocks, block_size, num_kv_heads, value.shape[2]):
        raise ValueError(
            f"{_SCATTER}: value_cache {tuple(value_cache.shape)} must be "
            f"[{num_blocks}, {block_size}, {num_kv_heads}, {value.shape[2]}]"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != num_tokens:
        raise ValueError(
            f"{_SCATTER}: slot_mapping must be [T={num_tokens}], got {tuple(slot_mapping.shape)}"
        )
    if num_tokens == 0:
        return None
    slots = slot_mapping.to(torch.int64)
    capacity = num_blocks * block_size
    if int(slots.min()) < 0 or int(slots.max()) >= capacity:
        raise ValueError(
            f"{_SCATTER}: slot_mapping values must lie in [0, {capacity - 1}] "
            f"(num_blocks * block_size - 1); got min {int(slots.min())}, max {int(slots.max())}"
        )
    if torch.unique(slots).numel() != num_tokens:
        raise ValueError(f"{_SCATTER}: slot_mapping contains duplicate slots")
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots - blocks * block_size
    key_cache[blocks, offsets] = key
    value_cache[blocks, offsets] = value
    return None


# --------------------------------------------------------------------------------------------
# norms and activations
# --------------------------------------------------------------------------------------------


def rms_norm_rstd_shape(x: torch.Tensor, gamma: torch.Tensor) -> tuple[int, ...]:
    """Shape of rstd: x's leading dims, then 1 for each of gamma's dims (torch_npu meta)."""
    lead = x.dim() - gamma.dim()
    return tuple(x.shape[:lead]) + (1,) * gamma.dim()


def _check_rms_args(fn: str, x: torch.Tensor, gamma: torch.Tensor) -> None:
    _check_float(fn, "x", x)
    _check_same_dtype(fn, "x", x, gamma=gamma)
    if (
        gamma.dim() < 1
        or gamma.dim() > x.dim()
        or tuple(x.shape[-gamma.dim() :]) != tuple(gamma.shape)
    ):
        raise ValueError(
            f"{fn}: gamma {tuple(gamma.shape)} must equal the trailing dims of x {tuple(x.shape)}"
        )


def _rms_norm_f32(
    xf: torch.Tensor, gamma: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    dims = tuple(range(xf.dim() - gamma.dim(), xf.dim()))
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return xf * rstd * gamma.float(), rstd


def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """RmsNorm: y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + epsilon).

    The mean runs over the trailing ``gamma.dim()`` dims of x ("gamma ... 通常为self的最后一维").
    Returns (y in x's dtype, rstd float32 of shape ``x.shape[:-gamma.dim()] + (1,) *
    gamma.dim()``, the "reverse rms中间结果"). gamma must have x's dtype.
    """
    _check_rms_args("npu_rms_norm", self, gamma)
    y, rstd = _rms_norm_f32(self.float(), gamma, epsilon)
    return y.to(self.dtype), rstd


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AddRmsNorm: x = x1 + x2, then RmsNorm of x.

    Schema ``npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) ->
    (Tensor, Tensor, Tensor)``: returns (y, rstd, x). The sum is formed in float32 and the
    norm is taken of that float32 sum; x is returned in x1's dtype, y in x1's dtype, rstd as
    float32 with the shape of npu_rms_norm's rstd.
    """
    fn = "npu_add_rms_norm"
    _check_rms_args(fn, x1, gamma)
    _check_same_dtype(fn, "x1", x1, x2=x2)
    if x1.shape != x2.shape:
        raise ValueError(f"{fn}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must match")
    xf = x1.float() + x2.float()
    y, rstd = _rms_norm_f32(xf, gamma, epsilon)
    return y.to(x1.dtype), rstd, xf.to(x1.dtype)


def swiglu_output_shape(x: torch.Tensor, dim: int) -> tuple[int, ...]:
    """x's shape with ``dim`` halved."""
    if x.dim() < 1:
        raise ValueError("npu_swiglu: x must have at least 1 dim")
    d = dim % x.dim()
    if x.shape[d] % 2 != 0:
        raise ValueError(f"npu_swiglu: dim {dim} of x {tuple(x.shape)} must have an even size")
    shape = list(x.shape)
    shape[d] //= 2
    return tuple(shape)


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """swiglu(x, dim) = swish(A) * B = A * sigmoid(A) * B, with A, B the halves of x along dim."""
    _check_float("npu_swiglu", "x", self)
    swiglu_output_shape(self, dim)
    a, b = self.float().chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(self.dtype)


def npu_rotary_mul(
    self: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """RotaryEmbedding: output = r1 * input + r2 * x_new, as documented.

    * ``'half'`` (NeoX rotate_half): x1, x2 = chunk(input, 2, -1); x_new = cat(-x2, x1).
    * ``'interleave'`` (GPT-J): x1 = input[..., ::2], x2 = input[..., 1::2];
      x_new = rearrange(stack(-x2, x1, -1), "... d two -> ... (d two)").
    * with ``rotate`` (a [D, D] matrix): x_new = input @ rotate, whatever the mode.

    input, r1 (cos), r2 (sin) are 4-dim; r1/r2 broadcast to input's shape (e.g. 1S1D for a
    BSND input); D is even. The output has input's shape and dtype.
    """
    fn = "npu_rotary_mul"
    _check_float(fn, "input", self)
    _check_same_dtype(fn, "input", self, r1=r1, r2=r2)
    if rotary_mode not in ("half", "interleave"):
        raise ValueError(f"{fn}: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    if self.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        raise ValueError(
            f"{fn}: input, r1 and r2 must be 4-dim, got {self.dim()}, {r1.dim()}, {r2.dim()}"
        )
    if self.shape[-1] % 2 != 0:
        raise ValueError(f"{fn}: D={self.shape[-1]} must be even")
    for name, r in (("r1", r1), ("r2", r2)):
        try:
            bshape = torch.broadcast_shapes(r.shape, self.shape)
        except RuntimeError as exc:
            raise ValueError(f"{fn}: {name} {tuple(r.shape)} does not broadcast to input") from exc
        if bshape != self.shape:
            raise ValueError(
                f"{fn}: {name} {tuple(r.shape)} must broadcast to input {tuple(self.shape)}"
            )
    x = self.float()
    if rotate is not None:
        _check_same_dtype(fn, "input", self, rotate=rotate)
        d = self.shape[-1]
        if tuple(rotate.shape) != (d, d):
            raise ValueError(f"{fn}: rotate must be [{d}, {d}], got {tuple(rotate.shape)}")
        x_new = torch.matmul(x, rotate.float())
    elif rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        x_new = torch.cat((-x2, x1), dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
        x_new = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return (r1.float() * x + r2.float() * x_new).to(self.dtype)
