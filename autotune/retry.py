"""Queueing a config again when its trial was cut short for a reason that is not the config's fault (a stop
request, a dead tuner, a lost connection). The new trial carries ``retry_of``; the cut-short one then no longer
counts towards the budget (results.launches)."""
from __future__ import annotations

import logging
import warnings

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import record

log = logging.getLogger("autotune")

#: reasons that say nothing about the config however often they happen: always retried
ALWAYS_RETRIED = ("interrupted", "baseline_pending")


def frozen(trial: optuna.Trial) -> FrozenTrial:
    """The stored record of a running trial."""
    return next(t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.number == trial.number)


def should_retry(trial: optuna.Trial | FrozenTrial, reason: str | None) -> bool:
    """Each config is retried once; a stop request (the user asked) or a missing baseline (the study's order) is
    always worth another try."""
    return record.retry_of(trial) is None or reason in ALWAYS_RETRIED


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose workers stopped beating (a no-op without heartbeats); the storage's callback queues
    their configs again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def stale_trial_callback(study: optuna.Study, trial: FrozenTrial) -> None:
    """For RDBStorage's heartbeat: a worker died in the middle of ``trial`` (now failed): retry its config once."""
    if should_retry(trial, None):
        record.requeue(study, trial)
        log.info("trial %d lost its worker (%s): failed, its config is queued again", trial.number,
                 record.TrialRecord.of(trial).worker or "unknown")
