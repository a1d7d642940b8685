"""One trial: suggestion -> candidate -> decision -> launch (deployment, readiness, verification, measurement) ->
score -> record.

How a trial ends, and what the sampler learns from it:
- measured: COMPLETE with its value(s); constraint values say whether it was feasible;
- the config is to blame (rejected by the engine's rules, out of memory, crashed, never ready, died or stalled
  under load, given up on): PRUNED with every constraint violated, so TPE ranks it below every feasible config and
  avoids the region (Optuna's TPE learns from pruned trials' constraints; its GP sampler ignores them);
- clearly worse after an early stage: PRUNED by the pruner, with the stage recorded;
- the infrastructure is to blame (SSH lost, a foreign process on the port, a stale server, a stop request):
  FAIL, and the same config is queued again once, so nothing the user paid for is lost;
- an effective config that was already measured is not deployed again: its result is reused.
What happens before a launch is decision.py's; how a launch measures is the ``Launch``'s (a real server or a
surrogate): the objective is the same for both.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import adaptive_schedule
from autotune.run import queue
from autotune import record
from autotune.results.adaptive_schedule import Schedule
from autotune.bench.capacity import SLO
from autotune.errors import TrialFailure, UserError
from autotune.run.plan import Plan
from autotune.run.progress import Phase
from autotune.record import write
from autotune.results.score import (
    RELATIVE,
    capacity_bound,
    constraint_values,
    objective_bound,
    objective_values,
    reference_of,
    violated,
)
from autotune.studyfile.space import Candidate
from autotune.redact import mask
from autotune.record.storage import WRITE_ERRORS, write_reason
from autotune.run.trial.decision import Decision, HostCheck, decide
from autotune.run.trial.launch import Launch, Measured

log = logging.getLogger("autotune")

#: seconds between looks at a twin trial another worker is running
TWIN_POLL = 2.0


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Objective:
    """Callable for ``study.optimize``: runs one trial through ``launch``."""

    def __init__(
        self,
        plan: Plan,
        launch: Launch,
        should_stop: Callable[[], bool] = lambda: False,
        on_phase: Callable[[Phase], None] = lambda phase: None,
        host: HostCheck | None = None,
    ) -> None:
        """``host``: asks the engine on the target about a config before its launch (hostresolve.py)."""
        self.plan = plan
        self.host = host
        self.spec = plan.spec
        self.launch = launch
        self.should_stop = should_stop
        self.on_phase = on_phase
        self.phase = Phase()
        #: seconds this trial spent in each phase (deploying, waiting, verifying, measuring)
        self.timings: dict[str, float] = {}
        self._since = time.monotonic()
        self._max_running: int | None = None
        #: called once the trial exists in storage and names its target and its config (the tuner releases the
        #: admission lock)
        self.on_start: Callable[[], None] = lambda: None
        #: gives back the room kept for the study database's last writes (storage.Reserve); whether there was any
        self.free_space: Callable[[], bool] = lambda: False
        #: the database's refusal of a trial's figures, once the trial was recorded failed in the room given back:
        #: the run stops with it
        self.unstored: BaseException | None = None

    # -- the trial ---------------------------------------------------------------------------------------------

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        baseline = record.is_baseline(trial)
        write.started(trial, self.launch.target_name, worker_id())
        # the admission lock is held until this trial names its config (however long the engine on the target
        # takes to answer), so that a worker proposing the same config sees this trial as its twin
        try:
            self._phase(trial, "suggest")
            space = self.plan.space
            measures_adaptive = record.is_adaptive(trial)
            params = space.suggest(trial, only={} if measures_adaptive else space.baseline_params() if baseline
                                   else None)
            log.info("trial %d start: %s%s", trial.number, "the adaptive server" if measures_adaptive
                     else self.plan.engine.describe(params), " (baseline)" if baseline else "")
            confirmation = record.is_confirmation(trial)
            try:
                schedule = self._schedule(trial) if measures_adaptive else None
            except UserError as e:
                write.candidate(trial, params)
                return self._infeasible(trial, "invalid_config", str(e), stage="validate")
            if self.host is not None:
                self._phase(trial, "resolving")  # asking the engine on the target
            try:
                decision = decide(self.plan, trial.study.get_trials(deepcopy=False), trial.number, params,
                                  baseline=baseline, confirmation=confirmation, schedule=schedule, host=self.host)
            except TrialFailure as failure:  # the target was lost, or a stop requested, while it was asked
                write.candidate(trial, params)
                return self._retry(trial, failure)
            if decision.candidate is None:
                write.candidate(trial, params)
                return self._infeasible(trial, "invalid_config", decision.detail, stage="validate")
            candidate = decision.candidate
            if decision.kind == "host_rejected":
                write.candidate(trial, candidate.tuned(space.names), candidate.args, candidate.key)
                return self._infeasible(trial, "host_rejected", decision.detail, stage="validate")
            if decision.rewritten is not None:
                self._rewritten(trial, decision.rewritten, candidate)
            # the tuned flags as the server runs them (the sampler's own parameters may be fill fractions); written
            # before any wait, so that a worker proposing the same config sees this trial as its twin. An adaptive
            # server records none: it is no point of the space
            write.candidate(trial, {} if measures_adaptive else candidate.tuned(space.names), candidate.args,
                            candidate.key, None if measures_adaptive else self.plan.engine.cost(candidate.args))
        finally:
            self.on_start()
        try:
            while decision.kind == "wait":
                decision = self._wait_for_twin(trial, decision, params, confirmation)
        except TrialFailure as failure:
            return self._retry(trial, failure)
        if decision.kind == "reuse":
            return self._reuse(trial, decision.prior)
        if decision.kind == "too_large":
            oom = decision.prior
            flags = ", ".join(self.plan.engine.memory_flags(candidate.args))
            return self._infeasible(trial, "oom_predicted", f"at least as large in {flags} as the config of trial "
                                    f"{oom.number}, which ran out of memory ({record.reason_of(oom)})",
                                    stage="validate")
        if decision.kind == "given_up":
            gone = decision.prior
            return self._infeasible(trial, "given_up", f"the config of trial {gone.number}, which failed for the "
                                    f"infrastructure after its retry ({record.reason_of(gone)})", stage="validate")
        try:
            return self._launch(trial, candidate)
        except TrialFailure as failure:
            if failure.infeasible:
                return self._infeasible(trial, failure.reason, failure.detail, stage=self.phase.name)
            return self._retry(trial, failure)
        except (optuna.TrialPruned, *WRITE_ERRORS):  # a database that takes no write is no bug of the trial's
            raise
        except Exception as e:
            log.exception("trial %d: unexpected error", trial.number)
            return self._retry(trial, TrialFailure("tuner_error", f"{type(e).__name__}: {e}"))
        finally:
            self._phase(trial, "done")
            write.timings(trial, self.timings)
            self.launch.finish(trial, candidate)

    def _schedule(self, trial: optuna.Trial) -> Schedule:
        """The adaptive server's schedule from the study's measurements so far, recorded with the trial."""
        plan = self.plan
        name = adaptive_schedule.file_name(plan.spec.name, trial.number)
        schedule = adaptive_schedule.build(trial.study, plan.engine, plan.spec.workload.tolerance, name,
                                           fixed=plan.space.fixed)
        write.schedule(trial, schedule.document, name, schedule.trials, schedule.family_trial,
                       adaptive_schedule.summary(schedule, None))
        log.info("trial %d: adaptive schedule %s, from trials %s", trial.number, json.dumps(schedule.document),
                 ", ".join(map(str, schedule.trials)))
        return schedule

    def _wait_for_twin(self, trial: optuna.Trial, decision: Decision, params: dict[str, Any],
                       confirmation: bool) -> Decision:
        """Wait a moment for the twin another worker runs, then decide again."""
        twin = decision.prior.number
        self._phase(trial, "waiting for a twin", f"trial {twin}")
        log.info("trial %d waits for trial %d (same config, another worker)", trial.number, twin)
        self._pause(TWIN_POLL, f"waiting for trial {twin}")
        queue.fail_stale(trial.study)
        return decide(self.plan, trial.study.get_trials(deepcopy=False), trial.number, params,
                      confirmation=confirmation, host=self.host)

    def _rewritten(self, trial: optuna.Trial, predicted: Candidate, candidate: Candidate) -> None:
        """The engine on the target runs other values than the rules predicted: recorded, and said."""
        changes = {k: [predicted.args.get(k), v] for k, v in candidate.args.items() if predicted.args.get(k) != v}
        write.host_rewrote(trial, changes)
        log.info("trial %d: the engine on the target runs %s", trial.number,
                 ", ".join(f"{k}={v} (not {was})" for k, (was, v) in changes.items()))

    def _launch(self, trial: optuna.Trial, candidate: Candidate) -> float | list[float]:
        spec = self.spec
        info = self.launch.start(trial, candidate, lambda stage, detail: self._phase(trial, stage, detail))
        self._max_running = info.max_running_requests
        if spec.constraints.min_running_requests is not None and info.max_running_requests is not None \
                and info.max_running_requests < spec.constraints.min_running_requests:
            raise TrialFailure("constraints", f"max_running_requests {info.max_running_requests} < "
                                              f"min_running_requests {spec.constraints.min_running_requests}")
        self._phase(trial, "measuring")
        reference = record.study.reference(trial.study)
        measured = self.launch.measure(trial, info,
                                       lambda step, c, levels: self._on_level(trial, step, c, levels, reference))
        try:
            if record.is_baseline(trial):
                reference = record.study.set_reference(trial.study, reference_of(measured.metrics), trial.number)
            elif reference is None and spec.objective in RELATIVE:
                reference = self._await_reference(trial)
            values = objective_values(spec.objective, measured.metrics, reference, spec.workload.mix)
            constraints = constraint_values(spec.constraints, measured.metrics)
            self._record_measurement(trial, measured, constraints, values)
        except WRITE_ERRORS as e:
            _keep(trial, measured)
            if not self.free_space():
                raise
            self.unstored = e
            return self._retry(trial, TrialFailure("not_stored", f"the study database would not take its figures "
                                                   f"({write_reason(e)}); they are on stdout: \"autotune: trial "
                                                   f"{trial.number} measured but not stored\""))
        bad = violated(constraints)
        if bad:
            write.failed(trial, "constraints", ", ".join(bad))
        return values if len(values) > 1 else values[0]

    def _on_level(self, trial: optuna.Trial, step: int, concurrency: int, levels: list[dict[str, Any]],
                  reference: dict[str, Any] | None) -> None:
        self._phase(trial, "measuring", f"concurrency {concurrency}")
        spec = self.spec
        if not spec.pruning or record.is_baseline(trial) or record.is_confirmation(trial) \
                or record.is_adaptive(trial):  # measured at every load, to be compared at every load
            return
        if reference is None and spec.objective in RELATIVE:
            return  # values are relative to the baseline, which another worker is still measuring
        if spec.objective == "capacity":
            slo = SLO(*spec.constraints.slo)  # type: ignore[misc]
            value = capacity_bound(levels, slo.meets, max(spec.levels), self._max_running)
        elif concurrency == max(spec.levels):
            return  # measured to the end: the trial completes with its value, whatever it is
        else:
            measured = {lv["concurrency"]: lv["output_tok_s"] for lv in levels}
            value = objective_bound(spec.objective, spec.levels, concurrency, measured, reference, self._max_running,
                                    spec.workload.mix)
        if value is None:
            return
        trial.report(value, step)
        if trial.should_prune():
            stage = "single" if concurrency == 1 else f"c{concurrency}"
            write.pruned(trial, stage, levels)
            trial.set_constraint("failed", 0.0)
            for key in constraint_values(spec.constraints, None):
                if key != "failed":
                    trial.set_constraint(key, 0.0)
            log.info("trial %d pruned after %s: %.4g", trial.number, stage, value)
            raise optuna.TrialPruned(f"pruned after {stage}")

    # -- outcomes ----------------------------------------------------------------------------------------------

    def _record_measurement(self, trial: optuna.Trial, measured: Measured, constraints: dict[str, float],
                            values: list[float]) -> None:
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        # the 95% interval of the objective (of the first objective for pareto studies)
        p = measured.precision
        ci = None if p is None else [values[0] * (1 - p), values[0] * (1 + p)]
        write.measured(trial, measured.metrics, measured.levels, ci)
        write.predicted_outcome(trial, values[0], p)
        if measured.capacity is not None:
            write.slo_capacity(trial, measured.capacity)

    def _infeasible(self, trial: optuna.Trial, reason: str, detail: str, stage: str) -> float:
        for key, value in constraint_values(self.spec.constraints, None).items():
            trial.set_constraint(key, value)
        write.failed(trial, reason, detail, stage)
        log.info("trial %d failed: %s (%s)", trial.number, reason, detail[:200])
        raise optuna.TrialPruned(f"{reason}: {detail}")

    def _retry(self, trial: optuna.Trial, failure: TrialFailure) -> float:
        """An infrastructure failure: FAIL this trial and queue its config again (once, unless interrupted)."""
        retry = queue.should_retry(trial, failure.reason)
        write.failed(trial, failure.reason, failure.detail, self.phase.name)
        if retry:
            queue.requeue(trial.study, queue.stored(trial))
        log.info("trial %d failed: %s (%s)%s", trial.number, failure.reason, failure.detail[:200],
                 "; its config is queued again" if retry else "")
        return math.nan

    def _reuse(self, trial: optuna.Trial, prior: FrozenTrial) -> float | list[float]:
        write.reused(trial, prior)
        for key, value in prior.constraints.items():
            trial.set_constraint(key, value)
        log.info("trial %d reuses trial %d (same effective config)", trial.number, prior.number)
        if prior.state == TrialState.COMPLETE:
            return prior.values if len(prior.values) > 1 else prior.values[0]
        for step, value in prior.intermediate_values.items():
            trial.report(value, step)
        raise optuna.TrialPruned(f"same config as trial {prior.number}")

    # -- helpers -----------------------------------------------------------------------------------------------

    def _await_reference(self, trial: optuna.Trial) -> dict[str, Any] | None:
        """The baseline's figures, once another worker has measured the baseline. None if it never will be (it
        failed): then every trial's value is the raw geometric mean, the same for all. Waits only while the baseline
        is running; a baseline waiting in the queue (its worker died) would wait for this worker, so this trial is
        queued again behind it instead."""
        while True:
            reference = record.study.reference(trial.study)
            if reference is not None:
                return reference
            active = trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
            pending = [t for t in active if record.is_baseline(t) and t.number != trial.number]
            if not pending:
                return None
            if all(t.state == TrialState.WAITING for t in pending):
                raise TrialFailure("baseline_pending", f"the baseline (trial {pending[0].number}) is queued again")
            self._phase(trial, "waiting for the baseline", f"trial {pending[0].number}")
            self._pause(TWIN_POLL, "waiting for the baseline")
            queue.fail_stale(trial.study)

    def _pause(self, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.should_stop():
                raise TrialFailure("interrupted", f"stop requested while {what}")
            time.sleep(0.2)

    def _phase(self, trial: optuna.Trial, name: str, detail: str = "") -> None:
        now = time.monotonic()
        if name != self.phase.name or trial.number != self.phase.trial:
            if self.phase.trial == trial.number:
                self.timings[self.phase.name] = round(self.timings.get(self.phase.name, 0.0) + now - self._since, 3)
            else:
                self.timings = {}
            self._since = now
        self.phase = Phase(trial.number, name, detail)
        self.on_phase(self.phase)


def _keep(trial: optuna.Trial, measured: Measured) -> None:
    """A measurement the study database would not take (read-only, a full disk), kept where it can be: one line on
    stdout (a terminal, journald) with the config and every figure, so that it can be queued or compared by hand."""
    kept = {"trial": trial.number, "params": trial.params, "metrics": measured.metrics, "levels": measured.levels}
    sys.stdout.write("autotune: trial %d measured but not stored: %s\n"
                     % (trial.number, mask(json.dumps(kept, default=str, separators=(",", ":")))))
    sys.stdout.flush()
