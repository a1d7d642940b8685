"""A second acceptance model: SGLang's EAGLE tree built and verified by Monte Carlo over a draft's distribution.

The emulator's own model (model.py) is a closed form: a per-depth acceptance, candidates at a depth covering it as
``m^gain`` independent tries, a budget spent greedily where it adds most. This one simulates what SGLang does instead,
one verify step at a time (SGLang's speculative/eagle_utils.py and the EAGLE worker's draft loop, read, not copied):

* the draft step: from the accepted token the draft proposes its ``topk`` most likely next tokens, each scored by
  its probability; at every later step each of the ``topk`` beams proposes its own ``topk`` children, scored by the
  beam's score times the child's probability (``topk^2`` candidates), and the ``topk`` best of those become the
  next beams. Every candidate of every step is kept with its score: ``topk + (steps - 1) * topk^2`` of them;
* the tree: the ``draft - 1`` candidates with the highest scores (a child never scores above its parent, so the
  set holds each candidate's ancestors);
* verification (greedy): the target's token is compared along the tree from the root; the accepted length is the
  longest path of candidates that match, plus the target's own bonus token.

The draft's distribution at each candidate: its most likely token has probability ``p``, drawn per candidate from a
beta distribution of mean ``confidence`` (``confidence_spread`` is the beta's a + b: small, a draft sure of some
tokens and lost on others; large, the same confidence everywhere), and its i-th most likely ``p (1 - p)^(i-1)``. The
target's token is the draft's i-th with probability ``align_d * q_i`` (a calibrated draft whose distribution is
right ``align_d`` of the time), else none of the draft's; ``align_d = align * align_decay^(d-1)`` at depth d (the
draft's features drift as it runs ahead of the target).

Tables are simulated once per (parameters, topk, temperature) with a fixed seed and the most steps any config asks
for, kept in memory (``functools.lru_cache``): every config of a given topk reads the same draws (common random
numbers), so neighbouring configs differ by what they do, not by sampling noise.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

#: Monte Carlo verify steps per table (the accept length's standard error is about 0.5% of it)
SAMPLES = 6000
#: the deepest tree simulated (SGLang's speculative-num-steps stays well below)
MAX_STEPS = 16


@dataclass(frozen=True)
class TreeDraft:
    """A draft as the Monte Carlo model sees it."""

    align: float              # the share of depth-1 positions at which the target's token is in the draft's ranks
    align_decay: float        # align's factor per depth further
    confidence: float         # the mean probability of the draft's most likely token
    confidence_spread: float  # the beta distribution's a + b for that probability


def reach_probabilities(draft: TreeDraft, steps: int, topk: int, draft_tokens: int,
                        temperature_factor: float = 1.0) -> list[float]:
    """P(the accepted path reaches depth d), d = 1..steps, for the tree (steps, topk, draft_tokens);
    ``temperature_factor`` scales ``align`` (sampling at a temperature matches the draft less often)."""
    table = _table(draft, topk, min(max(steps, 1), MAX_STEPS), round(temperature_factor, 4))
    budget = max(0, min(draft_tokens - 1, table.shape[1] - 1))
    return [float(x) for x in table[:steps, budget]]


def accept_length(draft: TreeDraft, steps: int, topk: int, draft_tokens: int, temperature_factor: float = 1.0
                  ) -> float:
    """Expected tokens per verify step: one plus the chance of reaching each depth."""
    return 1.0 + sum(reach_probabilities(draft, steps, topk, draft_tokens, temperature_factor))


@functools.lru_cache(maxsize=256)
def _table(draft: TreeDraft, topk: int, steps: int, temperature_factor: float) -> np.ndarray:
    """[depth - 1, tokens in the tree] -> P(the accepted path reaches that depth), for every budget of draft tokens
    up to the whole candidate set, for trees of ``steps`` steps."""
    rng = np.random.default_rng(1_000_003 * topk + 7)
    n, k = SAMPLES, topk
    a = draft.confidence * draft.confidence_spread
    b = (1.0 - draft.confidence) * draft.confidence_spread
    ranks = np.arange(k)
    scores: list[np.ndarray] = []       # per step: every candidate's score, (n, candidates)
    right: list[np.ndarray] = []        # per step: the score of the candidate that matches the target (nan: none)
    beam_scores = np.ones((n, 1))
    beam_right = np.zeros(n, dtype=int)  # which beam holds the target's path (-1: it was lost)
    for depth in range(steps):
        align = min(1.0, draft.align * draft.align_decay ** depth * temperature_factor)
        beams = beam_scores.shape[1]
        p = rng.beta(a, b, size=(n, beams))
        q = p[:, :, None] * (1.0 - p[:, :, None]) ** ranks           # (n, beams, k): each beam's top-k
        children = (beam_scores[:, :, None] * q).reshape(n, beams * k)
        # the target's token among the right beam's children: rank i with probability align * q_i
        u = rng.random(n)
        rows = np.arange(n)
        alive = beam_right >= 0
        q_right = q[rows, np.maximum(beam_right, 0)]                  # (n, k)
        hit = np.argmax(np.cumsum(align * q_right, axis=1) > u[:, None], axis=1)
        found = alive & (align * q_right.sum(axis=1) > u)
        index = np.where(found, np.maximum(beam_right, 0) * k + hit, -1)
        right.append(np.where(found, children[rows, np.maximum(index, 0)], np.nan))
        scores.append(children)
        # the next beams: the k best children
        order = np.argsort(-children, axis=1)[:, :k]
        beam_scores = np.take_along_axis(children, order, axis=1)
        match = order == index[:, None]
        beam_right = np.where(found & match.any(axis=1), np.argmax(match, axis=1), -1)
    everything = np.concatenate(scores, axis=1)
    total = everything.shape[1]
    table = np.zeros((steps, total + 1))
    for depth, score in enumerate(right):
        ok = ~np.isnan(score)
        # the candidate's place among all candidates by score: in the tree when fewer than the budget rank above
        above = (everything > np.where(ok, score, np.inf)[:, None]).sum(axis=1)
        place = np.where(ok, above, total + 1)
        counts = np.bincount(np.minimum(place, total), minlength=total + 1)[:total]
        # reached with a budget of m tokens (m - 1 candidates... index m = candidates in the tree) when place < m
        table[depth, 1:] = np.cumsum(counts) / n
    return table
