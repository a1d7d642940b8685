"""Where configs fit in memory: a monotone boundary learned from the study's own launches, kept apart from the
models of the objective.

A server's memory need grows with each of the flags the engine names (``Engine.memory_flags``: for SGLang's EAGLE
trees, draft tokens, steps and topk), everything else being equal. So one launch says something about many
configs:

* a config that ran out of memory (``MEMORY_REASONS``) predicts the same for every config at least as large in each
  of those flags; such a config is never launched (trial/decision.py rejects it, free, like an invalid one);
* a config that started predicts that every config at most as large starts too;
* a failure says nothing about smaller configs, and nothing about the objective: the models of the objective learn
  from measurements only (a failure at a large draft count must not make a whole topk look poor).

Between the two, nothing is known; ``probability`` gives those configs ``SearchSettings.fit_unknown`` once the
study has seen a memory failure (before any, every config is taken to fit), so that the search prefers a config
known to fit when the objective's models rate two alike.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from autotune import results
from autotune.engines import ArgValue, Engine
from autotune.record import TrialRecord

#: failure reasons that say the config needs more memory than the server has
MEMORY_REASONS = ("oom_startup", "oom_under_load")


@dataclass(frozen=True)
class Boundary:
    """One launch's evidence: its config (the engine's effective args) and whether it ran out of memory."""

    args: Mapping[str, ArgValue]
    trial: FrozenTrial
    oom: bool


class Feasibility:
    """The study's memory boundary, from its launches."""

    def __init__(self, engine: Engine, trials: Sequence[FrozenTrial]) -> None:
        self.engine = engine
        self.evidence: list[Boundary] = []
        for t in results.launches(list(trials)):
            rec = TrialRecord.of(t)
            if rec.config is None or rec.adaptive:  # sized for its widest step, not the one its config names
                continue
            if rec.reason in MEMORY_REASONS:
                self.evidence.append(Boundary(_plain(engine, rec.config), t, oom=True))
            elif rec.capacity is not None:  # the server started: it fit
                self.evidence.append(Boundary(_plain(engine, rec.config), t, oom=False))

    @property
    def failures(self) -> list[Boundary]:
        return [b for b in self.evidence if b.oom]

    def known_oom(self, args: Mapping[str, ArgValue]) -> FrozenTrial | None:
        """The launch that ran out of memory with a config at most as large as ``args`` (None: none did)."""
        here = _plain(self.engine, args)
        return next((b.trial for b in self.failures if at_least(self.engine, here, b.args)), None)

    def known_fit(self, args: Mapping[str, ArgValue]) -> bool:
        """Whether a config at least as large as ``args`` started."""
        here = _plain(self.engine, args)
        return any(not b.oom and at_least(self.engine, b.args, here) for b in self.evidence)

    def probability(self, args: Mapping[str, ArgValue], unknown: float) -> float:
        """The chance that ``args`` fits: 0 above a memory failure, 1 below a config that started, ``unknown``
        between (1 while the study has seen no memory failure)."""
        if self.known_oom(args) is not None:
            return 0.0
        if not self.failures or self.known_fit(args):
            return 1.0
        return unknown


def at_least(engine: Engine, big: Mapping[str, ArgValue], small: Mapping[str, ArgValue]) -> bool:
    """Whether ``big`` needs at least as much memory as ``small`` by the engine's rule: equal in every flag but the
    memory flags, and at least as large in each of those."""
    flags = engine.memory_flags(big)
    if not flags or set(flags) != set(engine.memory_flags(small)) or set(big) != set(small):
        return False
    if any(value != small[name] for name, value in big.items() if name not in flags):
        return False
    return all(_number(big[name]) >= _number(small[name]) for name in flags)


def _plain(engine: Engine, args: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
    """The args without the port, which says where a config runs, not how large it is."""
    return {k: v for k, v in args.items() if k != engine.port_flag}


def _number(value: ArgValue) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")
