"""How the tuner picks its next neighbour (autotune/search/, ``scope = "local"``), on a study whose measurements are
given: the move the measurements so far favour comes first, a leader with nothing left around it hands over to its
close rivals, and a config whose launch failed for the infrastructure even after its retry is neither a neighbour nor
a confirmation again, nor launched when the sampler proposes it. The whole search, on the emulator, is
tests/search/test_search.py."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from autotune.run import queue
from autotune import record, search
from autotune.run.plan import Plan, make_plan
from autotune.search import SearchSettings
from autotune.studyfile.space import Space
from autotune.studyfile.spec import read_study_file
from autotune.targets import make_target
from autotune.testing.studies import write_study
from autotune.run.trial import Objective, ServerLaunch

STEPS, TOPK = "speculative-num-steps", "speculative-eagle-topk"
#: steps along a chain or a topk-2 tree of 5 draft tokens (SGLang runs that tree from 2 steps to 4): a config's
#: neighbours are steps +-1 and the other topk
DRAFT = {"speculative-num-draft-tokens": 5}
SPACE = """
[space.speculative-num-steps]
type = "int"
low = 1
high = 8
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2]
"""


def new_study(tmp_path: Path) -> tuple[optuna.Study, Plan]:
    """A study and its plan, with the local search starting after two launches."""
    spec = read_study_file(str(write_study(tmp_path, objective="concurrent", space=SPACE, args=DRAFT)))
    plan = make_plan(replace(spec, startup_trials=2))
    return optuna.create_study(direction="maximize"), replace(plan, search=SearchSettings(scope="local"))


def launch(trial: optuna.Trial, space: Space) -> None:
    """Record the queued config as launched, as the tuner does before it measures."""
    candidate = space.candidate(space.suggest(trial))
    record.write.candidate(trial, candidate.tuned(space.names), candidate.args, candidate.key)
    record.write.launched(trial, ["emulator"], "")


def measure(study: optuna.Study, plan: Plan, steps: int, topk: int, value: float, spread: float = 0.01) -> None:
    """A launch of (steps, topk) that measured ``value`` with a 95% interval of +-``spread``."""
    space = plan.space
    queue.enqueue(study, space.internal({STEPS: steps, TOPK: topk}), "neighbour")

    def objective(trial: optuna.Trial) -> float:
        launch(trial, space)
        record.write.measured(trial, {"concurrent_tok_s": value}, [], [value * (1 - spread), value * (1 + spread)])
        return value

    study.optimize(objective, n_trials=1)


def fail_for_the_infrastructure(study: optuna.Study, plan: Plan, steps: int, topk: int,
                                role: str = "neighbour") -> None:
    """A launch of (steps, topk) whose SSH connection dropped, and its one retry, alike."""
    space = plan.space
    queue.enqueue(study, space.internal({STEPS: steps, TOPK: topk}), role)
    for _ in range(2):
        def objective(trial: optuna.Trial) -> float:
            launch(trial, space)
            record.write.failed(trial, "ssh_lost", "the SSH connection to the target dropped")
            raise RuntimeError("ssh_lost")

        study.optimize(objective, n_trials=1, catch=(RuntimeError,))
        attempt = study.get_trials(deepcopy=False)[-1]
        if record.retry_of(attempt) is None:
            queue.requeue(study, attempt)


def proposed(study: optuna.Study, plan: Plan, seed: int) -> tuple[int, int] | None:
    queued = search.propose(study, study.get_trials(deepcopy=False), plan, budget=30, seed=seed)
    if queued is None:
        return None
    assert queued.role == "neighbour"
    return queued.params[STEPS], queued.params[TOPK]


def test_a_leader_with_every_neighbour_measured_hands_over_to_a_close_rival(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, 4, 1, 1100, spread=0.05)
    measure(study, plan, 3, 1, 1080, spread=0.05)   # inside the leader's interval: it may be the better one
    measure(study, plan, 5, 1, 800)
    measure(study, plan, 4, 2, 700)
    measure(study, plan, 2, 2, 600)                 # far below: not a rival
    assert {proposed(study, plan, seed) for seed in range(4)} <= {(2, 1), (3, 2)}  # the rival's neighbours
    measure(study, plan, 2, 1, 900)
    measure(study, plan, 3, 2, 900)
    # nothing left around the leader or its rival: the sampler proposes
    assert proposed(study, plan, 0) is None


def test_the_neighbour_the_measurements_favour_comes_first(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    # deeper chains keep getting faster; the topk-2 trees measured so far are slower than the chains beside them
    for steps, topk, value in ((2, 1, 700), (3, 1, 850), (4, 1, 1000), (2, 2, 600), (3, 2, 700)):
        measure(study, plan, steps, topk, value)
    # the leader (4, 1) has two unmeasured neighbours, (5, 1) and (4, 2): every seed goes deeper first
    assert {proposed(study, plan, seed) for seed in range(6)} == {(5, 1)}
    measure(study, plan, 5, 1, 1100)
    # the trend goes on from the new leader, not back to the trees
    assert {proposed(study, plan, seed) for seed in range(6)} == {(6, 1)}


def test_a_config_that_failed_for_the_infrastructure_after_its_retry_is_not_proposed_again(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    for steps, value in ((2, 700), (3, 850), (4, 1000)):
        measure(study, plan, steps, 1, value)
    measure(study, plan, 4, 2, 600)
    measure(study, plan, 3, 2, 650)
    # the leader's one unmeasured neighbour outran the client twice: the search does not pay for it a third time
    assert {proposed(study, plan, seed) for seed in range(4)} == {(5, 1)}
    fail_for_the_infrastructure(study, plan, 5, 1)
    assert [t.state for t in study.get_trials()][-2:] == [optuna.trial.TrialState.FAIL] * 2
    assert proposed(study, plan, 0) is None


def test_a_confirmation_that_failed_for_the_infrastructure_after_its_retry_goes_to_the_next_rival(
        tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, 4, 1, 1000, spread=0.05)
    measure(study, plan, 3, 1, 980, spread=0.05)    # a close rival
    for steps in (1, 2, 5, 6, 7, 8):
        measure(study, plan, steps, 1, 500 + 10 * steps)
    measure(study, plan, 2, 2, 400)
    measure(study, plan, 3, 2, 400)

    def confirmation() -> tuple[int, int] | None:
        queued = search.propose(study, study.get_trials(deepcopy=False), plan, budget=12, seed=0)
        assert queued is None or queued.role == "confirmation"
        return None if queued is None else (queued.params[STEPS], queued.params[TOPK])

    # 10 launches of 12: the last two confirm, the leader first
    assert confirmation() == (4, 1)
    fail_for_the_infrastructure(study, plan, 4, 1, role="confirmation")
    assert confirmation() == (3, 1)


def test_the_sampler_proposing_a_config_given_up_on_launches_nothing(tmp_path: Path) -> None:
    study, plan = new_study(tmp_path)
    measure(study, plan, 3, 1, 850)
    fail_for_the_infrastructure(study, plan, 5, 1)
    study.enqueue_trial(plan.space.internal({STEPS: 5, TOPK: 1}))  # as TPE would draw it: no role of the tuner's
    target = make_target(plan.target, cwd=tmp_path)
    try:
        study.optimize(Objective(plan, ServerLaunch(plan, target, should_stop=lambda: False)), n_trials=1)
    finally:
        target.stop()
    trial = study.get_trials(deepcopy=False)[-1]
    rec = record.TrialRecord.of(trial)
    assert trial.state == optuna.trial.TrialState.PRUNED, "rejected like an infeasible config: TPE learns to avoid it"
    assert (rec.reason, rec.launched) == ("given_up", False)
    assert f"trial {trial.number - 1}" in rec.detail and "ssh_lost" in rec.detail
    assert not (plan.logs_dir / f"trial-{trial.number:04d}.log").exists(), "no server was started for it"
