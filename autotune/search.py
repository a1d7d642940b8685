"""The configs the tuner queues itself, beside the sampler's proposals.

* The opening: a new study's starting points (or a warm start's configs), one at a time whenever the queue is empty,
  so that a config queued again after a failure that was not its fault runs next, not behind all of them.
* Neighbours of the leader (model-based samplers only). After the startup launches (the baseline, the engine's
  starting points, the sampler's first draws), each launch measures an unmeasured neighbour of the config with the
  best pooled estimate or of its close rivals (configs whose 95% intervals overlap it: noise may have put the wrong
  one first): one tuned flag moved one place along its values (a wide range by an eighth of it; a flag whose valid
  range depends on others, like draft tokens, inside that range, and kept at the same place in it when another
  flag's move changes the range). Steps and topk are ordered and neighbouring configs behave alike, so the optimum
  is usually next to the incumbent. Which neighbour comes first is the local model's call (local_model.py: a small
  Gaussian process over every config measured so far ranks them by its optimistic value), at random while it has
  too few points. When no neighbour is left, the sampler proposes, so the search leaves a local optimum for the
  regions its model favours. Chosen by measurement (scripts/bench_sample_efficiency.py over five emulator
  profiles): a neighbour at every launch against every other launch or none, 6 startup launches against 4 and 8,
  rivals' neighbours against none, the model's order against a random one (llama8b weighted within 2% by launch
  10.5 instead of more than 15 in 30 surrogate seeds; no row later); a pattern move (one more step the way the
  leader's own move went) was no better and is not kept.
* Confirmations. The last launches of the budget re-measure the leader and its close rivals (configs whose 95%
  intervals overlap the leader's), each once, so that the pick rests on more than one lucky measurement; every
  config's estimate pools all its launches (results.estimates).
"""
from __future__ import annotations

import math
import random

import optuna
from optuna.trial import TrialState

from autotune import local_model, record, results
from autotune.engines import ArgValue
from autotune.errors import InvalidConfig
from autotune.plan import Plan
from autotune.record import Queued, TrialRecord
from autotune.sampling import MODEL_BASED
from autotune.space import Space, values_inside
from autotune.study import ParamSpec

#: after the startup launches, one launch in this many is a neighbour of the leader (0: none; 1: every launch)
NEIGHBOUR_EVERY = 1
#: when the leader has no unmeasured neighbour left, measure its close rivals' neighbours before the sampler proposes
RIVALS_NEIGHBOURS = True
#: the most launches kept back at the end of the budget to confirm the leader and its close rivals
CONFIRM_AT_MOST = 3
#: a flag's values are stepped through in strides of this fraction of them (at least one place)
STRIDE = 1 / 8


