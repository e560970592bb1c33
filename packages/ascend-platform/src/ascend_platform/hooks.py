"""The suite's lifecycle hooks (pluggy project ``ascend``).

vLLM has entry-point groups for platforms and general plugins but no hook at some points
of the life of a process that the suite needs. The platform calls these hooks there;
other distributions implement them and announce the implementation through the
entry-point group :data:`ENTRY_POINT_GROUP`. Implementations must be idempotent: vLLM
starts several processes and may reach a stage more than once in one process.

Stages:

- ``ascend_platform_stage``: main process, from ``Platform.pre_register_and_update``
  (before vLLM parses its arguments) and again from ``check_and_update_config``;
- ``ascend_worker_stage``: each worker process, from the worker's ``__init__``.
"""

from __future__ import annotations

import functools
from typing import Any

import pluggy

PROJECT = "ascend"
ENTRY_POINT_GROUP = "ascend.hooks"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class AscendHookSpec:
    """The hook specification."""

    @hookspec
    def ascend_platform_stage(self, platform_cls: type) -> None:
        """The Ascend platform is active in this (main) process; vLLM's config is not
        built yet. ``platform_cls`` is the active platform class."""

    @hookspec
    def ascend_worker_stage(self, vllm_config: Any, device_type: str) -> None:
        """A worker is being constructed in this process; ``device_type`` is ``npu`` or
        ``cpu`` (the reference device)."""


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with the installed implementations loaded."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(AscendHookSpec)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm
