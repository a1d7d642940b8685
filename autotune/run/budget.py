"""The study's budget of launches (servers started), shared by every worker of the study.

A trial is admitted only while launches + running trials < budget, and the check and the creation of the trial happen
under a lock every worker of the study takes, so several workers meet the budget exactly (a running trial that turns
out to reuse a measurement gives its place back when it ends). The lock
dies with its holder: a PostgreSQL advisory lock on its own connection, or an flock beside a SQLite database.
"""
from __future__ import annotations

import fcntl
import logging
import os
import zlib
from pathlib import Path
from types import TracebackType

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from autotune import record
from autotune.results import tally

log = logging.getLogger("autotune")

#: this many trials in a row without a launch (every proposal measured or rejected already): the space is exhausted
IDLE_TRIALS = 50


class AdmissionLock:
    """Held from the budget check until the new trial exists in storage and names its config."""

    def __init__(self, storage: optuna.storages.RDBStorage, url: str, study_name: str) -> None:
        self._key = zlib.crc32(f"autotune:{study_name}".encode()) & 0x7FFFFFFF
        self._engine = storage.engine if url.startswith("postgresql") else None
        self._path = Path(url[len("sqlite:///"):] + ".admission.lock") if url.startswith("sqlite:///") else None
        self._held: object | None = None

    def acquire(self) -> None:
        if self._engine is not None:
            conn = self._engine.connect()
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            self._held = conn
        elif self._path is not None:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held = fd

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        if isinstance(held, int):
            os.close(held)  # closing the descriptor drops the flock
        else:
            held.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            held.close()

    def __enter__(self) -> AdmissionLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def exhausted(study: optuna.Study, trials: list[FrozenTrial]) -> str | None:
    """Why the search has nothing left to try (None: it has): the grid is done, or the sampler has proposed only
    configs measured or rejected already for a while (counted since the space last changed: a widened space is
    searched)."""
    if isinstance(study.sampler, optuna.samplers.GridSampler) and study.sampler.is_exhausted(study):
        return "every config of the grid was tried"
    if tally.since_launch(trials, record.study.space(study)[1]) >= IDLE_TRIALS:
        return (f"the last {IDLE_TRIALS} trials measured no new config (every config they proposed was measured or "
                "rejected already): the space looks exhausted")
    return None


def standing(study: optuna.Study) -> tuple[int, int]:
    """(launches so far, trials running now) in the study, all workers together."""
    trials = study.get_trials(deepcopy=False)
    again = tally.retried(trials)
    running = sum(1 for t in trials if t.state == TrialState.RUNNING and t.number not in again)
    return len(tally.launches(trials)), running


def admit(study: optuna.Study, budget: int, heartbeats: bool) -> str:
    """Whether the study may start another trial (call it under the admission lock): "run"; "wait" while other
    workers run the last ones (one of them may die and its config come back: only with ``heartbeats``, without which
    a dead worker's trial cannot be told from a live one); or why to stop: "budget", "exhausted" (the grid is done,
    or the sampler proposes only configs measured or rejected already, and no config waits in the queue)."""
    done, running = standing(study)
    if done >= budget:
        return "budget"
    trials = study.get_trials(deepcopy=False)
    waiting = any(t.state == TrialState.WAITING for t in trials)
    why = None if waiting else exhausted(study, trials)
    if why is not None:
        log.info("%s", why)
        return "exhausted"
    if done + running < budget:
        return "run"
    return "wait" if heartbeats else "budget"
