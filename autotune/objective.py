"""One trial: suggestion -> candidate -> deployment -> readiness -> verification -> measurement -> score.

How a trial ends, and what the sampler learns from it:
- measured: COMPLETE with its value(s); constraint values say whether it was feasible;
- the config is to blame (rejected by the engine's rules, out of memory, crashed, never ready, died or stalled
  under load): PRUNED with every constraint violated, so TPE ranks it below every feasible config and avoids the
  region (docs: optuna.md, "States");
- clearly worse after an early stage: PRUNED by the pruner, with the stage recorded;
- the infrastructure is to blame (SSH lost, a foreign process on the port, a stale server, a stop request):
  FAIL, and the same config is queued again once, so nothing the user paid for is lost;
- an effective config that was already measured is not deployed again: its result is reused.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from autotune import record, results
from autotune.artifacts import upload_trial
from autotune.bench.measure import Bench, Measurement
from autotune.bringup import bring_up
from autotune.engines import ServerInfo
from autotune.errors import InvalidConfig, TrialFailure
from autotune.health import check_alive
from autotune.plan import Plan
from autotune.retry import fail_stale, frozen, should_retry
from autotune.score import (
    constraint_values,
    metrics_of,
    objective_values,
    reference_of,
    RELATIVE,
    objective_bound,
    relative_precision,
    violated,
)
from autotune.space import Candidate
from autotune.targets import Deployment, Target
from autotune.targets.measuring import load_generator

log = logging.getLogger("autotune")

#: seconds between looks at a twin trial another worker is running
TWIN_POLL = 2.0
#: trial states whose result a later identical config can reuse
REUSABLE = (TrialState.COMPLETE, TrialState.PRUNED)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Phase:
    """What the current trial is doing, for progress displays."""

    trial: int | None = None
    name: str = "idle"
    detail: str = ""


class Objective:
    """Callable for ``study.optimize``: runs one trial on one target."""

    def __init__(
        self,
        plan: Plan,
        target: Target,
        should_stop: Callable[[], bool],
        on_phase: Callable[[Phase], None] = lambda phase: None,
        artifacts: FileSystemArtifactStore | None = None,
    ) -> None:
        self.plan = plan
        self.spec = plan.spec
        self.engine = plan.engine
        self.space = plan.space
        self.target = target
        self.logs_dir = plan.logs_dir
        self.should_stop = should_stop
        self.on_phase = on_phase
        self.artifacts = artifacts
        self.deployment: Deployment | None = None
        self.phase = Phase()
        #: seconds this trial spent in each phase (deploying, waiting, verifying, measuring)
        self.timings: dict[str, float] = {}
        self._since = time.monotonic()
        self._bench: Bench | None = None
        self._max_running: int | None = None
        #: called once the trial exists in storage and names its target (the tuner releases the admission lock)
        self.on_start: Callable[[], None] = lambda: None

    # -- the trial ---------------------------------------------------------------------------------------------

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        baseline = record.is_baseline(trial)
        record.started(trial, self.target.name, worker_id())
        self.on_start()
        self._phase(trial, "suggest")
        params = self.space.suggest(trial, only=self.space.baseline_params() if baseline else None)
        log.info("trial %d start: %s%s", trial.number, self.engine.describe(params), " (baseline)" if baseline else "")
        try:
            candidate = self.space.baseline() if baseline else self.space.candidate(params)
        except InvalidConfig as e:
            record.candidate(trial, params)
            return self._infeasible(trial, "invalid_config", str(e), stage="validate")
        # the tuned flags as the server runs them (the sampler's own parameters may be fill fractions)
        record.candidate(trial, candidate.tuned(self.space.names), candidate.args, candidate.key)

        if not baseline and not record.is_confirmation(trial):
            try:
                self._wait_for_twin(trial, candidate.key)
            except TrialFailure as failure:
                return self._retry(trial, failure)
            prior = self._measured(trial.study, candidate.key, trial.number)
            if prior is not None:
                return self._reuse(trial, prior)
            gone = results.given_up(trial.study.get_trials(deepcopy=False)).get(candidate.key)
            if gone is not None:
                return self._infeasible(trial, "given_up", f"the config of trial {gone.number}, which failed for the "
                                        f"infrastructure after its retry ({record.reason_of(gone)})", stage="validate")
        self._bench = None
        self.deployment = None
        try:
            return self._run(trial, candidate)
        except TrialFailure as failure:
            if failure.infeasible and self.deployment is not None and self.deployment.reconnected():
                failure = TrialFailure("ssh_lost", f"the SSH connection was reopened during the trial ({failure})")
            if failure.infeasible:
                return self._infeasible(trial, failure.reason, failure.detail, stage=self.phase.name)
            return self._retry(trial, failure)
        except optuna.TrialPruned:
            raise
        except Exception as e:
            log.exception("trial %d: unexpected error", trial.number)
            return self._retry(trial, TrialFailure("tuner_error", f"{type(e).__name__}: {e}"))
        finally:
            self._phase(trial, "done")
            record.timings(trial, self.timings)
            self._upload(trial, candidate)

    def _upload(self, trial: optuna.Trial, candidate: Candidate) -> None:
        if self.artifacts is None:
            return
        argv = self.engine.render(self.spec.engine.command, candidate.args)
        records = self._bench.measurement.records() if self._bench is not None else None
        log_path = self.logs_dir / f"trial-{trial.number:04d}.log"
        upload_trial(self.artifacts, trial, self.logs_dir, log_path,
                     self.target.rendered(argv, self.spec.engine.env), records)

    def _run(self, trial: optuna.Trial, candidate: Candidate) -> float | list[float]:
        spec = self.spec
        argv = self.engine.render(spec.engine.command, candidate.args)
        log_path = self.logs_dir / f"trial-{trial.number:04d}.log"
        record.launched(trial, argv, str(log_path))
        headers = self.engine.auth_headers(candidate.args)

        def deployed(deployment: Deployment) -> None:
            self.deployment = deployment
            log.info("trial %d deploy: %s", trial.number, " ".join(argv))

        running = bring_up(lambda: self.target.deploy(argv, spec.engine.env, log_path), self.engine, spec.health,
                           headers, candidate.tuned(self.space.names), should_stop=self.should_stop,
                           on_stage=lambda stage, detail: self._phase(trial, stage, detail), on_deployed=deployed)
        record.ready(trial, running.ready.seconds)
        log.info("trial %d ready in %.1f s", trial.number, running.ready.seconds)
        assert running.info is not None
        info = self._capacity(trial, running.deployment, candidate, running.info)
        self._max_running = info.max_running_requests
        if spec.constraints.min_running_requests is not None and info.max_running_requests is not None \
                and info.max_running_requests < spec.constraints.min_running_requests:
            raise TrialFailure("constraints", f"max_running_requests {info.max_running_requests} < "
                                              f"min_running_requests {spec.constraints.min_running_requests}")

        self._phase(trial, "measuring")
        deployment = running.deployment
        reference = record.reference(trial.study)
        self._bench = bench = Bench(
            deployment.base_url, self.engine, spec.workload, self.plan.prompts, headers=headers,
            check=lambda: check_alive(deployment, self.engine), should_stop=self.should_stop,
            seed=trial.number, max_error_rate=spec.constraints.max_error_rate, levels=spec.levels,
            load=load_generator(self.target, deployment.base_url, spec.workload.client),
        )
        m = bench.run(
            on_level=lambda step, c, m: self._on_level(trial, step, c, m, reference),
            precision_of=lambda m: relative_precision(spec.objective, m, spec.workload.mix),
        )
        metrics = metrics_of(m, info)
        if record.is_baseline(trial):
            reference = record.set_reference(trial.study, reference_of(metrics), trial.number)
        elif reference is None and spec.objective in RELATIVE:
            reference = self._await_reference(trial)
        values = objective_values(spec.objective, metrics, reference, spec.workload.mix)
        constraints = constraint_values(spec.constraints, metrics)
        self._record_measurement(trial, m, metrics, constraints, values)
        bad = violated(constraints)
        if bad:
            record.failed(trial, "constraints", ", ".join(bad))
        return values if len(values) > 1 else values[0]

    def _capacity(self, trial: optuna.Trial, deployment: Deployment, candidate: Candidate,
                  info: ServerInfo) -> ServerInfo:
        """Record what the server runs and the capacity it reports (its log cross-checks the figures)."""
        applied = {**candidate.args, **{n: info.applied[n] for n in self.space.names if n in info.applied}}
        logged = self.engine.capacity_from_log(deployment.log_path.read_text(errors="replace")
                                               if deployment.log_path.exists() else "")
        record.verified(trial, self.space.key(applied), {
            "max_running_requests": info.max_running_requests,
            "max_total_num_tokens": info.max_total_num_tokens,
            "log": logged,
        })
        if logged.get("max_running_requests") not in (None, info.max_running_requests):
            log.warning("trial %d: the log says max_running_requests=%s, the server says %s", trial.number,
                        logged.get("max_running_requests"), info.max_running_requests)
        return info

    def _on_level(self, trial: optuna.Trial, step: int, concurrency: int, m: Measurement,
                  reference: dict[str, Any] | None) -> None:
        self._phase(trial, "measuring", f"concurrency {concurrency}")
        if not self.spec.pruning or record.is_baseline(trial) or record.is_confirmation(trial):
            return
        if reference is None and self.spec.objective in RELATIVE:
            return  # values are relative to the baseline, which another worker is still measuring
        if concurrency == max(self.spec.levels):
            return  # measured to the end: the trial completes with its value, whatever it is
        value = objective_bound(self.spec.objective, self.spec.levels, concurrency, m, reference,
                                self._max_running, self.spec.workload.mix)
        if value is None:
            return
        trial.report(value, step)
        if trial.should_prune():
            stage = "single" if concurrency == 1 else f"c{concurrency}"
            record.pruned(trial, stage, [m.summary(c) for c in m.concurrencies])
            trial.set_constraint("failed", 0.0)
            for key in constraint_values(self.spec.constraints, None):
                if key != "failed":
                    trial.set_constraint(key, 0.0)
            log.info("trial %d pruned after %s: %.4g", trial.number, stage, value)
            raise optuna.TrialPruned(f"pruned after {stage}")

    # -- outcomes ----------------------------------------------------------------------------------------------

    def _record_measurement(self, trial: optuna.Trial, m: Measurement, metrics: dict[str, Any],
                            constraints: dict[str, float], values: list[float]) -> None:
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        # the 95% interval of the objective (of the first objective for pareto studies)
        ci = None if m.precision is None else [values[0] * (1 - m.precision), values[0] * (1 + m.precision)]
        record.measured(trial, metrics, [m.summary(c) for c in m.concurrencies], ci)

    def _infeasible(self, trial: optuna.Trial, reason: str, detail: str, stage: str) -> float:
        for key, value in constraint_values(self.spec.constraints, None).items():
            trial.set_constraint(key, value)
        record.failed(trial, reason, detail, stage)
        log.info("trial %d failed: %s (%s)", trial.number, reason, detail[:200])
        raise optuna.TrialPruned(f"{reason}: {detail}")

    def _retry(self, trial: optuna.Trial, failure: TrialFailure) -> float:
        """An infrastructure failure: FAIL this trial and queue its config again (once, unless interrupted)."""
        retry = should_retry(trial, failure.reason)
        record.failed(trial, failure.reason, failure.detail, self.phase.name)
        if retry:
            record.requeue(trial.study, frozen(trial))
        log.info("trial %d failed: %s (%s)%s", trial.number, failure.reason, failure.detail[:200],
                 "; its config is queued again" if retry else "")
        return math.nan

    def _reuse(self, trial: optuna.Trial, prior: optuna.trial.FrozenTrial) -> float | list[float]:
        record.reused(trial, prior)
        for key, value in prior.constraints.items():
            trial.set_constraint(key, value)
        log.info("trial %d reuses trial %d (same effective config)", trial.number, prior.number)
        if prior.state == TrialState.COMPLETE:
            return prior.values if len(prior.values) > 1 else prior.values[0]
        for step, value in prior.intermediate_values.items():
            trial.report(value, step)
        raise optuna.TrialPruned(f"same config as trial {prior.number}")

    # -- helpers -----------------------------------------------------------------------------------------------

    def _measured(self, study: optuna.Study, key: str, number: int) -> optuna.trial.FrozenTrial | None:
        for t in study.get_trials(deepcopy=False, states=REUSABLE):
            if t.number != number and key in record.config_keys(t):
                return t
        return None

    def _await_reference(self, trial: optuna.Trial) -> dict[str, Any] | None:
        """The baseline's figures, once another worker has measured the baseline. None if it never will be (it
        failed): then every trial's value is the raw geometric mean, the same for all. Waits only while the baseline
        is running; a baseline waiting in the queue (its worker died) would wait for this worker, so this trial is
        queued again behind it instead."""
        while True:
            reference = record.reference(trial.study)
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
            fail_stale(trial.study)

    def _wait_for_twin(self, trial: optuna.Trial, key: str) -> None:
        """Another worker runs the same effective config under an earlier trial: wait for its result instead of
        measuring it twice at once (Optuna's constant liar makes this rarer, not impossible)."""
        while True:
            twins = [t.number for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                     if t.number < trial.number and record.config_keys(t)[0] == key]
            if not twins:
                return
            self._phase(trial, "waiting for a twin", f"trial {twins[0]}")
            log.info("trial %d waits for trial %d (same config, another worker)", trial.number, twins[0])
            self._pause(TWIN_POLL, f"waiting for trial {twins[0]}")
            fail_stale(trial.study)

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
