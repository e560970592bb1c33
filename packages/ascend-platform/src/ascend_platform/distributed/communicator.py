"""The device communicator: HCCL on the NPU, gloo standing in for it on the reference device.

vLLM builds one per process group. Collectives go through ``torch.distributed`` on the
group's device process group, whose backend the platform chose (``dist_backend``), so the
same code serves both devices.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)


class AscendCommunicator(DeviceCommunicatorBase):
    """All-reduce, all-gather, reduce-scatter, send and recv over HCCL (or gloo)."""

    def __init__(
        self,
        cpu_group: ProcessGroup,
        device: torch.device | None = None,
        device_group: ProcessGroup | None = None,
        unique_name: str = "",
        use_all2all: bool = False,
    ) -> None:
        super().__init__(cpu_group, device, device_group, unique_name, use_all2all=use_all2all)
        if self.device_group is None:
            self.device_group = cpu_group

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        torch.distributed.all_reduce(input_, group=self.device_group)
        return input_
