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

Between the two, nothing is known for sure; ``probability`` gives those configs a chance of fitting below 1 where a
memory failure may reach them (before any, every config is taken to fit), so that the search prefers a config more
likely to fit when the objective's models rate two alike. Per width (``SearchSettings.boundary``): a draft tree's
memory grows with its width (topk), so a failure at one width puts in doubt the configs of that width and of the
wider ones, never the narrower ones (a failure of a topk-8 tree says nothing against a chain). Within a width the
need grows about linearly with steps and draft tokens (SGLang's CUDA graphs: batch x draft tokens for the verify,
batch x the tree's candidates for the draft), so the boundary there is a line: "line" gives a config the share of the
lines through that width's evidence (the failures above, the configs that started below; every mix of the two
numbers, the line anywhere between) under which it fits, and a config next to a failure gets little; "topk" gives
every config in doubt ``SearchSettings.fit_unknown``; "one" does so for every config once any failure is seen.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from optuna.trial import FrozenTrial

from autotune.results import tally
from autotune.engines import ArgValue, Engine
from autotune.record import TrialRecord

#: failure reasons that say the config needs more memory than the server has
MEMORY_REASONS = ("oom_startup", "oom_under_load")


@dataclass(frozen=True)
class Size:
    """How large a config is to the engine's memory rule: its values of the memory flags (by name), everything else
    it sets (two configs compare only when that is equal), and its draft tree (steps, topk, draft tokens)."""

    values: tuple[tuple[str, float], ...]
    rest: frozenset[tuple[str, str]]
    tree: tuple[int, int, int] | None

    @classmethod
    def of(cls, engine: Engine, args: Mapping[str, ArgValue]) -> Size | None:
        """None when the engine names no memory flag for ``args``."""
        plain = _plain(engine, args)
        flags = engine.memory_flags(plain)
        if not flags:
            return None
        return cls(tuple(sorted((f, _number(plain[f])) for f in flags)),
                   frozenset((k, str(v)) for k, v in plain.items() if k not in flags), engine.draft_tree(plain))

    def at_least(self, other: Size) -> bool:
        """Whether this config needs at least as much memory as ``other``: alike in everything else, at least as
        large in each memory flag."""
        return (self.rest == other.rest and [f for f, _ in self.values] == [f for f, _ in other.values]
                and all(a >= b for (_, a), (_, b) in zip(self.values, other.values, strict=True)))

    @property
    def width(self) -> int | None:
        """The draft tree's width (topk); None: no tree."""
        return None if self.tree is None else self.tree[1]


@dataclass(frozen=True)
class Boundary:
    """One launch's evidence: its config (the engine's effective args), how large it is, and whether it ran out of
    memory."""

    args: Mapping[str, ArgValue]
    trial: FrozenTrial
    oom: bool
    size: Size | None


