"""A study as files a person reads: trials.csv (pandas), summary.md, HTML plots (optuna.visualization / plotly);
and the best trial as a command line, a systemd unit or JSON (`autotune best --format`).

Nothing here deploys or writes to the study; every plot that cannot be drawn is skipped with a line saying why.
"""
from __future__ import annotations

import logging
import math
import shlex
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from autotune import results
from autotune.errors import TrialFailure, UserError
from autotune.study import StudySpec

#: the two SGLang flags the contour plot is drawn over when both are tuned
CONTOUR_PARAMS = ("speculative-num-steps", "speculative-eagle-topk")
TOP = 5
#: pixels; plotly's own default (450) squeezes the subplots
PLOT_HEIGHT = 600


# -- the table ---------------------------------------------------------------------------------------------------

def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}_{k}", v, out)
    else:
        out[prefix] = value


def value_names(study: optuna.Study) -> list[str]:
    """The trials.csv column(s) of the objective value(s): ``value`` for one objective, ``values_<metric>`` for
    several (the study's metric names)."""
    if len(study.directions) == 1:
        return ["value"]
    names = study.metric_names or [str(i) for i in range(len(study.directions))]
    return [f"values_{n}" for n in names]


def trial_record(t: FrozenTrial, study: optuna.Study, param_names: list[str]) -> dict[str, Any]:
    """One trial as one flat row: identity, value(s), params, metrics, outcome, timing."""
    a = t.user_attrs
    rec: dict[str, Any] = {
        "number": t.number,
        "state": t.state.name,
        "baseline": bool(a.get("baseline")),
        "starting_point": bool(a.get("starting_point")),
        "feasible": results.feasible(t),
    }
    complete = t.state == TrialState.COMPLETE and t.values is not None
    for i, name in enumerate(value_names(study)):
        rec[name] = t.values[i] if complete else None
    ci = a.get("value_ci") or [None, None]
    rec["value_ci_low"], rec["value_ci_high"] = ci[0], ci[1]
    shown = results.params(t)
    for name in param_names:
        rec[f"params_{name}"] = shown.get(name)
    for name in sorted(set(shown) - set(param_names)):
        rec[f"params_{name}"] = shown[name]
    metrics: dict[str, Any] = {}
    _flat("metrics", a.get("metrics") or {}, metrics)
    rec.update(metrics)
    rec.update({
        "reason": results.reason(t),
        "detail": a.get("detail"),
        "stage": a.get("stage"),
        "reused_from": a.get("reused_from"),
        "retry_of": a.get("retry_of"),
        "target": a.get("target"),
        "worker": a.get("worker"),
        "duration_s": t.duration.total_seconds() if t.duration else None,
        "started": t.datetime_start.isoformat() if t.datetime_start else None,
        "completed": t.datetime_complete.isoformat() if t.datetime_complete else None,
        "ready_s": a.get("ready_s"),
    })
    for phase, seconds in (a.get("timings") or {}).items():
        rec[f"timings_{phase}"] = seconds
    command = a.get("command")
    rec["command"] = shlex.join(command) if command else None
    return rec


def trials_frame(study: optuna.Study, param_names: list[str] | None = None) -> pd.DataFrame:
    """Every trial, one row each, columns in a stable order (the union of what the trials carry)."""
    trials = study.get_trials(deepcopy=False)
    names = list(param_names or [])
    rows = [trial_record(t, study, names) for t in trials]
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    front = [c for c in columns if not c.startswith(("metrics_", "timings_")) and c not in _TAIL]
    metric_cols = [c for c in columns if c.startswith("metrics_")]
    timing_cols = [c for c in columns if c.startswith("timings_")]
    ordered = ([c for c in front if not c.startswith("params_")] + [c for c in front if c.startswith("params_")]
               + metric_cols + [c for c in _TAIL if c in columns and c != "command"] + timing_cols + ["command"])
    ordered = list(dict.fromkeys(c for c in ordered if c in columns))
    return pd.DataFrame(rows, columns=ordered)


