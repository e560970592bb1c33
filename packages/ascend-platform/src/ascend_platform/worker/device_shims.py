"""Stand-ins for the CUDA stream and event classes vLLM's GPU runner constructs.

vLLM's GPU model runner, which the Ascend runner extends, creates ``torch.cuda.Stream``
and ``torch.Event`` objects while it initialises. On the NPU those must be the NPU's own
(``torch.npu.Stream``, ``torch.npu.Event``); on the reference device, where every
operation is synchronous, inert objects do. :func:`device_stream_classes` swaps them in
for the duration of the runner's constructor only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class _InertEvent:
    """An event on a synchronous device: recording and waiting are no-ops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        return True


class _InertStream:
    """A stream on a synchronous device."""

    device = torch.device("cpu")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def device_stream_classes(device_type: str) -> Iterator[None]:
    """Within the block, ``torch.cuda.Stream`` and ``torch.Event`` build the device's own."""
    if device_type == "npu":
        stream_cls: Any = torch.npu.Stream  # type: ignore[attr-defined]
        event_cls: Any = torch.npu.Event  # type: ignore[attr-defined]
    else:
        stream_cls, event_cls = _InertStream, _InertEvent
    saved = torch.cuda.Stream, torch.Event
    try:
        torch.cuda.Stream, torch.Event = stream_cls, event_cls  # type: ignore[misc]
        yield
    finally:
        torch.cuda.Stream, torch.Event = saved  # type: ignore[misc]


def host_accelerator_calls() -> None:
    """Make vLLM's device-generic ``torch.accelerator`` calls host operations.

    vLLM's runner and model loader synchronise and free memory through
    ``torch.accelerator``. On the reference device there is no accelerator (a CUDA build
    of torch would try CUDA), so synchronisation and cache release become no-ops (CPU
    work is synchronous) and memory info is the host's. Idempotent; applies to this
    (worker) process. On an NPU these calls are left to torch_npu; the ascend-patches
    distribution routes them to ``torch.npu`` where torch_npu does not.
    """
    accelerator: Any = torch.accelerator

    # Distinct functions: Dynamo keys special handling on the function object.
    def synchronize(*args: Any, **kwargs: Any) -> None:
        pass

    def empty_cache(*args: Any, **kwargs: Any) -> None:
        pass

    def get_memory_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    accelerator.synchronize = synchronize
    accelerator.empty_cache = empty_cache
    accelerator.get_memory_info = get_memory_info
