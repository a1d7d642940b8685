"""The second acceptance model (autotune/sim/tree_acceptance.py): SGLang's EAGLE tree built and verified by Monte
Carlo over a draft distribution, checked against a plain step-by-step simulation written here from the same
description, and the second family of random hosts that uses it (`autotune sim profile --random SEED --family
tree`)."""
from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.sim import model
from autotune.sim.profile import ProfileError, load_profile
from autotune.sim.random_profile import draw
from autotune.sim.tree_acceptance import TreeDraft, accept_length, reach_probabilities

DRAFT = TreeDraft(align=0.92, align_decay=0.95, confidence=0.7, confidence_spread=4.0)


def reference(draft: TreeDraft, steps: int, topk: int, tokens: int, samples: int = 3000, seed: int = 11) -> float:
    """One verify step at a time, as SGLang does it: beams expand their top-k, the k best children become the next
    beams, the tokens - 1 best-scored candidates form the tree, the accepted path is the longest one matching the
    target (each node's correct child drawn from the draft's own distribution, scaled by the alignment)."""
    rng = random.Random(seed)
    a = draft.confidence * draft.confidence_spread
    b = (1 - draft.confidence) * draft.confidence_spread
    total = 0.0
    for _ in range(samples):
        nodes: list[tuple[float, int, bool]] = []  # (score, depth, on the target's path)
        beams = [(1.0, True)]
        for depth in range(1, steps + 1):
            align = draft.align * draft.align_decay ** (depth - 1)
            children = []
            for score, right in beams:
                p = rng.betavariate(a, b)
                q = [p * (1 - p) ** i for i in range(topk)]
                u, hit, acc = rng.random(), None, 0.0
                for i, qi in enumerate(q):
                    acc += align * qi
                    if u < acc:
                        hit = i
                        break
                children += [(score * qi, right and hit == i) for i, qi in enumerate(q)]
            nodes += [(s, depth, r) for s, r in children]
            beams = sorted(children, key=lambda c: -c[0])[:topk]
        tree = sorted(nodes, key=lambda n: -n[0])[:tokens - 1]
        total += 1 + sum(1 for _, _, right in tree if right)
    return total / samples


@pytest.mark.parametrize("tree", [(1, 1, 2), (3, 1, 4), (2, 2, 4), (3, 2, 6), (2, 4, 8), (3, 4, 12), (2, 8, 7)])
def test_the_tables_agree_with_a_step_by_step_simulation(tree):
    steps, topk, tokens = tree
    assert accept_length(DRAFT, steps, topk, tokens) == pytest.approx(reference(DRAFT, steps, topk, tokens), rel=0.03)


def test_a_one_step_chain_accepts_its_top_token_as_often_as_the_draft_is_right():
    assert accept_length(DRAFT, 1, 1, 2) == pytest.approx(1 + DRAFT.align * DRAFT.confidence, rel=0.02)


def test_more_tokens_and_wider_trees_accept_more_and_reach_falls_with_depth():
    for steps in (2, 4, 6):
        for topk in (2, 4, 8):
            lengths = [accept_length(DRAFT, steps, topk, n) for n in range(2, 33)]
            assert lengths == sorted(lengths)
            reach = reach_probabilities(DRAFT, steps, topk, 32)
            assert reach == sorted(reach, reverse=True)
    assert accept_length(DRAFT, 3, 8, 16) > accept_length(DRAFT, 3, 2, 16) > accept_length(DRAFT, 3, 1, 4)


def test_a_draft_that_is_surer_where_it_is_right_gains_less_from_width():
    """A draft whose top token is nearly always its only guess (high confidence) gets little from extra branches;
    an unsure one gets more: what the closed form's topk_gain stands for, here an outcome of the distribution."""
    sure = dataclasses.replace(DRAFT, confidence=0.9)
    unsure = dataclasses.replace(DRAFT, confidence=0.5)

    def gain(d):
        return accept_length(d, 2, 8, 12) / accept_length(d, 2, 1, 3)
    assert gain(unsure) > gain(sure) * 1.1


def test_the_tree_family_shares_the_hardware_and_changes_only_the_draft(tmp_path: Path):
    for seed in (3, 17, 123):
        closed, tree = draw(seed), draw(seed, family="tree")
        assert tree.name == f"random-tree-{seed}" and closed.name == f"random-{seed}"
        for section in ("model", "hardware", "memory", "timing"):
            assert closed.sections[section] == tree.sections[section]
        assert tree.sections["acceptance"]["model"] == "tree"
        path = tmp_path / f"{tree.name}.toml"
        path.write_text(tree.toml())
        profile = load_profile(str(path))
        spec = model.Spec(3, 4, 10)
        draft = model.tree_draft(profile, spec)
        assert model.accept_length(profile, spec) == pytest.approx(accept_length(draft, 3, 4, 10))
        assert model.accept_length(profile, spec) != pytest.approx(model.accept_length(closed.profile(), spec))


def test_the_command_line_draws_either_family(tmp_path: Path):
    out = tmp_path / "t.toml"
    done = subprocess.run([sys.executable, "-m", "autotune", "sim", "profile", "--random", "5", "--family", "tree",
                           "--out", str(out)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert 'model = "tree"' in out.read_text() and "--family tree" in out.read_text()
    bad = subprocess.run([sys.executable, "-m", "autotune", "sim", "profile", "--random", "5", "--family", "mc"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "'mc' is not one of" in bad.stderr


def test_a_profile_naming_an_unknown_model_is_refused(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text(draw(5).toml().replace("[acceptance]\n", '[acceptance]\nmodel = "mc"\n'))
    with pytest.raises(ProfileError, match=r"\[acceptance\].model: expected \"closed\" or \"tree\""):
        load_profile(str(path))
