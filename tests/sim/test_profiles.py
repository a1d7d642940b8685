"""The extra emulator profiles: they load, most configs fit, and each header's shape claims hold.

Every claim checked here is written in the header comment of its profile file; change both together.
"""
from __future__ import annotations

import functools
import itertools

import pytest

from autotune.sim import model
from autotune.sim.profile import load_profile
from autotune.sim.surface import DRAFT, STEPS, TOPK, surface

NEW_PROFILES = ("llama70b", "qwen235b", "qwen14b")
ALL_PROFILES = ("qwen122b", "llama8b", *NEW_PROFILES)


@functools.cache
def fitting_rows(name: str) -> tuple[dict, ...]:
    return tuple(r for r in surface(name, 32)["configs"] if r["fits"])


def key(row: dict) -> tuple[int, int, int]:
    p = row["params"]
    return p[STEPS], p[TOPK], p[DRAFT]


def optimum(name: str, objective: str) -> tuple[int, int, int]:
    """(steps, topk, draft) of the noise-free optimum: single, concurrent (c32) or weighted (their product)."""
    score = {
        "single": lambda r: r["single_tok_s"],
        "concurrent": lambda r: r["concurrent_tok_s"],
        "weighted": lambda r: r["single_tok_s"] * r["concurrent_tok_s"],
    }[objective]
    return key(max(fitting_rows(name), key=score))


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_profile_loads_and_most_configs_fit(name):
    profile = load_profile(name)
    assert profile.name == name
    assert len(fitting_rows(name)) >= 100


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_only_the_largest_trees_run_out_of_graph_memory(name):
    profile = load_profile(name)
    rows = surface(name, 32)["configs"]
    failing = [key(r) for r in rows if not r["fits"]]
    assert (8, 8, 32) in failing
    for steps, topk, draft in failing:
        assert topk == 8
        cfg = model.Config(tp=profile.timing.reference_tp, spec=model.Spec(steps, topk, draft),
                           max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS)
        assert model.memory_plan(profile, cfg).error_phase == "graph"
    assert all(r["fits"] for r in rows if r["params"][TOPK] <= 2)


# ------------------------------------------------------------------------------------- header shape claims


def test_llama70b_header_claims():
    steps, topk, _ = optimum("llama70b", "single")
    assert topk == 8 and 4 <= steps <= 6
    assert steps < optimum("llama8b", "single")[0]  # shallower than llama8b: tp 8 draft steps are expensive
    steps, topk, _ = optimum("llama70b", "concurrent")
    assert topk == 1 and steps <= 3
    steps, topk, _ = optimum("llama70b", "weighted")
    assert topk >= 2 and 3 <= steps <= 5


def test_llama70b_matches_its_anchors():
    profile = load_profile("llama70b")
    plain = model.figures(profile, model.Config(tp=8), 1)
    assert abs(plain.single_tok_s / 88.6 - 1) < 0.05
    wide = model.Config(tp=8, spec=model.Spec(8, 8, 64), max_running_requests=48, cuda_graph_max_bs=1)
    assert abs(model.accept_length(profile, wide.spec) / 5.88 - 1) < 0.05
    assert 22.0 <= model.step_ms(profile, wide, 1, 512) <= 26.0


def test_qwen235b_header_claims():
    steps, topk, _ = optimum("qwen235b", "single")
    assert topk == 1 and steps <= 3
    steps, topk, _ = optimum("qwen235b", "concurrent")
    assert topk >= 4
    steps, _, _ = optimum("qwen235b", "weighted")
    assert steps <= 3
    # the weak draft: a chain stops gaining after about 4 steps
    profile = load_profile("qwen235b")
    chain = [model.accept_length(profile, model.Spec(s, 1, s + 1)) for s in range(1, 9)]
    assert chain[-1] - chain[3] < 0.1 and chain[-1] < 3.0


def test_qwen14b_header_claims():
    for objective in ("concurrent", "weighted"):
        steps, topk, _ = optimum("qwen14b", objective)
        assert topk == 1 and steps <= 2, objective
    steps, topk, _ = optimum("qwen14b", "single")
    assert 2 <= topk <= 4 and 3 <= steps <= 5


def test_qwen14b_capacity_holds_the_c32_workload():
    profile = load_profile("qwen14b")
    cfg = model.Config(tp=1, spec=model.Spec(3, 1, 4), max_running_requests=48)
    plan = model.memory_plan(profile, cfg)
    tokens_at_c32 = 32 * (profile.workload.prompt_tokens + profile.workload.output_tokens)
    assert tokens_at_c32 < plan.max_total_num_tokens < 4 * tokens_at_c32


def test_weighted_optima_of_all_profiles_are_pairwise_different():
    optima = {name: optimum(name, "weighted") for name in ALL_PROFILES}
    for a, b in itertools.combinations(ALL_PROFILES, 2):
        assert optima[a] != optima[b], (a, b, optima[a])
