"""Whose is it: a trial left RUNNING is an orphan only once the process that ran it is gone (its host, the host's boot,
its pid and start time), never because of the target it names; a study autotune did not create is refused (a study
another autotune is creating this moment is waited for); a command that only reads never creates a table."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import queue, record
from autotune.cli import main
from autotune.errors import UserError
from autotune.owner import Owner, boot_id, start_time
from autotune.record import write
from autotune.storage import load_existing_study, open_storage, refuse_foreign
from tests.test_study import VALID


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


def test_a_study_another_autotune_is_creating_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study without trials or autotune's record may be one another worker created a moment ago: it gets a few
    seconds to carry the record; another program's study without a record is refused once they are over."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    later = threading.Timer(0.5, record.study.describe, (study, "weighted", VALID, "s.toml"))
    later.start()
    assert refuse_foreign(storage, "s", url) is True
    later.join()
    monkeypatch.setattr("autotune.storage.CREATION_WAIT", 0.5)
    optuna.create_study(study_name="t", storage=storage)
    started = time.monotonic()
    with pytest.raises(UserError, match=r"study 't' in sqlite:///.*s\.db was not created by autotune"):
        refuse_foreign(storage, "t", url)
    assert time.monotonic() - started >= 0.5


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
