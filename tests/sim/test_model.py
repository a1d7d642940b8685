"""The performance and memory model: seed calibration, physical shape, and the surface."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from autotune.sim import model
from autotune.sim.profile import ProfileError, load_profile
from autotune.sim.surface import surface, valid_configs

QWEN = load_profile("qwen122b")
LLAMA = load_profile("llama8b")


def eagle(steps: int, topk: int, draft: int, profile=QWEN, **kw) -> model.Config:
    return model.Config(tp=profile.timing.reference_tp, spec=model.Spec(steps, topk, draft),
                        max_running_requests=48, **kw)


@pytest.mark.parametrize("steps,seed_tok_s", [(1, 123), (2, 186), (3, 234)])
def test_qwen_single_stream_matches_the_seed_within_10_percent(steps, seed_tok_s):
    fig = model.figures(QWEN, eagle(steps, 1, steps + 1), 32)
    assert fig.fits
    assert abs(fig.single_tok_s / seed_tok_s - 1) < 0.10, fig.single_tok_s


@pytest.mark.parametrize("steps,seed_mrr", [(2, 21), (3, 17)])
def test_qwen_running_requests_match_the_seed(steps, seed_mrr):
    plan = model.memory_plan(QWEN, eagle(steps, 1, steps + 1))
    assert plan.max_running_requests == seed_mrr
    assert plan.capped_by == "mamba"


def test_qwen_startup_takes_90_to_120_seconds_at_time_scale_1():
    for steps in (1, 3, 8):
        cfg = eagle(steps, 1, steps + 1)
        assert 90 <= model.startup_total(QWEN, cfg, model.memory_plan(QWEN, cfg)) <= 120


def test_acceptance_decays_with_depth_and_rises_with_topk():
    qs = [model.depth_acceptance(QWEN, d) for d in range(1, 9)]
    assert all(a > b for a, b in itertools.pairwise(qs))
    chain = [model.accept_length(QWEN, model.Spec(s, 1, s + 1)) for s in range(1, 9)]
    assert all(b > a for a, b in itertools.pairwise(chain))
    assert chain[-1] - chain[-2] < chain[1] - chain[0]  # diminishing returns
    # more candidates per depth (same depth, bigger budget) accept more, limited by the tree budget
    assert model.accept_length(QWEN, model.Spec(3, 4, 12)) > model.accept_length(QWEN, model.Spec(3, 1, 4))
    chain3 = model.accept_length(QWEN, model.Spec(3, 1, 4))
    assert model.accept_length(QWEN, model.Spec(3, 4, 4)) == pytest.approx(chain3)
    assert model.accept_length(QWEN, None) == 1.0


def test_step_cost_grows_with_batch_width_and_context():
    cfg = eagle(3, 1, 4)
    assert model.step_ms(QWEN, cfg, 8, 8000) > model.step_ms(QWEN, cfg, 1, 1000)
    assert model.step_ms(QWEN, eagle(3, 4, 16), 8, 8000) > model.step_ms(QWEN, cfg, 8, 8000)
    assert model.step_ms(QWEN, cfg, 8, 80000) > model.step_ms(QWEN, cfg, 8, 8000)
    assert model.prefill_ms(QWEN, cfg, 4000, 1) > model.prefill_ms(QWEN, cfg, 400, 1)
    # MoE: a wider batch touches more experts, so the per-token cost falls as the batch grows
    assert model.verify_ms(QWEN, cfg, 16, 0) / 16 < model.verify_ms(QWEN, cfg, 1, 0)


def test_memory_default_fraction_draft_layers_and_graph_headroom():
    plain = model.memory_plan(LLAMA, model.Config())
    spec = model.memory_plan(LLAMA, eagle(3, 1, 4, LLAMA))
    assert spec.max_total_num_tokens < plain.max_total_num_tokens  # draft weights and draft KV layers
    assert model.memory_plan(QWEN, eagle(3, 1, 4)).mem_fraction_static == 0.863
    tight = model.memory_plan(QWEN, eagle(3, 1, 4, mem_fraction_static=0.3))
    assert tight.error_phase == "kv" and "Loaded weights leave no GPU memory" in tight.error
    zero = model.memory_plan(QWEN, eagle(3, 1, 4, max_total_tokens=0))
    assert zero.error.startswith("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    big = model.memory_plan(QWEN, eagle(8, 8, 32))
    assert big.error_phase == "graph" and "CUDA out of memory" in big.error
    # a smaller CUDA-graph batch is SGLang's advice, and it makes the tree fit
    assert model.memory_plan(QWEN, eagle(8, 8, 32, cuda_graph_max_bs=8)).error is None
    assert model.memory_plan(LLAMA, eagle(8, 8, 32, LLAMA)).error_phase == "graph"


def test_best_single_stream_config_is_not_best_at_concurrency_32():
    for profile in (QWEN, LLAMA):
        rows = [r for r in surface(profile, 32)["configs"] if r["fits"]]
        best_single = max(rows, key=lambda r: r["single_tok_s"])
        best_conc = max(rows, key=lambda r: r["concurrent_tok_s"])
        assert best_single["params"] != best_conc["params"]
        assert best_conc["concurrent_tok_s"] > 1.3 * next(
            r["concurrent_tok_s"] for r in rows if r["params"] == best_single["params"])


def test_valid_configs_follow_sglang_rules():
    configs = valid_configs()
    assert len(configs) == len(set(configs))
    assert all(d == s + 1 for s, k, d in configs if k == 1)
    assert sum(1 for _, k, _ in configs if k == 1) == 8
    assert (2, 2, 8) not in configs and (2, 2, 7) in configs  # draft - 1 <= topk + (steps - 1) * topk^2
    assert (8, 8, 32) in configs


def test_surface_cli_prints_one_json_document():
    proc = subprocess.run([sys.executable, "-c", "from autotune.cli import main; main()", "sim", "surface",
                           "--profile", "qwen122b", "--concurrency", "32", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["profile"] == "qwen122b" and doc["concurrency"] == 32
    row = doc["configs"][0]
    assert set(row) == {"params", "single_tok_s", "concurrent_tok_s", "accept_length", "max_running_requests", "fits"}
    by_params = {tuple(r["params"].values()): r for r in doc["configs"]}
    assert by_params[(3, 1, 4)]["max_running_requests"] == 17
    assert by_params[(8, 8, 32)]["fits"] is False


def test_surface_cli_table_space_override_and_errors(monkeypatch, capsys):
    from tests.support.cli import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "sim", "surface", "--profile", "llama8b", "--space",
                             '{"speculative-num-steps": [2, 3], "speculative-eagle-topk": [1]}')
    assert code == 0, err
    assert "2 valid configs" in out and "best single" in out
    code, out, err = run_cli(monkeypatch, capsys, "sim", "surface", "--profile", "no-such-profile")
    assert code == 2 and "no profile 'no-such-profile'" in err and len(err.strip().splitlines()) == 1


def test_profile_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    with open(QWEN.path) as source:
        bad.write_text(source.read().replace("base_ms = ", "base_msec = "))
    with pytest.raises(ProfileError, match=r"bad.toml: \[timing\]: unknown key\(s\) base_msec"):
        load_profile(str(bad))