class Feasibility:
    """The study's memory boundary, from its launches."""

    def __init__(self, engine: Engine, trials: Sequence[FrozenTrial]) -> None:
        self.engine = engine
        self.evidence: list[Boundary] = []
        self._lines: dict[tuple[int, frozenset[tuple[str, str]]], _Line | None] = {}
        for t in tally.launches(list(trials)):
            rec = TrialRecord.of(t)
            if rec.config is None or rec.adaptive:  # sized for its widest step, not the one its config names
                continue
            if rec.reason in MEMORY_REASONS or rec.capacity is not None:  # ran out of memory, or started: it fit
                plain = _plain(engine, rec.config)
                self.evidence.append(Boundary(plain, t, rec.reason in MEMORY_REASONS, Size.of(engine, plain)))

    @property
    def failures(self) -> list[Boundary]:
        return [b for b in self.evidence if b.oom]

    def known_oom(self, args: Mapping[str, ArgValue]) -> FrozenTrial | None:
        """The launch that ran out of memory with a config at most as large as ``args`` (None: none did)."""
        here = Size.of(self.engine, args)
        return None if here is None else self._oom(here)

    def known_fit(self, args: Mapping[str, ArgValue]) -> bool:
        """Whether a config at least as large as ``args`` started."""
        here = Size.of(self.engine, args)
        return here is not None and self._fit(here)

    def probability(self, args: Mapping[str, ArgValue], unknown: float, boundary: str = "line") -> float:
        """The chance that ``args`` fits: 0 above a memory failure, 1 below a config that started, between where a
        failure may reach it (``boundary``: "one", any failure; "topk" and "line", one at its draft tree's width or
        a narrower one) ``unknown``, or with "line" the share of its width's boundary lines under which it fits; 1
        where no failure reaches."""
        here = Size.of(self.engine, args)
        if here is None:
            return 1.0 if not self.failures else unknown
        if self._oom(here) is not None:
            return 0.0
        if self._fit(here) or not self.reaching(here, boundary != "one"):
            return 1.0
        if boundary == "line" and here.tree is not None:
            line = self._line(here)
            if line is not None:
                return line.chance(here.tree)
        return unknown

    def reaching(self, here: Size, per_width: bool = True) -> list[Boundary]:
        """The memory failures that put a config of size ``here`` in doubt: every one, or with ``per_width`` those
        at the width of its draft tree or a narrower one (all of them for a config that drafts no tree)."""
        if not per_width or here.width is None:
            return self.failures
        return [b for b in self.failures if b.size is None or (b.size.width or 0) <= here.width]

    def _oom(self, here: Size) -> FrozenTrial | None:
        return next((b.trial for b in self.failures if b.size is not None and here.at_least(b.size)), None)

    def _fit(self, here: Size) -> bool:
        return any(not b.oom and b.size is not None and b.size.at_least(here) for b in self.evidence)

    def _line(self, here: Size) -> _Line | None:
        """The boundary lines of ``here``'s width for configs alike it in every other flag, from the failures at
        that width or a narrower one (they fail there too) and the configs that started at that width or a wider
        one (they fit there too); None when no failure reaches or no line separates them."""
        assert here.tree is not None
        width = here.tree[1]
        if (width, here.rest) not in self._lines:
            fails, fits = [], []
            for b in self.evidence:
                if b.size is None or b.size.tree is None or b.size.rest != here.rest:
                    continue
                if b.oom and b.size.tree[1] <= width:
                    fails.append((b.size.tree[0], b.size.tree[2]))
                elif not b.oom and b.size.tree[1] >= width:
                    fits.append((b.size.tree[0], b.size.tree[2]))
            self._lines[(width, here.rest)] = _Line.through(fails, fits)
        return self._lines[(width, here.rest)]


class _Line:
    """A width's memory boundary as a line in (steps, draft tokens): a config fits when w x draft / D + (1 - w) x
    steps / S stays under a threshold, for mixes w of the two numbers (D, S: the first failure's) and a threshold
    anywhere between the largest config that started and the smallest that failed, each mix weighted by how much
    room its threshold has (a uniform prior over both)."""

    MIXES = np.linspace(0.0, 1.0, 21)

    def __init__(self, scale: tuple[float, float], low: np.ndarray, high: np.ndarray) -> None:
        self.scale, self.low, self.high = scale, low, high
        self.weight = np.maximum(high - low, 0.0)

    @classmethod
    def through(cls, fails: list[tuple[int, int]], fits: list[tuple[int, int]]) -> _Line | None:
        if not fails:
            return None
        scale = (float(fails[0][0]), float(fails[0][1]))
        line = cls(scale, np.zeros(len(cls.MIXES)), np.full(len(cls.MIXES), np.inf))
        line.high = np.min([line.need(f) for f in fails], axis=0)
        line.low = np.max([line.need(f) for f in fits], axis=0) if fits else np.zeros(len(cls.MIXES))
        line.weight = np.maximum(line.high - line.low, 0.0)
        return line if line.weight.sum() > 0 else None

    def need(self, tree: tuple[int, ...]) -> np.ndarray:
        """Each mix's need of a (steps, draft tokens) pair or a (steps, topk, draft tokens) tree."""
        steps, draft = tree[0], tree[-1]
        return self.MIXES * draft / self.scale[1] + (1 - self.MIXES) * steps / self.scale[0]

    def chance(self, tree: tuple[int, int, int]) -> float:
        room = np.clip((self.high - self.need(tree)) / np.maximum(self.high - self.low, 1e-12), 0.0, 1.0)
        return float((room * self.weight).sum() / self.weight.sum())


def at_least(engine: Engine, big: Mapping[str, ArgValue], small: Mapping[str, ArgValue]) -> bool:
    """Whether ``big`` needs at least as much memory as ``small`` by the engine's rule: equal in every flag but the
    memory flags, and at least as large in each of those."""
    a, b = Size.of(engine, big), Size.of(engine, small)
    return a is not None and b is not None and a.at_least(b)


def _plain(engine: Engine, args: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
    """The args without the port, which says where a config runs, not how large it is."""
    return {k: v for k, v in args.items() if k != engine.port_flag}


def _number(value: ArgValue) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")
