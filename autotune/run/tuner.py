"""The study lifecycle: create or resume, sweep what a dead tuner left, run trials to the budget or deadline, stop
cleanly on a signal, and leave the target healthy.

The budget counts launches (servers started) across restarts: a trial that reuses a measurement of the same config,
or whose config the engine rejects, costs none; a trial whose config was queued again (interrupted, stale,
infrastructure failure) does not count, its retry does. Between the sampler's proposals the tuner queues its own
(queue.py; search/: neighbours of the leader, confirmations of the leader and its close rivals).
"""
from __future__ import annotations

import datetime as dt
import logging
import signal
import time
import warnings
from dataclasses import dataclass
from types import FrameType

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import client_limit, tally
from autotune.run import queue, study_terms
from autotune import record
from autotune.studyfile import paths
from autotune.record.artifacts import open_store
from autotune.run.budget import AdmissionLock
from autotune.run.bringup import deploy_trial, restore_original
from autotune.errors import InvalidConfig, TrialFailure, UserError
from autotune.run.hostresolve import HostResolver
from autotune.logs import setup as setup_logging
from autotune.run.plan import Plan
from autotune.run.progress import Progress
from autotune.run.pruning import make_pruner
from autotune.record import TrialRecord
from autotune.results.score import METRIC_NAMES
from autotune.search import Proposal, make_sampler
from autotune.record.storage import Reserve, failed_write, open_storage, redact, refuse_foreign, write_failure
from autotune.targets import Target, make_target
from autotune.run.trial import Objective, ServerLaunch, trial_step
from autotune.run.warmstart import warm_configs

log = logging.getLogger("autotune")

#: after an infrastructure failure, wait this long (doubling, capped) before the next trial
BACKOFF_START, BACKOFF_CAP = 5.0, 300.0
#: seconds between looks at a study whose last trials other workers are running
WAIT_FOR_OTHERS = 2.0


@dataclass
class RunOptions:
    launches: int | None = None      # total budget (default: the study file's)
    timeout: float | None = None     # seconds from now
    until: str | None = None         # HH:MM, local time, the next occurrence
    storage: str | None = None       # overrides the study file's storage
    target: str | None = None        # which [targets.NAME] to run on
    restore: bool = True             # leave the target running the best (or original) config
    warm_start: str | None = None    # a study whose best configs a new study measures first
    processes: int | None = None     # the load generator's processes (overrides [workload] processes)
    forget_host_answers: bool = False  # the answers the hosts gave before are forgotten: each config asked again

    def flags(self) -> list[str]:
        """The `autotune run` flags that ask for these options again (for another worker of the study)."""
        out: list[str] = []
        for flag, value in (("--launches", self.launches), ("--timeout", self.timeout), ("--until", self.until),
                            ("--storage", self.storage), ("--processes", self.processes)):
            if value is not None:
                out += [flag, str(value)]
        if self.forget_host_answers:
            out.append("--forget-host-answers")
        return out if self.restore else [*out, "--no-restore"]