_TAIL = ("reason", "detail", "stage", "reused_from", "retry_of", "target", "worker", "duration_s", "started",
         "completed", "ready_s", "command")


# -- the summary -------------------------------------------------------------------------------------------------

def _rel_half_width(value: float | None, ci: list[float] | None) -> float | None:
    if value is None or not ci or ci[0] is None or ci[1] is None or value == 0:
        return None
    return abs(ci[1] - ci[0]) / 2 / abs(value)


@dataclass
class Gain:
    """``ratio`` of a trial's figure to the baseline's, with the 95% interval of the ratio when both are known."""

    name: str
    ratio: float
    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        pct = f"{(self.ratio - 1) * 100:+.1f}%"
        if self.low is None or self.high is None:
            return f"{pct} (interval unknown)"
        return f"{pct} (95% CI {(self.low - 1) * 100:+.1f}% to {(self.high - 1) * 100:+.1f}%)"


def gain(name: str, value: float | None, ref: float | None, rel: float | None, rel_ref: float | None) -> Gain | None:
    """value / ref; independent relative errors combine as for a quotient: sqrt(a^2 + b^2)."""
    if value is None or not ref:
        return None
    ratio = value / ref
    if rel is None or rel_ref is None:
        return Gain(name, ratio)
    r = math.sqrt(rel * rel + rel_ref * rel_ref)
    return Gain(name, ratio, ratio * (1 - r), ratio * (1 + r))


def _level(t: FrozenTrial, concurrency: int | None) -> dict[str, Any]:
    for lv in t.user_attrs.get("levels") or []:
        if lv.get("concurrency") == concurrency:
            return lv
    return {}


def gains(best: FrozenTrial, base: FrozenTrial, study: optuna.Study) -> list[Gain]:
    """The best trial against the baseline: the objective (from each trial's value_ci) and both throughputs (from
    the per-level confidence intervals)."""
    out: list[Gain] = []
    if len(best.values) == 1 and base.state == TrialState.COMPLETE:
        v, v0 = best.values[0], base.values[0]
        g = gain("objective", v, v0, _rel_half_width(v, best.user_attrs.get("value_ci")),
                 _rel_half_width(v0, base.user_attrs.get("value_ci")))
        if g:
            out.append(g)
    m, m0 = best.user_attrs.get("metrics") or {}, base.user_attrs.get("metrics") or {}
    top, top0 = m.get("concurrency"), m0.get("concurrency")
    for key, c, c0, ci_key in (("single_tok_s", 1, 1, "decode_tok_s_rel_ci"),
                               ("concurrent_tok_s", top, top0, "output_tok_s_rel_ci")):
        g = gain(key, m.get(key), m0.get(key), _level(best, c).get(ci_key), _level(base, c0).get(ci_key))
        if g:
            out.append(g)
    return out


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _params(t: FrozenTrial) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in results.params(t).items()) or "(fixed args)"


def _rate(x: Any) -> str:
    """tok/s: whole numbers from 100 up, else 4 significant digits."""
    if isinstance(x, (int, float)) and not math.isnan(x) and abs(x) >= 100:
        return f"{x:.0f}"
    return _fmt(x)


def _figures(m: dict[str, Any]) -> str:
    return (f"single-stream {_rate(m.get('single_tok_s'))} tok/s, concurrent {_rate(m.get('concurrent_tok_s'))} tok/s "
            f"at concurrency {m.get('concurrency')}, max_running_requests {m.get('max_running_requests')}")


def _value_text(t: FrozenTrial) -> str:
    if t.state != TrialState.COMPLETE or not t.values:
        return "-"
    text = " / ".join(_fmt(v) for v in t.values)
    ci = t.user_attrs.get("value_ci")
    if ci and len(t.values) == 1:
        text += f" [{_fmt(ci[0])}, {_fmt(ci[1])}]"
    return text


