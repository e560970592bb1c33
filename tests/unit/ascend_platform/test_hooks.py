"""The suite's pluggy hooks are called at the platform and worker stages."""

from __future__ import annotations

from ascend_platform.hooks import ENTRY_POINT_GROUP, PROJECT, hookimpl, plugin_manager


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    @hookimpl
    def ascend_platform_stage(self, platform_cls: type) -> None:
        self.calls.append(("platform", platform_cls))


def test_platform_stage_runs_in_pre_register_and_update() -> None:
    from vllm.platforms import current_platform

    recorder = Recorder()
    pm = plugin_manager()
    pm.register(recorder)
    try:
        current_platform.pre_register_and_update()
    finally:
        pm.unregister(recorder)
    assert recorder.calls == [("platform", type(current_platform))]


def test_hook_names() -> None:
    assert PROJECT == "ascend"
    assert ENTRY_POINT_GROUP == "ascend.hooks"
    assert {h for h in dir(plugin_manager().hook) if h.startswith("ascend_")} == {
        "ascend_platform_stage",
        "ascend_worker_stage",
    }
