"""A trial's real measurement step: the candidate's server deployed on the target, ready and verified (bringup.py),
its capacity read, then measured (bench/), and its log, command and request records kept as the trial's
artifacts."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore

from autotune.record.artifacts import upload_trial
from autotune.bench.capacity import capacity_ladder, capacity_record
from autotune.bench.measure import Bench, Measurement
from autotune.run.bringup import bring_up
from autotune.engines import ServerInfo
from autotune.errors import TrialFailure
from autotune.run.health import check_alive
from autotune.run.plan import Plan
from autotune.record import write
from autotune.results.score import capacity_metrics, capacity_precision, metrics_of, relative_precision
from autotune.studyfile.space import Candidate
from autotune.targets import Deployment, Target
from autotune.bench.measuring import load_generator
from autotune.run.trial.launch import Launch, Measured, OnLevel, OnPhase

log = logging.getLogger("autotune")


class ServerLaunch(Launch):
    """Starts each trial's server on ``target`` and measures it with the study's workload."""

    def __init__(self, plan: Plan, target: Target, should_stop: Callable[[], bool],
                 artifacts: FileSystemArtifactStore | None = None) -> None:
        self.plan = plan
        self.target = target
        self.target_name = target.name
        self.should_stop = should_stop
        self.artifacts = artifacts
        self.deployment: Deployment | None = None
        self._bench: Bench | None = None
        self._headers: dict[str, str] = {}
        self._args: dict[str, Any] | None = None  # the args of this start, its files placed

    def _log_path(self, trial: optuna.Trial) -> Path:
        return self.plan.logs_dir / f"trial-{trial.number:04d}.log"

    def start(self, trial: optuna.Trial, candidate: Candidate, on_phase: OnPhase) -> ServerInfo:
        self.deployment, self._bench, self._args = None, None, None
        plan, engine = self.plan, self.plan.engine
        argv = engine.render(plan.spec.engine.command, self._placed(candidate))
        log_path = self._log_path(trial)
        write.launched(trial, argv, str(log_path))
        self._headers = engine.auth_headers(candidate.args)

        def deployed(deployment: Deployment) -> None:
            self.deployment = deployment
            log.info("trial %d deploy: %s", trial.number, " ".join(argv))

        with self._blamed():
            running = bring_up(lambda: self.target.deploy(argv, plan.spec.engine.env, log_path), engine,
                               plan.spec.health, self._headers, candidate.tuned(plan.space.names),
                               should_stop=self.should_stop, on_stage=on_phase, on_deployed=deployed)
        write.ready(trial, running.ready.seconds)
        log.info("trial %d ready in %.1f s", trial.number, running.ready.seconds)
        assert running.info is not None
        return self._capacity(trial, running.deployment, candidate, running.info)

    def measure(self, trial: optuna.Trial, info: ServerInfo, on_level: OnLevel) -> Measured:
        spec = self.plan.spec
        deployment = self.deployment
        assert deployment is not None
        ladder = capacity_ladder(spec)
        # every trial draws the same requests in the same order (common random numbers): on a dataset whose
        # requests decode at different speeds, two configs are compared on the same requests, not on two samples
        self._bench = bench = Bench(
            deployment.base_url, self.plan.engine, spec.workload, self.plan.prompts, headers=self._headers,
            check=lambda: check_alive(deployment, self.plan.engine), should_stop=self.should_stop,
            seed=spec.seed or 0, max_error_rate=spec.constraints.max_error_rate, levels=spec.levels,
            load=load_generator(self.target, deployment.base_url, spec.workload.client), ladder=ladder,
            most_accepted=self.plan.engine.most_accepted({**info.applied, **(self._args or {})}),
        )

        def precision(m: Measurement) -> float | None:
            if ladder is not None:
                return capacity_precision(m.summaries(), ladder.capacity)
            return relative_precision(spec.objective, m.summaries(), spec.workload.mix)
        with self._blamed():
            m = bench.run(on_level=lambda step, c, m: on_level(step, c, m.summaries()), precision_of=precision)
        levels = m.summaries()
        metrics = metrics_of(levels, len(m.repeats), info)
        if ladder is None:
            return Measured(metrics, levels, m.precision)
        return Measured(capacity_metrics(metrics, levels, ladder.capacity), levels, m.precision,
                        capacity_record(ladder, levels))

    def finish(self, trial: optuna.Trial, candidate: Candidate) -> None:
        """Keep the server log of this start, the command (or unit) it ran, the files it read and the raw request
        records."""
        if self.artifacts is None:
            return
        argv = self.plan.engine.render(self.plan.spec.engine.command, self._args or candidate.args)
        records = self._bench.measurement.records() if self._bench is not None else None
        upload_trial(self.artifacts, trial, self.plan.logs_dir, self._log_path(trial),
                     self.target.rendered(argv, self.plan.spec.engine.env), records,
                     [(f.name, f.text) for f in candidate.files])

    def _placed(self, candidate: Candidate) -> dict[str, Any]:
        """The candidate's args with each file it reads placed on the target, its flag naming it there (a local
        copy stays beside the study)."""
        self._args = args = dict(candidate.args)
        for f in candidate.files:
            args[f.flag] = self.target.place_file(f.name, f.text.encode(), self.plan.spec.directory / f.name)
        return args

    @contextlib.contextmanager
    def _blamed(self) -> Iterator[None]:
        """A failure that looks like the config's, in a trial whose SSH connection was reopened meanwhile, is the
        connection's (a server seen dead through a broken connection may be alive)."""
        try:
            yield
        except TrialFailure as failure:
            if failure.infeasible and self.deployment is not None and self.deployment.reconnected():
                raise TrialFailure("ssh_lost", f"the SSH connection was reopened during the trial ({failure})") \
                    from None
            raise

    def _capacity(self, trial: optuna.Trial, deployment: Deployment, candidate: Candidate,
                  info: ServerInfo) -> ServerInfo:
        """Record what the server runs and the capacity it reports (its log cross-checks the figures)."""
        names = self.plan.space.names
        applied = {**candidate.args, **{n: info.applied[n] for n in names if n in info.applied}}
        logged = self.plan.engine.capacity_from_log(deployment.log_path.read_text(errors="replace")
                                                    if deployment.log_path.exists() else "")
        write.verified(trial, self.plan.space.key(applied), {
            "max_running_requests": info.max_running_requests,
            "max_total_num_tokens": info.max_total_num_tokens,
            "log": logged,
        })
        if logged.get("max_running_requests") not in (None, info.max_running_requests):
            log.warning("trial %d: the log says max_running_requests=%s, the server says %s", trial.number,
                        logged.get("max_running_requests"), info.max_running_requests)
        return info
