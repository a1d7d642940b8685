"""What no peer gives, on the emulator: the best config for each load (from trials already run), an objective for a
known load mix, a warm start from an earlier study, and a drift check of the deployed server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.testing.studies import port_of, write_study
from tests.support.cli import run_autotune, status
from tests.support.emulator import start_emulator

#: chains of 1, 4 and 8 steps on the qwen122b profile: 8 steps streams fastest alone, 4 steps serves 32 requests best
#: (`autotune sim surface --study`, below)
CHAINS = ('[space.speculative-num-steps]\ntype = "categorical"\nchoices = [1, 4, 8]\n'
          '[space.speculative-eagle-topk]\ntype = "categorical"\nchoices = [1]\n')
#: at the model's own speed: 32 requests in flight of 64 tokens each at x4 left the client behind the server on a busy
#: 2-core machine (43% of a request's time outside the server), and each such launch was retried after a backoff
SPEED = 1
WORKLOAD = "max_tokens = 64\nconcurrency = [1, 32]\nrequests = 32\nwindow_generations = 1\nwarmup = 1\ntolerance = 0.2"
STEPS = "speculative-num-steps"
#: every test here runs or reads studies of several launches at concurrency 32, and compares what they measured
pytestmark = [pytest.mark.slow, pytest.mark.alone]


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished grid study of the three chains (3 launches: the baseline is the 1-step chain)."""
    directory = tmp_path_factory.mktemp("chains")
    study = write_study(directory, "old", sampler="grid", launches=3, space=CHAINS, workload=WORKLOAD,
                        args={"sim-speedup": SPEED})
    r = run_autotune("run", "--study", str(study), cwd=directory)
    assert r.returncode == 0, r.stderr + r.stdout
    return study


def _truth(study: Path) -> dict[int, int]:
    """The steps of the best chain at each level, by the emulator's noise-free figures for the study's workload."""
    r = run_autotune("sim", "surface", "--study", str(study), "--json")
    configs = json.loads(r.stdout)["configs"]
    return {int(c): max(configs, key=lambda x: x["level_tok_s"][c])["params"][STEPS]
            for c in configs[0]["level_tok_s"]}


def test_the_best_config_for_each_load(chains: Path) -> None:
    truth = _truth(chains)
    assert truth[1] != truth[32], truth  # the profile's optima differ by load: the table has something to show
    r = run_autotune("best", "--study", str(chains), "--per-concurrency", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["concurrency"]: row for row in json.loads(r.stdout)}
    assert {c: row["params"][STEPS] for c, row in rows.items()} == truth
    for row in rows.values():
        assert row["low"] < row["output_tok_s"] < row["high"]
        assert row["confirmed"] is False and row["launches"] == 1  # each config was launched once
        assert row["gain"] > 1.0   # the 1-step chain (the baseline) is best at neither load
    text = run_autotune("best", "--study", str(chains), "--per-concurrency").stdout
    assert "c1" in text and "c32" in text and "measured once" in text
    out = chains.parent / "report"
    assert run_autotune("report", "--study", str(chains), "--out", str(out)).returncode == 0
    assert "## Best config per load" in (out / "summary.md").read_text()


def test_a_load_mix_is_the_objective(tmp_path: Path) -> None:
    mix = "\nmix = { 1 = 1, 32 = 3 }"   # shares normalised: a quarter of the time alone, three quarters at 32
    study = write_study(tmp_path, sampler="grid", launches=2, objective="mix", space=CHAINS.replace("1, 4, 8", "1, 4"),
                        workload=WORKLOAD + mix, args={"sim-speedup": SPEED})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    base, other = status(study)["trials"]
    assert base["value"] == pytest.approx(1.0)
    levels, ref = other["metrics"]["level_output_tok_s"], base["metrics"]["level_output_tok_s"]
    assert other["value"] == pytest.approx(0.25 * levels["1"] / ref["1"] + 0.75 * levels["32"] / ref["32"])

    bad = write_study(tmp_path, "bad", objective="mix", workload=WORKLOAD + "\nmix = { 8 = 1 }")
    r = run_autotune("validate", "--study", str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "[workload.mix] 8: must be one of the concurrency levels [1, 32]" in r.stderr


def test_a_warm_start_measures_the_old_best_first(chains: Path, tmp_path: Path) -> None:
    old_best = json.loads(run_autotune("best", "--study", str(chains), "--json").stdout)
    study = write_study(tmp_path, "new", launches=3, seed=11, space=CHAINS, workload=WORKLOAD,
                        args={"sim-speedup": SPEED})
    r = run_autotune("run", "--study", str(study), "--warm-start", str(chains), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"warm start from {chains}" in r.stdout
    trials = status(study)["trials"]
    first = trials[1]
    assert first["role"] == "warm start" and first["origin"] == f"study old, trial {old_best['number']}"
    assert first["params"][STEPS] == old_best["params"][STEPS], "the old optimum, by the second launch"
    assert first["value"] != old_best["value"], "measured afresh, not copied"
    assert f"[warm start, from study old, trial {old_best['number']}]" in r.stdout

    r = run_autotune("run", "--study", str(write_study(tmp_path, "other")), "--warm-start", "nope", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope" in r.stderr
    assert not (tmp_path / "other.db").exists()


def test_the_drift_check(chains: Path) -> None:
    port = port_of(chains)
    for steps, speedup, code, says in ((4, SPEED, 0, "as recorded"), (4, SPEED / 2, 1, "slower than recorded"),
                                       (2, SPEED, 2, "has not measured")):
        # the study's model (its KV cache, so the same max_running_requests at concurrency 32)
        server = start_emulator(port, steps, 1, steps + 1, speedup, model="/shared/models/Qwen3.5-122B-A10B")
        try:
            r = run_autotune("check", "--study", str(chains), cwd=chains.parent)
        finally:
            server.kill()
            server.wait()
        assert r.returncode == code, (steps, speedup, r.stdout, r.stderr)
        assert says in r.stdout + r.stderr
        if code == 1:  # measured twice before it says so
            assert "slower" in r.stdout and "recorded" in r.stdout and "measured again" in r.stdout
