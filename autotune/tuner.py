"""The study lifecycle: create or resume, sweep what a dead tuner left, run trials to the budget or deadline, stop
cleanly on a signal, and leave the target healthy.

The budget counts finished trials across restarts; a trial whose config was queued again (interrupted, stale,
infrastructure failure) does not count, its retry does.
"""
from __future__ import annotations

import datetime as dt
import logging
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import results
from autotune.artifacts import open_store
from autotune.bench.measure import Bench
from autotune.bench.workload import load_prompts
from autotune.budget import AdmissionLock, standing
from autotune.engines import Engine, get_engine
from autotune.errors import InvalidConfig, TrialFailure, UserError
from autotune.health import wait_ready
from autotune.logs import setup as setup_logging
from autotune.objective import Objective, Phase, auth_headers
from autotune.progress import Progress
from autotune.retry import fail_stale, queue_again, should_retry
from autotune.sampling import check_sampler, initial_design, make_pruner, make_sampler
from autotune.score import METRIC_NAMES, metrics_of
from autotune.space import Space, describe
from autotune.storage import load_existing_study, open_storage, redact
from autotune.study import StudySpec, TargetSpec
from autotune.targets import Target, make_target

log = logging.getLogger("autotune")

#: after an infrastructure failure, wait this long (doubling, capped) before the next trial
BACKOFF_START, BACKOFF_CAP = 5.0, 300.0
#: seconds between looks at a study whose last trials other workers are running
WAIT_FOR_OTHERS = 2.0


@dataclass
class RunOptions:
    trials: int | None = None        # total budget (default: the study file's)
    timeout: float | None = None     # seconds from now
    until: str | None = None         # HH:MM, local time, the next occurrence
    storage: str | None = None       # overrides the study file's storage
    target: str | None = None        # which [targets.NAME] to run on
    restore: bool = True             # leave the target running the best (or original) config


@dataclass
class RunSummary:
    finished: int
    budget: int
    stopped_by: str                  # budget | deadline | signal
    best: int | None


