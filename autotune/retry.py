"""Queueing a config again when its trial was cut short for a reason that is not the config's fault (a stop
request, a dead tuner, a lost connection). The new trial carries ``retry_of``; the cut-short one then no longer
counts towards the budget (results.counted)."""
from __future__ import annotations

import logging
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import ROLES

log = logging.getLogger("autotune")


def queue_again(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue ``trial`` again as a new trial: the same parameters with their distributions and the sampler's own
    records of it (a baseline stays the baseline, a starting point a starting point; a grid trial keeps its grid
    point). A trial cut short before it asked for every parameter gets the missing ones from the sampler as usual."""
    attrs: dict[str, Any] = {"retry_of": trial.number}
    attrs.update({k: True for k in ROLES if trial.user_attrs.get(k)})
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions, user_attrs=attrs,
        system_attrs={k: v for k, v in trial.system_attrs.items() if k != "fail_reason"}))


def frozen(trial: optuna.Trial) -> FrozenTrial:
    """The stored record of a running trial."""
    return next(t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.number == trial.number)


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
        queue_again(study, trial)
        log.info("trial %d lost its worker (%s): failed, its config is queued again", trial.number,
                 trial.user_attrs.get("worker", "unknown"))