@dataclass
class RunSummary:
    launches: int
    trials: int
    budget: int
    stopped_by: str                  # budget | deadline | signal | exhausted | client_bound
    best: int | None
    signal: str | None = None        # the stop signal received, whenever it came (SIGTERM, SIGINT)

    @property
    def exit_status(self) -> int:
        """128 + the signal's number after a stop by a signal (the target left as at any end), 1 when the measuring
        client could not keep up, else 0."""
        if self.signal is not None:
            return 128 + signal.Signals[self.signal].value
        return 1 if self.stopped_by == "client_bound" else 0


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
    """Runs one study on one target until its budget or deadline."""

    def __init__(self, plan: Plan, options: RunOptions) -> None:
        self.plan = plan
        self.spec = plan.spec
        self.options = options
        self.budget = plan.budget
        self.deadline = deadline_of(options.timeout, options.until)
        self.storage_url = options.storage or plan.spec.storage
        self._stop_reason: str | None = None
        self._progress = Progress(enabled=False)
        self._warm: list[Proposal] = []
        self._traffic = study_terms.traffic(plan.spec, plan.prompts)
        self._space = study_terms.space(plan.spec.space)

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self) -> RunSummary:
        paths.check(self.spec)
        target = make_target(self.plan.target, cwd=self.spec.directory)
        target.preflight(self.spec.engine.command)
        if self.options.warm_start:  # read before anything is written: an unknown study stops the run here
            self._warm = warm_configs(self.options.warm_start, self.plan, min(self.plan.startup, self.budget - 1))
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        # from here on a first signal asks for a stop at the next safe point, whatever the phase (the question to
        # the host at start-up too, even with SIGINT ignored by whoever started the tuner); a second one forces it.
        # The handlers stay until the target is left as promised: a first signal never cuts the end short
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            with target.lock(self.spec.name):
                # the storage before the log file: a URL that cannot be opened stops the run having written nothing
                self.storage = open_storage(self.storage_url, heartbeat=self.spec.heartbeat,
                                            on_stale=queue.stale_trial_callback)
                refuse_foreign(self.storage, self.spec.name, self.storage_url)
                self._refuse_another_study()
                setup_logging(self.spec.directory / f"{self.spec.name}.log")
                try:
                    self._host = self._ask_host(target)
                except TrialFailure as e:
                    if e.reason != "interrupted":
                        raise
                    log.info("%s during the question to the host: stopped before any trial, the target left as it "
                             "was", self._stop_reason)
                    return RunSummary(launches=0, trials=0, budget=self.budget, stopped_by="signal", best=None,
                                      signal=self._stop_reason)
                self._progress = Progress(self.budget, self.deadline, self.spec.levels)
                study = self._open_study()
                self._progress.update(study)
                try:
                    with Reserve(self.storage_url) as self._reserve:
                        return self._run(study, target)
                finally:
                    if not target.keeps_server:
                        target.stop()  # however the run ended, a local server never outlives its tuner
        except Exception as e:  # a read-only database, a full disk: what was measured is on stdout (objective)
            failed = failed_write(e)
            if failed is None:
                raise
            raise write_failure(failed, self.storage_url) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._progress.close()
            target.close()

    def _refuse_another_study(self) -> None:
        """A study resumed under another objective would compare values of two kinds (relative figures against
        tokens per second), under other traffic measurements of two worlds, and over a space Optuna cannot follow it
        would stop at its first trial with Optuna's error: refused before anything is written (study_terms.py)."""
        try:
            study = optuna.load_study(study_name=self.spec.name, storage=self.storage)
        except KeyError:
            return
        stored = record.study.objective(study)
        if stored is not None and stored != self.spec.objective:
            raise UserError(f"study {self.spec.name!r} in {redact(self.storage_url)} was created with objective = "
                            f"{stored!r}, the study file now says {self.spec.objective!r}: put {stored!r} back, or "
                            "give the study a new name")
        study_terms.refuse_other_traffic(self.spec.name, self.storage_url, record.study.traffic(study),
                                         self._traffic)
        study_terms.space_change(self.spec.name, self.storage_url, record.study.space(study)[0], self._space)

    def _ask_host(self, target: Target) -> HostResolver:
        """The engine on the target, asked about the baseline before anything runs: whether it can answer, and
        the GPU there, which the engine's rules take from here on (hostresolve.py)."""
        # asked in the environment the server starts with (Target.start_command: the study's [engine.env] over the
        # target's): SGLang's resolution reads it (SGLANG_USE_CPU_ENGINE turns a CPU host's backend around)
        env = {**self.plan.target.env, **self.spec.engine.env}
        host = HostResolver(self.plan.engine, target, self.spec.engine.command, env, self.plan.space.params,
                            should_stop=self._should_stop)
        space = self.plan.space
        try:
            baseline = space.baseline()
            args, key = baseline.args, baseline.key
        except InvalidConfig:
            args, key = dict(space.fixed), space.key(dict(space.fixed))
        space.platform = host.probe(args, key)
        return host

    def _open_study(self) -> optuna.Study:
        spec = self.spec
        storage = self.storage
        # other workers may be starting too: one of them creates the study and records it as autotune's, the
        # others find it recorded (a study without the record is one whose creation was cut short: storage.py)
        with AdmissionLock(storage, self.storage_url, spec.name):
            study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                        load_if_exists=True, pruner=make_pruner(spec))
            want = [optuna.study.StudyDirection.MAXIMIZE] * len(spec.directions)
            if list(study.directions) != want:
                raise UserError(f"study {spec.name!r} in {redact(self.storage_url)} was created with "
                                f"{len(study.directions)} objective(s); objective = {spec.objective!r} needs "
                                f"{len(want)}: give the study a new name")
            created = not record.study.is_autotunes(study)
            if created:
                record.study.describe(study, spec.objective, spec.text, str(spec.path))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.set_metric_names(METRIC_NAMES[spec.objective])
            trials = study.get_trials(deepcopy=False)
            self._record_terms(study, len(trials))
            study.sampler = make_sampler(spec, self.plan.space, len(trials))
            log.info("study %s: %s %s, storage %s, target %s (%s)", spec.name, "created" if created else "resumed",
                     f"{len(tally.launches(trials))}/{self.budget} launches done", redact(self.storage_url),
                     self.plan.target.name, self.plan.target.kind)
            if self.options.forget_host_answers:
                forgotten = record.study.forget_host_answers(study)
                log.info("--forget-host-answers: %d kept answer%s of the host forgotten; each config is asked again",
                         forgotten, "" if forgotten == 1 else "s")
            if not queue.has_baseline(study):
                self._queue_start(study)
            elif self.options.warm_start:
                log.info("--warm-start %s ignored: study %s has begun already (a warm start seeds a new study)",
                         self.options.warm_start, spec.name)
            queue.sweep(study, self.plan.target.name)
        return study

    def _record_terms(self, study: optuna.Study, trials: int) -> None:
        """The traffic and space a new study measures, and a space changed since (searched from trial ``trials``
        on); a study an older autotune created takes the study file's as its own."""
        if record.study.traffic(study) is None:
            record.study.set_traffic(study, self._traffic)
        stored = record.study.space(study)[0]
        if stored is None:
            record.study.set_space(study, self._space, 0)
            return
        change = study_terms.space_change(self.spec.name, self.storage_url, stored, self._space)
        if change:
            record.study.set_space(study, self._space, trials)
            log.info("study %s: the space changed (%s): searched as it is now from trial %d on", self.spec.name,
                     change, trials)

    def _queue_start(self, study: optuna.Study) -> None:
        """A new study's first configs: the baseline, then an earlier study's best (--warm-start) or the engine's
        starting points, queued one at a time (queue.start)."""
        if not self.options.warm_start:
            queue.start(study, self.plan)
            return
        warm = self._warm
        log.info("warm start from %s: %d configs measured first (%s)", self.options.warm_start, len(warm),
                 "; ".join(w.origin or "" for w in warm) or "none of its configs fits this study's space")
        queue.start(study, self.plan, warm)

    def _run(self, study: optuna.Study, target: Target) -> RunSummary:
        launch = ServerLaunch(self.plan, target, self._should_stop, open_store(self.spec.directory, self.spec.name))
        host = self._host
        objective = Objective(self.plan, launch, should_stop=self._should_stop, on_phase=self._progress.on_phase,
                              host=lambda candidate: host.effective(candidate.args, candidate.key, study))
        admission = AdmissionLock(self.storage, self.storage_url, self.spec.name)
        objective.on_start = admission.release
        objective.free_space = self._reserve.release
        try:
            try:
                stopped_by = self._trials(study, objective, admission)
            except KeyboardInterrupt:
                if objective.phase.trial is not None:
                    queue.requeue_forced(study, objective.phase.trial)
                raise
            best = self._finish(study, target)
        except KeyboardInterrupt:
            log.info("forced stop: the server is left as it is")
            raise
        trials = study.get_trials(deepcopy=False)
        launches, finished = len(tally.launches(trials)), len(tally.finished(trials))
        log.info("study %s stopped (%s): %d/%d launches in %d trials, best %s", self.spec.name, stopped_by, launches,
                 self.budget, finished, f"trial {best.number}" if best else "none")
        return RunSummary(launches=launches, trials=finished, budget=self.budget, stopped_by=stopped_by,
                          best=best.number if best else None, signal=self._stop_reason)

    def _trials(self, study: optuna.Study, objective: Objective, admission: AdmissionLock) -> str:
        """Run trials one after another (trial/step.py) until the budget, the deadline or a signal; returns which
        ended it."""
        backoff = 0.0
        heartbeats = self.storage.get_heartbeat_interval() is not None
        while True:
            if self._stop_reason:
                return "signal"
            if self.deadline is not None and time.time() >= self.deadline:
                return "deadline"
            with admission:
                step = trial_step(study, self.plan, self.budget, objective, heartbeats)
            if step.verdict == "wait":
                self._sleep(WAIT_FOR_OTHERS)
                queue.fail_stale(study)
                continue
            if step.verdict != "run":
                return "signal" if self._stop_reason else step.verdict
            if step.trial is None:
                continue
            trial = step.trial
            self._report(study, trial)
            if objective.unstored is not None:
                raise objective.unstored  # recorded as failed in the room kept for it: the database takes no more
            failed = trial.state == TrialState.FAIL and not self._stop_reason
            if failed and TrialRecord.of(trial).reason == "baseline_pending":
                self._sleep(WAIT_FOR_OTHERS)  # the study's order, not a failing host: no backoff
                continue
            if step.client_bound is not None:
                log.error("%s", step.client_bound)
                return "client_bound"
            if failed and client_limit.blames_machine(trial):
                continue  # the measuring machine's condition: waiting does not cure it
            backoff = min(BACKOFF_CAP, backoff * 2 or BACKOFF_START) if failed else 0.0
            self._sleep(backoff)

    def _report(self, study: optuna.Study, t: FrozenTrial) -> None:
        """The one line per trial a user reads: number, launch count, params, result or failure reason, best so far
        (the leader's pooled estimate, with its interval once it has one)."""
        chosen = tally.pick(study)
        leader = None if chosen is None else chosen.estimate
        best_text = "best: none yet" if leader is None else (
            f"best {leader.value:.4g} (trial {leader.trials[0]})" if leader.launches == 1 else
            f"best {leader.value:.4g} [{leader.low:.4g}, {leader.high:.4g}] (trial {leader.trials[0]}, "
            f"{leader.launches} launches)")
        if chosen is not None and chosen.tied:
            best_text += f"; {chosen.tie_text()}"
        rec = TrialRecord.of(t)
        trials = study.get_trials(deepcopy=False)
        if t.number in tally.retried(trials):
            counter = "retried, no launch counted"
        elif rec.launched:
            counter = f"launch {sum(x.number <= t.number for x in tally.launches(trials))}/{self.budget}"
        else:
            counter = "no launch"
        if rec.feasible:
            outcome = f"{rec.values_text()} ({rec.figures_text()})"
            if rec.reused_from is not None:
                outcome += f", reused from trial {rec.reused_from}"
        else:
            outcome = (rec.reason or t.state.name.lower()) + (f" ({rec.detail[:120]})" if rec.detail else "")
        tag = f" [{rec.role}{', from ' + rec.origin if rec.origin else ''}]" if rec.role else ""
        log.info("trial %d%s %s: %s -> %s | %s | %s", t.number, tag, t.state.name,
                 _schedule_text(rec) if rec.adaptive else self.plan.engine.describe(rec.params), outcome, best_text,
                 counter)
        self._progress.update(study)

    # -- end of study ------------------------------------------------------------------------------------------

    def _finish(self, study: optuna.Study, target: Target) -> FrozenTrial | None:
        """Leave the target running the best feasible config, else the original; a local target is stopped.

        A final start of the best config that fails for the infrastructure (a lost connection, a busy port, a stale
        server) is tried once more; if the best does not come up then (or failed for its config), the next-best
        config that beats the baseline is deployed; the original is restored only when neither comes up. The log
        says which config was left running."""
        best = tally.best(study)
        if not target.keeps_server:
            target.stop()
            log.info("stopped the local server")
            return best
        if not self.options.restore:
            log.info("--no-restore: the server is left as the last trial left it")
            return best
        ahead = tally.above_baseline(study)
        log.info("final deploy: %s", f"the best config, trial {ahead[0].number}" if ahead else
                 "the original config (no config beats the baseline)")
        if ahead and self._deploy_final(target, ahead[0], "best", attempts=2):
            return best
        if len(ahead) > 1 and self._deploy_final(target, ahead[1], "next-best", attempts=1):
            return best
        if ahead:
            log.info("%s: restoring the original", "no other config beats the baseline" if len(ahead) == 1 else
                     "neither the best nor the next-best config came up")
        try:
            restore_original(self.plan, target)
        except TrialFailure as e:
            log.error("could not restore the original config: %s", e)
        return best

    def _deploy_final(self, target: Target, trial: FrozenTrial, which: str, attempts: int) -> bool:
        """Deploy ``trial``'s config to stay (``which``: the best, the next-best), started again after a failure of
        the infrastructure, up to ``attempts`` starts in all (a failure of the config is not worth another start);
        whether it came up healthy."""
        rec = TrialRecord.of(trial)
        described = f"trial {trial.number} ({self.plan.engine.describe(rec.params)})"
        for attempt in range(1, attempts + 1):
            try:
                deploy_trial(self.plan, target, rec, self.plan.logs_dir / "final.log")
            except TrialFailure as e:
                if e.infeasible or attempt == attempts:
                    log.info("the %s config, %s, did not come up%s: %s", which, described,
                             " again" if attempt > 1 else "", e)
                    return False
                log.info("the %s config, %s, did not come up: %s; starting it once more", which, described, e)
                continue
            log.info("left running the %s config: %s%s", which, described,
                     " (at its second start)" if attempt > 1 else "")
            return True
        return False

    # -- signals -----------------------------------------------------------------------------------------------

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


def _schedule_text(rec: TrialRecord) -> str:
    """An adaptive server in short: its steps by batch size."""
    document = (rec.schedule or {}).get("document") or {}
    return "steps by batch " + " ".join(f"{k}:{v.get('candidate_steps')}" for k, v in document.items())
