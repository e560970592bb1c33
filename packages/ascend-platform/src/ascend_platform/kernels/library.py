"""Registration of the reference kernels as ``torch.ops.npu.*``.

The ops are defined in torch_npu's own namespace (``npu``) under torch_npu's op names, with
the schemas torch_npu registers (``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``
of torch-npu 2.13.0, which also match the ``torch_npu.npu_xxx(...) -> ...`` prototypes of
its documentation, up to the order of keyword-only arguments). Each op gets a CPU kernel
from :mod:`ascend_platform.kernels.reference` and a fake (meta) implementation, so
``torch.compile`` can trace it.

Nothing is registered when torch_npu is importable: there the real kernels own the names.
Registration is idempotent and thread safe: vLLM imports the platform in several processes
and more than once in each.

Every call of a registered CPU kernel is counted per op (:func:`call_counts`), so tests can
prove which kernels served a model (e.g. that ascend-ops' layers really ran on
``npu_rms_norm``); calls of the fake implementations, i.e. traces by ``torch.compile``, are
counted apart (:func:`fake_call_counts`).
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Sequence

import torch

from ascend_platform.kernels import reference, torch_npu_available

__all__ = [
    "NAMESPACE",
    "SCHEMAS",
    "call_counts",
    "fake_call_counts",
    "register_reference_kernels",
    "reset_call_counts",
    "torch_npu_available",
]

NAMESPACE = "npu"

SCHEMAS: dict[str, str] = {
    "npu_fused_infer_attention_score": (
        "(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
        "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
        "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, "
        "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
        "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
        "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, "
        "Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
        "Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
        "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, "
        "Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
        "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
        "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, "
        "float scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, "
        'str input_layout="BSH", int num_key_value_heads=0, int sparse_mode=0, '
        "int inner_precise=0, int block_size=0, int antiquant_mode=0, "
        "int key_antiquant_mode=0, int value_antiquant_mode=0, bool softmax_lse_flag=False) "
        "-> (Tensor, Tensor)"
    ),
    "npu_scatter_pa_kv_cache": (
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, "
        "Tensor? compress_seq_offsets=None, Tensor? seq_lens=None, "
        "str? cache_mode='PA_NZ') -> ()"
    ),
    "npu_rms_norm": "(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_add_rms_norm": (
        "(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)"
    ),
    "npu_swiglu": "(Tensor self, int dim=-1) -> Tensor",
    "npu_rotary_mul": (
        "(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor"
    ),
}
"""Op name -> schema (without the name), as torch_npu registers it."""


# --------------------------------------------------------------------------------------------
# fake (meta) implementations: shapes and dtypes only
# --------------------------------------------------------------------------------------------


def _fake_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    softmax_lse_flag: bool = False,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = reference.attention_output_shapes(
        query,
        value,
        block_table=block_table,
        num_heads=num_heads,
        input_layout=input_layout,
        num_key_value_heads=num_key_value_heads,
        softmax_lse_flag=softmax_lse_flag,
    )
    out = query.new_empty(shapes.attention_out)
    lse = query.new_empty(shapes.softmax_lse, dtype=torch.float32)
    return out, lse


def _fake_scatter_pa_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    **_: object,
) -> None:
    return None


def _fake_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = self.new_empty(reference.rms_norm_rstd_shape(self, gamma), dtype=torch.float32)
    return torch.empty_like(self), rstd


def _fake_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rstd = x1.new_empty(reference.rms_norm_rstd_shape(x1, gamma), dtype=torch.float32)
    return torch.empty_like(x1), rstd, torch.empty_like(x1)


def _fake_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return self.new_empty(reference.swiglu_output_shape(self, dim))


def _fake_rotary_mul(
    self: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    return torch.empty_like(self)


_KERNELS: dict[str, tuple[Callable[..., object], Callable[..., object]]] = {
    "npu_fused_infer_attention_score": (
        reference.npu_fused_infer_attention_score,
        _fake_fused_infer_attention_score,
    ),
    "npu_scatter_pa_kv_cache": (reference.npu_scatter_pa_kv_cache, _fake_scatter_pa_kv_cache),
    "npu_rms_norm": (reference.npu_rms_norm, _fake_rms_norm),
    "npu_add_rms_norm": (reference.npu_add_rms_norm, _fake_add_rms_norm),
    "npu_swiglu": (reference.npu_swiglu, _fake_swiglu),
    "npu_rotary_mul": (reference.npu_rotary_mul, _fake_rotary_mul),
}

_CALLS: collections.Counter[str] = collections.Counter()
_FAKE_CALLS: collections.Counter[str] = collections.Counter()


def call_counts() -> dict[str, int]:
    """Calls of each registered CPU kernel in this process so far (op name -> count).

    Only calls that reached a kernel through the dispatcher (``torch.ops.npu.<name>``) are
    counted; ops never called are absent.
    """
    return dict(_CALLS)


def fake_call_counts() -> dict[str, int]:
    """Calls of each op's fake implementation (tracing, e.g. by dynamo) so far."""
    return dict(_FAKE_CALLS)


def reset_call_counts() -> None:
    """Forget all counted calls (see :func:`call_counts` and :func:`fake_call_counts`)."""
    _CALLS.clear()
    _FAKE_CALLS.clear()


def _counted(
    name: str, impl: Callable[..., object], counter: collections.Counter[str]
) -> Callable[..., object]:
    @functools.wraps(impl)
    def counted(*args: object, **kwargs: object) -> object:
        counter[name] += 1
        return impl(*args, **kwargs)

    return counted


# The Library must stay alive: its destruction would deregister the ops.
_LIBRARY: torch.library.Library | None = None
_REGISTERED = False
_LOCK = threading.Lock()


def _op_defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def registered_op_names() -> Sequence[str]:
    """Names of the ops this module registers (all of :data:`SCHEMAS`)."""
    return tuple(SCHEMAS)


def register_reference_kernels() -> bool:
    """Define ``torch.ops.npu.<name>`` for every reference kernel, once per process.

    Returns True if the reference kernels are registered (now or by an earlier call), and
    False, registering nothing, when torch_npu is importable. Ops that already exist under
    ``torch.ops.npu`` (defined elsewhere) are left alone, so repeated calls never fail with
    "already registered".
    """
    global _LIBRARY, _REGISTERED
    if _REGISTERED:
        return True
    with _LOCK:
        if _REGISTERED:
            return True
        if torch_npu_available():
            return False
        missing = [name for name in SCHEMAS if not _op_defined(name)]
        if missing:
            lib = _LIBRARY if _LIBRARY is not None else torch.library.Library(NAMESPACE, "FRAGMENT")
            for name in missing:
                impl, fake = _KERNELS[name]
                lib.define(name + SCHEMAS[name])
                lib.impl(name, _counted(name, impl, _CALLS), "CPU")
                torch.library.register_fake(
                    f"{NAMESPACE}::{name}", _counted(name, fake, _FAKE_CALLS), lib=lib
                )
            _LIBRARY = lib
        _REGISTERED = True
        return True