def deadline_of(timeout: float | None, until: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds since the epoch at which to stop starting trials (the earlier of --timeout and --until)."""
    now = now or dt.datetime.now()
    ends = []
    if timeout is not None:
        ends.append(now.timestamp() + timeout)
    if until is not None:
        try:
            hh, mm = (int(x) for x in until.split(":"))
            at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        except ValueError:
            raise UserError(f"--until: expected HH:MM (24-hour local time), got {until!r}") from None
        if at <= now:
            at += dt.timedelta(days=1)
        ends.append(at.timestamp())
    return min(ends) if ends else None


class Tuner:
    def __init__(self, spec: StudySpec, options: RunOptions) -> None:
        self.spec = spec
        self.options = options
        self.engine: Engine = get_engine(spec.engine.kind)
        # commands that only read the study need no target; any target's port will do for the space
        some_target = spec.targets.get(options.target or "", next(iter(spec.targets.values())))
        self.space = Space(spec, self.engine, some_target.server_port)
        self.budget = options.trials or spec.trials
        self.deadline = deadline_of(options.timeout, options.until)
        self.storage_url = options.storage or spec.storage
        self._stop_reason: str | None = None
        self._progress = Progress(enabled=False)

    # -- checks that need nothing deployed -------------------------------------------------------------------

    @property
    def target_spec(self) -> TargetSpec:
        """The target this tuner works on (--target, or the study's only one)."""
        return self.spec.target(self.options.target)

    def validate(self) -> dict[str, Any]:
        """Everything that can be checked offline; raises ``UserError``. Returns a short description."""
        spec = self.spec
        port = spec.engine.args.get(self.engine.port_flag)
        if port is not None and port != self.target_spec.server_port:
            raise UserError(f"{spec.path}: [engine.args] {self.engine.port_flag} = {port} but the target's "
                            f"server_port is {self.target_spec.server_port}; set one of them only")
        check_sampler(spec)
        valid, partial = self.space.check()
        try:
            baseline = self.space.baseline()
        except InvalidConfig as e:
            raise UserError(f"{spec.path}: [engine.args] the baseline (the fixed args) is invalid: {e}") from None
        self.prompts = load_prompts(spec.workload.prompts, spec.directory)
        return {"valid_configs": valid, "at_least": partial, "baseline": baseline.args, "prompts": len(self.prompts),
                "starting_points": self._starting_points()}

    def _starting_points(self) -> list[dict[str, Any]]:
        """The configs a new study queues after the baseline: no more than the budget holds beside it, so a config
        cut short and queued again behind them still fits in the budget."""
        return initial_design(self.spec, self.space)[:max(0, self.budget - 1)]

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self) -> RunSummary:
        self.validate()
        target = make_target(self.target_spec, cwd=self.spec.directory)
        target.preflight(self.spec.engine.command)
        setup_logging(self.spec.directory / f"{self.spec.name}.log")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self._progress = Progress(self.budget, self.deadline, self.spec.workload.concurrency)
        try:
            with target.lock(self.spec.name):
                study = self._open_study()
                self._progress.update(study)
                try:
                    return self._run(study, target)
                finally:
                    if not target.keeps_server:
                        target.stop()  # however the run ended, a local server never outlives its tuner
        finally:
            self._progress.close()
            target.close()

    def _open_study(self) -> optuna.Study:
        spec = self.spec
        storage = self.storage = open_storage(self.storage_url, heartbeat=spec.heartbeat)
        existing = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        created = spec.name not in existing
        study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                    load_if_exists=True, pruner=make_pruner(spec))
        want = [optuna.study.StudyDirection.MAXIMIZE] * len(spec.directions)
        if list(study.directions) != want:
            raise UserError(f"study {spec.name!r} in {redact(self.storage_url)} was created with "
                            f"{len(study.directions)} objective(s); objective = {spec.objective!r} needs "
                            f"{len(want)}: give the study a new name")
        trials = study.get_trials(deepcopy=False)
        study.sampler = make_sampler(spec, self.space, len(trials))
        if created:
            study.set_user_attr("objective", spec.objective)
            study.set_user_attr("study_file", spec.text)
            study.set_user_attr("study_path", str(spec.path))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(METRIC_NAMES[spec.objective])
        log.info("study %s: %s %s, storage %s, target %s (%s)", spec.name, "created" if created else "resumed",
                 f"{len(results.counted(trials))}/{self.budget} trials done", redact(self.storage_url),
                 self.target_spec.name, self.target_spec.kind)
        with AdmissionLock(storage, self.storage_url, spec.name):  # other workers may be starting too
            if not any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
                study.enqueue_trial(self.space.internal(self.space.baseline_params()), user_attrs={"baseline": True})
                for params in self._starting_points():
                    study.enqueue_trial(self.space.internal(params), user_attrs={"starting_point": True})
            self._sweep(study)
        return study

    def _sweep(self, study: optuna.Study) -> None:
        """Trials left RUNNING on this target by a tuner that died: fail them and queue each config once more.

        This target's lock is ours, so its RUNNING trials are stale. The sweep runs under the study's admission
        lock, which a worker holds from creating a trial until the trial names its target: a RUNNING trial that
        names none was left by a worker that died in between. Other targets' trials are their workers' business
        (or the heartbeat's)."""
        trials = study.get_trials(deepcopy=False)
        again = results.retried(trials)
        for t in trials:
            if (t.state != TrialState.RUNNING
                    or t.user_attrs.get("target", self.target_spec.name) != self.target_spec.name):
                continue
            if t.number not in again and should_retry(t.user_attrs, t.user_attrs.get("reason")):
                queue_again(study, t)
                log.info("trial %d was left running by a stopped tuner: failed, its config is queued again", t.number)
            else:
                log.info("trial %d was left running by a stopped tuner: failed", t.number)
            study.tell(t.number, state=TrialState.FAIL)

    def _run(self, study: optuna.Study, target: Target) -> RunSummary:
        objective = Objective(self.spec, self.engine, target, self.space, self.prompts, self._logs_dir,
                              should_stop=self._should_stop, on_phase=self._progress.on_phase,
                              artifacts=open_store(self.spec.directory, self.spec.name))
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        admission = AdmissionLock(self.storage, self.storage_url, self.spec.name)
        objective.on_start = admission.release
        stopped_by = "budget"
        backoff = 0.0
        try:
            while True:
                if self._stop_reason:
                    stopped_by = "signal"
                    break
                if self.deadline is not None and time.time() >= self.deadline:
                    stopped_by = "deadline"
                    break
                with admission:
                    done, running = standing(study)
                    if done >= self.budget:
                        break
                    if done + running >= self.budget:
                        if self.storage.get_heartbeat_interval() is None:
                            break  # without heartbeats a dead worker's trial cannot be told from a live one
                        # other workers run the last trials; stay in case one of them dies and its config returns
                        admission.release()
                        self._sleep(WAIT_FOR_OTHERS)
                        fail_stale(study)
                        continue
                    objective.phase = Phase()
                    study.optimize(objective, n_trials=1, gc_after_trial=False)
                if objective.phase.trial is None:
                    continue
                trial = study.get_trials(deepcopy=False)[objective.phase.trial]
                self._report(study, trial)
                if trial.state == TrialState.FAIL and not self._stop_reason:
                    backoff = min(BACKOFF_CAP, backoff * 2 or BACKOFF_START)
                    self._sleep(backoff)
                else:
                    backoff = 0.0
        except KeyboardInterrupt:
            self._requeue_forced(study, objective.phase.trial)
            log.info("forced stop: the server is left as it is")
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self._stop_reason:
            stopped_by = "signal"
        best = self._finish(study, target)
        done = len(results.counted(study.get_trials(deepcopy=False)))
        log.info("study %s stopped (%s): %d/%d trials, best %s", self.spec.name, stopped_by, done, self.budget,
                 f"trial {best.number}" if best else "none")
        return RunSummary(finished=done, budget=self.budget, stopped_by=stopped_by,
                          best=best.number if best else None)

    def _requeue_forced(self, study: optuna.Study, number: int | None) -> None:
        """A second signal cut a trial short: Optuna failed it; queue its config again like an interrupted one."""
        if number is None:
            return
        trials = study.get_trials(deepcopy=False)
        t = trials[number]
        if t.state == TrialState.FAIL and number not in results.retried(trials) and "reason" not in t.user_attrs:
            queue_again(study, t)

    def _report(self, study: optuna.Study, t: FrozenTrial) -> None:
        """The one line per trial a user reads: number, params, result or failure reason, best so far."""
        best = results.best(study)
        best_text = f"best {results.score(best, study):.4g} (trial {best.number})" if best else "best: none yet"
        params = describe(results.params(t))
        m = t.user_attrs.get("metrics") or {}
        if t.state == TrialState.COMPLETE and results.feasible(t):
            value = " / ".join(f"{v:.4g}" for v in t.values)
            outcome = (f"{value} (single {m.get('single_tok_s', 0):.1f} tok/s, concurrent "
                       f"{m.get('concurrent_tok_s', 0):.1f} tok/s, "
                       f"max_running_requests {m.get('max_running_requests')})")
            if "reused_from" in t.user_attrs:
                outcome += f", reused from trial {t.user_attrs['reused_from']}"
        else:
            reason = results.reason(t) or t.state.name.lower()
            detail = t.user_attrs.get("detail")
            outcome = f"{reason}" + (f" ({detail[:120]})" if detail else "")
        role = results.role(t)
        tag = f" [{role}]" if role else ""
        log.info("trial %d%s %s: %s -> %s | %s", t.number, tag, t.state.name, params, outcome, best_text)
        self._progress.update(study)

    # -- end of study ------------------------------------------------------------------------------------------

    def _finish(self, study: optuna.Study, target: Target) -> FrozenTrial | None:
        """Leave the target running the best feasible config, else the original; a local target is stopped."""
        trials = study.get_trials(deepcopy=False)
        best = results.best(study)
        if not target.keeps_server:
            target.stop()
            log.info("stopped the local server")
            return best
        if not self.options.restore:
            log.info("--no-restore: the server is left as the last trial left it")
            return best
        base = results.baseline(trials)
        beats = best is not None and (
            base is None or not results.feasible(base)
            or (best.number != base.number and results.score(best, study) > results.score(base, study)))
        if beats and best is not None:
            try:
                self._deploy_and_check(target, best, self._logs_dir / "final.log")
                log.info("left running the best config: trial %d (%s)", best.number, describe(results.params(best)))
                return best
            except TrialFailure as e:
                log.info("the best config (trial %d) did not come up again: %s; restoring the original", best.number, e)
        self._restore_original(target)
        return best

    def _restore_original(self, target: Target) -> None:
        argv = self.engine.render(self.spec.engine.command, self.space.baseline().args)
        try:
            deployment = target.restore(argv, self.spec.engine.env, self._logs_dir / "restore.log")
            if deployment is not None:
                ready = wait_ready(deployment, self.engine, self.spec.health.interval, self.spec.health.timeout,
                                   auth_headers(self.space.fixed))
                log.info("restored the original config: healthy after %.1f s", ready.seconds)
        except TrialFailure as e:
            log.error("could not restore the original config: %s", e)

    @property
    def _logs_dir(self) -> Path:
        return self.spec.directory / f"{self.spec.name}-logs"

    def _deploy_and_check(self, target: Target, trial: FrozenTrial, log_path: Path) -> None:
        """Deploy a measured trial's command again and check it is healthy and runs its tuned args."""
        config = trial.user_attrs["config"]
        expect = {n: config[n] for n in self.space.names if n in config}
        deployment = target.deploy(trial.user_attrs["command"], self.spec.engine.env, log_path)
        headers = auth_headers(self.space.fixed)
        wait_ready(deployment, self.engine, self.spec.health.interval, self.spec.health.timeout, headers)
        with httpx.Client(base_url=deployment.base_url, headers=headers, timeout=10.0) as client:
            info = self.engine.server_info(client)
        wrong = self.engine.mismatches(expect, info)
        if wrong:
            raise TrialFailure("wrong_args", "; ".join(wrong))

    def open_existing(self) -> optuna.Study:
        """The study as stored, for commands that only read it."""
        return load_existing_study(self.spec.name, self.storage_url)

    # -- one-off commands on the target ------------------------------------------------------------------------

    def apply(self, number: int | None = None) -> FrozenTrial:
        """Deploy the best (or the chosen) measured trial's config and wait until it is healthy."""
        study = self.open_existing()
        if number is None:
            trial = results.best(study)
            if trial is None:
                raise UserError(f"study {self.spec.name!r} has no feasible measured trial to apply")
        else:
            trials = study.get_trials(deepcopy=False)
            if not 0 <= number < len(trials):
                raise UserError(f"study {self.spec.name!r} has no trial {number} (trials 0-{len(trials) - 1})")
            trial = trials[number]
            if "command" not in trial.user_attrs or trial.user_attrs.get("config") is None:
                raise UserError(f"trial {number} never deployed a server ({results.reason(trial) or trial.state.name})")
        self._with_target(lambda target: self._deploy_and_check(target, trial, self._logs_dir / "apply.log"))
        return trial

    def restore(self) -> None:
        """Put the target back as it was before tuning (the backed-up unit, or the study's fixed args)."""
        self._with_target(self._restore_original)

    def bench(self) -> dict[str, Any]:
        """Measure the server deployed on the target now, with the study's workload; deploys nothing."""
        self.validate()
        target = make_target(self.target_spec, cwd=self.spec.directory)
        try:
            base_url = target.base_url()
            headers = auth_headers(self.space.fixed)
            try:
                with httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as client:
                    info = self.engine.server_info(client)
            except (httpx.HTTPError, ValueError) as e:
                raise UserError(f"no {self.engine.kind} server answers at {base_url}: {e}") from None
            bench = Bench(base_url, self.engine, self.spec.workload, self.prompts, headers=headers)
            try:
                m = bench.run()
            except TrialFailure as e:
                raise UserError(f"measurement failed: {e}") from None
            return {"url": base_url, "server": {n: info.applied.get(n) for n in self.space.names},
                    "metrics": metrics_of(m, info), "levels": [m.summary(c) for c in m.concurrencies]}
        finally:
            target.close()

    def _with_target(self, action: Callable[[Target], object]) -> None:
        self.validate()
        setup_logging(self.spec.directory / f"{self.spec.name}.log")
        target = make_target(self.target_spec, cwd=self.spec.directory)
        try:
            with target.lock(self.spec.name):
                action(target)
        finally:
            target.close()

    # -- signals and progress --------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_reason:
            raise KeyboardInterrupt
        self._stop_reason = signal.Signals(signum).name
        log.info("%s received: stopping at the next safe point (again to force)", self._stop_reason)

    def _should_stop(self) -> bool:
        return self._stop_reason is not None

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self._stop_reason:
            time.sleep(0.2)
