"""The best trial in the three forms `autotune best` prints: a JSON document, the server's command line, and a
systemd service unit running it."""
from __future__ import annotations

import shlex
from typing import Any

import optuna

from autotune.redact import mask_mapping
from autotune.results import adaptive_versus_fixed, tally
from autotune.errors import TrialFailure, UserError
from autotune.record import TrialRecord
from autotune.studyfile.spec import StudySpec
from autotune.targets.unitfile import render_service


def best_record(study: optuna.Study) -> TrialRecord:
    t = tally.best(study)
    if t is None:
        raise UserError(f"study {study.study_name!r} has no feasible measured trial yet")
    return TrialRecord.of(t)


def document(rec: TrialRecord, study: optuna.Study) -> dict[str, Any]:
    """DESIGN.md's `best --json` shape, the config's estimate pooled over its launches, and (``adaptive``, only in a
    study that measured an adaptive server) that server against it."""
    found = _estimate(rec, study)
    estimate = None if found is None else {"value": found.value, "low": found.low, "high": found.high,
                                           "launches": found.launches, "trials": list(found.trials)}
    doc = {"number": rec.number, "params": rec.params,
           "value": rec.values[0] if rec.values and len(rec.values) == 1 else None, "values": rec.values,
           "metrics": rec.metrics, "command": rec.command, "estimate": estimate}
    predicted = tally.predictions(study.get_trials(deepcopy=False))
    doc["predictions"] = None if predicted is None else predicted.document()
    chosen = tally.pick(study)
    doc["tie"] = None if chosen is None or not chosen.tied else {
        "with": [e.trials[0] for e in chosen.tied], "text": chosen.tie_text()}
    measured = adaptive_versus_fixed.compare(study)
    if measured is not None:
        doc["adaptive"] = adaptive_versus_fixed.document(measured)
    return doc


def _estimate(rec: TrialRecord, study: optuna.Study) -> tally.Estimate | None:
    key = rec.config_key if rec.reused_from is None else TrialRecord.of(
        study.get_trials(deepcopy=False)[rec.reused_from]).config_key
    return tally.estimates(study).get(key) if key else None


def predictions_line(study: optuna.Study) -> str | None:
    """How well the search predicted its launches (how far to trust the pick), or None when it predicted none."""
    predicted = tally.predictions(study.get_trials(deepcopy=False))
    return None if predicted is None else f"how far to trust the pick: {predicted.text()}"


def tie_line(study: optuna.Study) -> str | None:
    """How the pick was settled when its measurements could not tell it from another config's (None: they could)."""
    chosen = tally.pick(study)
    return None if chosen is None else chosen.tie_text()


def estimate_text(rec: TrialRecord, study: optuna.Study) -> str:
    """'value 1.234 [1.21, 1.26] over 2 launches (trials 5, 14)': the config's pooled estimate."""
    found = _estimate(rec, study)
    if found is None:
        return "no estimate"
    trials = ", ".join(map(str, found.trials))
    return (f"value {found.value:.4g} [{found.low:.4g}, {found.high:.4g}] over {found.launches} launch"
            f"{'es' if found.launches > 1 else ''} (trial{'s' if found.launches > 1 else ''} {trials})")


def server_env(rec: TrialRecord, spec: StudySpec) -> dict[str, str]:
    """The environment the trial's server ran with: its target's env, then the engine's; secrets masked (give them
    to the unit or the shell yourself)."""
    target = spec.targets.get(rec.target or "") or spec.target(None)
    return mask_mapping({**target.env, **spec.engine.env})


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


# -- the best config for each load ------------------------------------------------------------------------------

def per_concurrency(study: optuna.Study) -> list[dict[str, Any]]:
    """`best --per-concurrency --json`: for every measured concurrency level, the best feasible config there."""
    trials = study.get_trials(deepcopy=False)
    out = []
    for row in tally.per_concurrency(study):
        rec = TrialRecord.of(trials[row.best.trials[0]])
        out.append({"concurrency": row.concurrency, "trial": rec.number, "params": rec.params,
                    "output_tok_s": row.best.value, "low": row.best.low, "high": row.best.high,
                    "gain": row.gain, "launches": row.best.launches, "trials": list(row.best.trials),
                    "confirmed": row.confirmed})
    return out


