"""Several targets, one study, workers sharing a real PostgreSQL server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.testing import postgres
from autotune.testing.studies import write_multi
from tests.support import requires
from tests.support.cli import kept, launches, run_autotune, status

#: servers up in 0.1 s, tokens at four times the model's speed: three workers' clients keep up on two cores
FAST = {"time_scale": 0.001, "speedup": 4}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    url = os.environ.get(postgres.ENV)
    if url:
        yield url
        return
    requires.postgres_initdb()
    root = postgres.new_root()
    yield postgres.start(root)
    postgres.stop(root)


@pytest.fixture
def database(postgres_server: str) -> str:
    return postgres.new_database(postgres_server)


def load(storage: str) -> optuna.Study:
    return optuna.load_study(study_name="multi", storage=storage)


@pytest.mark.slow
def test_three_workers_share_one_study_exactly(tmp_path: Path, database: str) -> None:
    study, _ = write_multi(tmp_path, database, ["a", "b", "c"], launches=10, **FAST)
    r = run_autotune("run", "--study", str(study), "--all-targets", cwd=tmp_path, timeout=600)
    errors = [line for line in r.stdout.splitlines() if "error" in line.lower()]
    assert r.returncode == 0, "\n".join(errors[-20:]) + "\n...\n" + r.stdout[-2000:] + r.stderr
    for name in ("a", "b", "c"):
        assert f"[{name}] " in r.stdout and "stopped (budget)" in r.stdout

    rows = status(study)["trials"]
    assert launches(rows) == 10, "the budget of launches is met exactly, across workers"
    assert not [t for t in rows if t["state"] in ("RUNNING", "WAITING")]
    assert {t["target"] for t in rows} == {"a", "b", "c"}, "every worker contributed"
    # one baseline, however many workers (a busy machine may cut its first attempt short: then it counts its retry)
    assert sum(t["baseline"] for t in kept(rows)) == 1

    # no effective config was ever deployed by two workers at the same time
    trials = load(database).get_trials()
    deployed = [t for t in trials if "command" in t.user_attrs and "reused_from" not in t.user_attrs]
    for i, a in enumerate(deployed):
        for b in deployed[i + 1:]:
            if a.user_attrs["config_key"] == b.user_attrs["config_key"]:
                assert a.datetime_complete <= b.datetime_start or b.datetime_complete <= a.datetime_start


@pytest.mark.slow
def test_a_killed_worker_has_its_trial_retried_by_another(tmp_path: Path, database: str) -> None:
    study, ports = write_multi(tmp_path, database, ["a", "b"], launches=6, **FAST)
    workers = {name: subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study), "--target",
                                       name], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for name in ("a", "b")}
    try:
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:
            try:
                running = load(database).get_trials(states=(optuna.trial.TrialState.RUNNING,))
            except KeyError:
                running = []
            victim = next((t.number for t in running if t.user_attrs.get("target") == "a"
                           and "command" in t.user_attrs), None)
            time.sleep(0.1)
        assert victim is not None, "worker a never deployed a trial"
        os.kill(workers["a"].pid, signal.SIGKILL)
        workers["a"].wait()
        assert workers["b"].wait(timeout=300) == 0, workers["b"].stderr.read().decode()[-2000:]
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
        subprocess.run(["pkill", "-f", "--", f"--port {ports['a']}"], check=False)  # worker a's orphaned server

    rows = status(study)["trials"]
    dead = rows[victim]
    assert dead["state"] == "FAIL" and dead["target"] == "a"
    retry = [t for t in rows if t["retry_of"] == victim]
    assert len(retry) == 1 and retry[0]["target"] == "b" and retry[0]["params"] == dead["params"]
    assert retry[0]["state"] in ("COMPLETE", "PRUNED")
    assert launches(rows) == 6
    assert not [t for t in rows if t["state"] in ("RUNNING", "WAITING")]
