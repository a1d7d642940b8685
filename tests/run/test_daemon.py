"""The overnight daemon: signals, kills at any point, a second tuner, and what is left behind."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import optuna
import pytest

from autotune.targets.local import port_open
from autotune.testing.studies import port_of, write_study
from tests.support.cli import kept, launches, run_autotune, start_run, status, wait_for_line

#: four distinct valid configs besides the baseline, in grid order: every trial deploys a server
DEPLOYING_SPACE = """
[space.speculative-num-steps]
type = "categorical"
choices = [2, 3, 4, 5]
"""


def assert_nothing_lost(study: Path, budget: int) -> list[dict]:
    trials = status(study)["trials"]
    assert not [t for t in trials if t["state"] in ("RUNNING", "WAITING")], "a trial was left running or queued"
    retried = {t["retry_of"] for t in trials if t["retry_of"] is not None}
    assert launches(trials) == budget, "the budget counts every launch once"
    for t in trials:
        if t["state"] == "FAIL":
            assert t["number"] in retried or t["retry_of"] is not None, f"trial {t['number']}'s config was lost"
    assert not port_open(port_of(study)), "the local server was left running"
    return trials


@pytest.mark.slow
@pytest.mark.parametrize("moment, time_scale", [
    (r"trial 1 start", 0.001),                        # before anything is deployed
    (r"trial 1 deploy", 0.02),                        # while the server starts (2 s: the readiness wait)
    (r"trial 1 ready in", 0.001),                     # while it is measured
    (r"trial 1 (\[baseline\] )?(COMPLETE|PRUNED|FAIL):", 0.001),  # right after the result was written
])
def test_sigkill_at_any_moment_then_restart(tmp_path: Path, moment: str, time_scale: float) -> None:
    study = write_study(tmp_path, launches=4, sampler="grid", space=DEPLOYING_SPACE,
                        args={"sim-time-scale": time_scale})
    proc = start_run(study)
    try:
        wait_for_line(tmp_path / "t.log", moment, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = assert_nothing_lost(study, 4)
    base = [t for t in kept(trials) if t["baseline"]]  # a busy machine may cut its first attempt short
    assert len(base) == 1 and base[0]["state"] == "COMPLETE"


@pytest.mark.slow
def test_a_trial_killed_before_it_chose_a_config_is_run_again(tmp_path: Path) -> None:
    """The tuner died between creating a grid trial and asking for its parameters: the restart runs that grid point
    (the window is too short to hit with a signal, so the dead tuner's trial is made here with Optuna itself)."""
    study = write_study(tmp_path, launches=4, sampler="grid", space=DEPLOYING_SPACE)
    assert run_autotune("run", "--study", str(study), "--trials", "1", cwd=tmp_path).returncode == 0
    storage = f"sqlite:///{tmp_path / 't.db'}"
    grid = optuna.samplers.GridSampler({"speculative-num-steps": [2, 3, 4, 5]}, seed=7)
    optuna.load_study(study_name="t", storage=storage, sampler=grid).ask()

    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = assert_nothing_lost(study, 4)
    assert trials[1]["state"] == "FAIL" and trials[1]["params"] == {}
    retry = next(t for t in trials if t["retry_of"] == 1)
    assert retry["state"] in ("COMPLETE", "PRUNED")
    ran = [t["params"]["speculative-num-steps"] for t in trials if t["state"] != "FAIL" and not t["baseline"]]
    assert len(set(ran)) == 3, "no grid point ran twice"
    stored = optuna.load_study(study_name="t", storage=storage).trials
    assert stored[retry["number"]].system_attrs["grid_id"] == stored[1].system_attrs["grid_id"], \
        "the retry ran the dead tuner's grid point"


@pytest.mark.slow
def test_sigterm_mid_trial_stops_cleanly_and_the_config_is_retried(tmp_path: Path) -> None:
    study = write_study(tmp_path, launches=4, sampler="grid", space=DEPLOYING_SPACE, args={"sim-time-scale": 0.02},
                        workload="max_tokens = 400\nconcurrency = [1, 4]\nrequests = 6\n"
                                 "window_generations = 1\nwarmup = 1\ntolerance = 0.5")
    proc = start_run(study)
    wait_for_line(tmp_path / "t.log", r"trial 2 ready in", proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # stopped by a signal, as a shell reports one
    assert time.monotonic() - sent < 30
    assert "SIGTERM received: stopping at the next safe point" in out
    assert re.search(r"trial 2 failed: interrupted .*; its config is queued again", out)
    assert "stopped the local server" in out
    assert not port_open(port_of(study))
    trials = status(study)["trials"]
    assert trials[2]["state"] == "FAIL" and trials[2]["reason"] == "interrupted"
    queued = [t for t in trials if t["state"] == "WAITING"]
    assert len(queued) == 1 and queued[0]["retry_of"] == 2

    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = assert_nothing_lost(study, 4)
    retry = next(t for t in trials if t["retry_of"] == 2)
    assert retry["params"] == trials[2]["params"] and retry["state"] in ("COMPLETE", "PRUNED")


@pytest.mark.slow
def test_a_second_tuner_on_the_same_target_is_refused(tmp_path: Path) -> None:
    study = write_study(tmp_path, launches=3, args={"sim-time-scale": 0.02})
    other = write_study(tmp_path, "other", launches=3, port=port_of(study))  # another study, the same target
    proc = start_run(study)
    try:
        wait_for_line(tmp_path / "t.log", r"trial 0 deploy", proc)
        r = run_autotune("run", "--study", str(other), cwd=tmp_path)
        assert r.returncode == 2
        assert re.fullmatch(rf"autotune: error: target local:{port_of(study)} is busy: held by autotune pid "
                            rf"{proc.pid} on \S+ \(study t, since [0-9: -]+\)\n", r.stderr), r.stderr
        assert not (tmp_path / "other.db").exists()
        os.kill(proc.pid, signal.SIGKILL)  # a lock left by a killed tuner is free again
        proc.wait()
        r = run_autotune("run", "--study", str(other), "--trials", "1", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert status(other)["trials"][0]["state"] == "COMPLETE", "the orphaned server was stopped first"
    finally:
        if proc.poll() is None:
            proc.kill()