def capacity_curves(study: optuna.Study) -> list[dict[str, Any]]:
    """A capacity study's curves: every launch that measured one (its capacity, highest first), with the SLO, the
    capacity load and its throughput, and each probed load's throughput, p99s and whether it met the SLO."""
    recs = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    found = [r for r in recs if r.slo_capacity is not None and r.reused_from is None]
    found.sort(key=lambda r: (-(r.slo_capacity or {}).get("output_tok_s", 0.0), r.number))
    return [{"trial": r.number, "params": r.params, **(r.slo_capacity or {})} for r in found]


def slo_text(slo: dict[str, Any]) -> str:
    """A capacity curve's SLO as a person reads it: "TTFT p99 <= 40 ms and ITL p99 <= 60 ms"."""
    return " and ".join(f"{name} p99 <= {slo[key]:g} ms" for name, key in (("TTFT", "ttft_p99_ms"),
                                                                         ("ITL", "itl_p99_ms")) if slo[key])


def capacity_label(curve: dict[str, Any]) -> str:
    """A launch's capacity load: "c16", "c32+" (no load of the ladder broke the SLO) or "none"."""
    if curve["concurrency"] is None:
        return "none"
    return f"c{curve['concurrency']}{'' if curve['below_top'] else '+'}"


def capacity_table(study: optuna.Study) -> list[str]:
    """``capacity_curves`` as lines a person reads: one block per launch, one line per probed load."""
    curves = capacity_curves(study)
    if not curves:
        return []
    bounds = slo_text(curves[0]["slo"])
    lines = [f"capacity within the SLO ({bounds}), each launch's curve, most capacity first:"]
    for c in curves:
        config = ", ".join(f"{k}={v}" for k, v in c["params"].items()) or "the fixed args"
        load = capacity_label(c)
        lines.append(f"trial {c['trial']}: capacity {load}, {c['output_tok_s']:.1f} tok/s  ({config})")
        lines.append(f"  {'load':>5}  {'output tok/s':>12}  {'TTFT p99 ms':>11}  {'ITL p99 ms':>10}  SLO")
        for p in c["curve"]:
            lines.append(f"  {'c' + str(p['concurrency']):>5}  {p['output_tok_s'] or 0.0:>12.1f}  "
                         f"{_ms(p['ttft_ms_p99']):>11}  {_ms(p['itl_ms_p99']):>10}  "
                         f"{'met' if p['meets_slo'] else 'broken'}")
    return lines


def capacity_line(rec: TrialRecord) -> str:
    """'capacity c17 within the SLO: 5493.2 tok/s (loads probed: c4 c8 c16 c17 c18 c20x c24x)'."""
    cap = rec.slo_capacity or {}
    probed = " ".join(f"c{p['concurrency']}" + ("" if p["meets_slo"] else "x") for p in cap.get("curve", []))
    load = "none" if cap.get("concurrency") is None else f"c{cap['concurrency']}{'' if cap['below_top'] else '+'}"
    return (f"capacity {load} within the SLO: {cap.get('output_tok_s', 0.0):.1f} tok/s (loads probed: "
            f"{probed}; x: broke it)")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def per_concurrency_table(study: optuna.Study) -> list[str]:
    """The same as a table a person reads (also in the report's summary)."""
    rows = per_concurrency(study)
    if not rows:
        raise UserError(f"study {study.study_name!r} has no feasible measured trial yet")
    lines = [f"{'load':>5}  {'trial':>5}  {'output tok/s':>12}  {'95% interval':>17}  {'vs baseline':>11}  "
             f"{'':<16}  config"]
    for r in rows:
        gain = f"{r['gain'] - 1:+.1%}" if r["gain"] else "-"
        sure = f"confirmed ({r['launches']})" if r["confirmed"] else "measured once"
        config = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "the fixed args"
        lines.append(f"{'c' + str(r['concurrency']):>5}  {r['trial']:>5}  {r['output_tok_s']:>12.1f}  "
                     f"{r['low']:>8.1f}-{r['high']:<8.1f}  {gain:>11}  {sure:<16}  {config}")
    capacity = capacity_table(study)
    return [*lines, *(["", *capacity] if capacity else []), *adaptive_lines(study)]


def adaptive_lines(study: optuna.Study) -> list[str]:
    """The adaptive server against the best fixed config, after a blank line ([] when none was measured)."""
    measured = adaptive_versus_fixed.compare(study)
    return [] if measured is None else ["", *adaptive_versus_fixed.lines(measured)]
