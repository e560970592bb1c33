"""The suite's pluggy hook implementations that apply the platform and worker stages.

Registered under the entry-point group ``ascend.hooks`` (project ``ascend``); the Ascend
platform calls these hooks, so they run only where the Ascend platform is active.
"""

from __future__ import annotations

from typing import Any

import pluggy

from ascend_patches.core import load_patches

hookimpl = pluggy.HookimplMarker("ascend")


@hookimpl
def ascend_platform_stage(platform_cls: type) -> None:
    load_patches().apply_stage("platform", platform_cls.device_type)


@hookimpl
def ascend_worker_stage(vllm_config: Any, device_type: str) -> None:
    load_patches().apply_stage("worker", device_type)
