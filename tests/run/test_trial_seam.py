"""One seam for a trial: what happens to a proposed config (autotune/run/trial/decision.py) and the measurement step
behind one interface (a real launch, or the truth plus noise). A study run through the product's own objective and
queue with the surrogate launch makes the tuner's decisions: the baseline first, the engine's starting points next,
configs the engine rejects or that were measured already cost no launch, a config that does not fit is recorded as
the config's failure, and the pick is the truly best config when nothing is noisy."""
from __future__ import annotations

from pathlib import Path

from optuna.trial import TrialState

from autotune.run import queue
from autotune.run.plan import Plan, make_plan
from autotune.record import TrialRecord, write
from autotune.studyfile.spec import read_study_file
from autotune.run.trial import decide
from autotune.run.study_truth import ConfigTruth
from autotune.testing.studies import write_study
from tests.support.surrogate_studies import run

STEPS, TOPK, DRAFT = "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"
SPACE = """
[space.speculative-num-steps]
type = "int"
low = 1
high = 6
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2]
[space.speculative-num-draft-tokens]
type = "int"
low = 2
high = 8
"""


def plan_of(tmp_path: Path, launches: int = 12, objective: str = "concurrent") -> Plan:
    return make_plan(read_study_file(str(write_study(tmp_path, objective=objective, space=SPACE, launches=launches))))


def landscape(plan: Plan) -> dict[str, ConfigTruth]:
    """A made-up truth for every config of the space: deeper chains are faster up to 5 steps, trees are slower, and
    every tree of 6 or more draft tokens does not fit in memory."""
    out = {}
    for candidate in plan.space.candidates():
        steps, topk, draft = (candidate.args[n] for n in (STEPS, TOPK, DRAFT))
        speed = 1000 + 100 * min(steps, 5) - 20 * max(steps - 5, 0) - (150 if topk > 1 else 0) + 5 * draft
        out[candidate.key] = ConfigTruth({STEPS: steps, TOPK: topk, DRAFT: draft}, {1: speed / 4, 4: speed}, 3.0,
                                         24, fits=topk == 1 or draft < 6)
    out[plan.baseline.key] = out.get(plan.baseline.key) or ConfigTruth({}, {1: 200.0, 4: 800.0}, 1.5, 24, True)
    return out


def test_a_surrogate_study_makes_the_tuners_own_decisions(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    truth = landscape(plan)
    study = run(plan, truth)
    recs = [TrialRecord.of(t) for t in study.get_trials()]
    launched = [r for r in recs if r.launched]
    assert len(launched) == plan.budget, "the budget counts launches"
    assert recs[0].baseline and recs[0].feasible
    opening = [r for r in recs if r.starting_point]
    assert [r.params for r in opening] == plan.opening and opening
    assert [r.number for r in opening] == list(range(1, len(opening) + 1)), "the starting points come next, in order"
    for r in recs:
        if r.reused_from is not None:
            assert not r.launched and r.config_key == recs[r.reused_from].config_key
        if r.launched and not truth[r.config_key].fits:
            assert (r.state, r.reason) == (TrialState.PRUNED, "oom_startup"), r
    # without noise the pick is the best config measured, and the chains' optimum is within reach of the search
    best = max((truth[r.config_key].level_tok_s[4], r.config_key) for r in launched if r.feasible)
    assert truth[best[1]].level_tok_s[4] == max(t.level_tok_s[4] for t in truth.values() if t.fits)


def test_each_decision_before_a_launch(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, launches=4)
    truth = landscape(plan)
    study = run(plan, truth)
    trials = study.get_trials(deepcopy=False)
    chain = {STEPS: 2, TOPK: 1, DRAFT: 3}  # the first starting point
    measured = next(t for t in trials if TrialRecord.of(t).params == chain)
    n = len(trials)
    assert decide(plan, trials, n, {STEPS: 3, TOPK: 2, DRAFT: 20}).kind == "invalid"   # a tree SGLang rejects
    assert decide(plan, trials, n, {**chain, DRAFT: 7}).prior.number == measured.number  # topk 1: draft ignored
    assert decide(plan, trials, n, {**chain, DRAFT: 7}).kind == "reuse"
    assert decide(plan, trials, n, chain, confirmation=True).kind == "launch", "a confirmation measures again"
    assert decide(plan, trials, n, {STEPS: 6, TOPK: 1, DRAFT: 7}).kind == "launch"
    assert decide(plan, trials, n, {STEPS: 6, TOPK: 1, DRAFT: 7}, baseline=True).candidate.key == plan.baseline.key
    # another worker is running a config: a proposal of the same config waits for it
    queue.enqueue(study, plan.space.internal({STEPS: 6, TOPK: 1}), "neighbour")
    running = study.ask()
    candidate = plan.space.candidate(plan.space.suggest(running))
    write.candidate(running, candidate.tuned(plan.space.names), candidate.args, candidate.key)
    decision = decide(plan, study.get_trials(deepcopy=False), running.number + 1, {STEPS: 6, TOPK: 1, DRAFT: 7})
    assert (decision.kind, decision.prior.number) == ("wait", running.number)


def test_a_config_given_up_on_is_rejected_without_a_launch(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, launches=3)
    study = run(plan, landscape(plan))
    measured = {TrialRecord.of(t).config_key for t in study.get_trials(deepcopy=False)}
    chain = next({STEPS: s, TOPK: 1} for s in range(6, 0, -1) if plan.space.candidate({STEPS: s, TOPK: 1}).key
                 not in measured)
    candidate = plan.space.candidate(chain)
    queue.enqueue(study, plan.space.internal(chain), "neighbour")
    for _ in range(2):  # the launch and its one retry, both cut short by the infrastructure
        trial = study.ask()
        plan.space.suggest(trial)
        write.candidate(trial, candidate.tuned(plan.space.names), candidate.args, candidate.key)
        write.launched(trial, ["surrogate"], "")
        write.failed(trial, "ssh_lost", "the SSH connection dropped")
        study.tell(trial, state=TrialState.FAIL)
        if queue.should_retry(trial, "ssh_lost"):
            queue.requeue(study, study.get_trials(deepcopy=False)[trial.number])
    trials = study.get_trials(deepcopy=False)
    decision = decide(plan, trials, len(trials), {**chain, DRAFT: 7})
    assert (decision.kind, decision.prior.number) == ("given_up", trials[-1].number)
