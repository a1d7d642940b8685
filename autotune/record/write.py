"""Writing a trial's record as the trial goes (the objective's side): who runs it, the config, the launch, readiness,
what the server reports, the measurement or why there is none, and the attrs a queued trial starts with."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.engines import ArgValue
from autotune.record.owner import Owner
from autotune.record.read import ROLES
from autotune.visible import visible
from autotune.redact import mask, mask_argv, mask_mapping

#: what a trial that reuses another's measurement copies from it
_CARRIED = ("metrics", "levels", "capacity", "slo_capacity", "value_ci", "reason", "detail", "stage", "applied_key",
            "ready_s", "command")
#: the longest failure detail kept
DETAIL_LIMIT = 500


def started(trial: optuna.Trial, target: str, worker: str) -> None:
    """Where the trial runs, and the process running it (so that a trial it leaves RUNNING is known for an orphan
    once that process is gone, and never before)."""
    trial.set_user_attr("target", target)
    trial.set_user_attr("worker", worker)
    trial.set_user_attr("owner", Owner.this().as_attr())


def candidate(trial: optuna.Trial, params: Mapping[str, ArgValue], config: Mapping[str, ArgValue] | None = None,
              key: str | None = None, cost: Sequence[float] | None = None) -> None:
    """The tuned flags as the server will run them (and, once known, the whole effective config, its key and what
    it costs to run, Engine.cost)."""
    trial.set_user_attr("params", dict(params))
    if config is not None:
        trial.set_user_attr("config", mask_mapping(config))
        trial.set_user_attr("config_key", key)
    if cost is not None:
        trial.set_user_attr("cost", list(cost))


def host_rewrote(trial: optuna.Trial, changes: Mapping[str, list[ArgValue | None]]) -> None:
    """The flags the engine on the target, asked before the launch, runs with other values than the rules
    predicted: ``{flag: [predicted, runs]}`` (the recorded config holds what runs)."""
    trial.set_user_attr("host_rewrote", mask_mapping(dict(changes)))


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


def slo_capacity(trial: optuna.Trial, capacity: Mapping[str, Any]) -> None:
    """A capacity measurement: the SLO, the highest load found to meet it and its throughput, and the curve (every
    probed load's throughput and p99s, and whether it met the SLO)."""
    trial.set_user_attr("slo_capacity", dict(capacity))


def failed(trial: optuna.Trial, reason: str, detail: str, stage: str | None = None) -> None:
    """Why the trial gave no feasible measurement (a failure, a violated constraint, pruning)."""
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("detail", visible(mask(detail))[:DETAIL_LIMIT])
    if stage is not None:
        trial.set_user_attr("stage", stage)


def pruned(trial: optuna.Trial, stage: str, levels: list[dict[str, Any]]) -> None:
    """Stopped after ``stage`` because it could no longer be competitive; what it measured so far."""
    trial.set_user_attr("reason", "pruned")
    trial.set_user_attr("stage", stage)
    trial.set_user_attr("levels", levels)


def schedule(trial: optuna.Trial, document: dict[str, Any], file: str, built_from: list[int], family_trial: int,
             lines: list[str]) -> None:
    """The adaptive server's schedule: the file it ran, its name, the trials whose measurements it was built from,
    the trial whose config's chains it switches between, and how each slot was chosen."""
    trial.set_user_attr("schedule", {"document": document, "file": file, "built_from": built_from,
                                     "family_trial": family_trial, "summary": lines})


def timings(trial: optuna.Trial, seconds: Mapping[str, float]) -> None:
    trial.set_user_attr("timings", dict(seconds))


def reused(trial: optuna.Trial, prior: FrozenTrial) -> None:
    """The trial copies the record of ``prior``, which measured the same effective config."""
    trial.set_user_attr("reused_from", prior.number)
    for key in _CARRIED:
        if key in prior.user_attrs:
            trial.set_user_attr(key, prior.user_attrs[key])


def queued(role: str, origin: str | None = None, prediction: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The attrs a trial queued as ``role`` (one of ROLES) starts with; ``origin``: where a warm start's config came
    from ("study OLD, trial N"); ``prediction``: what the search's model expected of it before it ran (``value``,
    its 95% interval ``low`` and ``high``, and ``physics``, the fitted physics' own value, when the model used it)."""
    assert role in ROLES
    attrs: dict[str, Any] = {role: True}
    if origin is not None:
        attrs["origin"] = origin
    if prediction is not None:
        attrs["prediction"] = dict(prediction)
    return attrs


def predicted_outcome(trial: optuna.Trial, value: float, precision: float | None = None) -> None:
    """Once a trial with a prediction is measured: how far off the prediction was (``error``: measured over
    predicted, less one) and whether the prediction's 95% interval meets the measurement's own (``precision``: its
    relative half-width; a measurement's noise alone is no miss); the same for physics' own prediction
    (``physics_error``, ``physics_inside``). A no-op without a prediction."""
    prediction = trial.user_attrs.get("prediction")
    if not prediction or not prediction.get("value"):
        return
    lo, hi = value * (1 - (precision or 0.0)), value * (1 + (precision or 0.0))
    outcome: dict[str, Any] = {"error": value / prediction["value"] - 1,
                               "inside": bool(prediction["low"] <= hi and lo <= prediction["high"])}
    if prediction.get("physics"):
        outcome["physics_error"] = value / prediction["physics"] - 1
        outcome["physics_inside"] = bool(prediction["physics_low"] <= hi and lo <= prediction["physics_high"])
    trial.set_user_attr("prediction_outcome", outcome)


def retried(trial: FrozenTrial) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (user attrs, system attrs) of a new trial that repeats ``trial``: its role and origin, its flags' values
    and the sampler's own records of it (a grid trial keeps its grid point), never the attempt's outcome: its
    failure, and its constraint values (Optuna keeps the first value a trial sets, so a copied one would stand for
    the retry's own)."""
    attrs: dict[str, Any] = {"retry_of": trial.number}
    attrs.update({k: True for k in ROLES if trial.user_attrs.get(k)})
    if "params" in trial.user_attrs:  # the server flags the attempt ran, for `status` while the retry waits
        attrs["params"] = trial.user_attrs["params"]
    if "origin" in trial.user_attrs:
        attrs["origin"] = trial.user_attrs["origin"]
    kept = {k: v for k, v in trial.system_attrs.items() if k != "fail_reason" and not k.startswith("constraints:")}
    return attrs, kept
