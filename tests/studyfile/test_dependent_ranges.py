"""Dependent ranges: SGLang's draft tokens drawn inside the tree the chosen steps and topk allow."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.engines import ValidRange, get_engine
from autotune.engines.sglang import tree_capacity
from autotune.errors import InvalidConfig
from autotune.record import TrialRecord
from autotune.studyfile.space import FILL
from tests.support.cli import launches, run_autotune
from tests.support.search_study import LAUNCHES, search_study
from tests.support.study_texts import DRAFT, STEPS, TOPK, WIDE, space_of


def test_sglang_says_which_draft_counts_a_tree_holds() -> None:
    engine = get_engine("sglang")
    assert engine.depends_on(DRAFT) == (STEPS, TOPK)
    assert engine.depends_on(STEPS) == () and engine.depends_on("mem-fraction-static") == ()
    tree = {"speculative-algorithm": "EAGLE", STEPS: 3, TOPK: 2}
    assert engine.valid_range(DRAFT, tree) == ValidRange(low=3 + 1, high=2 + 2 * 4 + 1)
    assert engine.valid_range(DRAFT, tree).high == tree_capacity(3, 2)
    assert engine.valid_range(DRAFT, {**tree, TOPK: 1}).irrelevant  # SGLang runs steps + 1 whatever is asked
    assert engine.valid_range(DRAFT, {**tree, "speculative-algorithm": "nextn"}).high == 11
    assert engine.valid_range(DRAFT, {**tree, "speculative-algorithm": "NGRAM"}) == ValidRange()
    assert engine.valid_range(DRAFT, {"speculative-algorithm": "EAGLE", STEPS: 3}) == ValidRange()  # topk not chosen
    assert engine.valid_range(STEPS, tree) == ValidRange()
    # the rule the range comes from is the one resolve() enforces
    engine.resolve({**tree, DRAFT: tree_capacity(3, 2)})
    with pytest.raises(InvalidConfig, match="selected index k out of range"):
        engine.resolve({**tree, DRAFT: tree_capacity(3, 2) + 1})
    engine.resolve({**tree, DRAFT: 3 + 1})
    with pytest.raises(InvalidConfig, match="too few draft tokens for the tree"):
        engine.resolve({**tree, DRAFT: 3})


def test_every_suggestion_is_a_config_sglang_runs(tmp_path: Path) -> None:
    space = space_of(tmp_path)
    assert space.dependent == {DRAFT}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(300):
        trial = study.ask()
        params = space.suggest(trial)
        # the sampler sees a fill fraction; the flag values are real, in the study's order
        assert set(trial.params) == {STEPS, TOPK, DRAFT + FILL} and 0 <= trial.params[DRAFT + FILL] <= 1
        assert list(params) == [STEPS, TOPK, DRAFT]
        candidate = space.candidate(params)  # never InvalidConfig
        steps, topk, draft = (candidate.args[n] for n in (STEPS, TOPK, DRAFT))
        assert 2 <= draft <= min(32, tree_capacity(steps, topk)) or (topk == 1 and draft == steps + 1)
        seen.add(candidate.key)
        study.tell(trial, 0.0)
    # steps 1 / topk 2 holds 2 or 3 draft tokens, and both come up
    assert {json.loads(k)[DRAFT] for k in seen if (json.loads(k)[STEPS], json.loads(k)[TOPK]) == (1, 2)} == {2, 3}


def test_fill_fractions_share_the_valid_values_equally_and_round_trip(tmp_path: Path) -> None:
    space = space_of(tmp_path)
    study = optuna.create_study()
    for steps, topk, draft in [(1, 2, 2), (1, 2, 3), (3, 2, 11), (2, 4, 21), (8, 8, 32), (4, 1, 5)]:
        internal = space.internal({STEPS: steps, TOPK: topk, DRAFT: draft})
        assert set(internal) == {STEPS, TOPK, DRAFT + FILL}
        study.enqueue_trial(internal)
        trial = study.ask()
        assert space.suggest(trial) == {STEPS: steps, TOPK: topk, DRAFT: draft}
        study.tell(trial, 0.0)
    # steps 1 / topk 2 has two valid counts: each gets half of [0, 1]
    assert space.internal({STEPS: 1, TOPK: 2, DRAFT: 2})[DRAFT + FILL] == 0.25
    assert space.internal({STEPS: 1, TOPK: 2, DRAFT: 3})[DRAFT + FILL] == 0.75


def test_the_baseline_is_queued_as_the_sampler_sees_it(tmp_path: Path) -> None:
    text = WIDE.replace('speculative-algorithm = "EAGLE"', 'speculative-algorithm = "EAGLE"\n'
                        'speculative-num-steps = 3\nspeculative-eagle-topk = 4\nspeculative-num-draft-tokens = 16')
    space = space_of(tmp_path, text)
    study = optuna.create_study()
    study.enqueue_trial(space.internal(space.baseline_params()), user_attrs={"baseline": True})
    trial = study.ask()
    assert space.suggest(trial, only=space.baseline_params()) == {STEPS: 3, TOPK: 4, DRAFT: 16}


def test_fixed_ranges_and_the_grid_draw_the_space_as_written(tmp_path: Path) -> None:
    for extra in ('ranges = "fixed"', 'sampler = "grid"'):
        space = space_of(tmp_path, WIDE.replace("trials = 10", f"trials = 10\n{extra}"))
        assert space.dependent == set()
        trial = optuna.create_study().ask()
        params = space.suggest(trial)
        assert set(trial.params) == {STEPS, TOPK, DRAFT} and params == trial.params


def test_a_fixed_tree_narrows_the_draft_range_itself(tmp_path: Path) -> None:
    # steps and topk fixed by the study: the valid range is the same in every trial, drawn under the flag's own name
    text = WIDE.replace('speculative-algorithm = "EAGLE"', 'speculative-algorithm = "EAGLE"\n'
                        'speculative-num-steps = 2\nspeculative-eagle-topk = 2')
    text = text[:text.index(f"[space.{STEPS}]")] + text[text.index(f"[space.{DRAFT}]"):]
    space = space_of(tmp_path, text)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    values = set()
    for _ in range(80):
        trial = study.ask()
        values.add(space.suggest(trial)[DRAFT])
        assert set(trial.params) == {DRAFT}
        study.tell(trial, 0.0)
    assert values == set(range(2 + 1, tree_capacity(2, 2) + 1))


def test_results_show_the_flag_values_not_the_fill() -> None:
    trial = optuna.trial.create_trial(
        params={STEPS: 3, TOPK: 1, DRAFT + FILL: 0.4},
        distributions={STEPS: optuna.distributions.IntDistribution(1, 8),
                       TOPK: optuna.distributions.CategoricalDistribution([1, 2]),
                       DRAFT + FILL: optuna.distributions.FloatDistribution(0, 1)},
        value=1.0, user_attrs={"params": {STEPS: 3, TOPK: 1, DRAFT: 4}})
    assert TrialRecord.of(trial).params == {STEPS: 3, TOPK: 1, DRAFT: 4}
    assert TrialRecord.of(trial).as_row()["params"] == {STEPS: 3, TOPK: 1, DRAFT: 4}
    old = optuna.trial.create_trial(params={STEPS: 3}, value=1.0,
                                    distributions={STEPS: optuna.distributions.IntDistribution(1, 8)})
    assert TrialRecord.of(old).params == {STEPS: 3}


@pytest.mark.slow
def test_a_default_study_never_deploys_an_invalid_tree_and_shows_real_flags(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    shared = search_study(tmp_path_factory)   # tests/support/search_study.py: a default study of LAUNCHES launches
    trials = shared.trials
    assert launches(trials) == LAUNCHES
    assert not [t for t in trials if t["reason"] == "invalid_config"]
    for t in trials:
        p = t["params"]
        assert set(p) == {STEPS, TOPK, DRAFT}, p  # the real flags, never the fill fraction
        assert p == {k: t["config"][k] for k in p}  # ... as the server ran them
        assert p[DRAFT] == p[STEPS] + 1 if p[TOPK] == 1 else p[DRAFT] <= tree_capacity(p[STEPS], p[TOPK])
    best = json.loads(run_autotune("best", "--study", str(shared.path), "--json").stdout)
    assert set(best["params"]) == {STEPS, TOPK, DRAFT}
    assert f"--{DRAFT}" in best["command"]
    assert best["command"][best["command"].index(f"--{DRAFT}") + 1] == str(best["params"][DRAFT])
