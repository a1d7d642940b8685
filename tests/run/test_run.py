"""`autotune run` end to end: the real command line, the real emulator, real HTTP, real SQLite."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.targets.local import port_open
from autotune.testing.studies import port_of, write_study
from tests.support import requires
from tests.support.cli import kept, launches, run_autotune, status
from tests.support.search_study import LAUNCHES, search_study


@pytest.mark.slow
def test_study_beats_the_baseline_and_records_every_trial(tmp_path_factory: pytest.TempPathFactory,
                                                          tmp_path: Path) -> None:
    shared = search_study(tmp_path_factory)   # tests/support/search_study.py: a default study of LAUNCHES launches
    study, r, trials = shared.path, shared.run, shared.trials
    # one line per trial on stdout: number, params, result or failure reason, best so far
    finished = re.findall(r"trial (\d+)(?: \[[a-z ]+\])? (COMPLETE|PRUNED|FAIL): .* -> .* \| best .* \| "
                          rf"(launch \d+/{LAUNCHES}|no launch|retried, no launch counted)\n", r.stdout)
    assert [int(n) for n, _, _ in finished] == list(range(len(trials)))
    assert "Traceback" not in r.stderr
    # the budget counts launches: a trial that reused a measurement or was rejected costs none
    assert launches(trials) == LAUNCHES
    assert [c for _, _, c in finished if c.startswith("launch")] == [f"launch {n}/{LAUNCHES}"
                                                                      for n in range(1, LAUNCHES + 1)]
    assert all(t["launched"] == (t["reused_from"] is None and t["reason"] not in ("invalid_config", "given_up"))
               for t in trials)
    base = next(t for t in kept(trials) if t["baseline"])  # a busy machine may cut its first attempt short
    assert base["state"] == "COMPLETE" and base["value"] == pytest.approx(1.0)
    assert base["params"] == {"speculative-num-steps": 1, "speculative-eagle-topk": 1,
                              "speculative-num-draft-tokens": 2}
    for key in ("single_tok_s", "concurrent_tok_s", "max_running_requests"):
        assert base["metrics"][key] > 0
    for t in trials:
        assert t["state"] in ("COMPLETE", "PRUNED", "FAIL")
        assert t["state"] == "COMPLETE" or t["reason"], t

    best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
    assert best["value"] > 1.0, "the tuner found nothing better than the baseline"
    assert best["command"][0] == "autotune-sim"
    assert "--speculative-num-steps" in best["command"]

    # every deployed trial kept its own server log; the local server is stopped at the end
    deployed = [t for t in trials if t["launched"]]
    logs = study.parent / "t-logs"
    for t in deployed:
        text = (logs / f"trial-{t['number']:04d}.log").read_text()
        assert "The server is fired up and ready to roll!" in text or t["reason"]
    assert not port_open(port_of(study))
    assert (study.parent / "t.db").exists() and (study.parent / "t.log").exists()

    # running again resumes the same study (a copy of it here: other tests read the original): the budget counts
    # across runs and the baseline is not run again
    again = shared.copy(tmp_path)
    r = run_autotune("run", "--study", str(again), "--launches", str(LAUNCHES + 2), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = status(again)["trials"]
    assert launches(trials) == LAUNCHES + 2
    assert sum(t["baseline"] for t in kept(trials)) == 1


GRID_SPACE = """
[space.speculative-num-steps]
type = "int"
low = 1
high = 1
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2]
[space.speculative-num-draft-tokens]
type = "categorical"
choices = [2, 3, 4]
"""


@pytest.mark.slow
def test_invalid_and_duplicate_configs_cost_no_deployment(tmp_path: Path) -> None:
    # steps 1: topk 1 makes every draft count 2 (duplicates of the baseline); topk 2 allows at most 3 draft tokens
    # (a choice no config here can run: an int range reaching 4 would be refused as a whole, a listed choice is not)
    # at twice the model's speed, not ten times: there the client fell behind at c4 now and then, even on an idle
    # machine (25-47% of a 48-token request's time outside the server, 25% allowed)
    study = write_study(tmp_path, sampler="grid", launches=7, space=GRID_SPACE, args={"sim-speedup": 2})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    everything = status(study)["trials"]
    trials = kept(everything)  # an attempt a busy machine cut short as client_bound is queued again: its retry counts
    base = next(t for t in trials if t["baseline"])
    invalid = [t for t in trials if t["reason"] == "invalid_config"]
    assert [t["params"]["speculative-num-draft-tokens"] for t in invalid] == [4]
    assert invalid[0]["state"] == "PRUNED" and "selected index k out of range" in invalid[0]["detail"]
    reused = [t for t in trials if t["reused_from"] is not None]
    assert {t["params"]["speculative-eagle-topk"] for t in reused} == {1}
    assert all(t["reused_from"] == base["number"] for t in reused)
    assert all(t["value"] == base["value"] for t in reused)
    launched = sorted(p.name for p in (tmp_path / "t-logs").glob("trial-*.log"))
    started = [t for t in everything if t["launched"]]
    assert launched == [f"trial-{t['number']:04d}.log" for t in started]
    measured = [t for t in trials if t["launched"]]
    assert len(measured) == 3  # the baseline, topk 2 with 2 and with 3 draft tokens
    # a budget of 7 launches, and a grid that holds only 3 deployable configs: it stops once the grid is done
    assert re.search(r"stopped \(exhausted\): 3/7 launches in \d+ trials", r.stdout)


FAULT_SPACE = """
[space.sim-fault]
type = "categorical"
choices = ["startup-crash", "startup-hang", "warmup-hang"]
"""


@pytest.mark.slow
def test_startup_failures_end_with_named_reasons(tmp_path: Path) -> None:
    study = write_study(tmp_path, sampler="grid", launches=4, space=FAULT_SPACE, health="interval = 0.25\ntimeout = 4")
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    by_fault = {t["params"].get("sim-fault"): t for t in status(study)["trials"]}
    assert by_fault["startup-crash"]["reason"] == "crashed"
    assert by_fault["startup-hang"]["reason"] == "startup_timeout"
    assert by_fault["warmup-hang"]["reason"] == "startup_timeout"
    for fault in ("startup-crash", "startup-hang", "warmup-hang"):
        assert by_fault[fault]["state"] == "PRUNED", "a config that cannot start is infeasible, not retried"


@pytest.mark.parametrize("space, reason", [
    ('[space.mem-fraction-static]\ntype = "categorical"\nchoices = [0.3]\n', "oom_startup"),
    pytest.param('[space.speculative-eagle-topk]\ntype = "categorical"\nchoices = [8]\n'
                 '[space.speculative-num-steps]\ntype = "categorical"\nchoices = [8]\n'
                 '[space.speculative-num-draft-tokens]\ntype = "categorical"\nchoices = [64]\n', "oom_startup",
                 marks=pytest.mark.slow),   # the same reason as the first, through CUDA graph memory
    # an unknown flag: refused by the engine on the target when asked, before any launch
    ('[space.not-a-real-flag]\ntype = "categorical"\nchoices = ["x"]\n', "host_rejected"),
])
def test_out_of_memory_and_rejected_arguments(tmp_path: Path, space: str, reason: str) -> None:
    study = write_study(tmp_path, sampler="grid", launches=2, space=space)
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = status(study)["trials"]
    assert trials[0]["state"] == "COMPLETE"  # the baseline runs the fixed args only
    assert trials[1]["reason"] == reason and trials[1]["state"] == "PRUNED", trials[1]
    assert trials[1]["detail"]


@pytest.mark.slow
def test_sigkill_mid_trial_then_resume_loses_nothing(tmp_path: Path) -> None:
    # at twice the model's speed (see above): a client_bound retry before trial 2 would shift the trial it kills
    study = write_study(tmp_path, launches=5, args={"sim-time-scale": 0.02, "sim-speedup": 2})
    log = tmp_path / "t.log"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and "trial 2 deploy" in log.read_text():
                break
            assert proc.poll() is None, "the tuner ended early"
            time.sleep(0.05)
        else:
            pytest.fail("trial 2 never started")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()

    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "trial 2 was left running by a stopped tuner: failed, its config is queued again" in r.stdout
    trials = status(study)["trials"]
    assert not [t for t in trials if t["state"] == "RUNNING"]
    assert trials[2]["state"] == "FAIL" and trials[2]["reason"] == "stale"
    retries = [t for t in trials if t["retry_of"] == 2]
    assert len(retries) == 1 and retries[0]["params"] == trials[2]["params"]
    # measured, or (each config is retried once) cut short again by a busy machine, which is not the config's fault
    assert retries[0]["state"] in ("COMPLETE", "PRUNED") or retries[0]["reason"] == "client_bound", retries[0]
    counted = [t for t in kept(trials) if t["state"] != "RUNNING"]
    assert len(counted) == 5, "the budget counts finished trials, the retried ones excluded"
    assert not port_open(port_of(study)), "the orphaned server and the last one were stopped"


@pytest.mark.slow
def test_apply_deploys_the_best_or_a_chosen_trial_and_waits_until_healthy(tmp_path: Path) -> None:
    import httpx

    space = GRID_SPACE.replace("choices = [1, 2]", "choices = [2]").replace("low = 2\nhigh = 4", "low = 2\nhigh = 3")
    study = write_study(tmp_path, launches=3, sampler="grid", space=space)
    assert run_autotune("run", "--study", str(study), cwd=tmp_path).returncode == 0
    port = port_of(study)
    best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
    try:
        r = run_autotune("apply", "--study", str(study), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"trial {best['number']} deployed and healthy" in r.stdout
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert info["speculative_num_draft_tokens"] == best["params"]["speculative-num-draft-tokens"]

        r = run_autotune("apply", "--study", str(study), "--trial", "0", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert (info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (1, 2)

        r = run_autotune("apply", "--study", str(study), "--trial", "9", cwd=tmp_path)
        assert r.returncode == 2 and "has no trial 9" in r.stderr
    finally:
        subprocess.run(["pkill", "-f", "--", f"--port {port}"], check=False)


@pytest.mark.slow
def test_gp_sampler_runs_a_study_when_installed(tmp_path: Path) -> None:
    """sampler = "gp" (the optional [gp] extra): Optuna's GPSampler proposes the configs after the startup trials."""
    requires.torch()
    study = write_study(tmp_path, launches=8, sampler="gp")
    study.write_text(study.read_text().replace('sampler = "gp"', 'sampler = "gp"\nstartup_trials = 3'))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trials = status(study)["trials"]
    assert [t["state"] for t in trials].count("FAIL") == 0 and len(trials) == 8
    model_based = [t for t in trials[3:] if t["reused_from"] is None]
    assert model_based, "the GP proposed no new config after its startup trials"
    assert not port_open(port_of(study))
