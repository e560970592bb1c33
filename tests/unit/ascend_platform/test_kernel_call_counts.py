"""The kernel library's call counters (real CPU kernels and fake implementations)."""

from __future__ import annotations

import torch
from ascend_platform import kernels
from ascend_platform.kernels import library
from torch._subclasses.fake_tensor import FakeTensorMode


def test_calls_are_counted_per_op() -> None:
    assert kernels.register_reference_kernels()
    library.reset_call_counts()
    assert library.call_counts() == {} and library.fake_call_counts() == {}
    x = torch.randn(3, 8)
    torch.ops.npu.npu_rms_norm(x, torch.ones(8))
    torch.ops.npu.npu_rms_norm(x, torch.ones(8))
    torch.ops.npu.npu_swiglu(x)
    assert library.call_counts() == {"npu_rms_norm": 2, "npu_swiglu": 1}
    assert library.fake_call_counts() == {}
    with FakeTensorMode() as mode:
        torch.ops.npu.npu_swiglu(mode.from_tensor(x))
    assert library.call_counts() == {"npu_rms_norm": 2, "npu_swiglu": 1}
    assert library.fake_call_counts() == {"npu_swiglu": 1}
    counts = library.call_counts()
    counts["npu_swiglu"] = 99  # a copy: callers cannot corrupt the counters
    assert library.call_counts()["npu_swiglu"] == 1
    library.reset_call_counts()
    assert library.call_counts() == {} and library.fake_call_counts() == {}
