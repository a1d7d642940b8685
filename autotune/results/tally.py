"""Reading a study back: which trials count against the budget (launches), which is the baseline, and what each
measured config is worth, pooled over every launch of it: the best is the config with the best pooled estimate."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import client_limit
from autotune import record
from autotune.record import TrialRecord

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
#: a measurement without an interval of its own counts as this precise (relative half-width of its 95% interval)
UNKNOWN_PRECISION = 0.05
Z95 = 1.96


def retried(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of trials whose config was queued again (their retry counts instead of them)."""
    return {n for n in (record.retry_of(t) for t in trials) if n is not None}


def launches(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that use up the budget: finished ones that started a server (a reused or rejected config did not),
    except those that were retried."""
    again = retried(trials)
    return [t for t in trials if t.state in FINISHED and t.number not in again and TrialRecord.of(t).launched]


def given_up(trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
    """Configs whose launch failed for the infrastructure even after its one retry, by config key (with that last
    failed launch). Launching one again would pay for the same failure. Never a config that failed because the
    measuring client fell behind it (``client_limit``): that is the machine's condition, and the fastest configs
    would be the ones given up on."""
    return {k: t for t in launches(trials) if t.state == TrialState.FAIL and not client_limit.blames_machine(t)
            for k in record.config_keys(t) if k}


def finished(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Every finished trial that was not retried: launches, reused measurements and rejected configs."""
    again = retried(trials)
    return [t for t in trials if t.state in FINISHED and t.number not in again]


def since_launch(trials: list[FrozenTrial], since: int = 0) -> int:
    """Finished trials from trial ``since`` on after the last launch of a config: how long the sampler has proposed
    only measured or invalid configs. A confirmation or the adaptive server measures no new config: it does not end
    the count."""
    count = 0
    for t in sorted(finished(trials), key=lambda t: t.number, reverse=True):
        if t.number < since:
            break
        if TrialRecord.of(t).launched and not (record.is_confirmation(t) or record.is_adaptive(t)):
            break
        count += 1
    return count


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
    ref = record.study.reference(study) or {}
    s0, c0 = ref.get("single_tok_s") or 1.0, ref.get("concurrent_tok_s") or 1.0
    return math.sqrt(max(t.values[0], 0.0) / s0 * max(t.values[1], 0.0) / c0)


@dataclass(frozen=True)
class Estimate:
    """What one config is worth, pooled over every launch that measured it (inverse-variance weighted)."""

    key: str                        # the config key
    value: float
    low: float                      # its 95% interval
    high: float
    trials: tuple[int, ...]         # the trials that measured it, first to last

    @property
    def launches(self) -> int:
        return len(self.trials)

    @property
    def relative_sd(self) -> float:
        """The estimate's standard error relative to its value (from its 95% interval)."""
        return (self.high - self.low) / 2 / Z95 / abs(self.value) if self.value else math.inf

    def overlaps(self, other: Estimate) -> bool:
        return self.high >= other.low and other.high >= self.low


def estimates(study: optuna.Study, trials: list[FrozenTrial] | None = None,
              adaptive: bool = False) -> dict[str, Estimate]:
    """Every feasible measured config's pooled estimate (of the objective; of the gain over the baseline on both
    axes for pareto studies), by config key; over ``trials`` (default: the whole study). The fixed configs only;
    with ``adaptive`` the adaptive servers only."""
    grouped: dict[str, list[tuple[int, float, float]]] = {}
    for t, rec in _measured(study.get_trials(deepcopy=False) if trials is None else trials, adaptive):
        value = score(t, study)
        precision = UNKNOWN_PRECISION
        if rec.value_ci and len(t.values) == 1 and value:
            precision = max(abs(rec.value_ci[1] - rec.value_ci[0]) / 2 / abs(value), 1e-6)
        grouped.setdefault(rec.config_key, []).append((t.number, value, abs(value) * precision / Z95))
    return {key: _pool(key, runs) for key, runs in grouped.items()}


def _measured(trials: list[FrozenTrial], adaptive: bool = False) -> list[tuple[FrozenTrial, TrialRecord]]:
    """The trials that measured their config themselves (feasible, not reused), with their records: the fixed
    configs, or with ``adaptive`` the adaptive servers (never both: an adaptive server is no config to pick)."""
    out = []
    for t in trials:
        rec = TrialRecord.of(t)
        if rec.feasible and rec.reused_from is None and rec.config_key is not None and rec.adaptive == adaptive:
            out.append((t, rec))
    return out


def top(found: dict[str, Estimate]) -> Estimate | None:
    """The best estimate (the first measured among equals)."""
    return max(found.values(), key=lambda e: (e.value, -e.trials[0]), default=None)


def _pool(key: str, runs: list[tuple[int, float, float]]) -> Estimate:
    """One estimate from several launches' (trial, value, standard error), inverse-variance weighted."""
    weights = [1 / se ** 2 if se > 0 else 1e12 for _, _, se in runs]
    value = sum(w * v for w, (_, v, _) in zip(weights, runs, strict=True)) / sum(weights)
    half = Z95 / math.sqrt(sum(weights))
    return Estimate(key, value, value - half, value + half, tuple(n for n, _, _ in runs))


def level_estimates(study: optuna.Study, concurrency: int, adaptive: bool = False) -> dict[str, Estimate]:
    """Every feasible measured config's output tok/s at one concurrency level, pooled over its launches (with
    ``adaptive``: every adaptive server's instead)."""
    grouped: dict[str, list[tuple[int, float, float]]] = {}
    for t, rec in _measured(study.get_trials(deepcopy=False), adaptive):
        figure = rec.level(concurrency).get("output_tok_s")
        if not figure:
            continue
        precision = rec.level(concurrency).get("output_tok_s_rel_ci") or UNKNOWN_PRECISION
        grouped.setdefault(rec.config_key, []).append((t.number, figure, figure * precision / Z95))
    return {key: _pool(key, runs) for key, runs in grouped.items()}


@dataclass(frozen=True)
class LevelBest:
    """The best config at one concurrency level, and how sure that is."""

    concurrency: int
    best: Estimate                  # output tok/s at that level, pooled
    baseline: Estimate | None       # the baseline's, at that level

    @property
    def gain(self) -> float | None:
        return self.best.value / self.baseline.value if self.baseline and self.baseline.value else None

    @property
    def confirmed(self) -> bool:
        """Measured by more than one launch (confirmed), not a single measurement."""
        return self.best.launches > 1


def per_concurrency(study: optuna.Study) -> list[LevelBest]:
    """For every concurrency level the study measured, the feasible config with the best pooled throughput there:
    the answer for each load, at no extra launch."""
    trials = study.get_trials(deepcopy=False)
    levels = sorted({lv["concurrency"] for t in trials for lv in TrialRecord.of(t).levels if "concurrency" in lv})
    base = baseline(trials)
    base_key = TrialRecord.of(base).config_key if base is not None else None
    out = []
    for c in levels:
        found = level_estimates(study, c)
        best_here = top(found)
        if best_here is not None:
            out.append(LevelBest(c, best_here, found.get(base_key) if base_key else None))
    return out


#: how the pick settles a tie: the confirmed config with the higher pooled estimate (the default), or the one cheaper
#: to run (``TrialRecord.cost``: for SGLang fewer draft tokens). On the surrogate bench the cheaper one cost 7 to 10
#: studies of 300 whose final pick is within 2% of the optimum (docs/search-priors.md); the bench measures it again
#: with --pick cheaper
TIES = ("estimate", "cheaper")


@dataclass(frozen=True)
class Pick:
    """The config a study picks; the confirmed configs it could not be told from (their 95% intervals overlap after a
    confirmation of each), and of those the one cheapest to run when that is not the pick."""

    estimate: Estimate
    tied: tuple[Estimate, ...] = ()
    cheaper: Estimate | None = None

    def tie_text(self) -> str | None:
        """The tie in words (None: there was none)."""
        if not self.tied:
            return None
        others = ", ".join(str(e.trials[0]) for e in self.tied)
        cost = ("it is also the cheapest of them to run" if self.cheaper is None else
                f"the config of trial {self.cheaper.trials[0]} is cheaper to run (fewer draft tokens, for SGLang)")
        return (f"tied with the config of trial{'s' if len(self.tied) > 1 else ''} {others}: their 95% intervals "
                f"overlap after confirming each; the pick is the higher pooled estimate, and {cost}")


def settle(found: dict[str, Estimate], cost: dict[str, tuple[float, ...]], tie: str = "estimate") -> Pick | None:
    """The pick, settled by intervals. Until a config is confirmed (measured more than once) it is the best pooled
    estimate. After that the best confirmed config keeps it unless another config's interval clears its own (lies
    wholly above it), so that a confirmation that moves two configs' means a percent past each other does not move
    it; confirmed configs whose intervals overlap it are its tie, settled by ``tie`` (TIES; ``cost`` per config
    key)."""
    if tie not in TIES:
        raise ValueError(f"unknown tie rule {tie!r} (known: {', '.join(TIES)})")
    best = top(found)
    confirmed = {k: e for k, e in found.items() if e.launches > 1}
    if best is None or not confirmed:
        return None if best is None else Pick(best)
    incumbent = top(confirmed)
    assert incumbent is not None
    clearing = {k: e for k, e in found.items() if e.low > incumbent.high}
    if clearing:
        return Pick(top(clearing))  # type: ignore[arg-type]
    group = [incumbent, *sorted((e for e in confirmed.values() if e is not incumbent and e.overlaps(incumbent)),
                                key=lambda e: -e.value)]
    if len(group) == 1:
        return Pick(incumbent)
    known = all(e.key in cost for e in group)
    cheapest = min(group, key=lambda e: (cost[e.key], -e.value, e.trials[0])) if known else incumbent
    chosen = cheapest if tie == "cheaper" else incumbent
    return Pick(chosen, tuple(e for e in group if e is not chosen), None if cheapest is chosen else cheapest)


def pick(study: optuna.Study, trials: list[FrozenTrial] | None = None, tie: str = "estimate") -> Pick | None:
    """The study's pick over ``trials`` (default: the whole study): ``settle`` on every measured config."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    found = estimates(study, trials)
    by_number = {t.number: t for t in trials}
    cost = {}
    for key, e in found.items():
        its = TrialRecord.of(by_number[e.trials[0]]).cost
        if its is not None:
            cost[key] = its
    return settle(found, cost, tie)


def leader(study: optuna.Study, trials: list[FrozenTrial] | None = None) -> Estimate | None:
    """The picked config's pooled estimate (``pick``)."""
    chosen = pick(study, trials)
    return None if chosen is None else chosen.estimate


def ranked(study: optuna.Study) -> list[FrozenTrial]:
    """Every feasible measured config, the pick first, then by pooled estimate, each as the first trial that
    measured it (``best`` is the first of them)."""
    trials = study.get_trials(deepcopy=False)
    found = estimates(study)
    if found:
        first = leader(study, trials)
        order = sorted(found.values(), key=lambda e: (first is None or e.key != first.key, -e.value, e.trials[0]))
        return [trials[e.trials[0]] for e in order]
    return sorted((t for t in trials if feasible(t)), key=lambda t: (-score(t, study), t.number))


def above_baseline(study: optuna.Study) -> list[FrozenTrial]:
    """The configs of ``ranked`` that beat the baseline (every one when the baseline has no feasible measurement):
    those worth leaving running at the end of a study."""
    base = baseline(study.get_trials(deepcopy=False))
    if base is None or not feasible(base):
        return ranked(study)
    key, value = TrialRecord.of(base).config_key, score(base, study)
    return [t for t in ranked(study) if t.number != base.number and (key is None or TrialRecord.of(t).config_key
                                                                       != key) and score(t, study) > value]


def best(study: optuna.Study) -> FrozenTrial | None:
    """The first trial that measured the best config (its command and figures stand for the config); see ``leader``
    for the config's pooled estimate. A study whose trials carry no config key (written by hand) ranks trials."""
    top = leader(study)
    trials = study.get_trials(deepcopy=False)
    if top is not None:
        return trials[top.trials[0]]
    candidates = [t for t in trials if feasible(t)]
    return max(candidates, key=lambda t: (score(t, study), -t.number), default=None)


@dataclass(frozen=True)
class Predictions:
    """How well the search's model predicted the launches it chose, before they ran: how many it predicted, the
    median and the worst error (measured over predicted, less one) with the worst one's trial, and how many fell
    outside the predicted 95% interval, and how many outside physics' own (the study's search then set physics
    aside)."""

    launches: int
    median_error: float
    worst_error: float
    worst_trial: int
    outside: int
    physics_outside: int

    def text(self) -> str:
        return (f"the search's model predicted {self.launches} launch{'es' if self.launches > 1 else ''} before "
                f"they ran: median error {self.median_error:+.1%}, worst {self.worst_error:+.1%} (trial "
                f"{self.worst_trial}); {self.outside} outside the predicted 95% interval"
                + (f"; physics missed {self.physics_outside} (then set aside)" if self.physics_outside else ""))

    def document(self) -> dict[str, float | int]:
        return {"launches": self.launches, "median_error": self.median_error, "worst_error": self.worst_error,
                "worst_trial": self.worst_trial, "outside": self.outside, "physics_outside": self.physics_outside}


def predictions(trials: list[FrozenTrial]) -> Predictions | None:
    """The study's launches the search predicted (None: none was)."""
    rows = [(t.number, rec) for t in launches(trials) if (rec := TrialRecord.of(t)).prediction_outcome]
    if not rows:
        return None
    errors = sorted((rec.prediction_outcome["error"], n) for n, rec in rows)
    worst = max(errors, key=lambda e: abs(e[0]))
    misses = [rec for _, rec in rows if not rec.prediction_outcome["inside"]]
    return Predictions(len(rows), statistics.median(e for e, _ in errors), worst[0], worst[1], len(misses),
                       sum(1 for _, rec in rows if rec.prediction_outcome.get("physics_inside") is False))
