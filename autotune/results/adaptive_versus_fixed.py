"""The adaptive server a study measured (``[study] adaptive``) against its fixed configs: whether it beat the best
fixed config, by how much and at which loads, with the 95% intervals the study computes for each config and level.

An adaptive server is never one of the study's configs (tally.py leaves it out of the best, the ranking and the
per-load bests): it is compared with them here. A difference counts as a win or a loss only when the two intervals
do not overlap; otherwise the measurements cannot tell the two apart.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.results import tally
from autotune.record import TrialRecord
from autotune.results.tally import Estimate


def verdict(ours: Estimate, theirs: Estimate) -> str:
    """'beat', 'lost' or 'tie' (the intervals overlap)."""
    if ours.overlaps(theirs):
        return "tie"
    return "beat" if ours.value > theirs.value else "lost"


@dataclass(frozen=True)
class Level:
    """One load: the adaptive server, the best fixed config's figure there and the best figure of any fixed
    config there."""

    concurrency: int
    adaptive: Estimate
    fixed: Estimate | None          # the best fixed config (by the objective) at this load
    best_here: Estimate             # the fixed config fastest at this load
    best_here_trial: int

    def against(self, other: Estimate | None) -> tuple[float | None, str]:
        """(adaptive / other - 1, the verdict) at this load."""
        if other is None or not other.value:
            return None, "-"
        return self.adaptive.value / other.value - 1, verdict(self.adaptive, other)


@dataclass(frozen=True)
class Comparison:
    trial: int                      # the trial that measured the adaptive server
    schedule: dict[str, Any]        # its schedule file
    built_from: list[int]           # the trials whose measurements the schedule holds
    adaptive: Estimate              # its objective
    fixed: Estimate                 # the best fixed config's objective
    fixed_trial: int
    levels: list[Level]

    @property
    def gain(self) -> float:
        return self.adaptive.value / self.fixed.value - 1 if self.fixed.value else 0.0

    @property
    def verdict(self) -> str:
        return verdict(self.adaptive, self.fixed)


def compare(study: optuna.Study) -> Comparison | None:
    """The study's adaptive server against its best fixed config (None: no adaptive server was measured, or no
    fixed config was)."""
    ours = tally.top(tally.estimates(study, adaptive=True))
    theirs = tally.leader(study)
    if ours is None or theirs is None:
        return None
    trials = study.get_trials(deepcopy=False)
    rec = TrialRecord.of(trials[ours.trials[-1]])
    schedule = rec.schedule or {}
    levels = []
    for row in tally.per_concurrency(study):
        here = tally.level_estimates(study, row.concurrency, adaptive=True).get(ours.key)
        if here is not None:
            fixed = tally.level_estimates(study, row.concurrency).get(theirs.key)
            levels.append(Level(row.concurrency, here, fixed, row.best, row.best.trials[0]))
    return Comparison(rec.number, schedule.get("document") or {}, list(schedule.get("built_from") or []), ours,
                      theirs, theirs.trials[0], levels)


def _interval(e: Estimate) -> str:
    return f"{e.low:.1f}-{e.high:.1f}"


def said(gain: float | None, word: str) -> str:
    """'+4.2% beat', '-0.3% (tie)'."""
    if gain is None:
        return "-"
    return f"{gain:+.1%} {'(tie)' if word == 'tie' else word}"


def headline(c: Comparison) -> str:
    """The comparison in one sentence."""
    words = {"beat": "beat it", "lost": "lost to it", "tie": "no better or worse: the intervals overlap"}
    schedule = json.dumps({k: v.get("candidate_steps") for k, v in c.schedule.items()})
    return (f"adaptive server (trial {c.trial}; steps by batch {schedule}, from trials "
            f"{', '.join(map(str, c.built_from))}): value {c.adaptive.value:.4g} [{c.adaptive.low:.4g}, "
            f"{c.adaptive.high:.4g}] against the best fixed config (trial {c.fixed_trial}) {c.fixed.value:.4g} "
            f"[{c.fixed.low:.4g}, {c.fixed.high:.4g}]: {c.gain:+.1%}, {words[c.verdict]}")


def lines(c: Comparison) -> list[str]:
    """The comparison for a person: one sentence, then one row per load."""
    out = [headline(c),
           f"{'load':>5}  {'adaptive tok/s':>14}  {'95% interval':>17}  {'best fixed':>10}  {'95% interval':>17}  "
           f"{'vs it':>12}  {'best here':>9}  {'trial':>5}  {'vs that':>12}"]
    for lv in c.levels:
        gain, word = lv.against(lv.fixed)
        gain_here, word_here = lv.against(lv.best_here)
        fixed = f"{lv.fixed.value:>10.1f}  {_interval(lv.fixed):>17}" if lv.fixed else f"{'-':>10}  {'-':>17}"
        out.append(f"{'c' + str(lv.concurrency):>5}  {lv.adaptive.value:>14.1f}  {_interval(lv.adaptive):>17}  "
                   f"{fixed}  {said(gain, word):>12}  {lv.best_here.value:>9.1f}  {lv.best_here_trial:>5}  "
                   f"{said(gain_here, word_here):>12}")
    return out


def document(c: Comparison) -> dict[str, Any]:
    """The comparison as JSON (`best --json`'s ``adaptive``)."""
    def est(e: Estimate | None) -> dict[str, Any] | None:
        return None if e is None else {"value": e.value, "low": e.low, "high": e.high, "trials": list(e.trials)}

    return {"trial": c.trial, "schedule": c.schedule, "built_from": c.built_from, "value": est(c.adaptive),
            "best_fixed": {"trial": c.fixed_trial, **(est(c.fixed) or {})}, "gain": c.gain, "verdict": c.verdict,
            "levels": [{"concurrency": lv.concurrency, "adaptive": est(lv.adaptive), "best_fixed": est(lv.fixed),
                        "gain": lv.against(lv.fixed)[0], "verdict": lv.against(lv.fixed)[1],
                        "best_here": {"trial": lv.best_here_trial, **(est(lv.best_here) or {})},
                        "gain_here": lv.against(lv.best_here)[0], "verdict_here": lv.against(lv.best_here)[1]}
                       for lv in c.levels]}
