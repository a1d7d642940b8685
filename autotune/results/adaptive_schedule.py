"""An adaptive speculative schedule written from a study's own measurements (`autotune best --format
sglang-adaptive`): for each running batch size, the chain lengths that served that load best.

Every trial measures every `[workload] concurrency` level, so the study already holds, for each measured chain
(a topk-1 config its engine's adaptive mode can switch between), its throughput at each load, pooled over its
launches (``tally.level_estimates``). For each level the schedule takes the chains whose pooled throughput there is
within the workload's ``tolerance`` of the best chain's; nothing else, and no level or chain the study did not
measure. Only chains of one family are used (every other flag the same): the family of the chain with the best
pooled objective.

From concurrency levels to running batch sizes
----------------------------------------------
The engine routes each decode batch by how many requests are running (padded up to a captured CUDA-graph size).
With ``c`` requests kept in flight, ``c`` run at once, but never more than the server's ``max_running_requests``.
An adaptive server sizes its buffers and state pools for its widest step, so it runs at most M, what the deepest
chain in the schedule ran in the study (that chain's recorded capacity), and level ``c`` runs a batch of
``min(c, M)`` on it. A chain's figure at level ``c`` counts only if that chain ran the same batch there
(``min(c, its own max_running_requests)``): on a hybrid model a shallow chain runs more requests than a deep one,
and its figure at a high load is then a measurement of a batch the adaptive server never runs. The deepest chain
sets M and M decides which figures count, so the choice is repeated, the deepest chain only ever getting shallower,
until the deepest chain chosen is the one M came from.

The slot for the first level starts at batch 1 (it serves every smaller batch too); each later level's slot starts
just above the previous level's padded batch, so a batch between two measured levels takes the chains of the level
above it (under a closed loop of ``c`` the running batch is ``c`` or just below). A level whose padded batch is no
larger than the previous level's (every level beyond M, or one CUDA-graph padding merges with the one before) adds
no slot, nor does a level where no chain ran the server's batch; consecutive slots with the same chains are one.

With several chains in a slot, SGLang's controller walks between them by acceptance, not by speed: under a draft
that agrees often it settles on the slot's deepest chain, which may be the slowest one within the tolerance. The
tolerance is therefore also what a slot may cost at its load.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna

from autotune.results import tally
from autotune.engines import AdaptiveRules, Args, Engine
from autotune.errors import UserError
from autotune.record import TrialRecord
from autotune.results.tally import Estimate


@dataclass(frozen=True)
class Slot:
    """One slot of the schedule and the measurements it comes from."""

    key: int                        # the smallest running batch (after padding) it serves
    concurrency: int                # the measured level it stands for
    batch: int                      # that level's running batch on the adaptive server
    steps: tuple[int, ...]          # the chains within the tolerance of the best one there
    figures: dict[int, Estimate]    # every chain measured at that batch, by steps
    other_batch: dict[int, int]     # chains measured at that level that ran another batch: steps -> their batch

    @property
    def best(self) -> int:
        return max(self.figures, key=lambda s: self.figures[s].value)


@dataclass(frozen=True)
class Skipped:
    """A measured level that adds no slot, and why."""

    concurrency: int
    batch: int
    why: str
    other_batch: dict[int, int]


@dataclass(frozen=True)
class Schedule:
    """A schedule built from a study, the file that holds it and the config that deploys it."""

    slots: list[Slot]
    skipped: list[Skipped]
    max_running_requests: int | None
    deepest: int
    tolerance: float
    document: dict
    args: Args
    family_trial: int               # the trial whose config's family the chains share
    family_steps: int               # that trial's chain: the best fixed chain by the objective

    @property
    def trials(self) -> list[int]:
        """The trials whose measurements the slots hold."""
        return sorted({n for slot in self.slots for e in slot.figures.values() for n in e.trials})

    @property
    def differs(self) -> bool:
        """Whether the schedule runs anything but the best fixed chain (more than one slot, or another chain): only
        then is an adaptive server worth a launch."""
        return len(self.slots) > 1 or self.slots[0].steps != (self.family_steps,)


@dataclass(frozen=True)
class _Chain:
    key: str                        # its config key
    steps: int
    running: int | None             # the fewest max_running_requests any launch of it reported


def build(study: optuna.Study, engine: Engine, tolerance: float, path: str = "adaptive.json",
          fixed: Args | None = None) -> Schedule:
    """The schedule for ``study``'s measurements (see the module docstring); UserError when the study has no chain
    to build one from. The deploy args are the family trial's recorded config, or with ``fixed`` (the study's fixed
    args, secrets included) those with the family trial's tuned flags on top: what a tuner launches."""
    rules = engine.adaptive
    if rules is None:
        raise UserError(f"the {engine.kind} engine has no adaptive speculative mode")
    found = _chains(study, rules)
    if found is None:
        raise UserError(f"study {study.study_name!r} has no feasible measured chain (a topk-1 EAGLE/EAGLE3 config "
                        "whose settings allow adaptive mode) to build a schedule from")
    family_trial, chains = found
    by_key = {c.key: c for c in chains.values()}
    levels = sorted({lv["concurrency"] for t in study.get_trials(deepcopy=False)
                     for lv in TrialRecord.of(t).levels if "concurrency" in lv})
    measured = {c: {by_key[k].steps: e for k, e in tally.level_estimates(study, c).items() if k in by_key}
                for c in levels}
    deepest = max(chains)
    while True:
        slots, skipped = _slots(rules, chains, measured, deepest, tolerance)
        if not slots:
            raise UserError(f"study {study.study_name!r} measured no concurrency level on a chain")
        chosen = max(s for slot in slots for s in slot.steps)
        if chosen == deepest:
            break
        deepest = chosen
    plan = {slot.key: slot.steps for slot in slots}
    try:
        document = rules.document(plan)
    except ValueError as e:  # never written: the engine would refuse it
        raise UserError(f"study {study.study_name!r}: the schedule would be refused: {e}") from None
    rec = TrialRecord.of(study.get_trials(deepcopy=False)[family_trial])
    family = {**fixed, **rec.params} if fixed is not None else rec.config or {}
    return Schedule(slots, skipped, chains[deepest].running, deepest, tolerance, document,
                    rules.deploy_args(family, plan, path), family_trial, rules.chain_steps(rec.config or {}) or 0)


