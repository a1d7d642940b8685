"""The tuner's own proposals beside the sampler's (autotune/search.py), in a real study on the emulator (the study
tests/support/search_study.py runs once for several tests): after the startup launches it measures neighbours of the
leader, and it keeps its last launches to confirm the leader, whose pooled estimate `autotune best` then reports."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import launches, run_autotune
from tests.support.search_study import LAUNCHES, search_study

FLAGS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


def _one_move(a: tuple, b: tuple) -> bool:
    moved = [f for f, x, y in zip(FLAGS, a, b, strict=True) if x != y]
    return len(moved) == 1 or (len(moved) == 2 and moved[1] == "speculative-num-draft-tokens")


@pytest.mark.slow
def test_neighbours_of_the_leader_then_confirmations_within_the_launch_budget(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    shared = search_study(tmp_path_factory)
    study, r, trials = shared.path, shared.run, shared.trials
    retried = {t["retry_of"] for t in trials}
    assert launches(trials) == LAUNCHES

    def config(t: dict) -> tuple:
        return tuple(t["params"][f] for f in FLAGS)

    measured = []   # configs measured so far, in order
    neighbours = 0
    for t in trials:
        if t["role"] == "neighbour":
            neighbours += 1
            assert config(t) not in measured, "a neighbour is a config not measured yet"
            # one flag moved from a config measured before it (the leader at that time); draft tokens may follow
            # a move of steps or topk, kept at the same place in their new valid range
            assert any(_one_move(config(t), m) for m in measured), t
        if t["role"] == "confirmation":
            assert config(t) in measured, "a confirmation measures a config again"
            assert t["launched"] and t["reused_from"] is None
        if t["state"] == "COMPLETE" and t["reused_from"] is None:
            measured.append(config(t))
    assert neighbours >= 2
    # min(3, 12 // 6) launches kept back at the end
    assert [t["role"] for t in trials if t["launched"] and t["number"] not in retried][-2:] == ["confirmation"] * 2
    assert "[neighbour]" in r.stdout and "[confirmation]" in r.stdout

    best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
    estimate = best["estimate"]
    assert estimate["trials"][0] == best["number"]
    assert estimate["low"] <= estimate["value"] <= estimate["high"]
    same = [t for t in trials if t["reused_from"] is None and t["state"] == "COMPLETE"
            and config(t) == tuple(best["params"][f] for f in FLAGS)]
    assert estimate["launches"] == len(same) == len(estimate["trials"])
    # the pick was confirmed, or a rival overlapping it was and the pick stayed ahead
    text = run_autotune("best", "--study", str(study)).stdout
    assert "launch" in text and f"{estimate['value']:.4g}" in text
