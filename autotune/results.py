"""Reading a study back: which trials count against the budget, which is the baseline, which is the best."""
from __future__ import annotations

import math

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import record
from autotune.record import TrialRecord

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def retried(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of trials whose config was queued again (their retry counts instead of them)."""
    return {n for n in (record.retry_of(t) for t in trials) if n is not None}


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that use up the budget: finished ones, except those that were retried."""
    again = retried(trials)
    return [t for t in trials if t.state in FINISHED and t.number not in again]


def feasible(t: FrozenTrial) -> bool:
    return TrialRecord.of(t).feasible


def baseline(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The finished baseline trial (its retry, if the first attempt failed for the infrastructure)."""
    done = [t for t in trials if record.is_baseline(t) and t.state in FINISHED]
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    return (complete or done or [None])[-1]


def score(t: FrozenTrial, study: optuna.Study) -> float:
    """One number to rank feasible trials by; for pareto studies the gain over the baseline on both axes."""
    if len(t.values) == 1:
        return t.values[0]
    ref = record.reference(study) or {}
    s0, c0 = ref.get("single_tok_s") or 1.0, ref.get("concurrent_tok_s") or 1.0
    return math.sqrt(max(t.values[0], 0.0) / s0 * max(t.values[1], 0.0) / c0)


def best(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible trial (the earliest among equals, so a reused result never displaces its original)."""
    candidates = [t for t in study.get_trials(deepcopy=False) if feasible(t)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (score(t, study), -t.number))
