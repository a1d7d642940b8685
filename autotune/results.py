"""Reading a study back: which trials count, why each ended, which is best."""
from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
#: user attrs that say why a config was queued rather than suggested (a retry keeps them)
ROLES = ("baseline", "starting_point")


def retried(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of trials whose config was queued again (their retry counts instead of them)."""
    return {int(t.user_attrs["retry_of"]) for t in trials if "retry_of" in t.user_attrs}


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that use up the budget: finished ones, except those that were retried."""
    again = retried(trials)
    return [t for t in trials if t.state in FINISHED and t.number not in again]


def params(t: FrozenTrial) -> dict[str, Any]:
    """A trial's tuned flags as a user reads them: the values the server ran with (user attr ``params``, set by the
    objective: a draft count SGLang overrides shows as overridden, a fill fraction as the flag value it placed),
    else what the sampler suggested (trials from before that attr existed)."""
    return dict(t.user_attrs.get("params") or t.params)


def reason(t: FrozenTrial) -> str | None:
    """Why a trial did not produce a feasible measurement (None for a feasible COMPLETE trial)."""
    if "reason" in t.user_attrs:
        return str(t.user_attrs["reason"])
    if t.state == TrialState.FAIL:
        return "stale"  # its tuner died in the middle of it
    if t.state == TrialState.RUNNING:
        return None
    return None if feasible(t) else "constraints"


def role(t: FrozenTrial) -> str | None:
    """Why the trial's config was queued, in words ("baseline", "starting point"); None for the sampler's own."""
    return next((r.replace("_", " ") for r in ROLES if t.user_attrs.get(r)), None)


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())


def baseline(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The finished baseline trial (its retry, if the first attempt failed for the infrastructure)."""
    done = [t for t in trials if t.user_attrs.get("baseline") and t.state in FINISHED]
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    return (complete or done or [None])[-1]


def score(t: FrozenTrial, study: optuna.Study) -> float:
    """One number to rank feasible trials by; for pareto studies the gain over the baseline on both axes."""
    if len(t.values) == 1:
        return t.values[0]
    ref = study.user_attrs.get("reference") or {}
    s0, c0 = ref.get("single_tok_s") or 1.0, ref.get("concurrent_tok_s") or 1.0
    return math.sqrt(max(t.values[0], 0.0) / s0 * max(t.values[1], 0.0) / c0)


def best(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible trial (the earliest among equals, so a reused result never displaces its original)."""
    candidates = [t for t in study.get_trials(deepcopy=False) if feasible(t)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (score(t, study), -t.number))


def row(t: FrozenTrial) -> dict[str, Any]:
    """A trial as `status --json` shows it."""
    return {
        "number": t.number,
        "state": t.state.name,
        "params": params(t),
        "value": t.values[0] if t.values and len(t.values) == 1 else None,
        "values": t.values,
        "metrics": t.user_attrs.get("metrics", {}),
        "reason": reason(t),
        "detail": t.user_attrs.get("detail"),
        "stage": t.user_attrs.get("stage"),
        "baseline": bool(t.user_attrs.get("baseline")),
        "starting_point": bool(t.user_attrs.get("starting_point")),
        "config": t.user_attrs.get("config"),
        "target": t.user_attrs.get("target"),
        "worker": t.user_attrs.get("worker"),
        "reused_from": t.user_attrs.get("reused_from"),
        "retry_of": t.user_attrs.get("retry_of"),
        "value_ci": t.user_attrs.get("value_ci"),
        "duration_s": t.duration.total_seconds() if t.duration else None,
        "started": t.datetime_start.isoformat() if t.datetime_start else None,
        "completed": t.datetime_complete.isoformat() if t.datetime_complete else None,
        "timings": t.user_attrs.get("timings", {}),
    }
