"""The tuner's own proposals beside the sampler's, once a study's opening is measured.

* The whole space (``SearchSettings.scope = "global"``, the default; model-based samplers only). After the baseline
  and the opening (two of the engine's starting points), each launch measures the unmeasured valid config with the
  best expected improvement of the log objective over the leader under a small Gaussian process over every config
  measured so far (local_model.py), times its chance of fitting in memory (feasibility.py): a config above a memory
  failure is never proposed. From the opening on, the process models what a per-study physics model (physics.py:
  accept length and cost per token, fitted to the launches) does not explain, until physics mispredicts beyond its
  own interval. A memory failure marks the boundary only; the objective's models learn from measurements.
* Neighbours of the leader (``scope = "local"``, the search before the whole-space model). Each launch measures an
  unmeasured neighbour (neighbours.py) of the config with the best pooled estimate or of its close rivals (configs
  whose 95% intervals overlap it: noise may have put the wrong one first), the one the local model rates most
  promising; when no neighbour is left, the sampler proposes.
* Coverage. Each value of a categorical flag (topk) no launch has measured gets a launch at the model's best config
  there below the memory boundary, a few launches before the confirmations; a coverage or starting-point launch that
  ran out of memory is followed at once by one of the same value below it (coverage.py).
* Confirmations. The last launches of the budget re-measure the leader and its close rivals, each once, so that the
  pick rests on more than one lucky measurement; every config's estimate pools all its launches
  (tally.estimates), and the pick is settled by their intervals (tally.settle).

Every choice here was measured on random hosts (scripts/bench_sample_efficiency.py; docs/sampler.md,
docs/search-priors.md).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import record
from autotune.results import tally
from autotune.engines import ArgValue, Engine
from autotune.record import TrialRecord
from autotune.search.coverage import to_follow, uncovered
from autotune.search.feasibility import MEMORY_REASONS, Feasibility
from autotune.results.score import objective_values
from autotune.search.local_model import Point, improvement, informed, posterior, rank
from autotune.search.physics import Observation, Physics
from autotune.search.neighbours import lower, moves, places, spread, unordered, valid_configs
from autotune.search.sampling import MODEL_BASED
from autotune.search.settings import SearchSettings
from autotune.studyfile.space import Space
from autotune.studyfile.spec import StudySpec


class Plan(Protocol):
    """What the search reads of a study's plan (plan.Plan has it): named here so that search/ does not import the
    layer above it."""

    spec: StudySpec
    engine: Engine
    space: Space
    search: SearchSettings

    @property
    def startup(self) -> int: ...

#: a config's prior mean of the log objective, from its effective args
Prior = Callable[[Mapping[str, ArgValue]], float]
#: a 95% interval's half-width in standard deviations
Z95 = 1.96
#: roles of the configs the tuner's own search queues (a neighbour every ``neighbour_every`` launches)
OWN = ("neighbour", "model", "shrink", "coverage")


@dataclass(frozen=True)
class Proposal:
    """A config the tuner queues itself: its parameters (as the sampler gives them), why (one of record.ROLES), and
    where it came from (a warm start's "study OLD, trial N")."""

    params: dict[str, ArgValue]
    role: str
    origin: str | None = None
    #: what the model expects of it: value, low, high (its 95% interval), physics (physics' own value, or None)
    prediction: dict[str, float | None] | None = None


def propose(study: optuna.Study, trials: list[FrozenTrial], plan: Plan, budget: int, seed: int | None = None
            ) -> Proposal | None:
    """The tuner's next config to measure (None: let the sampler propose). ``trials``: the study's."""
    settings = plan.search
    launched = tally.launches(trials)
    running = sum(1 for t in trials if t.state == TrialState.RUNNING)
    left = budget - len(launched) - running
    found = _queueable(study, trials, plan)
    leader = tally.top(found)
    if left <= 0 or leader is None:
        return None
    own_search = plan.spec.sampler in MODEL_BASED and bool(settings.neighbour_every)
    reserve = settings.confirm_reserve(budget)
    done = sorted((TrialRecord.of(t) for t in launched), key=lambda r: r.number)
    start = plan.startup if settings.model_from is None else settings.model_from
    if not own_search or len(done) < start:
        return _confirmation(trials, leader, found) if left <= reserve else None
    measured = _measured_keys(trials)
    rng = random.Random(None if seed is None else seed * 7919 + len(done))
    feasibility = Feasibility(plan.engine, trials)
    predict = _physics(study, plan, trials) if settings.physics and settings.scope == "global" else None
    if predict is not None and physics_set_aside(trials, settings) is not None:
        predict = None  # it mispredicted beyond its interval: the data-only model for the rest of the study
    points = _points(plan.space, trials, found, settings, predict)
    if settings.cover != "off":
        gaps = uncovered(plan.space, trials, measured, feasibility, settings)
        follow = to_follow(trials, gaps) if settings.follow_oom else {}
        if follow:  # a coverage or starting-point launch ran out of memory: its value below the new boundary
            return _cover(plan.space, settings, follow, measured, points, feasibility, rng, predict)
        if gaps and (settings.cover == "early" or left <= reserve + len(gaps) + settings.cover_room):
            return _cover(plan.space, settings, gaps, measured, points, feasibility, rng, predict)
    if left <= reserve:
        return _confirmation(trials, leader, found)
    since = settings.neighbour_every - 1
    recent = done[start:][-since:] if since else []
    if any(r.role in OWN for r in recent):
        return None
    if settings.shrink_after_oom and done and done[-1].reason in MEMORY_REASONS:
        shrunk = _below(plan.space, done[-1].params, measured, feasibility)
        if shrunk is not None:
            return shrunk
    own = sum(r.role in OWN for r in done)
    if settings.scope == "global" and plan.space.walkable and not (settings.local_every and own % settings.local_every
                                           == settings.local_every - 1):
        return _anywhere(plan.space, settings, leader, measured, points, feasibility, rng, predict)
    rivals = _rivals(leader, found) if settings.rivals_neighbours else []
    around = [TrialRecord.of(trials[e.trials[0]]).params for e in (leader, *rivals)]
    return _neighbour(plan.space, settings, around, measured, points, rng)


def _cover(space: Space, settings: SearchSettings, gaps: dict[str, list[ArgValue]], measured: set[str],
           points: list[Point], feasibility: Feasibility, rng: random.Random, prior: Prior | None) -> Proposal | None:
    """The model's best config at a value of a categorical flag no launch has measured: of the configs there more
    likely to fit than not (chance at least ``SearchSettings.cover_fit``: below the boundary), the one with the best
    mean; when none is, the best mean times chance of fitting. Of the values open, the one whose best config the model
    rates highest (at random while the model has too few points)."""
    options = []
    for params, candidate in valid_configs(space):
        if candidate.key in measured or not any(params.get(n) in values for n, values in gaps.items()):
            continue
        chance = feasibility.probability(candidate.args, settings.fit_unknown, settings.boundary)
        if chance > 0:
            options.append((params, candidate, chance))
    if not options:
        return None
    rng.shuffle(options)
    if not informed(points, settings):
        return Proposal(space.internal(options[0][0]), "coverage")
    where = [coordinates(space, params, settings) for params, _, _ in options]
    priors = [prior(c.args) for _, c, _ in options] if prior else None
    mu, _ = posterior(points, where, unordered(space), settings, priors)
    below = [i for i in range(len(options)) if options[i][2] >= settings.cover_fit > 0]
    best = max(below, key=lambda i: mu[i]) if below else max(range(len(options)),
                                                              key=lambda i: mu[i] + math.log(options[i][2]))
    return Proposal(space.internal(options[best][0]), "coverage",
                    prediction=_predicted(points, where[best], space, settings, priors[best] if priors else None))


def physics_set_aside(trials: list[FrozenTrial], settings: SearchSettings) -> int | None:
    """The trial after which the study's physics prior is set aside: the ``physics_misses``-th launch whose
    measurement fell outside the interval physics predicted for it (None: not set aside)."""
    if not settings.physics_misses:
        return None
    misses = 0
    for t in sorted(tally.launches(trials), key=lambda t: t.number):
        rec = TrialRecord.of(t)
        if rec.prediction_outcome and rec.prediction_outcome.get("physics_inside") is False:
            misses += 1
            if misses >= settings.physics_misses:
                return rec.number
    return None


def _predicted(points: list[Point], where: tuple[float, ...], space: Space, settings: SearchSettings,
               prior: float | None) -> dict[str, float | None]:
    """What the search expects of one config's objective value before its launch: the model's mean and 95% interval
    (its own uncertainty and a measurement's noise, ``SearchSettings.prediction_noise``) and, when the physics
    prior is in use, physics' own value and interval (its spread: how far the launches it was fitted to lie from it,
    and the noise)."""
    mu, sd = posterior(points, [where], unordered(space), settings, None if prior is None else [prior])
    spread = Z95 * math.sqrt(float(sd[0]) ** 2 + settings.prediction_noise ** 2)
    m = float(mu[0])
    out: dict[str, float | None] = {"value": math.exp(m), "low": math.exp(m - spread),
                                    "high": math.exp(m + spread), "physics": None}
    if prior is not None:
        misfit = [(p.log_value - p.prior) ** 2 for p in points if p.log_value is not None]
        own = Z95 * math.sqrt(sum(misfit) / max(len(misfit), 1) + settings.prediction_noise ** 2)
        out.update(physics=math.exp(prior), physics_low=math.exp(prior - own), physics_high=math.exp(prior + own))
    return out


def _rivals(leader: tally.Estimate, found: dict[str, tally.Estimate]) -> list[tally.Estimate]:
    """The leader's close rivals, best first: configs whose 95% intervals overlap the leader's."""
    return sorted((e for e in found.values() if e is not leader and e.overlaps(leader)), key=lambda e: -e.value)


def confirmation(study: optuna.Study, trials: list[FrozenTrial], plan: Plan) -> Proposal | None:
    """The leader's config, or a close rival's, measured once more (each once); None when each was. For a search
    with nothing left to try and launches left."""
    found = _queueable(study, trials, plan)
    leader = tally.top(found)
    return None if leader is None else _confirmation(trials, leader, found)


def _queueable(study: optuna.Study, trials: list[FrozenTrial], plan: Plan) -> dict[str, tally.Estimate]:
    """The measured configs' estimates, of the configs whose trial names every tuned flag: only those can be queued
    again exactly (a baseline whose fixed args leave a tuned flag unset cannot: the sampler would fill it in)."""
    names = set(plan.space.names)
    return {k: e for k, e in tally.estimates(study, trials).items()
            if names <= set(TrialRecord.of(trials[e.trials[0]]).params)}


def _confirmation(trials: list[FrozenTrial], leader: tally.Estimate,
                  found: dict[str, tally.Estimate]) -> Proposal | None:
    given_up = tally.given_up(trials)
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
    return keys | tally.given_up(trials).keys()


def _points(space: Space, trials: list[FrozenTrial], found: dict[str, tally.Estimate],
            settings: SearchSettings, prior: Prior | None = None) -> list[Point]:
    """What the model of the objective learns from: every measured config's pooled estimate, and every config a
    launch found infeasible or stopped early. Failures of the infrastructure are not the config's and are left
    out; so are memory failures (unless ``oom_in_model``): they mark the memory boundary (feasibility.py), not a
    poor region. ``prior``: each point's prior mean of the log value (physics.py's prediction)."""
    oom_in_model = settings.oom_in_model

    def where(params: dict[str, ArgValue]) -> tuple[float, ...]:
        return coordinates(space, params, settings)
    points = []
    for e in found.values():
        params = TrialRecord.of(trials[e.trials[0]]).params
        if e.value > 0:
            config = TrialRecord.of(trials[e.trials[0]]).config or {}
            points.append(Point(where(params), math.log(e.value), e.relative_sd,
                                prior(config) if prior else 0.0))
    for t in tally.launches(trials):
        rec = TrialRecord.of(t)
        if t.state == TrialState.FAIL or rec.feasible or rec.config_key in found:
            continue
        if rec.reason in MEMORY_REASONS and not oom_in_model:
            continue
        if set(space.names) <= set(rec.params):
            points.append(Point(where(rec.params), prior=prior(rec.config or {}) if prior else 0.0))
    return points


def _physics(study: optuna.Study, plan: Plan, trials: list[FrozenTrial]) -> Prior | None:
    """The log objective physics.py predicts for a config from this study's launches (None: too few launches, no
    draft tree, or an objective it cannot predict), scored as the objective scores a measurement."""
    spec = plan.spec
    if spec.objective not in ("single", "concurrent", "weighted", "mix"):
        return None
    observations = []
    for t in trials:
        rec = TrialRecord.of(t)
        if not rec.feasible or rec.reused_from is not None or rec.config is None or rec.adaptive:
            continue
        tree = plan.engine.draft_tree(rec.config)
        levels = {int(c): float(v) for c, v in (rec.metrics.get("level_output_tok_s") or {}).items() if v}
        length = rec.metrics.get("accept_length") or rec.metrics.get("concurrent_accept_length")
        if tree is not None and levels and length:
            observations.append(Observation(tree, float(length), levels))
    model = Physics.fit(observations, plan.search.physics_from)
    if model is None:
        return None
    reference = record.study.reference(study)
    top = max(spec.levels)

    def predict(args: Mapping[str, ArgValue]) -> float:
        tree = plan.engine.draft_tree(args)
        if tree is None:
            return 0.0
        levels = model.tok_s(tree)
        metrics = {"single_tok_s": levels.get(1), "concurrent_tok_s": levels.get(top),
                   "level_output_tok_s": {str(c): v for c, v in levels.items()}}
        return math.log(max(objective_values(spec.objective, metrics, reference, spec.workload.mix)[0], 1e-12))
    return predict


def _below(space: Space, params: dict[str, ArgValue], measured: set[str], feasibility: Feasibility
           ) -> Proposal | None:
    """The same tree just below a config that ran out of memory: its memory flags lowered one at a time, in the
    engine's order (SGLang: fewer draft tokens, then fewer steps), the first config not measured yet and not above
    a known failure."""
    for moved, _ in lower(space, params, measured):
        if feasibility.known_oom(space.candidate(moved).args) is None:
            return Proposal(space.internal(moved), "shrink")
    return None


def coordinates(space: Space, params: dict[str, ArgValue], settings: SearchSettings) -> tuple[float, ...]:
    """A config's coordinates for the model: for the whole-space model, each flag over its whole range
    (``SearchSettings.geometry``); for the local one, its place inside the range the other flags leave it."""
    if settings.scope == "global" and settings.geometry != "places":
        return spread(space, params, log=settings.geometry.endswith("log"),
                      dependent_only=settings.geometry.startswith("draft"))
    return places(space, params)


def _anywhere(space: Space, settings: SearchSettings, leader: tally.Estimate, measured: set[str],
              points: list[Point], feasibility: Feasibility, rng: random.Random, prior: Prior | None = None
              ) -> Proposal | None:
    """The unmeasured valid config with the best expected improvement over the leader times its chance of fitting
    in memory, over the whole space; at random while the model has too few points."""
    options = []
    for params, candidate in valid_configs(space):
        if candidate.key in measured:
            continue
        chance = feasibility.probability(candidate.args, settings.fit_unknown, settings.boundary)
        if chance > 0:
            options.append((params, candidate, coordinates(space, params, settings), chance))
    if not options:
        return None
    rng.shuffle(options)
    if not informed(points, settings):
        return Proposal(space.internal(options[0][0]), "model")
    where = [w for _, _, w, _ in options]
    priors = [prior(c.args) for _, c, _, _ in options] if prior else None
    if settings.acquisition == "ucb":
        mu, sd = posterior(points, where, unordered(space), settings, priors)
        gain = np.exp(mu + settings.kappa * sd - math.log(leader.value))
    else:
        gain = improvement(points, where, unordered(space), math.log(leader.value), settings, priors)
    best = max(range(len(options)), key=lambda i: gain[i] * options[i][3])
    return Proposal(space.internal(options[best][0]), "model",
                    prediction=_predicted(points, where[best], space, settings, priors[best] if priors else None))


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
