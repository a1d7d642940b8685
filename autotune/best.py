"""The best trial in the three forms `autotune best` prints: a JSON document, the server's command line, and a
systemd service unit running it."""
from __future__ import annotations

import shlex
from typing import Any

import optuna

from autotune import results
from autotune.errors import TrialFailure, UserError
from autotune.record import TrialRecord
from autotune.study import StudySpec
from autotune.targets.unitfile import render_service


def best_record(study: optuna.Study) -> TrialRecord:
    t = results.best(study)
    if t is None:
        raise UserError(f"study {study.study_name!r} has no feasible measured trial yet")
    return TrialRecord.of(t)


def document(rec: TrialRecord) -> dict[str, Any]:
    """DESIGN.md's `best --json` shape."""
    return {"number": rec.number, "params": rec.params,
            "value": rec.values[0] if rec.values and len(rec.values) == 1 else None, "values": rec.values,
            "metrics": rec.metrics, "command": rec.command}


def server_env(rec: TrialRecord, spec: StudySpec) -> dict[str, str]:
    """The environment the trial's server ran with: its target's env, then the engine's."""
    target = spec.targets.get(rec.target or "") or spec.target(None)
    return {**target.env, **spec.engine.env}


def _command(rec: TrialRecord) -> list[str]:
    if not rec.command:
        raise UserError(f"trial {rec.number} has no recorded server command")
    return [str(a) for a in rec.command]


def args_line(rec: TrialRecord, spec: StudySpec) -> str:
    """The server's command line as one shell line (environment assignments first)."""
    env = server_env(rec, spec)
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(_command(rec))])


def unit(rec: TrialRecord, spec: StudySpec) -> str:
    """A systemd service unit that runs the trial's command (ExecStart= quoted as the ssh-systemd target quotes it)."""
    target = spec.targets.get(rec.target or "") or spec.target(None)
    tuned = ", ".join(f"{k}={v}" for k, v in rec.params.items()) or "none (the fixed args)"
    header = [
        f"The best config of autotune study {spec.name!r}: trial {rec.number} (value {rec.values_text()}),",
        f"Tuned params: {tuned}; ExecStart= is the",
        "effective command line the trial measured.",
        "Written by `autotune best --format unit`. Install as /etc/systemd/system/NAME.service, then",
        "  systemctl daemon-reload && systemctl enable --now NAME.service",
        *target.unit_note(spec.name),
    ]
    try:
        return render_service(_command(rec), server_env(rec, spec),
                              f"{spec.engine.kind} server (autotune study {spec.name}, trial {rec.number})", header)
    except TrialFailure as e:
        raise UserError(e.detail) from None
