"""The report's HTML plots (optuna.visualization and plotly): history, importances, slice, contour, Pareto front,
throughput against concurrency (best vs baseline) and the timeline. A plot that cannot be drawn is skipped with the
reason."""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results import tally
from autotune.engines import get_engine
from autotune.errors import UserError
from autotune.record import TrialRecord
from autotune.studyfile.spec import StudySpec

#: pixels; plotly's own default (450) squeezes the subplots
PLOT_HEIGHT = 600


@dataclass
class PlotResult:
    name: str
    title: str
    path: Path | None = None
    note: str = ""


def _target(study: optuna.Study) -> tuple[Callable[[FrozenTrial], float] | None, str]:
    """What the single-objective plots show: the objective, or for pareto studies the geometric-mean gain over the
    baseline of both objectives (what `autotune best` ranks by)."""
    names = study.metric_names
    if len(study.directions) == 1:
        return None, (names[0] if names else "objective")
    return (lambda t: tally.score(t, study)), "gain over the baseline (geometric mean of both objectives)"


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
    """The engine's two plot flags when both are tuned, else the first two parameters."""
    names = list(spec.param_names) if spec else sorted({k for t in _complete(study) for k in t.params})
    preferred = get_engine(spec.engine.kind).plot_params if spec else ()
    if preferred and all(p in names for p in preferred):
        return list(preferred)
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
    shown: list[tuple[str, TrialRecord]] = []
    best, base = tally.best(study), tally.baseline(trials)
    if best is not None:
        shown.append((f"best (trial {best.number})", TrialRecord.of(best)))
    if base is not None and (best is None or base.number != best.number):
        shown.append((f"baseline (trial {base.number})", TrialRecord.of(base)))
    shown = [(label, rec) for label, rec in shown if rec.levels]
    if not shown:
        raise _Skip("neither the best trial nor the baseline has per-level measurements")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("output tok/s (all requests)", "decode tok/s per request"))
    ticks: set[int] = set()
    for (label, rec), color in zip(shown, ("#1f77b4", "#7f7f7f"), strict=False):
        levels = sorted(rec.levels, key=lambda lv: lv["concurrency"])
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


def _lengths(study: optuna.Study, spec: StudySpec | None) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from autotune.run.plan import requests_of
    from autotune.bench.workload_view import describe

    if spec is None:
        raise _Skip("no study file")
    try:
        view = describe(spec, requests_of(spec))
    except UserError as e:
        raise _Skip(f"the study's requests cannot be read now: {e}") from None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prompt tokens (estimated)", "output tokens asked"))
    for col, key in ((1, "input_lengths"), (2, "output_lengths")):
        fig.add_trace(go.Histogram(x=view[key], nbinsx=40, showlegend=False), row=1, col=col)
        fig.update_xaxes(title_text="tokens", row=1, col=col)
        fig.update_yaxes(title_text="requests", row=1, col=col)
    fig.update_layout(title=f"Request lengths: {view['requests']} requests from {view['source']}")
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
    ("lengths", "Request lengths", _lengths),
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


