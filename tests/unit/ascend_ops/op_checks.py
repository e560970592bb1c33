"""Building layers under a vLLM config, and the comparison bound used by the op tests.

Tolerances (ours = ``forward_oot`` on the reference kernels, native = vLLM's
``forward_native``), checked element-wise as ``|ours - native| <= rtol * scale + atol``:

* float32: ``rtol = 1e-5``. Both sides compute in float32; they differ at most by the
  order of a reduction (the RMS mean).
* float16 / bfloat16: ``rtol = 2 * eps`` of the dtype (fp16 ``2 ** -9``, bf16 ``2 ** -6``).
  The reference kernels compute in float32 and round once to the output dtype (error at
  most u = eps / 2 of the result). vLLM's native code rounds more often: RMSNorm rounds the
  normalised value to the weight dtype and again after the weight multiply; SiluAndMul
  rounds ``silu(a)`` and then the product. That is at most 2u (plus u^2 terms), so the
  two sides differ by at most 3u = 1.5 eps of the result; 2 eps leaves a margin.
  Rotary embedding: native rounds ``x1*cos``, ``x2*sin`` and their difference; the
  difference can cancel, so the bound is relative to ``|x1 cos| + |x2 sin|``, itself at
  most ``|x| + |rotate(x)|`` (``|cos|, |sin| <= 1``), which is the ``scale`` used there:
  native error <= 2u * scale + u * |result|, ours <= u * |result| <= u * scale, so
  together <= 4u = 2 eps of the scale.
* ``atol = 2 * eps * tiny`` (two subnormal spacings) covers results below the smallest
  normal number, where rounding errors are absolute, not relative. Where native rounds an
  intermediate that may fall below the normal range and then multiplies it by a factor f
  (SiluAndMul: ``silu(a)`` times ``b``; RMSNorm: the normalised value times the weight),
  that rounding error (at most half a subnormal spacing) is scaled by ``|f|``: the test
  passes ``factor=|f|`` and the bound gains ``eps * tiny * |f|``.

The residual returned by the fused add is compared exactly: both sides add in float32
(exact for two float16/bfloat16 values) and round once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@contextlib.contextmanager
def vllm_config(*custom_ops: str) -> Iterator[None]:
    """A current vLLM config with ``compilation_config.custom_ops`` = ["all", *custom_ops]."""
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all", *custom_ops]))
    with set_current_vllm_config(config):
        yield


def rtol_for(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps


def assert_within(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype,
    scale: torch.Tensor | None = None,
    factor: torch.Tensor | None = None,
) -> None:
    """``|actual - expected| <= rtol * scale + atol (+ eps * tiny * factor)`` element-wise
    (scale defaults to |expected|)."""
    assert actual.dtype == expected.dtype == dtype, (actual.dtype, expected.dtype, dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.double(), expected.double()
    assert torch.isfinite(a).all() and torch.isfinite(e).all()
    finfo = torch.finfo(dtype)
    scale = e.abs() if scale is None else scale.double()
    bound = rtol_for(dtype) * scale + 2 * finfo.eps * finfo.tiny
    if factor is not None:
        bound = bound + finfo.eps * finfo.tiny * factor.double().abs()
    err = (a - e).abs()
    bad = err > bound
    if bool(bad.any()):
        i = int(torch.argmax((err - bound).flatten()))
        raise AssertionError(
            f"{int(bad.sum())} of {err.numel()} elements out of bound ({dtype}); worst: "
            f"actual {a.flatten()[i].item()}, expected {e.flatten()[i].item()}, "
            f"error {err.flatten()[i].item():.3e} > bound {bound.flatten()[i].item():.3e}"
        )
