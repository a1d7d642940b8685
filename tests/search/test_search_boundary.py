"""A memory failure is a boundary, not a verdict (autotune/search/feasibility.py, trial/decision.py): a config at
least as large as one that ran out of memory, in every flag the engine's memory need grows with, is rejected
without a launch; smaller ones, and other trees, stay open; and the models of the objective do not read the
failure as a poor region. Studies run through the product's own trial path with a surrogate launch on a made-up
landscape (fast: no server)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from optuna.trial import TrialState

from autotune.run import queue
from autotune.engines import get_engine
from autotune.run.plan import Plan, make_plan
from autotune.record import TrialRecord
from autotune.search import SearchSettings
from autotune.search.feasibility import Feasibility, at_least
from autotune.studyfile.spec import read_study_file
from autotune.run.trial import Objective, decide
from autotune.run.trial.surrogate import SurrogateLaunch
from autotune.testing.studies import write_study
from autotune.run.study_truth import ConfigTruth
from tests.support.study_texts import DRAFT, STEPS, TOPK
from tests.support.surrogate_studies import EXACT, SPACE, run


def plan_of(tmp_path: Path, launches: int, **search: object) -> Plan:
    """A study that measures all six of the engine's starting points first (the widest of them runs out of memory
    on ``wide_trees_win``), then lets the search's model choose. The made-up landscapes here have no physics (every
    config's accept length is the same), so the physics prior is off."""
    study = write_study(tmp_path, objective="concurrent", space=SPACE, launches=launches)
    plan = make_plan(read_study_file(str(study)))
    settings = {"starting_points": None, "model_from": 7, "physics": False, **search}
    return replace(plan, search=SearchSettings(**settings))  # type: ignore[arg-type]


def wide_trees_win(plan: Plan) -> dict[str, ConfigTruth]:
    """Topk-8 trees are the fastest, best at 2 steps and 8 draft tokens; a tree runs out of memory once its draft
    tokens plus topk x steps pass 30: (3, 8, 9), the engine's widest starting point here, does; the optimum
    (2, 8, 8) fits."""
    out = {}
    for c in plan.space.candidates():
        steps, topk, draft = (c.args[n] for n in (STEPS, TOPK, DRAFT))
        speed = 1000 * (1 + 0.1 * math.log2(topk)) * (1 - 0.03 * abs(steps - 2)) * (1 - 0.01 * abs(draft - 8))
        out[c.key] = ConfigTruth({STEPS: steps, TOPK: topk, DRAFT: draft}, {1: speed / 4, 4: speed}, 3.0, 24,
                                 fits=draft + topk * steps <= 30)
    out.setdefault(plan.baseline.key, ConfigTruth({}, {1: 200.0, 4: 800.0}, 1.5, 24, True))
    return out


def tree(rec: TrialRecord) -> tuple[int, int, int]:
    return tuple(int(rec.config[n]) for n in (STEPS, TOPK, DRAFT))  # type: ignore[return-value]


def test_a_config_above_a_memory_failure_is_rejected_without_a_launch(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, launches=8)
    truth = wide_trees_win(plan)
    study = run(plan, truth)
    trials = study.get_trials(deepcopy=False)
    oom = [t for t in trials if TrialRecord.of(t).reason == "oom_startup"]
    assert oom, "the widest starting point ran out of memory"
    failed = TrialRecord.of(oom[0])
    steps, topk, draft = tree(failed)
    n = len(trials)
    bigger = decide(plan, trials, n, {STEPS: steps + 1, TOPK: topk, DRAFT: draft + 1})
    assert (bigger.kind, bigger.prior.number) == ("too_large", failed.number)
    # smaller in one flag, or another tree: nothing is known, it is launched
    assert decide(plan, trials, n, {STEPS: steps - 1, TOPK: topk, DRAFT: draft}).kind == "launch"
    assert decide(plan, trials, n, {STEPS: steps + 1, TOPK: 4, DRAFT: draft}).kind == "launch"

    # the objective records the rejection like an invalid config: pruned, no server started
    queue.enqueue(study, plan.space.internal({STEPS: steps + 1, TOPK: topk, DRAFT: draft + 1}), "neighbour")
    study.optimize(Objective(plan, SurrogateLaunch(plan, truth, EXACT, seed=1)), n_trials=1)
    rec = TrialRecord.of(study.get_trials(deepcopy=False)[-1])
    assert (rec.state, rec.reason, rec.launched) == (TrialState.PRUNED, "oom_predicted", False)
    assert f"trial {failed.number}" in rec.detail


