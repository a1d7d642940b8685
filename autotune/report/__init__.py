"""A study as files a person reads (`autotune report`): trials.csv (table.py), summary.md (summary.py) and HTML
plots (plots.py). Nothing here deploys or writes to the study."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.errors import UserError
from autotune.report.plots import PlotResult, write_plots
from autotune.report.summary import summary_markdown
from autotune.report.table import trials_frame
from autotune.studyfile.spec import StudySpec

__all__ = ["PlotResult", "Report", "summary_markdown", "trials_frame", "write_report"]


@dataclass
class Report:
    out: Path
    rows: int
    columns: list[str]
    plots: list[PlotResult] = field(default_factory=list)


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
