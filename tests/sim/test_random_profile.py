"""Random emulator profiles (`autotune sim profile --random SEED`): real parts, valid files, the same file for the
same seed, landscapes with variety, and step costs that agree with weight bytes over datasheet bandwidth."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.sim import model
from autotune.sim.catalog import CARDS, GPU_BY_KEY
from autotune.sim.profile import load_profile
from autotune.sim.random_profile import (
    ALLREDUCE,
    BANDWIDTH_EFFICIENCY,
    LAYER_GAP_US,
    MFU,
    MIN_KV_TOKENS,
    MOE_BANDWIDTH_FACTOR,
    SCHED_MS,
    SCHED_MS_PER_DOUBLING,
    SCHED_REQ_MS,
    RandomProfileError,
    draw,
)
from autotune.sim.surface import DEFAULT_SPACE, DRAFT, STEPS, TOPK, surface, valid_configs

SEEDS = range(200)


def autotune(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], check=False, capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def baseline_config(tp: int) -> model.Config:
    return model.Config(tp=tp, spec=model.Spec(1, 1, 2), max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS)


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.name)
def test_card_dimensions_rebuild_the_cards_parameter_counts(card):
    total = sum(card.parameters().values()) / 1e9
    assert abs(total / card.params_b - 1) < 0.01, total
    if card.moe:  # cards count activated parameters with or without the embedding and lm_head
        active = card.active_linear_params() / 1e9
        low, high = active - card.vocab * card.hidden / 1e9, active + card.vocab * card.hidden / 1e9
        assert 0.95 * low <= card.active_b <= 1.05 * high, (low, high)


def test_generated_files_load_and_validate_for_many_seeds(tmp_path):
    for seed in SEEDS:
        host = draw(seed)
        path = tmp_path / f"{seed}.toml"
        path.write_text(host.toml())
        loaded = load_profile(str(path))
        assert dataclasses.replace(loaded, path="") == host.profile(), seed
        assert loaded.name == f"random-{seed}"
        assert host.tp in (1, 2, 4, 8) and loaded.hardware.gpus >= host.tp
        plan = model.memory_plan(loaded, baseline_config(host.tp))
        assert plan.error is None and plan.max_total_num_tokens >= MIN_KV_TOKENS, (seed, plan.error)
        assert model.memory_plan(loaded, model.Config(tp=host.tp)).error is None


def test_the_draw_covers_the_catalog():
    hosts = [draw(seed) for seed in SEEDS]
    assert {h.card.name for h in hosts} == {c.name for c in CARDS}
    assert {h.gpu.key for h in hosts} == set(GPU_BY_KEY)
    assert {h.tp for h in hosts} == {1, 2, 4, 8}
    assert {h.quant.key for h in hosts} == {"bf16", "fp8", "int4", "mxfp4"}
    assert not [h for h in hosts if h.quant.key == "fp8" and not h.gpu.fp8_tflops]


def test_same_seed_same_file_and_stdout_equals_out(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    for out in (first, second):
        done = autotune("sim", "profile", "--random", "1234", "--out", str(out))
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{out}: random-1234: {draw(1234).describe()}\n"
    printed = autotune("sim", "profile", "--random", "1234")
    assert printed.returncode == 0
    assert first.read_text() == second.read_text() == printed.stdout == draw(1234).toml()
    assert len({draw(seed).toml() for seed in range(20)}) == 20


def test_bad_seed_and_unwritable_out_fail_with_one_line(tmp_path):
    for args in (["--random", "x"], ["--random", "-1"], []):
        done = autotune("sim", "profile", *args)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1 and "--random" in done.stderr, done.stderr
    missing = tmp_path / "no" / "such" / "dir" / "p.toml"
    done = autotune("sim", "profile", "--random", "3", "--out", str(missing))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"autotune: error: cannot write {missing}:") and not missing.exists()


def test_pinned_choices_that_cannot_exist_are_refused():
    with pytest.raises(RandomProfileError, match="no fp8 tensor cores"):
        draw(1, model_name="Qwen3-8B", quant="fp8", gpu="a100-80")
    with pytest.raises(RandomProfileError, match="does not fit"):
        draw(1, model_name="DeepSeek-V3", quant="fp8", gpu="rtx4090", tp=8)
    with pytest.raises(RandomProfileError, match="unknown GPU"):
        draw(1, gpu="b200")


def test_surface_and_emulator_take_the_file(tmp_path, emulator):
    path = tmp_path / "host.toml"
    assert autotune("sim", "profile", "--random", "7", "--out", str(path)).returncode == 0
    host = draw(7)
    done = autotune("sim", "surface", "--profile", str(path), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["profile"] == "random-7" and len(result["configs"]) == 571
    emu = emulator("--model-path", "/models/random", "--tp-size", str(host.tp), "--sim-profile", str(path),
                   "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2",
                   "--sim-time-scale", "0.01", "--sim-speedup", "20", "--sim-seed", "1").wait_ready(60)
    info = httpx.get(f"{emu.url}/server_info", timeout=10).json()
    plan = model.memory_plan(load_profile(str(path)), baseline_config(host.tp))
    assert info["max_total_num_tokens"] == plan.max_total_num_tokens
    assert info["max_running_requests"] == plan.max_running_requests


# ---------------------------------------------------------------------------------------------- landscapes


def key(row: dict) -> tuple[int, int, int]:
    p = row["params"]
    return p[STEPS], p[TOPK], p[DRAFT]


@pytest.mark.slow
def test_landscapes_vary_over_200_seeds():
    """Some hosts fail a starting point for memory; the optima are chains on some hosts and trees on others."""
    starts = [(p[STEPS], p[TOPK], p[DRAFT])
              for p in SGLang().starting_points(DEFAULT_SPACE, {"speculative-algorithm": "EAGLE"})]
    oom, single_trees, c32_trees, baseline_best = 0, 0, 0, 0
    for seed in SEEDS:
        rows = {key(r): r for r in surface(draw(seed).profile(), 32)["configs"]}
        fitting = [r for r in rows.values() if r["fits"]]
        assert rows[(1, 1, 2)]["fits"], seed
        oom += any(not rows[p]["fits"] for p in starts)
        single = max(fitting, key=lambda r: r["single_tok_s"])
        c32 = max(fitting, key=lambda r: r["concurrent_tok_s"])
        single_trees += key(single)[1] > 1
        c32_trees += key(c32)[1] > 1
        baseline_best += key(c32) == (1, 1, 2)
    n = len(SEEDS)
    assert 0.1 * n <= oom <= 0.6 * n, oom
    assert 0.1 * n <= single_trees <= 0.95 * n, single_trees
    assert 0.1 * n <= c32_trees <= 0.9 * n, c32_trees
    assert baseline_best < 0.2 * n, baseline_best


def test_tight_hosts_lose_the_widest_tree_of_every_width_and_keep_the_narrower_ones():
    """The third family (`--family tight`): the tree family's host with less room for CUDA graphs. On every host the
    widest tree of each topk fails for memory while every chain and some tree of each topk start, and the host's
    hardware, costs and draft are the tree family's of the same seed."""
    trees = valid_configs(DEFAULT_SPACE)
    for seed in SEEDS:
        tight, tree = draw(seed, family="tight"), draw(seed, family="tree")
        assert tight.name == f"random-tight-{seed}"
        assert tight.sections["acceptance"] == tree.sections["acceptance"]
        assert tight.sections["timing"] == tree.sections["timing"]
        profile = tight.profile()
        fits = {t: _fits(profile, tight.tp, t) for t in trees}
        for topk in (2, 4, 8):
            at = [t for t in trees if t[1] == topk]
            assert not fits[max(at, key=lambda t: (t[2], t[0]))], (seed, topk)
            assert any(fits[t] for t in at), (seed, topk)
        assert all(fits[t] for t in trees if t[1] == 1), seed