def launches_saved(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Trials that cost no deployment: a reused measurement of the same effective config, or an invalid config
    rejected by the engine's rules; and roughly the time that saved (the median deployed trial's duration)."""
    reused = [t for t in trials if "reused_from" in t.user_attrs]
    invalid = [t for t in trials if t.user_attrs.get("reason") == "invalid_config"]
    deployed = [t.duration.total_seconds() for t in trials if t.duration and "command" in t.user_attrs
                and "reused_from" not in t.user_attrs and t.state in results.FINISHED]
    median = statistics.median(deployed) if deployed else None
    saved = len(reused) + len(invalid)
    return {"reused": len(reused), "invalid": len(invalid), "saved": saved,
            "seconds": saved * median if median is not None else None}


def summary_markdown(study: optuna.Study, spec: StudySpec | None, plots: list[PlotResult] | None = None) -> str:
    trials = study.get_trials(deepcopy=False)
    name = spec.name if spec else study.study_name
    objective = study.user_attrs.get("objective") or (spec.objective if spec else "?")
    states = Counter(t.state.name for t in trials)
    counted = results.counted(trials)
    lines = [f"# Study `{name}`", ""]
    lines.append(f"Objective `{objective}` ({', '.join(study.metric_names or ['value'])}), "
                 f"{len(trials)} trials ({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}), "
                 f"{len(counted)} counted against the budget"
                 + (f" of {spec.trials}" if spec else "") + f". Written {time.strftime('%Y-%m-%d %H:%M:%S')}.")
    lines.append("")

    base = results.baseline(trials)
    best = results.best(study)
    lines += ["## Best", ""]
    if best is None:
        lines += ["No feasible measured trial yet.", ""]
    else:
        m = best.user_attrs.get("metrics") or {}
        lines.append(f"Trial **{best.number}**: value {_value_text(best)}" +
                     (" (the baseline itself)" if best.user_attrs.get("baseline") else "") + ".")
        lines.append("")
        lines.append(f"- params: {_params(best)}")
        lines.append(f"- {_figures(m)}, accept length {_fmt(m.get('accept_length'), 3)}, "
                     f"TTFT p99 {_fmt(m.get('ttft_p99_ms'))} ms")
        if base is not None and base.number != best.number and base.state == TrialState.COMPLETE:
            for g in gains(best, base, study):
                lines.append(f"- {g.name} vs the baseline (trial {base.number}): {g.text()}")
        lines.append("")
        command = best.user_attrs.get("command")
        if command:
            lines += ["Server command line:", "", "```sh", shlex.join(command), "```", ""]
        lines.append(f"`autotune best --study {name} --format unit` prints it as a systemd service; "
                     f"`autotune apply --study {name}` deploys it.")
        lines.append("")

    lines += ["## Baseline", ""]
    if base is None:
        lines += ["The baseline has not finished yet.", ""]
    else:
        m0 = base.user_attrs.get("metrics") or {}
        why = f", {results.reason(base)}" if results.reason(base) else ""
        lines += [f"Trial {base.number} ({base.state.name}{why}): {_params(base)}; value {_value_text(base)}; "
                  f"{_figures(m0)}.", ""]

    lines += [f"## Top {TOP}", ""]
    ranked = sorted((t for t in trials if results.feasible(t) and "reused_from" not in t.user_attrs),
                    key=lambda t: (-results.score(t, study), t.number))[:TOP]
    if not ranked:
        lines += ["No feasible measured trial yet.", ""]
    else:
        again = Counter(t.user_attrs["reused_from"] for t in trials if "reused_from" in t.user_attrs)
        lines += ["| rank | trial | value [95% CI] | params | single tok/s | concurrent tok/s | max running | "
                  "proposed again |", "|---:|---:|---|---|---:|---:|---:|---:|"]
        for i, t in enumerate(ranked, 1):
            m = t.user_attrs.get("metrics") or {}
            role = results.role(t)
            tag = f" ({role})" if role else ""
            lines.append(f"| {i} | {t.number}{tag} | {_value_text(t)} | {_params(t)} | {_rate(m.get('single_tok_s'))} "
                         f"| {_rate(m.get('concurrent_tok_s'))} | {_fmt(m.get('max_running_requests'))} | "
                         f"{again.get(t.number, 0)} |")
        lines += ["", "Trials that reused an identical effective config are listed once, under the trial that "
                  "measured it (\"proposed again\").", ""]

    lines += ["## Failures by reason", ""]
    failed: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        r = results.reason(t)
        if r is not None and t.state != TrialState.RUNNING:
            failed.setdefault(r, []).append(t)
    if not failed:
        lines += ["None.", ""]
    else:
        lines += ["| reason | trials | states | numbers |", "|---|---:|---|---|"]
        for r, ts in sorted(failed.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            st = ", ".join(f"{n} {s}" for s, n in sorted(Counter(t.state.name for t in ts).items()))
            lines.append(f"| {r} | {len(ts)} | {st} | {', '.join(str(t.number) for t in ts)} |")
        lines.append("")
        retried = results.retried(trials)
        if retried:
            lines += [f"Infrastructure failures queue their config again once; {len(retried)} trial(s) were retried "
                      "and do not count against the budget.", ""]

    saved = launches_saved(trials)
    lines += ["## Launches saved", ""]
    secs = f", about {saved['seconds'] / 60:.1f} min of deployments" if saved["seconds"] else ""
    lines += [f"{saved['saved']} of {len(trials)} trials deployed nothing{secs}: {saved['reused']} reused the "
              f"measurement of an identical effective config, {saved['invalid']} were invalid configs rejected by "
              "the engine's rules before deployment.", ""]

    if plots is not None:
        lines += ["## Plots", ""]
        for p in plots:
            lines.append(f"- [{p.title}]({p.path.name})" if p.path else f"- {p.title}: not drawn ({p.note})")
        lines.append("")
    return "\n".join(lines)


# -- the plots ---------------------------------------------------------------------------------------------------

@dataclass
class PlotResult:
    name: str
    title: str
    path: Path | None = None
    note: str = ""


@dataclass
class Report:
    out: Path
    rows: int
    columns: list[str]
    plots: list[PlotResult] = field(default_factory=list)


def _target(study: optuna.Study) -> tuple[Callable[[FrozenTrial], float] | None, str]:
    """What the single-objective plots show: the objective, or for pareto studies the geometric-mean gain over the
    baseline of both objectives (what `autotune best` ranks by)."""
    names = study.metric_names
    if len(study.directions) == 1:
        return None, (names[0] if names else "objective")
    return (lambda t: results.score(t, study)), "gain over the baseline (geometric mean of both objectives)"


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _varying(trials: list[FrozenTrial], name: str) -> bool:
    return len({repr(t.params[name]) for t in trials if name in t.params}) >= 2


def _history(study: optuna.Study, spec: StudySpec | None) -> Any:
    if not _complete(study):
        raise _Skip("no completed trial")
    target, name = _target(study)
    return optuna.visualization.plot_optimization_history(study, target=target, target_name=name)


def _importances(study: optuna.Study, spec: StudySpec | None) -> Any:
    complete = _complete(study)
    if len(complete) < 2:
        raise _Skip(f"needs at least 2 completed trials, the study has {len(complete)}")
    varying = [p for p in {k for t in complete for k in t.params} if _varying(complete, p)]
    if not varying:
        raise _Skip("no parameter takes two values among the completed trials")
    target, name = _target(study)
    return optuna.visualization.plot_param_importances(study, target=target, target_name=name)


def _slice(study: optuna.Study, spec: StudySpec | None) -> Any:
    if not _complete(study):
        raise _Skip("no completed trial")
    target, name = _target(study)
    return optuna.visualization.plot_slice(study, target=target, target_name=name)


def _contour_params(study: optuna.Study, spec: StudySpec | None) -> list[str] | None:
    names = list(spec.param_names) if spec else sorted({k for t in _complete(study) for k in t.params})
    if all(p in names for p in CONTOUR_PARAMS):
        return list(CONTOUR_PARAMS)
    return names[:2] if len(names) >= 2 else None


def _contour(study: optuna.Study, spec: StudySpec | None) -> Any:
    params = _contour_params(study, spec)
    if params is None:
        raise _Skip("the space has fewer than two parameters")
    complete = _complete(study)
    both = [t for t in complete if all(p in t.params for p in params)]
    if len(both) < 2 or not all(_varying(both, p) for p in params):
        raise _Skip(f"needs completed trials with at least two values of each of {' and '.join(params)}")
    target, name = _target(study)
    return optuna.visualization.plot_contour(study, params=params, target=target, target_name=name)


def _pareto(study: optuna.Study, spec: StudySpec | None) -> Any:
    if len(study.directions) < 2:
        raise _Skip("a single-objective study; only objective = \"pareto\" has a front")
    if not _complete(study):
        raise _Skip("no completed trial")
    return optuna.visualization.plot_pareto_front(study, target_names=study.metric_names)


def _throughput(study: optuna.Study, spec: StudySpec | None) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    trials = study.get_trials(deepcopy=False)
    shown: list[tuple[str, FrozenTrial]] = []
    best, base = results.best(study), results.baseline(trials)
    if best is not None:
        shown.append((f"best (trial {best.number})", best))
    if base is not None and base.user_attrs.get("levels") and (best is None or base.number != best.number):
        shown.append((f"baseline (trial {base.number})", base))
    shown = [(label, t) for label, t in shown if t.user_attrs.get("levels")]
    if not shown:
        raise _Skip("neither the best trial nor the baseline has per-level measurements")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("output tok/s (all requests)", "decode tok/s per request"))
    ticks: set[int] = set()
    for (label, t), color in zip(shown, ("#1f77b4", "#7f7f7f"), strict=False):
        levels = sorted(t.user_attrs["levels"], key=lambda lv: lv["concurrency"])
        xs = [lv["concurrency"] for lv in levels]
        ticks.update(xs)
        for col, key in ((1, "output_tok_s"), (2, "decode_tok_s")):
            fig.add_trace(go.Scatter(x=xs, y=[lv.get(key) for lv in levels], mode="lines+markers", name=label,
                                     legendgroup=label, showlegend=col == 1, line={"color": color}), row=1, col=col)
    for col in (1, 2):
        fig.update_xaxes(title_text="requests in flight (concurrency)", type="log", tickvals=sorted(ticks),
                         row=1, col=col)
        fig.update_yaxes(title_text="tok/s", rangemode="tozero", row=1, col=col)
    fig.update_layout(title="Throughput against concurrency: best vs baseline")
    return fig


def _timeline(study: optuna.Study, spec: StudySpec | None) -> Any:
    if not study.get_trials(deepcopy=False):
        raise _Skip("no trial")
    return optuna.visualization.plot_timeline(study)


class _Skip(Exception):
    """A plot that cannot be drawn for this study, with the reason."""


PLOTS: list[tuple[str, str, Callable[[optuna.Study, StudySpec | None], Any]]] = [
    ("history", "Optimization history", _history),
    ("importances", "Parameter importances", _importances),
    ("slice", "Slice", _slice),
    ("contour", "Contour", _contour),
    ("pareto", "Pareto front", _pareto),
    ("throughput", "Throughput against concurrency", _throughput),
    ("timeline", "Timeline", _timeline),
]


def write_plots(study: optuna.Study, spec: StudySpec | None, out: Path) -> list[PlotResult]:
    """Each plot as a standalone HTML file in ``out`` (sharing one plotly.min.js there, so the report opens
    offline); a plot that cannot be drawn is recorded as skipped, with why."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return [PlotResult(n, t, note="plotly is not installed (pip install plotly)") for n, t, _ in PLOTS]
    done: list[PlotResult] = []
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        for name, title, draw in PLOTS:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fig = draw(study, spec)
                if name == "contour":
                    title = f"Contour of {' x '.join(_contour_params(study, spec) or [])}"  # noqa: PLW2901
                fig.update_layout(title=f"{fig.layout.title.text or title} (study {study.study_name})",
                                  height=fig.layout.height or PLOT_HEIGHT)
                path = out / f"{name}.html"
                fig.write_html(str(path), include_plotlyjs="directory")
                done.append(PlotResult(name, title, path))
            except _Skip as e:
                done.append(PlotResult(name, title, note=str(e)))
            except Exception as e:  # a plot is never worth the report
                logging.getLogger("autotune").debug("plot %s failed", name, exc_info=True)
                first = str(e).splitlines()[0] if str(e) else ""
                done.append(PlotResult(name, title, note=f"{type(e).__name__}: {first}"))
    finally:
        optuna.logging.set_verbosity(level)
    return done


