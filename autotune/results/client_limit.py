"""When the measuring client, not the config, is the limit: a study stops instead of retrying.

A level fails as ``client_bound`` when the load generator could not keep the server at the level's load (its CPU,
its event loop, the way to the server). That is the machine's condition, not the config's: a config is never given
up on for it (the faster a config, the likelier the client falls behind it, so giving up would steer the search
away from the best configs), and waiting does not cure it. When it persists (``IN_A_ROW`` launches in a row, or the
baseline and its retry, without which nothing can be scored) the study stops, with one line that says what the
client reached, the limit it hit and what to change (the failed level's own detail).
"""
from __future__ import annotations

from optuna.trial import FrozenTrial, TrialState

from autotune import record

REASON = "client_bound"
#: launches in a row that failed client_bound, after which a study stops
IN_A_ROW = 3
#: attempts at the baseline that failed client_bound, after which a study stops
BASELINE_ATTEMPTS = 2


def blames_machine(trial: FrozenTrial) -> bool:
    """Whether ``trial`` failed for the measuring machine (never a reason to give up on its config)."""
    return record.reason_of(trial) == REASON


def verdict(trials: list[FrozenTrial]) -> str | None:
    """The one line to stop the study with when its client cannot keep up, or None to go on."""
    finished = sorted((t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                       and record.TrialRecord.of(t).launched), key=lambda t: t.number)
    baseline = [t for t in finished if record.is_baseline(t)]
    if len(baseline) >= BASELINE_ATTEMPTS and all(blames_machine(t) for t in baseline):
        return _line(baseline, "the baseline")
    streak: list[FrozenTrial] = []
    for t in reversed(finished):
        if not blames_machine(t):
            break
        streak.append(t)
    if len(streak) >= IN_A_ROW:
        return _line(streak[::-1], f"{len(streak)} launches in a row")
    return None


def _line(failed: list[FrozenTrial], what: str) -> str:
    numbers = ", ".join(str(t.number) for t in failed)
    detail = record.TrialRecord.of(failed[-1]).detail or "the client fell behind the server"
    return (f"stopped: the measuring client could not keep up with {what} (trials {numbers}), which says nothing "
            f"about the configs; the last: {detail}")
