"""autotune: a Bayesian autotuner daemon for LLM serving engines.

The public face, for scripts and users: read a study file (``read_study_file`` -> ``StudySpec``), make the plan it
runs (``make_plan`` -> ``Plan``), the tuner and its options (``Tuner``, ``RunOptions``, ``RunSummary``), the engines
(``Engine``, ``ENGINES``, ``get_engine``) and the targets (``Target``, ``KINDS``, ``make_target``). Each name is
imported on first use, so that a part run on its own (the emulator, ``python -m autotune.sim``) loads none of the
tuner."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.engines import ENGINES, Engine, get_engine
    from autotune.run import Plan, RunOptions, RunSummary, Tuner, make_plan
    from autotune.studyfile import StudySpec, read_study_file
    from autotune.targets import KINDS, Target, make_target

#: each public name -> the package that defines it
_FACE = {
    "read_study_file": "autotune.studyfile", "StudySpec": "autotune.studyfile",
    "make_plan": "autotune.run", "Plan": "autotune.run",
    "Tuner": "autotune.run", "RunOptions": "autotune.run", "RunSummary": "autotune.run",
    "Engine": "autotune.engines", "ENGINES": "autotune.engines", "get_engine": "autotune.engines",
    "Target": "autotune.targets", "KINDS": "autotune.targets", "make_target": "autotune.targets",
}

__all__ = ["ENGINES", "KINDS", "Engine", "Plan", "RunOptions", "RunSummary", "StudySpec", "Target", "Tuner",
           "get_engine", "make_plan", "make_target", "read_study_file"]


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    return getattr(importlib.import_module(_FACE[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