def _slots(rules: AdaptiveRules, chains: dict[int, _Chain], measured: dict[int, dict[int, Estimate]], deepest: int,
           tolerance: float) -> tuple[list[Slot], list[Skipped]]:
    """The slots when the deepest chain allowed is ``deepest`` (the server then runs what it ran)."""
    limit = chains[deepest].running
    slots: list[Slot] = []
    skipped: list[Skipped] = []
    covered = 0  # the padded batch the slots so far reach up to
    for c, figures in measured.items():
        batch = _ran(c, limit)
        here = {s: e for s, e in figures.items() if s <= deepest and _ran(c, chains[s].running) == batch}
        other = {s: _ran(c, chains[s].running) for s in figures if s <= deepest and s not in here}
        if not here:
            if figures:
                skipped.append(Skipped(c, batch, f"no chain of at most {deepest} steps ran a batch of {batch} there",
                                       other))
            continue
        best = max(e.value for e in here.values())
        steps = tuple(sorted(s for s, e in here.items() if e.value >= best * (1 - tolerance)))
        padded = rules.padded_batch(batch, limit)
        if slots and padded <= covered:
            skipped.append(Skipped(c, batch, f"its batch of {batch} routes like c{slots[-1].concurrency}'s", other))
            continue
        if slots and steps == slots[-1].steps:
            skipped.append(Skipped(c, batch, f"the same chains as c{slots[-1].concurrency}, whose slot serves it",
                                   other))
        else:
            slots.append(Slot(covered + 1, c, batch, steps, here, other))
        covered = padded
    return slots, skipped


