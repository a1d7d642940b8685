"""The study's queue: which config a trial runs when it is not the sampler's to choose.

* The start: a new study's baseline, queued at once, then its opening (the engine's starting points or a warm
  start's configs), recorded with the study and queued one at a time, so that a config queued again after a failure
  that was not its fault (a retried baseline, say) runs next instead of behind all of them.
* Retries: a trial cut short for a reason that is not its config's fault (a stop request, a dead tuner, a lost
  connection) is queued again as a new trial carrying ``retry_of``; the cut-short one then no longer counts
  towards the budget (tally.launches). Each config is retried once; a stop request or a missing baseline always.
* The tuner's own next config (search.propose: a neighbour of the leader, a confirmation), queued only while
  nothing else waits.
* Confirmations once a model-based search has nothing left to try: with launches left, the leader and its close
  rivals are measured once more (each once) before the study stops as exhausted, resumed with a larger budget too.
* The adaptive server (``[study] adaptive``), once, as the study's last launch: queued when one launch of the budget
  is left or the search has nothing left to try, if the schedule built from the measurements so far runs anything
  but the best fixed chain (adaptive_schedule.py).
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import adaptive_schedule, tally
from autotune.run import budget
from autotune import record
from autotune.errors import UserError
from autotune.engines import ArgValue
from autotune.run.plan import Plan
from autotune.record import TrialRecord
from autotune.search import MODEL_BASED, Proposal, confirmation, propose

log = logging.getLogger("autotune")

#: reasons that say nothing about the config however often they happen: always retried
ALWAYS_RETRIED = ("interrupted", "baseline_pending")


def enqueue(study: optuna.Study, params: Mapping[str, ArgValue], role: str, origin: str | None = None,
            prediction: Mapping[str, float | None] | None = None) -> None:
    """Queue ``params`` as a trial of ``role`` (one of record.ROLES), with what the search predicted of it."""
    study.enqueue_trial(dict(params), user_attrs=record.write.queued(role, origin, prediction))


def start(study: optuna.Study, plan: Plan, warm: Sequence[Proposal] | None = None) -> None:
    """A new study's first configs: the baseline, queued now; then ``warm`` (a warm start's configs) or the engine's
    starting points, recorded as the study's opening and queued one at a time (``queue_next``)."""
    enqueue(study, plan.space.internal(plan.space.baseline_params()), "baseline")
    opening = list(warm) if warm is not None else [
        Proposal(plan.space.internal(p), "starting_point") for p in plan.opening]
    record.study.set_opening(study, [{"params": dict(q.params), "role": q.role, "origin": q.origin}
                                     for q in opening])


def has_baseline(study: optuna.Study) -> bool:
    """Whether the study ever queued its baseline."""
    return any(record.is_baseline(t) for t in study.get_trials(deepcopy=False))


def next_opening(study: optuna.Study, trials: Sequence[FrozenTrial]) -> Proposal | None:
    """The next config of the study's opening to queue (None: all of them were); ``trials``: the study's."""
    opening = record.study.opening(study)
    roles = {q["role"] for q in opening}
    queued = sum(1 for t in trials if record.retry_of(t) is None and roles.intersection(TrialRecord.of(t).roles))
    if queued >= len(opening):
        return None
    q = opening[queued]
    return Proposal(q["params"], q["role"], q["origin"])


