"""One step of the trial loop, the same for the tuner, the benches and the tests: the confirmations and the adaptive
server queued when their time comes, the trial admitted against the budget of launches, the queue's next config,
one trial run by the objective, and the check that the measuring client keeps up.

The tuner calls it under its admission lock (the objective releases the lock once the trial names its config); a
bench or a test calls it in a loop until it says to stop. Nothing else in autotune admits or runs a trial."""
from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from autotune.results import client_limit
from autotune.run import queue
from autotune.run.budget import admit
from autotune.run.plan import Plan
from autotune.run.progress import Phase
from autotune.run.trial.objective import Objective


@dataclass(frozen=True)
class Step:
    """What one step did: ``verdict`` is the admission's ("run" when a trial ran; "wait" while other workers run
    the last trials; else why the study ends: "budget", "exhausted"), ``trial`` the trial run (None when none ran
    or Optuna handed none back), ``client_bound`` the line to stop the study with when its measuring client cannot
    keep up (None: go on)."""

    verdict: str
    trial: FrozenTrial | None = None
    client_bound: str | None = None


def trial_step(study: optuna.Study, plan: Plan, launches: int, objective: Objective, heartbeats: bool) -> Step:
    """Queue what is due, admit a trial within ``launches`` (``heartbeats``: whether a dead worker's trial can be told
    from a live one, see budget.admit), queue the next config and run one trial with ``objective``."""
    queue.queue_confirmation(study, plan, launches)
    queue.queue_adaptive(study, plan, launches)
    verdict = admit(study, launches, heartbeats)
    if verdict != "run":
        return Step(verdict)
    queue.queue_next(study, plan, launches)
    objective.phase = Phase()
    finished: list[FrozenTrial] = []  # the trial study.optimize ran, as Optuna hands it to its callbacks
    study.optimize(objective, n_trials=1, gc_after_trial=False, callbacks=[lambda _, trial: finished.append(trial)])
    if not finished:
        return Step(verdict)
    if objective.unstored is not None:  # the database takes no more: the caller raises it, nothing more is read
        return Step(verdict, finished[0])
    return Step(verdict, finished[0], client_limit.verdict(study.get_trials(deepcopy=False)))


def run_trials(study: optuna.Study, plan: Plan, launches: int, objective: Objective) -> str:
    """Steps until the study ends, on one worker without heartbeats (a bench, a test); returns why it ended (the
    admission's verdict, or "client_bound")."""
    while True:
        step = trial_step(study, plan, launches, objective, heartbeats=False)
        if step.client_bound is not None:
            return "client_bound"
        if step.verdict != "run":
            return step.verdict
