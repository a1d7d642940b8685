"""An adaptive speculative schedule written from a study's own measurements (`autotune best --format
sglang-adaptive`): for each running batch size, the chain lengths that served that load best.

Every trial measures every `[workload] concurrency` level, so the study already holds, for each measured chain
(a topk-1 config its engine's adaptive mode can switch between), its throughput at each load, pooled over its
launches (``results.level_estimates``). For each level the schedule takes the chains whose pooled throughput there is
within the workload's ``tolerance`` of the best chain's; nothing else, and no level or chain the study did not
measure. Only chains of one family are used (every other flag the same): the family of the chain with the best
pooled objective.

From concurrency levels to running batch sizes
----------------------------------------------
The engine routes each decode batch by how many requests are running (padded up to a captured CUDA-graph size).
With ``c`` requests kept in flight, ``c`` run at once, but never more than the server's ``max_running_requests``;
an adaptive server sizes its buffers and state pools for its widest step, so it runs at most what the deepest chain
in the schedule ran in the study (M, from that chain's recorded capacity). Level ``c`` therefore runs a batch of
``min(c, M)``. The slot for the first measured level starts at 1 (it serves every smaller batch too), each later
level's slot starts just above the previous level's padded batch, so a batch between two measured levels takes the
chains of the level above it: under a closed loop of ``c`` the running batch is ``c`` or just below. A level whose
batch is no larger than the previous level's after padding (every level beyond M) adds no slot: the first level
that reaches M stands for them all. M is taken from the deepest chain any level chose, so it is never larger than
the deployed server's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna

from autotune import results
from autotune.engines import Args, Engine
from autotune.errors import UserError
from autotune.record import TrialRecord
from autotune.results import Estimate


@dataclass(frozen=True)
class Slot:
    """One slot of the schedule and the measurements it comes from."""

    key: int                        # the smallest running batch (after padding) it serves
    concurrency: int                # the measured level it stands for
    batch: int                      # that level's running batch on the adaptive server
    steps: tuple[int, ...]          # the chains within the tolerance of the best one there
    figures: dict[int, Estimate]    # every measured chain of the family at that level, by steps

    @property
    def best(self) -> int:
        return max(self.figures, key=lambda s: self.figures[s].value)


@dataclass(frozen=True)
class Schedule:
    """A schedule built from a study, the file that holds it and the config that deploys it."""

    slots: list[Slot]
    skipped: list[tuple[int, int]]  # (level, its batch) of the measured levels that add no slot
    max_running_requests: int | None
    deepest: int
    tolerance: float
    document: dict
    args: Args
    family_trial: int               # the trial whose config's family the chains share


def build(study: optuna.Study, engine: Engine, tolerance: float, path: str = "adaptive.json") -> Schedule:
    """The schedule for ``study``'s measurements (see the module docstring); UserError when the study has no chain
    to build one from."""
    rules = engine.adaptive
    if rules is None:
        raise UserError(f"the {engine.kind} engine has no adaptive speculative mode")
    chains = _chains(study, engine)
    if not chains:
        raise UserError(f"study {study.study_name!r} has no feasible measured chain (a topk-1 EAGLE/EAGLE3 config "
                        "whose settings allow adaptive mode) to build a schedule from")
    family_trial, steps_of = chains
    levels = sorted({lv["concurrency"] for t in study.get_trials(deepcopy=False)
                     for lv in TrialRecord.of(t).levels if "concurrency" in lv})
    chosen: list[tuple[int, dict[int, Estimate], tuple[int, ...]]] = []
    for c in levels:
        figures = {steps_of[k]: e for k, e in results.level_estimates(study, c).items() if k in steps_of}
        if not figures:
            continue
        best = max(e.value for e in figures.values())
        chosen.append((c, figures, tuple(sorted(s for s, e in figures.items() if e.value >= best * (1 - tolerance)))))
    if not chosen:
        raise UserError(f"study {study.study_name!r} measured no concurrency level on a chain")
    deepest = max(s for _, _, steps in chosen for s in steps)
    limit = _capacity(study, deepest, steps_of)
    slots: list[Slot] = []
    skipped: list[tuple[int, int]] = []
    for c, figures, steps in chosen:
        batch = min(c, limit) if limit is not None else c
        if slots and rules.padded_batch(batch, limit) <= rules.padded_batch(slots[-1].batch, limit):
            skipped.append((c, batch))
            continue
        key = 1 if not slots else rules.padded_batch(slots[-1].batch, limit) + 1
        slots.append(Slot(key, c, batch, steps, figures))
    plan = {slot.key: slot.steps for slot in slots}
    try:
        document = rules.document(plan)
    except ValueError as e:  # never written: the engine would refuse it
        raise UserError(f"study {study.study_name!r}: the schedule would be refused: {e}") from None
    family = TrialRecord.of(study.get_trials(deepcopy=False)[family_trial]).config or {}
    return Schedule(slots, skipped, limit, deepest, tolerance, document, rules.deploy_args(family, plan, path),
                    family_trial)


def _chains(study: optuna.Study, engine: Engine) -> tuple[int, dict[str, int]] | None:
    """(the trial of the best chain by the objective, {config key: steps} of the chains of its family)."""
    rules = engine.adaptive
    family: dict[str, tuple[str, int, int]] = {}  # config key -> (family key, steps, first trial)
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.of(t)
        if not rec.feasible or rec.reused_from is not None or not rec.config or rec.config_key is None:
            continue
        steps = rules.chain_steps(rec.config)
        if steps is not None and rec.config_key not in family:
            family[rec.config_key] = (_key(rules.family(rec.config)), steps, rec.number)
    ranked = {k: e for k, e in results.estimates(study).items() if k in family}
    top = results.top(ranked)
    if top is None:
        return None
    home = family[top.key][0]
    return family[top.key][2], {k: steps for k, (fam, steps, _) in family.items() if fam == home}


def _capacity(study: optuna.Study, steps: int, steps_of: dict[str, int]) -> int | None:
    """The max_running_requests the study recorded for the chain of ``steps`` (the fewest any launch of it saw)."""
    key = next(k for k, s in steps_of.items() if s == steps)
    seen = []
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.of(t)
        if rec.config_key == key and rec.reused_from is None:
            found = (rec.capacity or {}).get("max_running_requests") or rec.metrics.get("max_running_requests")
            if isinstance(found, int) and found > 0:
                seen.append(found)
    return min(seen) if seen else None


def _key(args: Args) -> str:
    return "\n".join(f"{k}={args[k]!r}" for k in sorted(args))


def summary(schedule: Schedule, describe: Callable[[Args], str]) -> list[str]:
    """What the schedule holds and why, for a person: one line per slot, the levels that add nothing, the deploy
    line (``describe`` turns the deploy args into the server's command line)."""
    limit = schedule.max_running_requests
    lines = [f"adaptive schedule from the chains of trial {schedule.family_trial}'s config, each within "
             f"{schedule.tolerance:.0%} of the best chain at its load:"]
    for i, slot in enumerate(schedule.slots):
        upper = schedule.slots[i + 1].key - 1 if i + 1 < len(schedule.slots) else None
        span = f"{slot.key}" + (f"-{upper}" if upper is not None and upper != slot.key else "+" if upper is None
                                else "")
        figures = ", ".join(f"{s}: {slot.figures[s].value:.1f} [{slot.figures[s].low:.1f}-{slot.figures[s].high:.1f}]"
                            for s in sorted(slot.figures, key=lambda s: -slot.figures[s].value))
        lines.append(f"  batch {span:<7} (c{slot.concurrency}, {slot.batch} running): steps "
                     f"{list(slot.steps)}; measured tok/s {figures}")
    for c, batch in schedule.skipped:
        lines.append(f"  c{c} adds no slot: its batch of {batch} routes like the level before it")
    if limit is not None:
        lines.append(f"the server runs at most {limit} requests at once (max_running_requests of the "
                     f"{schedule.deepest}-step chain: buffers are sized for the widest step)")
    lines.append(f"deploy: {describe(schedule.args)}")
    return lines
