"""The search's per-study model of what a draft tree's numbers do (autotune/search/physics.py): fitted to a few
launches' accept lengths and throughputs, it predicts trees never launched, and it needs a few launches first."""
from __future__ import annotations

from autotune.search.physics import Observation, Physics, accept_length, features

#: a draft whose first token is accepted 80% of the time, 0.9 as often at each depth further, and whose extra
#: candidates at a depth act like m^0.4 independent ones
DRAFT = (0.8, 0.9, 0.4)
#: seconds per accepted token and request: fixed, per step, per draft token, per step x topk (c1, c32)
COST = {1: (4e-3, 4e-4, 1e-5, 2e-5), 32: (6e-4, 5e-5, 3e-5, 4e-6)}


def observed(tree: tuple[int, int, int]) -> Observation:
    length = accept_length(tree, *DRAFT)
    levels = {c: length / sum(w * f for w, f in zip(cost, features(tree), strict=True)) for c, cost in COST.items()}
    return Observation(tree, length, levels)


def test_a_few_launches_predict_trees_never_launched() -> None:
    launched = [(1, 1, 2), (3, 1, 4), (5, 1, 6), (5, 2, 11), (5, 4, 17), (5, 8, 17)]
    model = Physics.fit([observed(t) for t in launched])
    assert model is not None
    for tree in ((2, 2, 4), (3, 2, 6), (4, 4, 12), (7, 8, 30), (8, 1, 9), (2, 8, 16)):
        truth = observed(tree)
        predicted = model.tok_s(tree)
        for c in COST:
            assert abs(predicted[c] / truth.level_tok_s[c] - 1) < 0.05, (tree, c, predicted[c], truth.level_tok_s[c])


def test_it_ranks_the_trees_as_the_truth_does() -> None:
    model = Physics.fit([observed(t) for t in [(1, 1, 2), (3, 1, 4), (3, 2, 6), (5, 4, 17)]])
    assert model is not None
    trees = [(s, k, d) for s in range(1, 9) for k in (1, 2, 4, 8) for d in range(2, 33)
             if (k == 1 and d == s + 1) or (k > 1 and d <= k + (s - 1) * k * k + 1)]
    for c in COST:
        best = max(trees, key=lambda t: observed(t).level_tok_s[c])
        pick = max(trees, key=lambda t: model.tok_s(t)[c])
        assert observed(pick).level_tok_s[c] >= 0.97 * observed(best).level_tok_s[c], (c, pick, best)


def test_too_few_launches_predict_nothing() -> None:
    assert Physics.fit([observed((1, 1, 2)), observed((3, 1, 4))]) is None
    assert Physics.fit([observed((3, 1, 4))] * 5) is None, "one tree measured five times is one tree"
