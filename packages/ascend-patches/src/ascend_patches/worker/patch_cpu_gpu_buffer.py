"""vLLM's host/device staging buffers (``CpuGpuBuffer``) on Ascend.

Every step the model runner fills host buffers and copies them to the device with
``CpuGpuBuffer.copy_to_gpu``.
"""

from __future__ import annotations

from typing import Any

from ascend_patches.core import PATCHES

VERSIONS = ">=0.31,<0.33"


@PATCHES.declare(
    target="vllm.v1.utils.CpuGpuBuffer.__init__",
    stage="worker",
    versions=VERSIONS,
    devices=("cpu",),
    why=(
        "On the CPU reference device the 'device' tensor of every staging buffer is a "
        "second host tensor, so each step copies every input buffer from host to host."
    ),
    how=(
        "After the original constructor, when the device tensor lives on the CPU, make it "
        "the host tensor itself: copy_to_gpu then copies a tensor onto itself (a no-op)."
    ),
    upstream=(
        "None: vLLM's own CPU runner does the same aliasing after construction "
        "(CPUModelRunner._postprocess_tensors); the GPU runner the Ascend runner extends "
        "cannot know that its device is the host."
    ),
    removal=(
        "Remove when vLLM's CpuGpuBuffer aliases host-resident device tensors itself, or "
        "when the Ascend runner stops extending the GPU runner."
    ),
)
def host_buffer_alias(original: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.gpu.device.type == "cpu":
            self.gpu = self.cpu

    return __init__


@PATCHES.declare(
    target="vllm.v1.utils.CpuGpuBuffer.copy_to_gpu",
    stage="worker",
    versions=VERSIONS,
    devices=("npu",),
    why=(
        "copy_to_gpu calls cpu.pin_memory() on every copy when pinned memory is available. "
        "On Ascend the host buffer is already allocated pinned, and torch_npu's "
        "pin_memory() allocates a new pinned tensor each call: one allocation per buffer "
        "per step, on the host path of every decode step."
    ),
    how="Copy the (already pinned) host slice to the device slice, non-blocking, as is.",
    upstream=(
        "None yet; the per-copy pin_memory() came with vLLM's change to pin lazily. "
        "vllm-ascend carries the same fix."
    ),
    removal="Remove when upstream stops re-pinning already pinned buffers.",
)
def copy_without_repin(original: Any) -> Any:
    def copy_to_gpu(self: Any, n: int | None = None) -> Any:
        cpu, gpu = self.cpu, self.gpu
        if n is not None:
            cpu, gpu = cpu[:n], gpu[:n]
        return gpu.copy_(cpu, non_blocking=True)

    return copy_to_gpu
