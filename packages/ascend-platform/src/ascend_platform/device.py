"""Which device the Ascend platform runs on: a real NPU, the CPU reference device, or none.

``VLLM_ASCEND_DEVICE`` chooses:

- unset, empty or ``auto``: the NPU when torch_npu imports and sees a device, else inactive;
- ``npu``: the NPU, inactive (with an error in the log) when none is usable;
- ``cpu``: the CPU reference device, whatever the host has.

The answer is cached per process: vLLM asks more than once.
"""

from __future__ import annotations

import functools
import logging
import os

from ascend_platform.kernels import torch_npu_available

logger = logging.getLogger("vllm.ascend_platform")  # under vLLM's logger, so its handlers apply

ENV_DEVICE = "VLLM_ASCEND_DEVICE"
ALLOWED_DEVICES = ("auto", "npu", "cpu")

NPU_PLATFORM = "ascend_platform.platform.AscendPlatform"
REFERENCE_PLATFORM = "ascend_platform.platform.AscendReferencePlatform"


def requested_device() -> str:
    """The value of ``VLLM_ASCEND_DEVICE``, normalised; raises ValueError when unknown."""
    value = os.environ.get(ENV_DEVICE, "").strip().lower() or "auto"
    if value not in ALLOWED_DEVICES:
        raise ValueError(
            f"{ENV_DEVICE}={os.environ.get(ENV_DEVICE)!r} is not allowed; "
            f"use one of {', '.join(ALLOWED_DEVICES)}"
        )
    return value


def npu_unavailable_reason() -> str | None:
    """None when an NPU is usable, else why not (cheap checks first)."""
    if not torch_npu_available():
        return "torch_npu is not installed"
    cann_home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if not cann_home and not os.path.isdir("/usr/local/Ascend"):
        return "no CANN toolkit found (ASCEND_HOME_PATH unset, no /usr/local/Ascend)"
    try:
        import torch
        import torch_npu  # noqa: F401

        count = torch.npu.device_count()
    except Exception as exc:  # torch_npu without a working CANN raises many kinds
        return f"torch_npu failed to initialise: {exc!r}"
    if count <= 0:
        return "torch_npu found no NPU device"
    return None


@functools.cache
def resolve_platform() -> str | None:
    """The platform class path for this process, or None (reason logged at debug level)."""
    try:
        device = requested_device()
    except ValueError as exc:
        logger.error("Ascend platform not activated: %s", exc)
        return None
    if device == "cpu":
        logger.debug("Ascend platform: CPU reference device requested by %s=cpu", ENV_DEVICE)
        return REFERENCE_PLATFORM
    reason = npu_unavailable_reason()
    if reason is None:
        return NPU_PLATFORM
    if device == "npu":
        logger.error("Ascend platform not activated although %s=npu: %s", ENV_DEVICE, reason)
    else:
        logger.debug("Ascend platform not activated: %s", reason)
    return None
