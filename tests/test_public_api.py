"""The public face of autotune (like httpx's test of its own): exactly these names, each the object its package
defines, and nothing of the tuner loaded by importing autotune alone."""
from __future__ import annotations

import subprocess
import sys

import autotune
from autotune import engines, run, studyfile, targets

PUBLIC = {
    "read_study_file": studyfile, "StudySpec": studyfile, "make_plan": run, "Plan": run, "Tuner": run,
    "RunOptions": run, "RunSummary": run, "Engine": engines, "ENGINES": engines, "get_engine": engines,
    "Target": targets, "KINDS": targets, "make_target": targets,
}


def test_the_public_names() -> None:
    assert sorted(autotune.__all__) == sorted(PUBLIC)
    assert sorted(dir(autotune)) == sorted(PUBLIC)
    for name, package in PUBLIC.items():
        assert getattr(autotune, name) is getattr(package, name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        autotune.load_study  # noqa: B018
    except AttributeError as e:
        assert "load_study" in str(e)
    else:
        raise AssertionError("autotune.load_study exists")


def test_importing_autotune_loads_none_of_the_tuner() -> None:
    loaded = subprocess.run([sys.executable, "-c", "import sys, autotune.sim; print(' '.join(sorted(sys.modules)))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if m.startswith(("optuna", "autotune.run", "autotune.studyfile"))]
