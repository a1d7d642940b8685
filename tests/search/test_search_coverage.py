"""No region the data cannot rule out is left unmeasured, and physics earns its weight by predicting
(autotune/search/propose.py): a surrogate host whose best tree width is the one the opening and the physics prior rank
lowest (topk 8 with a small verify budget, a draft whose wide shallow trees do better than the physics model's shape
allows). Every topk gets a launch; the search measures the hidden region and picks it, and a width whose coverage
launch ran out of memory or crashed stays open until a launch measures a config there; before each of its launches it
records a prediction with an interval, after it the error, and once physics misses beyond its own interval the study
leans on the data-only model. Surrogate studies through the product's own trial path (fast: no server)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.results import tally
from autotune.results.best import best_record, document, predictions_line
from autotune.engines import ServerInfo
from autotune.errors import TrialFailure
from autotune.run.plan import Plan, make_plan
from autotune.record import TrialRecord, write
from autotune.report.summary import summary_markdown
from autotune.search.feasibility import at_least
from autotune.search.physics import accept_length, features
from autotune.search.propose import physics_set_aside
from autotune.studyfile.space import Candidate
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import SPEC_SPACE, write_study
from autotune.run.trial.launch import OnPhase
from autotune.run.trial.surrogate import SurrogateLaunch
from autotune.run.study_truth import ConfigTruth
from tests.support.study_texts import DRAFT, STEPS, TOPK
from tests.support.surrogate_studies import EXACT, run

#: seconds per accepted token and request at each level: fixed, per step, per draft token, per step x topk (the
#: draft tree's candidates cost much: the physics shape ranks topk 8 lowest)
COST = {1: (4e-3, 4e-4, 3e-5, 1.2e-4), 4: (1.5e-3, 1.5e-4, 6e-5, 6e-5)}
#: what a topk-8 tree accepts beyond the physics shape: this much up to HIDDEN_DRAFT draft tokens, less above, none
#: from twice that many
HIDDEN_DRAFT, HIDDEN_GAIN = 10, 1.35


def tree_of(params: dict) -> tuple[int, int, int]:
    return int(params[STEPS]), int(params[TOPK]), int(params[DRAFT])


def hidden_host(plan: Plan) -> dict[str, ConfigTruth]:
    """A physics-shaped landscape (accept length from a draft that is right 70% of the time at the first depth, cost
    linear in the tree's numbers) whose wide shallow trees accept up to 35% more than that shape: the optimum is
    topk 8 at 2 steps and 7 draft tokens, 6% above the best chain, and the best topk-4 config is 0.88 of it."""
    out = {}
    for c in plan.space.candidates():
        tree = tree_of(c.args)
        length = accept_length(tree, 0.7, 0.85, 0.3)
        if tree[1] == 8:
            length *= 1 + (HIDDEN_GAIN - 1) * min(1.0, max(0.0, (2 * HIDDEN_DRAFT - tree[2]) / HIDDEN_DRAFT))
        levels = {c_: length / sum(w * f for w, f in zip(cost, features(tree), strict=True))
                  for c_, cost in COST.items()}
        out[c.key] = ConfigTruth(dict(zip((STEPS, TOPK, DRAFT), tree, strict=True)), levels, length, 24, True)
    return out


def weighted(truth: dict[str, ConfigTruth], plan: Plan, key: str) -> float:
    base = truth[plan.baseline.key].level_tok_s
    return math.sqrt(truth[key].level_tok_s[1] / base[1] * truth[key].level_tok_s[4] / base[4])


def study_of(tmp_path: Path, seed: int, **settings: object) -> tuple[Plan, dict[str, ConfigTruth], list]:
    plan = make_plan(read_study_file(str(write_study(tmp_path, name=f"s{seed}", objective="weighted", space=SPEC_SPACE,
                                                launches=15, seed=seed))))
    if settings:
        plan = replace(plan, search=replace(plan.search, **settings))
    truth = hidden_host(plan)
    study = run(plan, truth)
    return plan, truth, study


def test_the_landscape_hides_its_optimum_where_the_priors_look_last(tmp_path: Path) -> None:
    plan = make_plan(read_study_file(str(write_study(tmp_path, objective="weighted", space=SPEC_SPACE, launches=15))))
    truth = hidden_host(plan)
    best_of = {k: max(weighted(truth, plan, key) for key, t in truth.items() if t.params[TOPK] == k)
               for k in (1, 2, 4, 8)}
    assert max(best_of, key=best_of.get) == 8
    assert best_of[4] / best_of[8] < 0.9 and max(best_of[1], best_of[2]) / best_of[8] < 0.96
    # the physics shape without the hidden gain ranks topk 8 lowest: the priors would never look there
    shape = {k: max(accept_length(t, 0.7, 0.85, 0.3) / sum(w * f for w, f in zip(COST[4], features(t), strict=True))
                    for t in (tree_of(v.params) for v in truth.values()) if t[1] == k) for k in (1, 2, 4, 8)}
    assert min(shape, key=shape.get) == 8


#: a search whose own model does not look at topk 8 here: the physics prior waits for six trees (the default until
#: it was used from the opening on), and the model fitted to the opening alone ranks wide trees low
SLOW_PRIOR = {"physics_from": 6}


@pytest.mark.parametrize(("seed", "settings"), [(3, {}), (4, {}), (3, SLOW_PRIOR), (4, SLOW_PRIOR)])
def test_every_topk_is_measured_and_the_hidden_optimum_is_picked(tmp_path: Path, seed: int,
                                                                 settings: dict) -> None:
    plan, truth, study = study_of(tmp_path, seed, **settings)
    trials = study.get_trials(deepcopy=False)
    launched = [TrialRecord.of(t) for t in tally.launches(trials)]
    assert len(launched) == 15
    assert {tree_of(r.config)[1] for r in launched} == {1, 2, 4, 8}
    if settings:  # the model would not have gone there: the coverage launch did
        assert any(r.role == "coverage" for r in launched)
    leader = tally.leader(study)
    pick = TrialRecord.of(trials[leader.trials[0]])
    optimum = max(weighted(truth, plan, k) for k in truth)
    assert tree_of(pick.config)[1] == 8 and weighted(truth, plan, pick.config_key) >= 0.98 * optimum


def test_without_coverage_the_search_misses_it(tmp_path: Path) -> None:
    """The search whose own model does not look at topk 8, with the coverage switched off, never launches a topk-8
    tree of its own choosing and ends on a chain 5% short: what the coverage is for."""
    plan, truth, study = study_of(tmp_path, 3, cover="off", **SLOW_PRIOR)
    trials = study.get_trials(deepcopy=False)
    own = [TrialRecord.of(t) for t in tally.launches(trials) if TrialRecord.of(t).role == "model"]
    assert own and all(tree_of(r.config)[1] != 8 for r in own)
    pick = TrialRecord.of(trials[tally.leader(study).trials[0]])
    assert weighted(truth, plan, pick.config_key) < 0.96 * max(weighted(truth, plan, k) for k in truth)


def widest_out_of_memory(plan: Plan) -> dict[str, ConfigTruth]:
    """The hidden host with a tight memory: a topk-8 tree fits only up to 3 steps and 9 draft tokens, so the widest
    topk-8 trees, the ones the coverage launch goes for, run out of memory, and the optimum (2, 8, 7) sits below that
    boundary."""
    return {k: replace(t, fits=t.params[TOPK] < 8 or (t.params[STEPS] <= 3 and t.params[DRAFT] <= 9))
            for k, t in hidden_host(plan).items()}


def covered_study(tmp_path: Path, seed: int, **settings: object) -> tuple[Plan, dict[str, ConfigTruth], list]:
    plan = make_plan(read_study_file(str(write_study(tmp_path, name=f"s{seed}", objective="weighted", space=SPEC_SPACE,
                                                launches=15, seed=seed))))
    plan = replace(plan, search=replace(plan.search, **{**SLOW_PRIOR, **settings}))
    truth = widest_out_of_memory(plan)
    return plan, truth, run(plan, truth)


@pytest.mark.parametrize("seed", [3, 4])
def test_a_width_whose_coverage_runs_out_of_memory_is_measured_below_it(tmp_path: Path, seed: int) -> None:
    """A width is covered only by a measurement: the coverage launch of topk 8 runs out of memory, the next launch is
    the model's best topk-8 config below that failure, the search goes on until a topk-8 tree is measured, and it
    picks the optimum there."""
    plan, truth, study = covered_study(tmp_path, seed)
    trials = study.get_trials(deepcopy=False)
    launched = [TrialRecord.of(t) for t in tally.launches(trials)]
    first = next(i for i, r in enumerate(launched) if r.role == "coverage" and tree_of(r.config)[1] == 8)
    assert launched[first].reason == "oom_startup"
    after = launched[first + 1]
    assert after.role == "coverage" and tree_of(after.config)[1] == 8
    assert not at_least(plan.engine, after.config, launched[first].config)
    assert any(r.feasible and tree_of(r.config)[1] == 8 for r in launched)
    pick = TrialRecord.of(trials[tally.leader(study).trials[0]])
    optimum = max(weighted(truth, plan, k) for k, t in truth.items() if t.fits)
    assert tree_of(pick.config)[1] == 8 and weighted(truth, plan, pick.config_key) >= 0.98 * optimum


def test_counting_a_failed_launch_as_coverage_loses_the_width(tmp_path: Path) -> None:
    """The rule before: the coverage launch that ran out of memory counted as topk 8's, the search never measured a
    topk-8 tree and ended 5% short."""
    plan, truth, study = covered_study(tmp_path, 3, cover_by="launch", follow_oom=False, boundary="one")
    trials = study.get_trials(deepcopy=False)
    launched = [TrialRecord.of(t) for t in tally.launches(trials)]
    assert not any(r.feasible and tree_of(r.config)[1] == 8 for r in launched)
    pick = TrialRecord.of(trials[tally.leader(study).trials[0]])
    optimum = max(weighted(truth, plan, k) for k, t in truth.items() if t.fits)
    assert weighted(truth, plan, pick.config_key) < 0.96 * optimum


class CrashOnce(SurrogateLaunch):
    """The first topk-8 launch dies while its server starts (a one-off: the config is not to blame)."""

    crashed = False

    def start(self, trial: optuna.Trial, candidate: Candidate, on_phase: OnPhase) -> ServerInfo:
        if candidate.args[TOPK] == 8 and not self.crashed:
            self.crashed = True
            write.launched(trial, ["surrogate"], "")
            raise TrialFailure("crashed", "the server died while starting")
        return super().start(trial, candidate, on_phase)


@pytest.mark.parametrize(("cover_by", "measured"), [("measurement", True), ("launch", False)])
def test_a_width_lost_to_a_crash_stays_open(tmp_path: Path, cover_by: str, measured: bool) -> None:
    """The hidden host's coverage launch of topk 8 crashes at start: the width is not covered by it, so a later
    launch of the search measures a topk-8 tree and the pick is the optimum there; counted as covered by the crash
    (the rule before), the search measures no topk-8 tree and the pick ends short."""
    study = write_study(tmp_path, objective="weighted", space=SPEC_SPACE, launches=15, seed=3)
    plan = make_plan(read_study_file(str(study)))
    plan = replace(plan, search=replace(plan.search, **SLOW_PRIOR, cover_by=cover_by))
    truth = hidden_host(plan)
    study = run(plan, truth, CrashOnce(plan, truth, EXACT, seed=1))
    launched = [TrialRecord.of(t) for t in tally.launches(study.get_trials(deepcopy=False))]
    assert [r.reason for r in launched if tree_of(r.config)[1] == 8][:1] == ["crashed"]
    assert any(r.feasible and r.role is not None and tree_of(r.config)[1] == 8 for r in launched) == measured
    pick = TrialRecord.of(study.get_trials(deepcopy=False)[tally.leader(study).trials[0]])
    share = weighted(truth, plan, pick.config_key) / max(weighted(truth, plan, k) for k in truth)
    assert share >= 0.98 if measured else share < 0.96


def test_each_launch_the_search_chose_carries_its_prediction_and_error(tmp_path: Path) -> None:
    plan, _, study = study_of(tmp_path, 3)
    trials = study.get_trials(deepcopy=False)
    recs = [TrialRecord.of(t) for t in tally.launches(trials)]
    chosen = [r for r in recs if r.role in ("model", "coverage") and r.prediction is not None]
    assert len(chosen) >= 6
    for r in chosen:
        p, o = r.prediction, r.prediction_outcome
        assert p["low"] < p["value"] < p["high"]
        assert o["error"] == pytest.approx(r.values[0] / p["value"] - 1)
        # inside: the prediction's interval meets the measurement's own (noise alone is no miss)
        half = (r.value_ci[1] - r.value_ci[0]) / 2
        assert o["inside"] == (p["low"] <= r.values[0] + half and r.values[0] - half <= p["high"])
    # physics predicted the first topk-8 tree it was asked about far too low, beyond its own interval: the search
    # set it aside, and every later prediction is the data-only model's
    aside = physics_set_aside(trials, plan.search)
    assert aside is not None
    missed = TrialRecord.of(trials[aside])
    assert missed.prediction_outcome["physics_inside"] is False and missed.prediction_outcome["physics_error"] > 0.1
    assert all(r.prediction["physics"] is None for r in chosen if r.number > aside)
    # the user sees how far to trust the pick: in `best` (text and JSON) and in the report
    summary = tally.predictions(trials)
    assert summary is not None and summary.launches == sum(r.prediction_outcome is not None for r in recs)
    assert summary.physics_outside >= 1
    assert document(best_record(study), study)["predictions"]["launches"] == summary.launches
    assert predictions_line(study).startswith("how far to trust the pick: the search's model predicted")
    assert "how far to trust the pick" in summary_markdown(study, None)


def test_physics_kept_when_told_to_keep_it(tmp_path: Path) -> None:
    plan, _, study = study_of(tmp_path, 3, physics_misses=0)
    trials = study.get_trials(deepcopy=False)
    assert physics_set_aside(trials, plan.search) is None
    later = [TrialRecord.of(t) for t in tally.launches(trials) if (TrialRecord.of(t).prediction or {}).get("physics")]
    assert len(later) >= 3
