"""The tuner's own proposals beside the sampler's, once a study's opening is measured.

* Neighbours of the leader (model-based samplers only). After the startup launches (the baseline, the engine's
  starting points, the sampler's first draws), each launch measures an unmeasured neighbour (neighbours.py) of the
  config with the best pooled estimate or of its close rivals (configs whose 95% intervals overlap it: noise may
  have put the wrong one first). Steps and topk are ordered and neighbouring configs behave alike, so the optimum
  is usually next to the incumbent. Which neighbour comes first is the local model's call (local_model.py: a small
  Gaussian process over every config measured so far ranks them by its optimistic value), at random while it has
  too few points. When no neighbour is left, the sampler proposes, so the search leaves a local optimum for the
  regions its model favours. Chosen by measurement (scripts/bench_sample_efficiency.py; README, "Choosing the
  sampler"): a neighbour at every launch against every other launch or none, 6 startup launches against 4 and 8,
  rivals' neighbours against none, the model's order against a random one; a pattern move (one more step the way
  the leader's own move went) was no better and is not kept.
* Confirmations. The last launches of the budget re-measure the leader and its close rivals, each once, so that the
  pick rests on more than one lucky measurement; every config's estimate pools all its launches
  (results.estimates).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import record, results
from autotune.engines import ArgValue
from autotune.record import TrialRecord
from autotune.search.local_model import Point, informed, rank
from autotune.search.neighbours import moves, places, unordered
from autotune.search.sampling import MODEL_BASED
from autotune.search.settings import SearchSettings
from autotune.space import Space

if TYPE_CHECKING:
    from autotune.plan import Plan


@dataclass(frozen=True)
class Proposal:
    """A config the tuner queues itself: its parameters (as the sampler gives them), why (one of record.ROLES), and
    where it came from (a warm start's "study OLD, trial N")."""

    params: dict[str, ArgValue]
    role: str
    origin: str | None = None


def propose(study: optuna.Study, trials: list[FrozenTrial], plan: Plan, budget: int, seed: int | None = None
            ) -> Proposal | None:
    """A neighbour or a confirmation to measure next (None: let the sampler propose). ``trials``: the study's."""
    settings = plan.search
    launched = results.launches(trials)
    running = sum(1 for t in trials if t.state == TrialState.RUNNING)
    left = budget - len(launched) - running
    # only configs whose trial names every tuned flag can be queued again exactly (a baseline whose fixed args
    # leave a tuned flag unset cannot: the sampler would fill it in)
    names = set(plan.space.names)
    found = {k: e for k, e in results.estimates(study, trials).items()
             if names <= set(TrialRecord.of(trials[e.trials[0]]).params)}
    leader = results.top(found)
    if left <= 0 or leader is None:
        return None
    if left <= settings.confirm_reserve(budget):
        return _confirmation(trials, leader, found)
    if plan.spec.sampler not in MODEL_BASED or not settings.neighbour_every:
        return None  # random search and the grid stay what they say they are
    done = sorted((TrialRecord.of(t) for t in launched), key=lambda r: r.number)
    since = settings.neighbour_every - 1
    recent = done[plan.startup:][-since:] if since else []
    if len(done) < plan.startup or any(r.role == "neighbour" for r in recent):
        return None
    measured = _measured_keys(trials)
    rng = random.Random(None if seed is None else seed * 7919 + len(done))
    points = _points(plan.space, trials, found)
    rivals = _rivals(leader, found) if settings.rivals_neighbours else []
    around = [TrialRecord.of(trials[e.trials[0]]).params for e in (leader, *rivals)]
    return _neighbour(plan.space, settings, around, measured, points, rng)


def _rivals(leader: results.Estimate, found: dict[str, results.Estimate]) -> list[results.Estimate]:
    """The leader's close rivals, best first: configs whose 95% intervals overlap the leader's."""
    return sorted((e for e in found.values() if e is not leader and e.overlaps(leader)), key=lambda e: -e.value)


def _confirmation(trials: list[FrozenTrial], leader: results.Estimate,
                  found: dict[str, results.Estimate]) -> Proposal | None:
    given_up = results.given_up(trials)
    for estimate in (leader, *_rivals(leader, found)):
        if estimate.launches == 1 and estimate.key not in given_up:  # the same parameters as that trial's, again
            return Proposal(dict(trials[estimate.trials[0]].params), "confirmation")
    return None


def _measured_keys(trials: list[FrozenTrial]) -> set[str]:
    """Config keys a trial already measured or saw fail (proposing them again would only reuse that result), or
    that were given up on."""
    keys: set[str] = set()
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING):
            keys.update(k for k in record.config_keys(t) if k)
    return keys | results.given_up(trials).keys()


def _points(space: Space, trials: list[FrozenTrial], found: dict[str, results.Estimate]) -> list[Point]:
    """What the local model learns from: every measured config's pooled estimate, and every config a launch found
    infeasible or stopped early (failures of the infrastructure are not the config's and are left out)."""
    points = []
    for e in found.values():
        params = TrialRecord.of(trials[e.trials[0]]).params
        if e.value > 0:
            points.append(Point(places(space, params), math.log(e.value), e.relative_sd))
    for t in results.launches(trials):
        rec = TrialRecord.of(t)
        if t.state == TrialState.FAIL or rec.feasible or rec.config_key in found:
            continue
        if set(space.names) <= set(rec.params):
            points.append(Point(places(space, rec.params)))
    return points


def _neighbour(space: Space, settings: SearchSettings, around: list[dict[str, ArgValue]], measured: set[str],
               points: list[Point], rng: random.Random) -> Proposal | None:
    """The most promising unmeasured config one stride in one flag from any config of ``around`` (the leader and its
    close rivals), by the local model; while the model has too few points, a random neighbour of the first one that
    has any. None when every neighbour is measured."""
    options: list[tuple[dict[str, ArgValue], str]] = []
    for params in around:
        options += moves(space, params, measured | {k for _, k in options}, settings.stride)
        if options and not informed(points, settings):
            break
    if not options:
        return None
    rng.shuffle(options)
    order = rank(points, [places(space, moved) for moved, _ in options], unordered(space), settings)
    return Proposal(space.internal(options[order[0]][0]), "neighbour")
