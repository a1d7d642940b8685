"""Which regions of the space the study has covered: per categorical flag (topk above all), the values a launch
measured.

A region counts as covered only by a measurement. A launch that ran out of memory measured nothing there: the
memory boundary moved below it (feasibility.py), and when it was a coverage or starting-point launch, the model's best
config of the same value below that boundary is launched next (``to_follow``). A launch lost to a one-off failure (a
crash, a start that timed out, a lost connection) leaves its value open too: another config there may run.
"""
from __future__ import annotations

from optuna.trial import FrozenTrial

from autotune.results import tally
from autotune.engines import ArgValue
from autotune.record import TrialRecord
from autotune.search.feasibility import MEMORY_REASONS, Feasibility
from autotune.search.neighbours import valid_configs
from autotune.search.settings import SearchSettings
from autotune.studyfile.space import Space

#: roles whose memory failure is followed at once by a launch of the same value below the boundary
FOLLOWED = ("coverage", "starting_point")


def flags(space: Space) -> dict[str, list[ArgValue]]:
    """The space's categorical flags of more than one value, with their values."""
    return {p.name: p.values() for p in space.params if p.type == "categorical" and len(p.values()) > 1}


def measured(rec: TrialRecord) -> bool:
    """Whether a launch measured its config: it completed, or it was stopped after measuring (pruned, or outside
    the study's constraints); not a launch that failed before it measured anything."""
    return rec.feasible or bool(rec.levels)


def covered(space: Space, trials: list[FrozenTrial], by_measurement: bool = True) -> dict[str, set[ArgValue]]:
    """Per categorical flag, the values a launch measured (``by_measurement`` False: that any launch tried, the
    rule before measurements alone counted)."""
    seen: dict[str, set[ArgValue]] = {name: set() for name in flags(space)}
    for t in tally.launches(trials):
        rec = TrialRecord.of(t)
        if rec.adaptive or (by_measurement and not measured(rec)):
            continue
        for name in seen:
            if name in rec.params:
                seen[name].add(rec.params[name])
    return seen


def uncovered(space: Space, trials: list[FrozenTrial], measured_keys: set[str], feasibility: Feasibility,
              settings: SearchSettings) -> dict[str, list[ArgValue]]:
    """Per categorical flag, its values no launch has measured yet where some unmeasured config may still fit in
    memory."""
    values = flags(space)
    if not values:
        return {}
    seen = covered(space, trials, settings.cover_by == "measurement")
    open_: dict[str, set[ArgValue]] = {name: set() for name in values}
    for params, candidate in valid_configs(space):
        missing = [n for n in values if params.get(n) not in seen[n] and params.get(n) not in open_[n]]
        if missing and candidate.key not in measured_keys and feasibility.probability(
                candidate.args, settings.fit_unknown, settings.boundary) > 0:
            for n in missing:
                open_[n].add(params[n])
    return {n: [v for v in values[n] if v in open_[n]] for n in values if open_[n]}


def to_follow(trials: list[FrozenTrial], gaps: dict[str, list[ArgValue]]) -> dict[str, list[ArgValue]]:
    """Of the values still uncovered (``gaps``), those whose coverage or starting-point launch ran out of memory:
    the model's best config there below the new boundary is due next."""
    out: dict[str, list[ArgValue]] = {}
    for t in tally.launches(trials):
        rec = TrialRecord.of(t)
        if rec.reason not in MEMORY_REASONS or not any(role in rec.roles for role in FOLLOWED):
            continue
        for name, values in gaps.items():
            value = rec.params.get(name)
            if value in values and value not in out.get(name, []):
                out.setdefault(name, []).append(value)
    return out
