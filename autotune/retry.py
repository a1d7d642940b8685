"""Queueing a config again when its trial was cut short for a reason that is not the config's fault (a stop
request, a dead tuner, a lost connection). The new trial carries ``retry_of``; the cut-short one then no longer
counts towards the budget (results.counted)."""
from __future__ import annotations

import logging
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial

log = logging.getLogger("autotune")


def queue_again(study: optuna.Study, number: int, params: dict[str, Any], user_attrs: dict[str, Any]) -> None:
    """Queue trial ``number``'s params as a new trial (a baseline stays the baseline)."""
    attrs: dict[str, Any] = {"retry_of": number}
    if user_attrs.get("baseline"):
        attrs["baseline"] = True
    study.enqueue_trial(params, user_attrs=attrs)


#: reasons that say nothing about the config however often they happen: always retried
ALWAYS_RETRIED = ("interrupted", "baseline_pending")


def should_retry(user_attrs: dict[str, Any], reason: str | None) -> bool:
    """Each config is retried once; a stop request (the user asked) or a missing baseline (the study's order) is
    always worth another try."""
    return "retry_of" not in user_attrs or reason in ALWAYS_RETRIED


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose workers stopped beating (a no-op without heartbeats); the storage's callback queues
    their configs again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def stale_trial_callback(study: optuna.Study, trial: FrozenTrial) -> None:
    """For RDBStorage's heartbeat: a worker died in the middle of ``trial`` (now failed): retry its config once."""
    if should_retry(trial.user_attrs, None):
        queue_again(study, trial.number, trial.params, trial.user_attrs)
        log.info("trial %d lost its worker (%s): failed, its config is queued again", trial.number,
                 trial.user_attrs.get("worker", "unknown"))
