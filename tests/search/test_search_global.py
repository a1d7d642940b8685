"""The whole-space model (autotune/search/propose.py, scope "global", the default): after the baseline and two
starting points, every launch is the unmeasured config of the whole space with the best expected improvement times
its chance of fitting, so a region several strides from every starting point, in more than one flag, is reached
within a short budget. A surrogate study through the product's own trial path (fast: no server)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from autotune.run.plan import Plan, make_plan
from autotune.record import TrialRecord
from autotune.search import SearchSettings
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import write_study
from autotune.run.study_truth import ConfigTruth
from tests.support.study_texts import DRAFT, STEPS, TOPK
from tests.support.surrogate_studies import SPACE as BOUNDARY_SPACE
from tests.support.surrogate_studies import run


def far_corner(plan: Plan) -> dict[str, ConfigTruth]:
    """Wide shallow trees win (best: 2 steps, topk 8, 8 draft tokens), far from the chains the study starts on; every
    config fits."""
    out = {}
    for c in plan.space.candidates():
        steps, topk, draft = (c.args[n] for n in (STEPS, TOPK, DRAFT))
        speed = 1000 * (1 + 0.1 * math.log2(topk)) * (1 - 0.03 * abs(steps - 2)) * (1 - 0.01 * abs(draft - 8))
        out[c.key] = ConfigTruth({STEPS: steps, TOPK: topk, DRAFT: draft}, {1: speed / 4, 4: speed}, 3.0, 24, True)
    out.setdefault(plan.baseline.key, ConfigTruth({}, {1: 200.0, 4: 800.0}, 1.5, 24, True))
    return out


def test_the_whole_space_model_reaches_a_far_region_within_the_budget(tmp_path: Path) -> None:
    study = write_study(tmp_path, objective="concurrent", space=BOUNDARY_SPACE, launches=12)
    plan = make_plan(read_study_file(str(study)))
    plan = replace(plan, search=SearchSettings(physics=False))  # a made-up landscape: no physics to fit
    truth = far_corner(plan)
    study = run(plan, truth)
    recs = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    launched = [r for r in recs if r.launched]
    assert [r.role for r in launched[:3]] == ["baseline", "starting point", "starting point"]
    # then the model's picks until the launches kept for confirmations (the sampler's own when none is needed), a
    # topk no launch has tried among them (coverage: test_search_coverage.py)
    own = launched[3:10]
    assert {r.role for r in own} <= {"model", "coverage"} and sum(r.role == "model" for r in own) >= 4
    assert len({r.config_key for r in own}) == len(own)
    best = max(t.level_tok_s[4] for t in truth.values())
    pick = max((r for r in launched if r.feasible), key=lambda r: r.values[0])
    # the widest trees, two flags and several strides from both starting points: within 3% of the best there
    assert pick.config["speculative-eagle-topk"] == 8 and truth[pick.config_key].level_tok_s[4] >= 0.97 * best
