"""Targets: where the server runs. One module per kind behind ``Target`` (base.py)."""
from __future__ import annotations

from pathlib import Path

from autotune.study import TargetSpec
from autotune.targets.base import Deployment, Target

__all__ = ["Deployment", "Target", "make_target"]


def make_target(spec: TargetSpec, cwd: Path | None = None) -> Target:
    """The target for ``spec``: local, ssh-process or ssh-systemd. ``cwd`` is where a local server starts (the
    study file's directory, so relative paths in a study resolve beside it)."""
    if spec.kind == "local":
        from autotune.targets.local import LocalTarget

        return LocalTarget(spec, cwd=cwd)
    if spec.kind == "ssh-process":
        from autotune.targets.process import ProcessTarget

        return ProcessTarget(spec)
    if spec.kind == "ssh-systemd":
        from autotune.targets.systemd import SystemdTarget

        return SystemdTarget(spec)
    raise ValueError(f"unknown target kind {spec.kind!r}")
