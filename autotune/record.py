"""The trial record: what autotune keeps about each trial (and about the study) in Optuna's user attrs.

This is the only module that reads or writes user attrs. The objective writes a trial's record as the trial goes
(``started``, ``candidate``, ``launched``, ``ready``, ``verified``, ``measured``, ``failed``, ``pruned``,
``reused``); everything else reads it back through ``TrialRecord.of(frozen_trial)``, a typed view, and formats it
with ``values_text`` and ``TrialRecord.figures_text``.

Keys (user attrs of a trial):
    baseline, starting_point,  why the config was queued (ROLES); a retry keeps them
    warm_start, neighbour,
    confirmation
    origin                     a warm start's source ("study OLD, trial N")
    retry_of                   the trial this one repeats (cut short for the infrastructure's sake)
    target, worker             where and by whom it ran
    params                     the tuned flags as the server ran them (a dependent flag's value, not its fill)
    config, config_key         every server flag after the engine's rules, and its canonical key
    applied_key                the key of what /server_info reported
    command, log               the server's argv (secrets masked) and the local log file of that start
    ready_s, timings           seconds until ready; seconds per phase
    capacity                   max_running_requests and KV tokens the server reported (and its log stated)
    metrics, levels, value_ci  the measurement's flat figures, per-level summaries, the objective's 95% interval
    reason, detail, stage      why it did not give a feasible measurement, and at which stage
    reused_from                the trial whose measurement of the same effective config it copies
Study user attrs: objective, study_file, study_path, reference (the baseline's figures), opening (the configs a
new study measures after its baseline, queued one at a time).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.redact import mask, mask_argv, mask_mapping
from autotune.engines import ArgValue

#: user attrs that say why a config was queued rather than suggested (a retry keeps them): the baseline, the
#: engine's starting points, neighbours of the leader, confirmations of the leader and its close rivals
ROLES = ("baseline", "starting_point", "warm_start", "neighbour", "confirmation")
#: what a trial that reuses another's measurement copies from it
_CARRIED = ("metrics", "levels", "capacity", "value_ci", "reason", "detail", "stage", "applied_key", "ready_s",
            "command")
#: the longest failure detail kept
DETAIL_LIMIT = 500

AnyTrial = optuna.Trial | FrozenTrial


# -- reading ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialRecord:
    """A finished (or running) trial as autotune recorded it."""

    number: int
    state: TrialState
    values: list[float] | None
    #: the tuned flags as the server ran them (else what the sampler suggested)
    params: dict[str, ArgValue]
    constraints: dict[str, float]
    roles: tuple[str, ...] = ()
    retry_of: int | None = None
    origin: str | None = None                 # a warm start's source: "study OLD, trial N"
    target: str | None = None
    worker: str | None = None
    config: dict[str, ArgValue] | None = None
    config_key: str | None = None
    applied_key: str | None = None
    command: list[str] | None = None
    log: str | None = None
    ready_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    value_ci: list[float] | None = None
    detail: str | None = None
    stage: str | None = None
    reused_from: int | None = None
    duration_s: float | None = None
    started: str | None = None
    completed: str | None = None
    _reason: str | None = None

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialRecord:
        a = t.user_attrs
        return cls(
            number=t.number, state=t.state, values=list(t.values) if t.values is not None else None,
            params=dict(a.get("params") or t.params), constraints=dict(t.constraints),
            roles=tuple(r for r in ROLES if a.get(r)), retry_of=_int(a.get("retry_of")), target=a.get("target"),
            origin=a.get("origin"),
            worker=a.get("worker"), config=a.get("config"), config_key=a.get("config_key"),
            applied_key=a.get("applied_key"), command=a.get("command"), log=a.get("log"), ready_s=a.get("ready_s"),
            timings=dict(a.get("timings") or {}), capacity=a.get("capacity"), metrics=dict(a.get("metrics") or {}),
            levels=list(a.get("levels") or []), value_ci=a.get("value_ci"), detail=a.get("detail"),
            stage=a.get("stage"), reused_from=_int(a.get("reused_from")),
            duration_s=t.duration.total_seconds() if t.duration else None,
            started=t.datetime_start.isoformat() if t.datetime_start else None,
            completed=t.datetime_complete.isoformat() if t.datetime_complete else None,
            _reason=a.get("reason"),
        )

    @property
    def baseline(self) -> bool:
        return "baseline" in self.roles

    @property
    def starting_point(self) -> bool:
        return "starting_point" in self.roles

    @property
    def role(self) -> str | None:
        """Why the config was queued, in words ("baseline", "starting point"); None for the sampler's own."""
        return self.roles[0].replace("_", " ") if self.roles else None

    @property
    def feasible(self) -> bool:
        return self.state == TrialState.COMPLETE and all(v <= 0 for v in self.constraints.values())

    @property
    def reason(self) -> str | None:
        """Why the trial did not produce a feasible measurement (None for a feasible or running trial)."""
        if self._reason is not None:
            return str(self._reason)
        if self.state == TrialState.FAIL:
            return "stale"  # its tuner died in the middle of it
        if self.state == TrialState.RUNNING or self.feasible:
            return None
        return "constraints"

    @property
    def confirmation(self) -> bool:
        return "confirmation" in self.roles

    @property
    def launched(self) -> bool:
        """Whether the trial started a server (a reused or rejected config did not)."""
        return self.command is not None and self.reused_from is None

    def level(self, concurrency: int | None) -> dict[str, Any]:
        """The per-level summary at ``concurrency`` ({} if that level was not measured)."""
        return next((lv for lv in self.levels if lv.get("concurrency") == concurrency), {})

    def values_text(self) -> str:
        """The objective value(s) of a COMPLETE trial, "-" otherwise."""
        return values_text(self.values) if self.state == TrialState.COMPLETE and self.values else "-"

    def figures_text(self) -> str:
        """'single 234.1 tok/s, concurrent 1890.2 tok/s at 32, max_running_requests 17' ('' when not measured)."""
        return figures_text(self.metrics)

    def as_row(self) -> dict[str, Any]:
        """The trial as `autotune status --json` shows it."""
        return {
            "number": self.number,
            "state": self.state.name,
            "params": self.params,
            "value": self.values[0] if self.values and len(self.values) == 1 else None,
            "values": self.values,
            "metrics": self.metrics,
            "reason": self.reason,
            "detail": self.detail,
            "stage": self.stage,
            "baseline": self.baseline,
            "starting_point": self.starting_point,
            "role": self.role,
            "launched": self.launched,
            "config": self.config,
            "target": self.target,
            "worker": self.worker,
            "reused_from": self.reused_from,
            "retry_of": self.retry_of,
            "origin": self.origin,
            "value_ci": self.value_ci,
            "duration_s": self.duration_s,
            "started": self.started,
            "completed": self.completed,
            "ready_s": self.ready_s,
            "command": self.command,
            "timings": self.timings,
        }