def confirm_reserve(budget: int) -> int:
    """Launches kept for confirmations: none in a very short study."""
    return min(CONFIRM_AT_MOST, budget // 6)


def propose(study: optuna.Study, plan: Plan, budget: int, startup: int, seed: int | None = None) -> Queued | None:
    """What to queue before the sampler's next proposal (None: let the sampler propose). ``startup``: launches before
    the local search starts (the sampler's startup trials)."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return None
    opening = record.next_opening(study, trials)
    if opening is not None or len(study.directions) > 1:
        return opening
    launched = results.launches(trials)
    running = sum(1 for t in trials if t.state == TrialState.RUNNING)
    left = budget - len(launched) - running
    # only configs whose trial names every tuned flag can be queued again exactly (a baseline whose fixed args
    # leave a tuned flag unset cannot: the sampler would fill it in)
    names = set(plan.space.names)
    found = {k: e for k, e in results.estimates(study).items()
             if names <= set(TrialRecord.of(trials[e.trials[0]]).params)}
    leader = results.top(found)
    if left <= 0 or leader is None:
        return None
    if left <= confirm_reserve(budget):
        return _confirmation(trials, leader, found)
    if plan.spec.sampler not in MODEL_BASED or not NEIGHBOUR_EVERY:
        return None  # random search and the grid stay what they say they are
    done = sorted((TrialRecord.of(t) for t in launched), key=lambda r: r.number)
    since = NEIGHBOUR_EVERY - 1
    recent = done[startup:][-since:] if since else []
    if len(done) < startup or any(r.role == "neighbour" for r in recent):
        return None
    measured = _measured_keys(trials)
    rng = random.Random(None if seed is None else seed * 7919 + len(done))
    points = _points(plan.space, trials, found)
    rivals = _rivals(leader, found) if RIVALS_NEIGHBOURS else []
    around = [TrialRecord.of(trials[e.trials[0]]).params for e in (leader, *rivals)]
    return _neighbour(plan.space, around, measured, points, rng)


def _rivals(leader: results.Estimate, found: dict[str, results.Estimate]) -> list[results.Estimate]:
    """The leader's close rivals, best first: configs whose 95% intervals overlap the leader's."""
    return sorted((e for e in found.values() if e is not leader and e.overlaps(leader)), key=lambda e: -e.value)


def _confirmation(trials: list[optuna.trial.FrozenTrial], leader: results.Estimate,
                  found: dict[str, results.Estimate]) -> Queued | None:
    given_up = results.given_up(trials)
    for estimate in (leader, *_rivals(leader, found)):
        if estimate.launches == 1 and estimate.key not in given_up:  # the same parameters as that trial's, again
            return Queued(dict(trials[estimate.trials[0]].params), "confirmation")
    return None


def _measured_keys(trials: list[optuna.trial.FrozenTrial]) -> set[str]:
    """Config keys a trial already measured or saw fail (proposing them again would only reuse that result), or
    that were given up on."""
    keys: set[str] = set()
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING):
            keys.update(k for k in record.config_keys(t) if k)
    return keys | results.given_up(trials).keys()


def _points(space: Space, trials: list[optuna.trial.FrozenTrial],
            found: dict[str, results.Estimate]) -> list[local_model.Point]:
    """What the local model learns from: every measured config's pooled estimate, and every config a launch found
    infeasible or stopped early (failures of the infrastructure are not the config's and are left out)."""
    points = []
    for e in found.values():
        params = TrialRecord.of(trials[e.trials[0]]).params
        if e.value > 0:
            points.append(local_model.Point(_places(space, params), math.log(e.value), e.relative_sd))
    for t in results.launches(trials):
        rec = TrialRecord.of(t)
        if t.state == TrialState.FAIL or rec.feasible or rec.config_key in found:
            continue
        if set(space.names) <= set(rec.params):
            points.append(local_model.Point(_places(space, rec.params)))
    return points


def _places(space: Space, params: dict[str, ArgValue]) -> tuple[float, ...]:
    """A config's coordinates for the local model: each tuned flag's place among the values it may take there."""
    out = []
    for p in space.params:
        values = _values(space, p, params)
        here = _index(values, params.get(p.name))
        out.append(0.5 if here is None or len(values) < 2 else here / (len(values) - 1))
    return tuple(out)


def _neighbour(space: Space, around: list[dict[str, ArgValue]], measured: set[str], points: list[local_model.Point],
               rng: random.Random) -> Queued | None:
    """The most promising unmeasured config one stride in one flag from any config of ``around`` (the leader and its
    close rivals), by the local model; while the model has too few points, a random neighbour of the first one that
    has any. None when every neighbour is measured."""
    options: list[tuple[dict[str, ArgValue], str]] = []
    for params in around:
        options += _moves(space, params, measured | {k for _, k in options})
        if options and not local_model.informed(points):
            break
    if not options:
        return None
    rng.shuffle(options)
    unordered = [not _ordered(p.values()) if p.type == "categorical" else False for p in space.params]
    order = local_model.rank(points, [_places(space, moved) for moved, _ in options], unordered)
    return Queued(space.internal(options[order[0]][0]), "neighbour")


def _moves(space: Space, params: dict[str, ArgValue], measured: set[str]) -> list[tuple[dict[str, ArgValue], str]]:
    """The unmeasured configs one stride from ``params`` in one flag, with their keys."""
    options: list[tuple[dict[str, ArgValue], str]] = []
    for p in space.params:
        if p.name not in params:
            continue
        for value in _adjacent(space, p, params):
            moved = _refit(space, params, {**params, p.name: value})
            if not all(q.contains(moved[q.name]) for q in space.params if q.name not in space.dependent):
                continue  # a value the sampler could not suggest (a chain's forced draft count, say)
            try:
                key = space.candidate(moved).key
            except InvalidConfig:
                continue
            if key not in measured and key not in {k for _, k in options}:
                options.append((moved, key))
    return options


def _refit(space: Space, before: dict[str, ArgValue], moved: dict[str, ArgValue]) -> dict[str, ArgValue]:
    """``moved`` with each dependent flag whose valid range the move changed kept at the same place in its range (a
    flag that had no choice before, like draft tokens on a chain, goes halfway into the new range, as the engine's
    starting points place it): widening a tree keeps its fill instead of leaving it at the old draft count."""
    out = dict(moved)
    for name in space.dependent:
        if name not in before or name in (set(moved) - set(before)):
            continue
        p = next(q for q in space.params if q.name == name)
        old, new = _values(space, p, before), _values(space, p, moved)
        if old == new or not new:
            continue
        place = old.index(before[name]) / (len(old) - 1) if before[name] in old and len(old) > 1 else 0.5
        out[name] = new[round(place * (len(new) - 1))]
    return out


def _adjacent(space: Space, p: ParamSpec, params: dict[str, ArgValue]) -> list[ArgValue]:
    """The values one stride below and above ``params[p.name]`` among the values ``p`` may take there."""
    values = _values(space, p, params)
    current = params[p.name]
    here = _index(values, current)
    if here is None:
        return []
    stride = max(1, round(len(values) * STRIDE))
    return [values[i] for i in (here - stride, here + stride) if 0 <= i < len(values) and values[i] != current]


def _index(values: list[ArgValue], current: ArgValue | None) -> int | None:
    """Where ``current`` lies among ``values`` (the nearest of ordered ones); None if it is not there."""
    if not values or current is None:
        return None
    if isinstance(values, range):  # by arithmetic: a range may hold billions of values
        return min(len(values) - 1, max(0, round((_num(current) - values.start) / values.step)))
    if _ordered(values):
        return min(range(len(values)), key=lambda i: abs(_num(values[i]) - _num(current)))
    return next((i for i, v in enumerate(values) if v == current), None)


def _values(space: Space, p: ParamSpec, params: dict[str, ArgValue]) -> list[ArgValue]:
    """The values of ``p`` in order; a dependent flag's only those the engine accepts given the others."""
    if p.type == "float" and not p.step:
        lo, hi = float(p.low), float(p.high)  # type: ignore[arg-type]
        return [lo + (hi - lo) * i / 16 for i in range(17)]
    if p.name in space.dependent:
        valid = space.engine.valid_range(p.name, {**space.fixed, **params})
        if valid.irrelevant:
            return []
        return values_inside(p, valid) or []
    values = p.values()
    if p.type == "categorical" and _ordered(values):
        values = sorted(values, key=_num)
    return values


def _ordered(values: list[ArgValue]) -> bool:
    """Numbers (a categorical of numbers is ordered too); strings and booleans are not."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _num(value: ArgValue) -> float:
    return float(value)  # type: ignore[arg-type]
