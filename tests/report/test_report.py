"""`autotune report` and `autotune best --format` on a real study; the plots and the summary on synthetic studies
(single- and multi-objective, empty) without any server."""
from __future__ import annotations

import datetime as dt
import json
import math
import shlex
import warnings
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotune import report
from autotune.targets.unitfile import exec_line
from tests.support.cli import run_autotune, run_cli
from tests.support.small_study import small_study, small_study_trials

PLOTS = ("history", "importances", "slice", "contour", "throughput", "timeline")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_study(tmp_path_factory)


@pytest.fixture(scope="module")
def out(study: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("report") / "report"
    r = run_autotune("report", "--study", str(study), "--out", str(directory), cwd=study.parent)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Traceback" not in r.stderr
    return directory, r.stdout


def _same(a: object, b: object) -> bool:
    if b is None:
        return a is None or (isinstance(a, float) and math.isnan(a))
    if isinstance(b, float):
        return math.isclose(float(a), b, rel_tol=1e-9)  # type: ignore[arg-type]
    return a == b or str(a) == str(b)


def test_trials_csv_matches_status(out: tuple[Path, str]) -> None:
    directory, _ = out
    frame = pd.read_csv(directory / "trials.csv")
    trials = small_study_trials()
    assert list(frame["number"]) == [t["number"] for t in trials]
    params = sorted({p for t in trials for p in t["params"]})
    metrics = sorted({m for t in trials for m, v in t["metrics"].items() if not isinstance(v, dict)})
    for column in ("number", "state", "value", "value_ci_low", "value_ci_high", "reason", "stage", "duration_s",
                   "baseline", "reused_from", "retry_of", "target", "command",
                   *(f"params_{p}" for p in params), *(f"metrics_{m}" for m in metrics),
                   "metrics_level_output_tok_s_1", "metrics_level_output_tok_s_4"):
        assert column in frame.columns, column
    rows = frame.to_dict("records")
    for row, t in zip(rows, trials, strict=True):
        assert row["state"] == t["state"]
        assert _same(row["value"], t["value"]), (row["value"], t["value"])
        assert _same(row["reason"], t["reason"])
        assert _same(row["reused_from"], t["reused_from"])
        assert bool(row["baseline"]) == t["baseline"]
        assert row["target"] == t["target"]
        for p in params:
            assert _same(row[f"params_{p}"], t["params"].get(p)), (p, row[f"params_{p}"], t["params"].get(p))
        for m in metrics:
            assert _same(row[f"metrics_{m}"], t["metrics"].get(m)), m
    assert any(r["state"] == "PRUNED" and r["reason"] == "crashed" and r["stage"] == "waiting" for r in rows)


def test_every_plot_is_written(out: tuple[Path, str]) -> None:
    directory, stdout = out
    for name in PLOTS:
        path = directory / f"{name}.html"
        assert path.exists() and path.stat().st_size > 0, name
        text = path.read_text()
        assert "plotly" in text.lower() and "Plotly.newPlot" in text, name
    assert (directory / "plotly.min.js").stat().st_size > 1_000_000  # shared, so the report opens offline
    assert not (directory / "pareto.html").exists()
    assert "skipped pareto: a single-objective study" in stdout


def test_summary(out: tuple[Path, str], study: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    directory, _ = out
    text = (directory / "summary.md").read_text()
    best = json.loads(run_cli(monkeypatch, capsys, "best", "--study", str(study), "--json")[1])
    assert f"Trial **{best['number']}**" in text
    assert shlex.join(best["command"]) in text, "the best config's full command line"
    if best["number"] == 0:  # a noisy short measurement can leave the baseline on top
        assert "(the baseline itself)" in text
    else:
        assert "objective vs the baseline (trial 0): " in text and "95% CI" in text
    assert "## Top 5" in text and "## Failures by reason" in text
    assert "| crashed | " in text
    reused = sum(t["reused_from"] is not None for t in small_study_trials())
    assert reused >= 1
    assert "deployed nothing" in text and f"{reused} reused the measurement" in text
    for name in PLOTS:
        assert f"]({name}.html)" in text


def test_best_formats(study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def best(*args: str) -> str:
        code, out, err = run_cli(monkeypatch, capsys, "best", "--study", str(study), *args)
        assert code == 0, err
        return out

    as_json = json.loads(best("--format", "json"))
    assert set(as_json) == {"number", "params", "value", "values", "metrics", "command", "estimate",
                            "predictions", "tie"}
    estimate = as_json["estimate"]  # the config's value pooled over its launches, with its 95% interval
    assert estimate["low"] <= estimate["value"] <= estimate["high"] and as_json["number"] in estimate["trials"]
    assert json.loads(best("--json")) == as_json
    assert shlex.split(best("--format", "args")) == as_json["command"]
    unit = best("--format", "unit")
    assert f"ExecStart={exec_line(as_json['command'])}\n" in unit
    assert "[Service]" in unit and "[Install]" in unit and "WantedBy=multi-user.target" in unit
    code, _, err = run_cli(monkeypatch, capsys, "best", "--study", str(study), "--format", "yaml")
    assert code == 2 and "Traceback" not in err


# -- synthetic studies: no server, just the drawing ---------------------------------------------------------------

SPACE = {"speculative-num-steps": IntDistribution(1, 8),
         "speculative-eagle-topk": CategoricalDistribution([1, 2, 4, 8])}


def _trial(number: int, steps: int, topk: int, single: float | None, concurrent: float | None,
           values: list[float] | None, **attrs: object) -> optuna.trial.FrozenTrial:
    start = dt.datetime(2026, 12, 2, 12, 0) + dt.timedelta(minutes=number)
    levels = None
    if single is not None and concurrent is not None:
        levels = [{"concurrency": 1, "output_tok_s": single, "decode_tok_s": single * 1.05,
                   "decode_tok_s_rel_ci": 0.03, "output_tok_s_rel_ci": 0.02},
                  {"concurrency": 8, "output_tok_s": concurrent, "decode_tok_s": single / 2,
                   "decode_tok_s_rel_ci": 0.02, "output_tok_s_rel_ci": 0.03}]
    user_attrs = {"metrics": {"single_tok_s": single, "concurrent_tok_s": concurrent, "concurrency": 8,
                              "max_running_requests": 16} if single else {},
                  "levels": levels, "command": ["python3", "-m", "sglang.launch_server", "--x", str(number)],
                  "target": "default", **attrs}
    failed = values is None
    t = create_trial(state=TrialState.PRUNED if failed else TrialState.COMPLETE, values=values,
                     params={"speculative-num-steps": steps, "speculative-eagle-topk": topk}, distributions=SPACE,
                     user_attrs={k: v for k, v in user_attrs.items() if v is not None},
                     constraints={"failed": 1.0 if failed else 0.0})
    t.datetime_start, t.datetime_complete = start, start + dt.timedelta(seconds=40)
    return t


def _pareto_study() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "maximize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["single_tok_s", "concurrent_tok_s"])
    study.set_user_attr("objective", "pareto")
    study.set_user_attr("reference", {"single_tok_s": 100.0, "concurrent_tok_s": 800.0})
    rows = [(1, 1, 100.0, 800.0, {"baseline": True}), (3, 2, 150.0, 700.0, {}), (5, 4, 170.0, 500.0, {}),
            (8, 8, None, None, {"reason": "oom_startup", "stage": "waiting"}), (2, 1, 130.0, 900.0, {}),
            (2, 1, 130.0, 900.0, {"reused_from": 4})]
    for i, (steps, topk, s, c, attrs) in enumerate(rows):
        study.add_trial(_trial(i, steps, topk, s, c, [s, c] if s else None, **attrs))
    return study


def test_pareto_study_draws_its_front_and_ranks_by_gain(tmp_path: Path) -> None:
    result = report.write_report(_pareto_study(), None, tmp_path)
    drawn = {p.name for p in result.plots if p.path}
    assert drawn == {"history", "importances", "slice", "contour", "pareto", "throughput", "timeline"}, result.plots
    assert "Plotly.newPlot" in (tmp_path / "pareto.html").read_text()
    frame = pd.read_csv(tmp_path / "trials.csv")
    assert {"values_single_tok_s", "values_concurrent_tok_s"} <= set(frame.columns)
    assert len(frame) == 6
    text = (tmp_path / "summary.md").read_text()
    assert "Trial **4**" in text  # sqrt(1.3 * 1.125) beats sqrt(1.7 * 0.625) and sqrt(1.5 * 0.875)
    assert "single_tok_s vs the baseline (trial 0): +30.0%" in text
    assert "| oom_startup | 1 |" in text and "1 reused the measurement" in text


def test_plots_that_cannot_be_drawn_are_skipped_with_a_reason(tmp_path: Path) -> None:
    empty = optuna.create_study(direction="maximize")
    result = report.write_report(empty, None, tmp_path / "empty")
    assert result.rows == 0 and not [p for p in result.plots if p.path]
    assert all(p.note for p in result.plots)
    assert "No feasible measured trial yet." in (tmp_path / "empty" / "summary.md").read_text()

    one = optuna.create_study(direction="maximize")
    one.add_trial(_trial(0, 1, 1, 100.0, 800.0, [1.0], baseline=True))
    one.add_trial(_trial(1, 8, 8, None, None, None, reason="oom_startup"))
    result = report.write_report(one, None, tmp_path / "one")
    notes = {p.name: p.note for p in result.plots if not p.path}
    assert "at least 2 completed trials" in notes["importances"]
    assert "contour" in notes and "pareto" in notes
    assert {p.name for p in result.plots if p.path} >= {"history", "timeline", "throughput"}


def test_gain_over_the_baseline_combines_both_intervals(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(_trial(0, 1, 1, 100.0, 800.0, [1.0], baseline=True, value_ci=[0.97, 1.03]))
    study.add_trial(_trial(1, 3, 2, 130.0, 880.0, [1.2], value_ci=[1.14, 1.26]))
    report.write_report(study, None, tmp_path)
    text = (tmp_path / "summary.md").read_text()
    # relative half-widths 5% and 3% combine to sqrt(0.05^2 + 0.03^2) = 5.83% of the ratio 1.2
    assert "- objective vs the baseline (trial 0): +20.0% (95% CI +13.0% to +27.0%)" in text
    # per-level intervals: 2% and 2% for the single-stream rate
    assert "- single_tok_s vs the baseline (trial 0): +30.0% (95% CI +26.3% to +33.7%)" in text
