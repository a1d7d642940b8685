"""The pick is settled by intervals (autotune/results/tally.py): once a config is confirmed, a rival measured once takes
the pick only when its 95% interval clears the confirmed one's; confirmed configs whose intervals still overlap are a
tie, the higher pooled estimate is the pick, and `autotune best` (text and JSON) and summary.md say so and name the
cheaper config of the tie. On a study whose measurements are given."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.run import queue
from autotune import record
from autotune.results import tally
from autotune.results.best import best_record, document, tie_line
from autotune.run.plan import Plan, make_plan
from autotune.report.summary import summary_markdown
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import SPEC_SPACE, write_study
from tests.support.study_texts import DRAFT, STEPS, TOPK

#: two trees of the same width: the wider one (more draft tokens) costs more to run
WIDE, NARROW = (4, 4, 16), (4, 4, 9)


def new_study(tmp_path: Path) -> tuple[optuna.Study, Plan]:
    plan = make_plan(read_study_file(str(write_study(tmp_path, objective="concurrent", space=SPEC_SPACE))))
    return optuna.create_study(direction="maximize"), plan


def measure(study: optuna.Study, plan: Plan, tree: tuple[int, int, int], value: float, role: str = "model",
            spread: float = 0.01) -> None:
    """A launch of ``tree`` that measured ``value`` with a 95% interval of +-``spread``, recorded as the tuner
    records one."""
    queue.enqueue(study, plan.space.internal(dict(zip((STEPS, TOPK, DRAFT), tree, strict=True))), role)

    def objective(trial: optuna.Trial) -> float:
        candidate = plan.space.candidate(plan.space.suggest(trial))
        record.write.candidate(trial, candidate.tuned(plan.space.names), candidate.args, candidate.key,
                               plan.engine.cost(candidate.args))
        record.write.launched(trial, ["surrogate"], "")
        record.write.measured(trial, {"concurrent_tok_s": value}, [], [value * (1 - spread), value * (1 + spread)])
        return value

    study.optimize(objective, n_trials=1)


def picked(study: optuna.Study) -> int:
    """The first trial of the picked config."""
    return tally.leader(study).trials[0]


def test_before_any_confirmation_the_pick_is_the_best_estimate(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, NARROW, 1000.0)
    measure(study, plan, WIDE, 1010.0)
    assert picked(study) == 1 and tally.pick(study).tied == ()


def test_a_rival_measured_once_a_percent_ahead_does_not_take_the_pick_from_a_confirmed_config(
        tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, NARROW, 1010.0)
    measure(study, plan, WIDE, 1000.0)
    measure(study, plan, NARROW, 990.0, "confirmation")  # pooled 1000: the wider tree is ahead by its mean
    assert tally.top(tally.estimates(study)).trials[0] == 1
    assert picked(study) == 0, "an unconfirmed rival whose interval does not clear the confirmed leader's"
    measure(study, plan, WIDE, 1020.0, "confirmation")  # both confirmed, intervals overlapping: a tie
    chosen = tally.pick(study)
    assert chosen.estimate.trials[0] == 1 and [e.trials[0] for e in chosen.tied] == [0]


def test_a_rival_whose_interval_clears_the_leaders_takes_the_pick(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, NARROW, 1000.0)
    measure(study, plan, WIDE, 970.0)
    measure(study, plan, NARROW, 1000.0, "confirmation")
    measure(study, plan, (3, 4, 12), 1150.0)  # a new config, once: its interval clears the confirmed leader's
    chosen = tally.pick(study)
    assert chosen.estimate.trials[0] == 3 and chosen.tied == ()


def test_a_tie_is_said_with_the_cheaper_config_of_it(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, WIDE, 1010.0)
    measure(study, plan, NARROW, 1000.0)
    measure(study, plan, WIDE, 1012.0, "confirmation")
    measure(study, plan, NARROW, 1002.0, "confirmation")
    chosen = tally.pick(study)
    assert chosen.estimate.trials[0] == 0, "confirmed, overlapping: the higher pooled estimate"
    assert [e.trials[0] for e in chosen.tied] == [1] and chosen.cheaper.trials[0] == 1
    assert best_record(study).number == 0
    said = tie_line(study)
    assert said is not None and "tied with the config of trial 1" in said and "trial 1 is cheaper" in said
    assert document(best_record(study), study)["tie"]["with"] == [1]
    assert said in summary_markdown(study, None)
    # settled by cost instead (the bench measures that rule too): the fewer draft tokens
    assert tally.pick(study, tie="cheaper").estimate.trials[0] == 1
