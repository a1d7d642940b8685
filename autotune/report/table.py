"""trials.csv: every trial as one flat row (pandas), columns in a stable order."""
from __future__ import annotations

import shlex
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from autotune.record import TrialRecord

#: the columns that close a row, in this order (the command line last)
_TAIL = ("reason", "detail", "stage", "reused_from", "retry_of", "target", "worker", "duration_s", "started",
         "completed", "ready_s", "command")


def value_names(study: optuna.Study) -> list[str]:
    """The column(s) of the objective value(s): ``value`` for one objective, ``values_<metric>`` for several (the
    study's metric names)."""
    if len(study.directions) == 1:
        return ["value"]
    names = study.metric_names or [str(i) for i in range(len(study.directions))]
    return [f"values_{n}" for n in names]


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}_{k}", v, out)
    else:
        out[prefix] = value


def row(rec: TrialRecord, names: list[str], param_names: list[str]) -> dict[str, Any]:
    """One trial as one flat row: identity, value(s), params, metrics, outcome, timing."""
    out: dict[str, Any] = {"number": rec.number, "state": rec.state.name, "baseline": rec.baseline,
                           "starting_point": rec.starting_point, "adaptive": rec.adaptive, "feasible": rec.feasible}
    complete = rec.state == TrialState.COMPLETE and rec.values is not None
    for i, name in enumerate(names):
        out[name] = rec.values[i] if complete else None
    out["value_ci_low"], out["value_ci_high"] = (rec.value_ci or [None, None])[:2]
    for name in [*param_names, *sorted(set(rec.params) - set(param_names))]:
        out[f"params_{name}"] = rec.params.get(name)
    _flat("metrics", rec.metrics, out)
    as_row = rec.as_row()
    out.update({key: as_row[key] for key in _TAIL})
    for phase, seconds in rec.timings.items():
        out[f"timings_{phase}"] = seconds
    out["command"] = shlex.join(rec.command) if rec.command else None
    return out


def trials_frame(study: optuna.Study, param_names: list[str] | None = None) -> pd.DataFrame:
    """Every trial, one row each, columns in a stable order (the union of what the trials carry)."""
    names = value_names(study)
    rows = [row(TrialRecord.of(t), names, list(param_names or [])) for t in study.get_trials(deepcopy=False)]
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    front = [c for c in columns if not c.startswith(("metrics_", "timings_")) and c not in _TAIL]
    ordered = ([c for c in front if not c.startswith("params_")] + [c for c in front if c.startswith("params_")]
               + [c for c in columns if c.startswith("metrics_")] + [c for c in _TAIL if c != "command"]
               + [c for c in columns if c.startswith("timings_")] + ["command"])
    ordered = list(dict.fromkeys(c for c in ordered if c in columns))
    return pd.DataFrame(rows, columns=ordered)
