"""Whose is it: a trial left RUNNING is an orphan only once the process that ran it is gone (its host, the host's boot,
its pid and start time), never because of the target it names; a study autotune did not create is refused (a study
another autotune is creating this moment is waited for); a command that only reads never creates a table."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.run import queue
from autotune import record
from autotune.cli import main
from autotune.errors import UserError
from autotune.record.owner import Owner, boot_id, start_time
from autotune.record import write
from autotune.record.storage import load_existing_study, open_storage, refuse_foreign
from tests.support.study_texts import VALID


def running(study: optuna.Study, target: str | None, owner: Owner | None, worker: str = "w") -> int:
    """A RUNNING trial (of steps 2) as a worker writes it; ``owner`` as stored (None: an older autotune's)."""
    trial = study.ask({"speculative-num-steps": optuna.distributions.IntDistribution(1, 8)})
    if target is not None:
        trial.set_user_attr("target", target)
        trial.set_user_attr("worker", worker)
    if owner is not None:
        trial.set_user_attr("owner", owner.as_attr())
    return trial.number


def test_a_trial_is_an_orphan_once_its_process_is_gone_whatever_target_it_names() -> None:
    here = Owner.this()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = start_time(dead.pid)
    dead.wait()
    study = optuna.create_study(direction="maximize")
    try:
        live_owner = Owner(here.host, here.boot, live.pid, start_time(live.pid))
        trials = {
            # another `autotune run` on this host, alive, same target name: its trial
            "live, same target": running(study, "default", live_owner),
            # another machine's worker with the same target name: the heartbeat's business
            "another host, same target": running(study, "default", Owner("gpu-elsewhere", "b", 1, "1")),
            "exited": running(study, "default", Owner(here.host, here.boot, dead.pid, dead_start)),
            "pid reused since": running(study, "other", Owner(here.host, here.boot, live.pid, "1")),
            "host rebooted since": running(study, "other", Owner(here.host, "an-older-boot", live.pid,
                                                                 start_time(live.pid))),
            "no process named yet": running(study, None, None),
            "older autotune, this target": running(study, "default", None),
            "older autotune, another target": running(study, "gpu2", None),
        }
        queue.sweep(study, "default")
    finally:
        live.kill()
        live.wait()
    states = {name: study.trials[n].state for name, n in trials.items()}
    kept = {name for name, state in states.items() if state == TrialState.RUNNING}
    assert kept == {"live, same target", "another host, same target", "older autotune, another target"}, states
    retries = {record.retry_of(t) for t in study.trials if t.state == TrialState.WAITING}
    assert retries == {n for name, n in trials.items() if name not in kept}


def test_a_worker_names_its_process_on_its_trial() -> None:
    study = optuna.create_study()
    trial = study.ask()
    write.started(trial, "gpu1", "host:1")
    stored = record.owner_of(study.trials[0])
    assert stored == Owner.this()
    assert stored.gone() is True  # this very process: it runs one tuner, which has no trial left running
    assert stored.boot == boot_id() and stored.start == start_time(stored.pid)


def test_a_study_whose_creation_was_cut_short_is_autotunes_another_programs_is_refused(tmp_path: Path) -> None:
    """Creating a study and recording it as autotune's are two writes: a study with no trial, no attribute and
    maximized objectives is one an autotune was creating when it was killed (or is creating now), and is taken as
    autotune's; a study with a trial or an attribute of another program's, or one it minimizes, is refused."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    optuna.create_study(study_name="cut", storage=storage, direction="maximize")
    assert refuse_foreign(storage, "cut", url) is True
    optuna.create_study(study_name="minimized", storage=storage)
    optuna.create_study(study_name="attrs", storage=storage, direction="maximize").set_user_attr("tool", "x")
    optuna.create_study(study_name="trials", storage=storage, direction="maximize").ask()
    for name in ("minimized", "attrs", "trials"):
        with pytest.raises(UserError, match=rf"study '{name}' in sqlite:///.*s\.db was not created by autotune"):
            refuse_foreign(storage, name, url)


def test_a_run_resumes_a_study_whose_creation_was_cut_short(tmp_path: Path) -> None:
    """An earlier run was killed between creating the study and recording it as autotune's: the next run records it
    (its objective, its study file) and queues its baseline."""
    from autotune.run.plan import make_plan
    from autotune.studyfile.spec import read_study_file
    from autotune.run.tuner import RunOptions, Tuner

    study_file = tmp_path / "s.toml"
    study_file.write_text(VALID)
    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="s", storage=url, direction="maximize")
    tuner = Tuner(make_plan(read_study_file(str(study_file))), RunOptions())
    tuner.storage = open_storage(url)
    study = tuner._open_study()
    assert record.study.is_autotunes(study) and record.study.objective(study) == "weighted"
    assert [t.state for t in study.trials] == [TrialState.WAITING]  # the baseline, queued


def test_a_study_an_older_autotune_created_is_still_its_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for key, value in (("objective", "weighted"), ("study_file", VALID), ("study_path", "s.toml")):
        study.set_user_attr(key, value)
    study.ask()
    assert load_existing_study("s", url).study_name == "s"


@pytest.mark.parametrize("command", [("status",), ("best",), ("report", "--out", "r"), ("check",), ("apply",),
                                     ("dashboard",)])
def test_a_command_that_reads_creates_no_table_in_a_database_it_is_pointed_at(
        tmp_path: Path, command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An empty database, and one of another program's: neither gets a table (or a byte) from a command that reads."""
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "s.toml"
    study.write_text(VALID)
    empty, other = tmp_path / "empty.db", tmp_path / "other.db"
    sqlite3.connect(empty).close()
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE invoices (id INTEGER)")
    before = {p: p.read_bytes() for p in (empty, other)}
    for db in (empty, other):
        monkeypatch.setattr(sys, "argv", ["autotune", command[0], "--study", str(study), *command[1:], "--storage",
                                          f"sqlite:///{db}"])
        umask, hooks = os.umask(0o022), (sys.excepthook, threading.excepthook)
        try:
            with pytest.raises(SystemExit) as exit_status:
                main()
        finally:
            os.umask(umask)
            sys.excepthook, threading.excepthook = hooks
        assert exit_status.value.code == 2
        assert "holds no Optuna tables" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (empty, other)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "other.db", "s.toml"]