def queue_next(study: optuna.Study, plan: Plan, budget: int) -> Proposal | None:
    """Queue the tuner's own next config, if it has one and nothing waits: the study's next opening config, else a
    neighbour of the leader or a confirmation (multi-objective studies: the opening only). Returns what it queued."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return None
    proposal = next_opening(study, trials)
    if proposal is None and len(study.directions) == 1:
        proposal = propose(study, trials, plan, budget, plan.spec.seed)
    if proposal is not None:
        enqueue(study, proposal.params, proposal.role, proposal.origin, proposal.prediction)
    return proposal


def queue_confirmation(study: optuna.Study, plan: Plan, launches: int) -> bool:
    """Queue a confirmation when the search has nothing left to try and launches are left (``launches``: the
    budget); whether it did. Call it under the admission lock, before ``queue_adaptive`` and ``budget.admit``."""
    trials = study.get_trials(deepcopy=False)
    if plan.spec.sampler not in MODEL_BASED or len(study.directions) != 1 \
            or any(t.state == TrialState.WAITING for t in trials):
        return False  # the grid and random search stay what they say they are
    done, running = budget.standing(study)
    why = budget.exhausted(study, trials) if done + running < launches else None
    proposal = confirmation(study, trials, plan) if why is not None else None
    if proposal is None:
        return False
    enqueue(study, proposal.params, proposal.role)
    log.info("%s; %d launches left: the leading configs are measured once more first", why, launches - done - running)
    return True


def queue_adaptive(study: optuna.Study, plan: Plan, launches: int) -> bool:
    """Queue the adaptive server when it is due (see the module docstring; ``launches``: the budget); whether it
    did. Call it under the admission lock, before ``budget.admit``."""
    if not plan.spec.adaptive:
        return False
    trials = study.get_trials(deepcopy=False)
    if any(record.is_adaptive(t) or t.state == TrialState.WAITING for t in trials):
        return False
    done, running = budget.standing(study)
    if done + running >= launches or (done + running < launches - 1 and budget.exhausted(study, trials) is None):
        return False
    try:
        schedule = adaptive_schedule.build(study, plan.engine, plan.spec.workload.tolerance)
    except UserError:
        return False
    if not schedule.differs:
        return False
    enqueue(study, {}, "adaptive")
    log.info("queued the adaptive server: schedule %s from trials %s", schedule.document,
             ", ".join(map(str, schedule.trials)))
    return True


def should_retry(trial: optuna.Trial | FrozenTrial, reason: str | None) -> bool:
    """Each config is retried once; a stop request (the user asked) or a missing baseline (the study's order) is
    always worth another try."""
    return record.retry_of(trial) is None or reason in ALWAYS_RETRIED


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue ``trial`` again as a new trial: the same parameters with their distributions (a baseline stays the
    baseline, a starting point a starting point; a grid trial keeps its grid point). A trial cut short before it
    asked for every parameter gets the missing ones from the sampler as usual."""
    attrs, system = record.write.retried(trial)
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions, user_attrs=attrs,
        system_attrs=system))


def stored(trial: optuna.Trial) -> FrozenTrial:
    """The stored record of a running trial."""
    return next(t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.number == trial.number)


def sweep(study: optuna.Study, target: str) -> None:
    """Trials a dead tuner left RUNNING: fail them and queue each config once more.

    A trial is an orphan once the process that ran it is gone (``record.owner_of``: its host, the host's boot, its
    pid and start time), whatever target it names: a live worker on this host keeps its trial, a worker on another
    host is the heartbeat's business (PostgreSQL), never this sweep's. A RUNNING trial that names no process was left
    by a worker that died between creating it and naming itself: the caller holds the study's admission lock, which a
    worker holds over that span. A trial an older autotune started names only its target: it is an orphan when that
    is ``target``, whose lock the caller holds."""
    trials = study.get_trials(deepcopy=False)
    again = tally.retried(trials)
    for t in trials:
        if t.state != TrialState.RUNNING or not _orphaned(t, target):
            continue
        if t.number not in again and should_retry(t, record.reason_of(t)):
            requeue(study, t)
            log.info("trial %d was left running by a stopped tuner: failed, its config is queued again", t.number)
        else:
            log.info("trial %d was left running by a stopped tuner: failed", t.number)
        study.tell(t.number, state=TrialState.FAIL)


def _orphaned(trial: FrozenTrial, target: str) -> bool:
    owner = record.owner_of(trial)
    if owner is not None:
        return owner.gone() is True
    return (record.target_of(trial) or target) == target


def requeue_forced(study: optuna.Study, number: int) -> None:
    """A second signal cut trial ``number`` short: Optuna failed it; queue its config again like an interrupted
    one."""
    trials = study.get_trials(deepcopy=False)
    t = trials[number]
    if t.state == TrialState.FAIL and number not in tally.retried(trials) and record.reason_of(t) is None:
        requeue(study, t)


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose workers stopped beating (a no-op without heartbeats); the storage's callback queues
    their configs again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def stale_trial_callback(study: optuna.Study, trial: FrozenTrial) -> None:
    """For RDBStorage's heartbeat: a worker died in the middle of ``trial`` (now failed): retry its config once."""
    if should_retry(trial, None):
        requeue(study, trial)
        log.info("trial %d lost its worker (%s): failed, its config is queued again", trial.number,
                 TrialRecord.of(trial).worker or "unknown")
