"""The device communicator: HCCL on the NPU, gloo standing in for it on the reference device.

vLLM builds one per process group. vLLM's base communicator already runs every collective
through ``torch.distributed`` on the group's device process group, whose backend the
platform chose (``dist_backend``: ``hccl`` or ``gloo``), so the same code serves both
devices and nothing CUDA-specific (custom all-reduce, symmetric memory) is involved.
"""

from __future__ import annotations

from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)


class AscendCommunicator(DeviceCommunicatorBase):
    """All-reduce, all-gather, reduce-scatter, send and recv over HCCL (or gloo)."""
