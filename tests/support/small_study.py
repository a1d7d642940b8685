"""One small real study shared by the report and dashboard tests: `autotune run` on the emulator, a grid with a
config that crashes at startup (a PRUNED trial with a server log) and one that repeats an earlier effective config
(a reused measurement). Run once per test session, on first use."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.testing.studies import write_study
from tests.support.cli import launches, run_autotune, status

SPACE = """
[space.speculative-num-steps]
type = "categorical"
choices = [1, 2]
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2]
[space.speculative-num-draft-tokens]
type = "categorical"
choices = [2, 3]
[space.sim-fault]
type = "categorical"
choices = ["slow-start:0", "startup-crash"]
"""
TRIALS = 8

_made: dict[str, Any] = {}


def small_study(factory: pytest.TempPathFactory) -> Path:
    """The study file of a finished study of TRIALS launches (made on the first call). At twice the model's speed:
    one client keeps up with its 24-token requests even on a busy machine (at five times a launch of the baseline
    was cut short as client_bound here, and the report then had no trial 0 to compare with)."""
    if "path" not in _made:
        directory = factory.mktemp("small-study")
        path = write_study(directory, sampler="grid", launches=TRIALS, space=SPACE,
                           args={"sim-time-scale": 0.001, "sim-speedup": 2},
                           workload="max_tokens = 24\nconcurrency = [1, 4]\nrequests = 4\n"
                                    "window_generations = 1\nwarmup = 1\nmax_repeats = 1"
                                "\ntolerance = 0.5")
        r = run_autotune("run", "--study", str(path), cwd=directory,
                         env={"XDG_STATE_HOME": str(directory / "state")})
        assert r.returncode == 0, r.stderr + r.stdout
        trials = status(path)["trials"]
        assert launches(trials) == TRIALS, trials
        assert any(t["reason"] == "crashed" and t["state"] == "PRUNED" for t in trials), trials
        _made["path"], _made["status"] = path, trials
    return _made["path"]


def small_study_trials() -> list[dict[str, Any]]:
    """`autotune status --json` of the small study, as read right after it ran."""
    return _made["status"]

