"""The tuner's own proposals beside the sampler's (autotune/search/), in a real study on the emulator (the study
tests/support/search_study.py runs once for several tests): after the baseline and two of the engine's starting
points its model picks each launch from the whole space (a config not measured yet), and it keeps its last launches
to confirm the leader, whose pooled estimate `autotune best` then reports."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import launches, run_autotune
from tests.support.search_study import LAUNCHES, search_study

FLAGS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


@pytest.mark.slow
def test_the_models_picks_then_confirmations_within_the_launch_budget(tmp_path_factory: pytest.TempPathFactory) -> None:
    shared = search_study(tmp_path_factory)
    study, r, trials = shared.path, shared.run, shared.trials
    retried = {t["retry_of"] for t in trials}
    assert launches(trials) == LAUNCHES

    def config(t: dict) -> tuple:
        return tuple(t["params"][f] for f in FLAGS)

    kept = [t for t in trials if t["number"] not in retried]
    assert [t["role"] for t in kept[:3]] == ["baseline", "starting point", "starting point"]
    measured = []   # configs measured or found infeasible so far, in order
    picks = 0
    for t in kept:
        if t["role"] == "model":
            picks += 1
            assert config(t) not in measured, "the model picks a config not measured yet"
        if t["role"] == "confirmation":
            assert config(t) in measured, "a confirmation measures a config again"
            assert t["launched"] and t["reused_from"] is None
        if t["state"] in ("COMPLETE", "PRUNED") and t["reused_from"] is None:
            measured.append(config(t))
    assert picks >= 5
    # min(3, 12 // 6) launches kept back at the end
    assert [t["role"] for t in trials if t["launched"] and t["number"] not in retried][-2:] == ["confirmation"] * 2
    assert "[model]" in r.stdout and "[confirmation]" in r.stdout

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