def write_report(study: optuna.Study, spec: StudySpec | None, out: Path) -> Report:
    """trials.csv, summary.md and the plots in ``out`` (created if needed)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {out}: {e.strerror}") from None
    frame = trials_frame(study, list(spec.param_names) if spec else None)
    frame.to_csv(out / "trials.csv", index=False)
    plots = write_plots(study, spec, out)
    (out / "summary.md").write_text(summary_markdown(study, spec, plots))
    return Report(out=out, rows=len(frame), columns=list(frame.columns), plots=plots)


# -- the best trial, in three forms ------------------------------------------------------------------------------

def best_trial(study: optuna.Study) -> FrozenTrial:
    t = results.best(study)
    if t is None:
        raise UserError(f"study {study.study_name!r} has no feasible measured trial yet")
    return t


def best_document(t: FrozenTrial) -> dict[str, Any]:
    """DESIGN.md's `best --json` shape."""
    return {"number": t.number, "params": results.params(t), "value": t.values[0] if len(t.values) == 1 else None,
            "values": t.values, "metrics": t.user_attrs.get("metrics", {}), "command": t.user_attrs.get("command")}


def server_env(t: FrozenTrial, spec: StudySpec) -> dict[str, str]:
    """The environment the trial's server ran with: its target's env, then the engine's."""
    target = spec.targets.get(t.user_attrs.get("target") or "") or spec.target(None)
    return {**target.env, **spec.engine.env}