def test_a_study_never_launches_above_a_memory_failure_and_finds_the_tree_below_it(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, launches=15)
    truth = wide_trees_win(plan)
    study = run(plan, truth)
    recs = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    launched = [r for r in recs if r.launched]
    assert len(launched) == 15
    engine = get_engine("sglang")
    for i, r in enumerate(launched):
        for earlier in launched[:i]:
            if earlier.reason == "oom_startup":
                assert not at_least(engine, r.config, earlier.config), (tree(r), tree(earlier))
    # the failure of the widest starting point did not close its topk: the next launch measured a topk-8 tree below
    # it, and the pick is a topk-8 tree within 3% of the best (the optimum, (2, 8, 8), lies one step below the
    # failure (3, 8, 9): the boundary's line rates it 0.57 to fit, and the model's picks go elsewhere)
    failed = next(i for i, r in enumerate(launched) if r.reason == "oom_startup")
    after = launched[failed + 1]
    assert tree(after)[1] == 8 and after.feasible
    best = max((r for r in launched if r.feasible), key=lambda r: r.values[0])
    assert tree(best)[1] == 8 and truth[best.config_key].level_tok_s[4] >= 0.97 * max(
        t.level_tok_s[4] for t in truth.values() if t.fits)


def test_the_line_of_the_boundary_keeps_the_search_from_failing_again_right_below_a_failure(tmp_path: Path) -> None:
    """With the physics prior (which rates deep topk-8 trees best here) and every config a failure reaches given the
    same chance of fitting, the launches after the widest starting point's failure go down one flag at a time and
    run out of memory again and again; with the boundary's line per width, a config right below a failure is rated
    unlikely to fit, and the next launch is one that fits."""
    failures = {}
    for boundary in ("topk", "line"):
        (tmp_path / boundary).mkdir()
        plan = plan_of(tmp_path / boundary, launches=15, physics=True, boundary=boundary)
        study = run(plan, wide_trees_win(plan))
        launched = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False) if TrialRecord.of(t).launched]
        failures[boundary] = sum(r.reason == "oom_startup" for r in launched)
    assert failures["line"] == 1 and failures["topk"] >= 4, failures


def test_the_boundary_compares_only_configs_alike_in_every_other_flag(tmp_path: Path) -> None:
    engine = get_engine("sglang")
    big = {"speculative-algorithm": "EAGLE", STEPS: 5, TOPK: 8, DRAFT: 17, "tp-size": 4}
    assert at_least(engine, big, {**big, STEPS: 4, DRAFT: 9})
    assert not at_least(engine, big, {**big, TOPK: 4, DRAFT: 20}), "fewer of one flag, more of another: unknown"
    assert not at_least(engine, big, {**big, STEPS: 4, "tp-size": 8}), "another tp: another memory plan"
    assert not at_least(engine, {"speculative-algorithm": "NGRAM"}, {"speculative-algorithm": "NGRAM"})
    plan = plan_of(tmp_path, launches=8)
    study = run(plan, wide_trees_win(plan))
    feasibility = Feasibility(plan.engine, study.get_trials(deepcopy=False))
    failed = feasibility.failures[0].args
    assert feasibility.probability(failed, 0.5) == 0.0
    below = {**failed, STEPS: 2, TOPK: 4, DRAFT: 5}
    assert feasibility.probability(below, 0.5) == 1.0, "below (3, 4, 9), which started"
    assert feasibility.probability({**failed, STEPS: 1, DRAFT: 2}, 0.5) == 1.0, "below (1, 8, 6), which started"
    assert feasibility.probability({**failed, STEPS: 2, DRAFT: 2}, 0.5, "topk") == 0.5, "above it in steps: unknown"
    # per width: a topk-8 failure puts no chain in doubt; on its line, the closer to the failure the less likely
    assert feasibility.probability({**failed, STEPS: 8, TOPK: 1, DRAFT: 9}, 0.5) == 1.0
    right_below, far_below = ({**failed, STEPS: 3, DRAFT: 8}, {**failed, STEPS: 2, DRAFT: 3})
    assert 0 < feasibility.probability(right_below, 0.5) < 0.2 < 0.6 < feasibility.probability(far_below, 0.5) < 1