def _ran(concurrency: int, running: int | None) -> int:
    """The batch a closed loop of ``concurrency`` runs on a server that runs at most ``running`` requests."""
    return concurrency if running is None else min(concurrency, running)


def _chains(study: optuna.Study, rules: AdaptiveRules) -> tuple[int, dict[int, _Chain]] | None:
    """(the trial of the best chain by the objective, the chains of its family by steps)."""
    seen: dict[str, tuple[str, int, int]] = {}  # config key -> (family, steps, first trial)
    running: dict[str, list[int]] = {}
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.of(t)
        if not rec.feasible or rec.reused_from is not None or not rec.config or rec.config_key is None \
                or rec.adaptive:
            continue
        steps = rules.chain_steps(rec.config)
        if steps is None:
            continue
        seen.setdefault(rec.config_key, (_family_key(rules.family(rec.config)), steps, rec.number))
        mrr = (rec.capacity or {}).get("max_running_requests") or rec.metrics.get("max_running_requests")
        if isinstance(mrr, int) and mrr > 0:
            running.setdefault(rec.config_key, []).append(mrr)
    top = tally.top({k: e for k, e in tally.estimates(study).items() if k in seen})
    if top is None:
        return None
    home, _, first = seen[top.key]
    chains = {steps: _Chain(key, steps, min(running[key]) if key in running else None)
              for key, (family, steps, _) in seen.items() if family == home}
    return first, chains


def _other(batch: int, other_batch: dict[int, int]) -> str:
    if not other_batch:
        return ""
    ran = ", ".join(f"the {s}-step chain ran {b}" for s, b in sorted(other_batch.items()))
    return f" (not counted, measured at another batch than {batch}: {ran})"


def _family_key(args: Args) -> str:
    return "\n".join(f"{k}={args[k]!r}" for k in sorted(args))


def file_name(study: str, number: int) -> str:
    """The schedule file of the adaptive server a study launches as trial ``number``."""
    return f"{study}-adaptive-trial-{number:04d}.json"


def summary(schedule: Schedule, describe: Callable[[Args], str] | None) -> list[str]:
    """What the schedule holds and why, for a person: one line per slot, the levels that add none, the deploy line
    (``describe`` turns the deploy args into the server's command line; None: no deploy line)."""
    limit = schedule.max_running_requests
    lines = [f"adaptive schedule from the chains of trial {schedule.family_trial}'s config, each within "
             f"{schedule.tolerance:.0%} of the best chain at its load:"]
    for i, slot in enumerate(schedule.slots):
        upper = schedule.slots[i + 1].key - 1 if i + 1 < len(schedule.slots) else None
        span = f"{slot.key}+" if upper is None else f"{slot.key}" if upper == slot.key else f"{slot.key}-{upper}"
        figures = ", ".join(f"{s}: {slot.figures[s].value:.1f} [{slot.figures[s].low:.1f}-{slot.figures[s].high:.1f}]"
                            for s in sorted(slot.figures, key=lambda s: -slot.figures[s].value))
        lines.append(f"  batch {span:<7} (c{slot.concurrency}, {slot.batch} running): steps "
                     f"{list(slot.steps)}; measured tok/s {figures}{_other(slot.batch, slot.other_batch)}")
    for skip in schedule.skipped:
        lines.append(f"  c{skip.concurrency} adds no slot: {skip.why}{_other(skip.batch, skip.other_batch)}")
    if len(schedule.slots) == 1 and len(schedule.slots[0].steps) == 1:
        lines.append(f"one slot of one chain: the same as running the {schedule.slots[0].steps[0]}-step chain "
                     "without adaptive mode")
    if limit is not None:
        lines.append(f"the server runs at most {limit} requests at once (max_running_requests of the "
                     f"{schedule.deepest}-step chain: buffers are sized for the widest step)")
    if describe is not None:
        lines.append(f"deploy: {describe(schedule.args)}")
    return lines
