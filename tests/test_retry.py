"""Queueing a config again (autotune/queue.py's requeue) on a real SQLite study: the retry is the same config
with a clean slate."""
from __future__ import annotations

from pathlib import Path

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from autotune import queue, record


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
