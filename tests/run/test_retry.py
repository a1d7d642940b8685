"""Queueing a config again (autotune/run/queue.py's requeue) on a real SQLite study: the retry is the same config
with a clean slate."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.run import queue
from autotune import record
from autotune.testing.studies import SPEC_SPACE, write_study
from tests.support.cli import run_cli
from tests.support.study_texts import DRAFT, STEPS, TOPK


def test_a_retry_starts_without_the_killed_attempts_constraint_values(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s", direction="maximize")
    killed = study.ask({"speculative-num-steps": IntDistribution(1, 8)})
    # measured, found outside the study's limit (max_running_requests below min_running_requests), then killed
    # before the trial was told; the user relaxes the limit and starts the tuner again, which fails and requeues it
    killed.set_constraint("constraints", 1.0)
    killed.set_constraint("failed", 0.0)
    study.tell(killed, state=TrialState.FAIL)
    queue.requeue(study, study.trials[0])

    retry = study.ask()
    assert retry.params == killed.params
    assert record.retry_of(retry) == killed.number
    retry.set_constraint("constraints", 0.0)   # within the relaxed limit this time
    retry.set_constraint("failed", 0.0)
    study.tell(retry, 1.5)
    again = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}").trials[1]
    assert again.system_attrs["constraints:constraints"] == 0.0, "the retry kept the killed attempt's value"
    assert again.system_attrs["constraints:failed"] == 0.0


def test_a_queued_retry_shows_the_flags_it_will_run_and_no_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`autotune status` of a config queued again after a stop request: the server flags the attempt ran (not the
    sampler's internal fill fraction of a dependent flag), and no reason: it has not run yet."""
    path = write_study(tmp_path, space=SPEC_SPACE)   # draft tokens depend on steps and topk: drawn as a fill fraction
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 't.db'}", study_name="t", direction="maximize")
    record.study.describe(study, "weighted", path.read_text(), str(path))
    cut = study.ask({"speculative-num-steps": IntDistribution(1, 8),
                     "speculative-eagle-topk": CategoricalDistribution([1, 2, 4, 8]),
                     "speculative-num-draft-tokens.fill": FloatDistribution(0.0, 1.0)})
    record.write.candidate(cut, {STEPS: cut.params[STEPS], TOPK: cut.params[TOPK], DRAFT: 5})
    record.write.failed(cut, "interrupted", "SIGTERM received")
    study.tell(cut, state=TrialState.FAIL)
    queue.requeue(study, study.trials[0])

    code, out, err = run_cli(monkeypatch, capsys, "status", "--study", str(path))
    assert code == 0, err
    row = next(line for line in out.splitlines() if "WAITING" in line)
    assert f"{STEPS}={cut.params[STEPS]} {TOPK}={cut.params[TOPK]} {DRAFT}=5" in row, row
    assert ".fill" not in row and "constraints" not in row, row
    code, out, err = run_cli(monkeypatch, capsys, "status", "--study", str(path), "--json")
    queued = json.loads(out)["trials"][1]
    assert queued["state"] == "WAITING" and queued["reason"] is None and ".fill" not in str(queued["params"])