def records(trials: Sequence[FrozenTrial]) -> list[TrialRecord]:
    return [TrialRecord.of(t) for t in trials]


def values_text(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.4g}" for v in values)


def rate_text(x: float | None) -> str:
    """tok/s: whole numbers from 100 up, else 4 significant digits ("-" when unknown)."""
    if x is None or x != x:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.4g}"


def figures_text(metrics: Mapping[str, Any]) -> str:
    """The measured figures of a trial in one phrase ('' when it has none)."""
    if metrics.get("single_tok_s") is None:
        return ""
    return (f"single {rate_text(metrics['single_tok_s'])} tok/s, "
            f"concurrent {rate_text(metrics.get('concurrent_tok_s'))} tok/s at {metrics.get('concurrency')}, "
            f"max_running_requests {metrics.get('max_running_requests')}")


# -- reading a live trial ---------------------------------------------------------------------------------------

def is_baseline(trial: AnyTrial) -> bool:
    return bool(trial.user_attrs.get("baseline"))


def is_confirmation(trial: AnyTrial) -> bool:
    """A launch that measures an already measured config again on purpose (never a reuse)."""
    return bool(trial.user_attrs.get("confirmation"))


def retry_of(trial: AnyTrial) -> int | None:
    return _int(trial.user_attrs.get("retry_of"))


def reason_of(trial: AnyTrial) -> str | None:
    """The reason recorded so far (a trial cut short by a dead tuner has none)."""
    reason = trial.user_attrs.get("reason")
    return None if reason is None else str(reason)


def config_keys(trial: AnyTrial) -> tuple[str | None, str | None]:
    """(the requested config's key, the key of what the server reported running)."""
    return trial.user_attrs.get("config_key"), trial.user_attrs.get("applied_key")


def target_of(trial: AnyTrial) -> str | None:
    return trial.user_attrs.get("target")


# -- writing: the objective, as a trial goes --------------------------------------------------------------------

def started(trial: optuna.Trial, target: str, worker: str) -> None:
    trial.set_user_attr("target", target)
    trial.set_user_attr("worker", worker)


def candidate(trial: optuna.Trial, params: Mapping[str, ArgValue], config: Mapping[str, ArgValue] | None = None,
              key: str | None = None) -> None:
    """The tuned flags as the server will run them (and, once known, the whole effective config and its key)."""
    trial.set_user_attr("params", dict(params))
    if config is not None:
        trial.set_user_attr("config", mask_mapping(config))
        trial.set_user_attr("config_key", key)


def launched(trial: optuna.Trial, command: list[str], log: str) -> None:
    """The server command as started, its secrets masked (``apply`` puts them back from the study file)."""
    trial.set_user_attr("command", mask_argv(command))
    trial.set_user_attr("log", log)


def ready(trial: optuna.Trial, seconds: float) -> None:
    trial.set_user_attr("ready_s", round(seconds, 3))


def verified(trial: optuna.Trial, applied_key: str, capacity: Mapping[str, Any]) -> None:
    trial.set_user_attr("applied_key", applied_key)
    trial.set_user_attr("capacity", dict(capacity))


