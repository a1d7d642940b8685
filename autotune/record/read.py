"""Reading a trial's record: ``TrialRecord.of(frozen_trial)``, a typed view of what autotune wrote about it, the
readers of a live trial's attrs, and the phrases status lines are made of."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.engines import ArgValue
from autotune.record.owner import Owner

#: user attrs that say why a config was queued rather than suggested (a retry keeps them): the baseline, the
#: engine's starting points, neighbours of the leader, the search's picks over the whole space (``model``) and
#: right below a config that ran out of memory (``shrink``) and at a value of a categorical flag no launch has measured
#: (``coverage``), confirmations of the leader and its close rivals
ROLES = ("baseline", "starting_point", "warm_start", "neighbour", "model", "shrink", "coverage", "confirmation",
         "adaptive")

AnyTrial = optuna.Trial | FrozenTrial


# -- reading ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialRecord:
    """A finished (or running) trial as autotune recorded it."""

    number: int
    state: TrialState
    values: list[float] | None
    #: the tuned flags as the server ran them (else what the sampler suggested, without its internal parameters:
    #: a dependent flag's fill fraction, ``NAME.fill``; flag names hold no dot)
    params: dict[str, ArgValue]
    constraints: dict[str, float]
    roles: tuple[str, ...] = ()
    retry_of: int | None = None
    origin: str | None = None                 # a warm start's source: "study OLD, trial N"
    target: str | None = None
    worker: str | None = None
    config: dict[str, ArgValue] | None = None
    config_key: str | None = None
    #: what the config costs to run, to compare configs by (Engine.cost: smaller first; None: not recorded)
    cost: tuple[float, ...] | None = None
    applied_key: str | None = None
    command: list[str] | None = None
    log: str | None = None
    ready_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    #: a capacity measurement (objective "capacity"): slo, concurrency, output_tok_s, curve
    slo_capacity: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    levels: list[dict[str, Any]] = field(default_factory=list)
    value_ci: list[float] | None = None
    detail: str | None = None
    stage: str | None = None
    reused_from: int | None = None
    #: flags the engine on the target runs with other values than the rules predicted: {flag: [predicted, runs]}
    host_rewrote: dict[str, list[Any]] | None = None
    schedule: dict[str, Any] | None = None   # an adaptive server's schedule: the file and where it came from
    #: what the search's model expected before the launch: value, low, high (95%), physics (None: not used)
    prediction: dict[str, Any] | None = None
    #: after it: error (measured / predicted - 1) and whether the measurement fell inside the interval
    prediction_outcome: dict[str, Any] | None = None
    duration_s: float | None = None
    started: str | None = None
    completed: str | None = None
    _reason: str | None = None

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialRecord:
        a = t.user_attrs
        return cls(
            number=t.number, state=t.state, values=list(t.values) if t.values is not None else None,
            params=dict(a.get("params") or {k: v for k, v in t.params.items() if "." not in k}),
            constraints=dict(t.constraints),
            roles=tuple(r for r in ROLES if a.get(r)), retry_of=_int(a.get("retry_of")), target=a.get("target"),
            origin=a.get("origin"),
            worker=a.get("worker"), config=a.get("config"), config_key=a.get("config_key"),
            cost=tuple(a["cost"]) if a.get("cost") is not None else None,
            applied_key=a.get("applied_key"), command=a.get("command"), log=a.get("log"), ready_s=a.get("ready_s"),
            timings=dict(a.get("timings") or {}), capacity=a.get("capacity"),
            slo_capacity=a.get("slo_capacity"), metrics=dict(a.get("metrics") or {}),
            levels=list(a.get("levels") or []), value_ci=a.get("value_ci"), detail=a.get("detail"),
            stage=a.get("stage"), reused_from=_int(a.get("reused_from")), schedule=a.get("schedule"),
            host_rewrote=a.get("host_rewrote"),
            prediction=a.get("prediction"), prediction_outcome=a.get("prediction_outcome"),
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
        if self.state in (TrialState.RUNNING, TrialState.WAITING) or self.feasible:
            return None
        return "constraints"

    @property
    def adaptive(self) -> bool:
        """An adaptive speculative server built from the study's measurements, never a fixed config."""
        return "adaptive" in self.roles

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
            "host_rewrote": self.host_rewrote,
            "adaptive": self.adaptive,
            "schedule": self.schedule,
            "retry_of": self.retry_of,
            "origin": self.origin,
            "value_ci": self.value_ci,
            "prediction": self.prediction,
            "prediction_outcome": self.prediction_outcome,
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


def is_adaptive(trial: AnyTrial) -> bool:
    """A launch of the adaptive server built from the study's measurements so far (its own config, never a fixed
    one)."""
    return bool(trial.user_attrs.get("adaptive"))


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


def owner_of(trial: AnyTrial) -> Owner | None:
    """The process that ran the trial (None for a trial none has started, or one an older autotune started)."""
    return Owner.of(trial.user_attrs.get("owner"))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
