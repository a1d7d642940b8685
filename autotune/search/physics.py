"""What a draft tree's numbers do, fitted to one study's own launches: a prediction for every config never launched.

Each launch measures, beside its throughput, the accept length (tokens per verify step, from the responses) at
each level. Two small models explain those figures, fitted per study and never preset:

* acceptance: the draft's token at depth j survives with probability ``first * decay^(j-1)``; m candidates at a
  depth cover it with ``1 - (1 - q)^(m^gain)``; a tree of ``draft`` tokens spends them on its ``steps`` depths
  (one each, then more at the shallowest depths first, at most ``topk`` per depth). The accept length is one plus
  the chance of reaching each depth, summed. Fitted to the measured accept lengths on a grid of the three numbers.
* cost: the time a level spends per accepted token and request, accept length over throughput, grows linearly
  with steps (the draft's forward passes), draft tokens (the verify's width) and steps x topk (the draft tree's
  candidates), from a fixed cost: non-negative least squares over the launches, per level.

A config's predicted throughput at a level is then its predicted accept length over its predicted cost. The search
uses the prediction as its model's prior mean (propose.py), so that the model's own correction (local_model.py)
is left with what physics does not explain.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Tree = tuple[int, int, int]  # (steps, topk, draft tokens) as the engine runs them

#: the acceptance grid: first-depth acceptance, its decay per depth, what extra candidates at a depth buy
FIRST = tuple(np.linspace(0.30, 0.98, 18))
DECAY = tuple(np.linspace(0.60, 1.00, 11))
GAIN = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


@dataclass(frozen=True)
class Observation:
    """One launch: its tree, its accept length and its throughput at each level (tok/s by concurrency)."""

    tree: Tree
    accept_length: float
    level_tok_s: dict[int, float]


def allocation(tree: Tree) -> list[int]:
    """Candidates per depth: one at each of min(steps, draft - 1) depths, the rest at the shallowest depths first,
    at most topk per depth."""
    steps, topk, draft = tree
    depths = max(0, min(steps, draft - 1))
    alloc = [1] * depths
    extra = draft - 1 - depths
    for j in range(depths):
        add = min(topk - 1, extra)
        alloc[j] += add
        extra -= add
    return alloc


def accept_length(tree: Tree, first: float, decay: float, gain: float) -> float:
    length, reach = 1.0, 1.0
    for j, m in enumerate(allocation(tree)):
        q = first * decay ** j
        reach *= 1.0 - (1.0 - q) ** (m ** gain)
        length += reach
    return length


def _lengths(tree: Tree, first: np.ndarray, decay: np.ndarray, gain: np.ndarray) -> np.ndarray:
    """``accept_length`` for arrays of the three numbers at once."""
    length, reach = np.ones_like(first), np.ones_like(first)
    for j, m in enumerate(allocation(tree)):
        q = first * decay ** j
        reach = reach * (1.0 - (1.0 - q) ** (m ** gain))
        length = length + reach
    return length


def features(tree: Tree) -> list[float]:
    steps, topk, draft = tree
    return [1.0, float(steps), float(draft), float(steps * topk)]


class Physics:
    """The two models, fitted to a study's observations; ``None`` from ``fit`` when there are too few."""

    def __init__(self, acceptance: tuple[float, float, float], costs: dict[int, np.ndarray]) -> None:
        self.acceptance = acceptance
        self.costs = costs

    @classmethod
    def fit(cls, observations: Sequence[Observation], min_launches: int = 3) -> Physics | None:
        usable = [o for o in observations if o.accept_length > 0 and all(v > 0 for v in o.level_tok_s.values())]
        if len({o.tree for o in usable}) < min_launches:
            return None
        trees = [o.tree for o in usable]
        first, decay, gain = (np.array(v) for v in zip(*itertools.product(FIRST, DECAY, GAIN), strict=True))
        err = np.zeros(len(first))
        for o in usable:
            err += (np.log(_lengths(o.tree, first, decay, gain)) - math.log(o.accept_length)) ** 2
        i = int(np.argmin(err))
        best = (float(first[i]), float(decay[i]), float(gain[i]))
        x = np.array([features(t) for t in trees])
        levels = set.intersection(*(set(o.level_tok_s) for o in usable))
        costs = {c: _nnls(x, np.array([o.accept_length / o.level_tok_s[c] for o in usable])) for c in levels}
        return cls(best, costs)

    def tok_s(self, tree: Tree) -> dict[int, float]:
        """Predicted throughput at each fitted level."""
        length = accept_length(tree, *self.acceptance)
        f = np.array(features(tree))
        return {c: length / max(float(f @ w), 1e-12) for c, w in self.costs.items()}


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients: the most negative one dropped until none is (the fixed cost,
    the first column, always kept)."""
    active = list(range(x.shape[1]))
    while True:
        w = np.zeros(x.shape[1])
        w[active] = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
        negative = [i for i in active if w[i] < 0 and i != 0]
        if not negative:
            return np.maximum(w, 0.0)
        active.remove(min(negative, key=lambda i: w[i]))