def measured(trial: optuna.Trial, metrics: Mapping[str, Any], levels: list[dict[str, Any]],
             value_ci: list[float] | None) -> None:
    trial.set_user_attr("metrics", dict(metrics))
    trial.set_user_attr("levels", levels)
    if value_ci is not None:
        trial.set_user_attr("value_ci", value_ci)


def failed(trial: optuna.Trial, reason: str, detail: str, stage: str | None = None) -> None:
    """Why the trial gave no feasible measurement (a failure, a violated constraint, pruning)."""
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("detail", detail[:DETAIL_LIMIT])
    if stage is not None:
        trial.set_user_attr("stage", stage)


def pruned(trial: optuna.Trial, stage: str, levels: list[dict[str, Any]]) -> None:
    """Stopped after ``stage`` because it could no longer be competitive; what it measured so far."""
    trial.set_user_attr("reason", "pruned")
    trial.set_user_attr("stage", stage)
    trial.set_user_attr("levels", levels)


def timings(trial: optuna.Trial, seconds: Mapping[str, float]) -> None:
    trial.set_user_attr("timings", dict(seconds))


def reused(trial: optuna.Trial, prior: FrozenTrial) -> None:
    """The trial copies the record of ``prior``, which measured the same effective config."""
    trial.set_user_attr("reused_from", prior.number)
    for key in _CARRIED:
        if key in prior.user_attrs:
            trial.set_user_attr(key, prior.user_attrs[key])


# -- queueing configs -------------------------------------------------------------------------------------------

def enqueue(study: optuna.Study, params: Mapping[str, ArgValue], role: str, origin: str | None = None) -> None:
    """Queue ``params`` as a trial of ``role`` (one of ROLES); ``origin`` says where a warm start's config came from
    ("study OLD, trial N")."""
    assert role in ROLES
    attrs: dict[str, Any] = {role: True}
    if origin is not None:
        attrs["origin"] = origin
    study.enqueue_trial(dict(params), user_attrs=attrs)


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue ``trial`` again as a new trial: the same parameters with their distributions and the sampler's own
    records of it (a baseline stays the baseline, a starting point a starting point; a grid trial keeps its grid
    point). A trial cut short before it asked for every parameter gets the missing ones from the sampler as usual."""
    attrs: dict[str, Any] = {"retry_of": trial.number}
    attrs.update({k: True for k in ROLES if trial.user_attrs.get(k)})
    if "origin" in trial.user_attrs:
        attrs["origin"] = trial.user_attrs["origin"]
    # the attempt's outcome stays behind: its failure, and its constraint values (Optuna keeps the first value a
    # trial sets, so a copied one would stand for the retry's own)
    kept = {k: v for k, v in trial.system_attrs.items() if k != "fail_reason" and not k.startswith("constraints:")}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions, user_attrs=attrs,
        system_attrs=kept))


@dataclass(frozen=True)
class Queued:
    """A config the tuner queues itself: its parameters (as the sampler gives them), why, and where it came from."""

    params: dict[str, ArgValue]
    role: str
    origin: str | None = None


def set_opening(study: optuna.Study, opening: Sequence[Queued]) -> None:
    """Record the configs a new study measures after its baseline (the engine's starting points or a warm start's).
    They are queued one at a time (``next_opening``), so that a config queued again after a failure that was not its
    fault (a retried baseline, say) runs next instead of behind all of them."""
    study.set_user_attr("opening", [{"params": dict(q.params), "role": q.role, "origin": q.origin} for q in opening])


def next_opening(study: optuna.Study, trials: Sequence[FrozenTrial]) -> Queued | None:
    """The next config of the study's opening to queue (None: all of them were); ``trials``: the study's."""
    opening = study.user_attrs.get("opening") or []
    roles = {q["role"] for q in opening}
    queued = sum(1 for t in trials if retry_of(t) is None and any(t.user_attrs.get(r) for r in roles))
    if queued >= len(opening):
        return None
    q = opening[queued]
    return Queued(q["params"], q["role"], q["origin"])


def has_baseline(study: optuna.Study) -> bool:
    """Whether the study ever queued its baseline."""
    return any(is_baseline(t) for t in study.get_trials(deepcopy=False))


# -- the study's own record -------------------------------------------------------------------------------------

def describe_study(study: optuna.Study, objective: str, study_file: str, study_path: str) -> None:
    """What a new study records about itself: its objective and the study file it was created from."""
    study.set_user_attr("objective", objective)
    study.set_user_attr("study_file", mask(study_file))  # the dashboard shows it
    study.set_user_attr("study_path", study_path)


def study_objective(study: optuna.Study) -> str | None:
    return study.user_attrs.get("objective")


def reference(study: optuna.Study) -> dict[str, Any] | None:
    """The baseline's figures the weighted objective divides by (None until the baseline is measured)."""
    return study.user_attrs.get("reference")


def set_reference(study: optuna.Study, figures: Mapping[str, Any], number: int) -> dict[str, Any]:
    ref = {**figures, "trial": number}
    study.set_user_attr("reference", ref)
    return ref


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
