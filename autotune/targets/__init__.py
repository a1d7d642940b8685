"""Targets: where the server runs. One module per kind behind ``Target`` (base.py); each kind declares its own
option table (a ``TargetSpec`` subclass) and ``KINDS`` maps a study file's ``kind`` to both."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from autotune.tables import Reader
from autotune.targets.base import Deployment, Target, TargetSpec
from autotune.targets.local import LocalSpec, LocalTarget
from autotune.targets.process import ProcessSpec, ProcessTarget
from autotune.targets.systemd import SystemdSpec, SystemdTarget

__all__ = ["KINDS", "Deployment", "Kind", "LocalSpec", "LocalTarget", "ProcessSpec", "ProcessTarget", "SystemdSpec",
           "SystemdTarget", "Target", "TargetSpec", "make_target", "parse_target"]


class Kind(NamedTuple):
    spec: type[TargetSpec]
    target: type[Target]


KINDS: dict[str, Kind] = {
    LocalSpec.kind: Kind(LocalSpec, LocalTarget),
    ProcessSpec.kind: Kind(ProcessSpec, ProcessTarget),
    SystemdSpec.kind: Kind(SystemdSpec, SystemdTarget),
}


def parse_target(name: str, table: dict[str, Any], where: str, reader: Reader) -> TargetSpec:
    """The spec of one ``[target]`` or ``[targets.NAME]`` table; a key of another kind is named as such."""
    kind = reader.choice(table, where, "kind", tuple(KINDS), LocalSpec.kind)
    spec = KINDS[kind].spec
    for key in table:
        if key != "kind" and key not in spec.keys:
            owners = [k for k, c in KINDS.items() if key in c.spec.keys]
            if owners:
                reader.fail(where, key, f"only applies to kind = {' or '.join(owners)}, not {kind!r}")
            reader.fail(where, key, f"unknown key; allowed: {', '.join(('kind', *spec.keys))}")
    return spec.parse(name, table, where, reader)


def make_target(spec: TargetSpec, cwd: Path | None = None) -> Target:
    """The target for ``spec``. ``cwd`` is where a local server starts (the study file's directory, so relative paths
    in a study resolve beside it)."""
    return KINDS[spec.kind].target(spec, cwd)