def _fits(profile, tp: int, tree: tuple[int, int, int]) -> bool:
    config = model.Config(tp=tp, spec=model.Spec(*tree), max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS)
    return model.memory_plan(profile, config).error is None


@pytest.mark.slow
def test_tight_hosts_mostly_have_their_optimum_at_a_width_that_loses_its_widest_tree():
    """What the family is for: the best weighted config is a tree whose own width runs out of memory at its widest
    on most hosts, so a search that gives up a width after one failed launch there misses it."""
    below = 0
    for seed in range(20):
        rows = {key(r): r for r in surface(draw(seed, family="tight").profile(), 32)["configs"]}
        base = rows[(1, 1, 2)]
        best = max((k for k, r in rows.items() if r["fits"]),
                   key=lambda k: rows[k]["single_tok_s"] / base["single_tok_s"]
                   * rows[k]["concurrent_tok_s"] / base["concurrent_tok_s"])
        below += best[1] > 1 and any(not r["fits"] for k, r in rows.items() if k[1] == best[1])
    assert below >= 14, below


# ------------------------------------------------------------------------------------------- calibration


def test_single_stream_without_speculation_is_the_weight_read_over_bandwidth():
    """Decode of one stream without a draft takes at least the host's weight bytes over the datasheet bandwidth at
    the best justified efficiency, and at most those bytes at the worst efficiency plus every fixed cost at the
    top of its justified range."""
    for seed in SEEDS:
        host = draw(seed)
        profile = host.profile()
        ms = 1000.0 / model.figures(profile, model.Config(tp=host.tp), 1).single_tok_s
        card, tp, gpu = host.card, host.tp, host.gpu
        read = host.facts["read_bytes_per_gpu"]
        bandwidth = gpu.bandwidth_gbs * 1e6  # bytes per ms
        assert ms >= read / (bandwidth * BANDWIDTH_EFFICIENCY[1]), seed
        worst_bw = bandwidth * BANDWIDTH_EFFICIENCY[0] * (MOE_BANDWIDTH_FACTOR[0] if card.moe else 1.0)
        gaps = card.layers * LAYER_GAP_US["moe" if card.moe else "dense"][1] / 1000
        reductions = 2 * card.layers * ALLREDUCE[gpu.link]["latency_us"][1] / 1000 if tp > 1 else 0.0
        sched = SCHED_MS[1] + SCHED_MS_PER_DOUBLING * 3 + SCHED_REQ_MS[1]
        kv = 512 * card.kv_bytes_per_token(tp) / worst_bw
        peak = (gpu.fp8_tflops if host.quant.fp8_compute else gpu.bf16_tflops) * 1e9
        compute = 2 * card.active_linear_params() / tp / (peak * MFU["moe"][0]) + 2 * card.layers * card.hidden * 4 / (
            ALLREDUCE[gpu.link]["bus_gbs"][0] * 1e6)
        assert ms <= read / worst_bw + gaps + reductions + sched + kv + compute, seed


def test_a_measured_host_lies_inside_its_generated_range():
    """Llama-3.3-70B bf16 on 8x H100: SGLang PR 4716 measured 88.6 tok/s without speculation."""
    speeds = []
    for seed in range(100):
        host = draw(seed, model_name="Llama-3.3-70B-Instruct", quant="bf16", gpu="h100", tp=8)
        speeds.append(model.figures(host.profile(), model.Config(tp=8), 1).single_tok_s)
    assert min(speeds) < 88.6 < max(speeds)
    assert 0.7 < sorted(speeds)[50] / 88.6 < 1.3