def _command(t: FrozenTrial) -> list[str]:
    command = t.user_attrs.get("command")
    if not command:
        raise UserError(f"trial {t.number} has no recorded server command")
    return [str(a) for a in command]


def best_args(t: FrozenTrial, env: dict[str, str]) -> str:
    """The server's command line as one shell line (environment assignments first)."""
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(_command(t))])


def best_unit(t: FrozenTrial, spec: StudySpec, env: dict[str, str]) -> str:
    """A systemd service unit that runs the trial's command (ExecStart= quoting from the systemd target)."""
    from autotune.targets.systemd import environment_line, exec_line

    try:
        exec_start = exec_line(_command(t))
        env_lines = [f"Environment={environment_line(k, v)}" for k, v in env.items()]
    except TrialFailure as e:
        raise UserError(e.detail) from None
    values = " / ".join(f"{v:.4g}" for v in t.values)
    target = spec.targets.get(t.user_attrs.get("target") or "") or spec.target(None)
    lines = [
        f"# The best config of autotune study {spec.name!r}: trial {t.number} (value {values}),",
        f"# Tuned params: {', '.join(f'{k}={v}' for k, v in results.params(t).items()) or 'none (the fixed args)'}; "
        "ExecStart= is the",
        "# effective command line the trial measured.",
        "# Written by `autotune best --format unit`. Install as /etc/systemd/system/NAME.service, then",
        "#   systemctl daemon-reload && systemctl enable --now NAME.service",
    ]
    if target.kind == "ssh-systemd" and target.unit:
        lines += [f"# This study tunes {target.unit} through a drop-in: `autotune apply --study {spec.name}` puts this",
                  "# config on that unit instead and keeps the unit's own settings."]
    lines += [
        "",
        "[Unit]",
        f"Description={spec.engine.kind} server (autotune study {spec.name}, trial {t.number})",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        "# User=  (the account that should run the server)",
        f"ExecStart={exec_start}",
        *env_lines,
        "KillMode=control-group",
        "Restart=on-failure",
        "RestartSec=10",
        "LimitNOFILE=65536",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"
