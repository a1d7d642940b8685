"""A server that is not the one requested is never measured: a foreign process on the port, or a stale server
that answers with other args (a readiness race users of other tuners report)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import optuna
import pytest

from autotune.run.trial import Objective, ServerLaunch
from autotune.run.plan import make_plan
from autotune.studyfile.spec import read_study_file
from autotune.targets.base import Deployment, Target
from autotune.targets.completed import Completed
from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from tests.support.cli import run_autotune, status
from tests.support.emulator import start_emulator
from tests.support.port_holder import holding


class StaleTarget(Target):
    """A target whose restart silently did nothing: the old server keeps answering on the port."""

    def __init__(self, spec, url: str, log: Path) -> None:  # type: ignore[no-untyped-def]
        super().__init__(spec)
        self.url = url
        self.log = log

    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> Deployment:
        target = self

        class Old(Deployment):
            base_url = target.url
            log_path = target.log

            def exit_status(self) -> int | None:
                return None

            def read_log(self) -> str:
                return ""

        return Old()

    def stop(self) -> None:
        pass

    def base_url(self) -> str:
        return self.url

    def lock(self, holder: str) -> AbstractContextManager[None]:
        return nullcontext()

    def run_engine_program(self, command: str, program: str, stdin: bytes, timeout: float,
                           should_stop: Callable[[], bool] = lambda: False) -> Completed:
        return Completed(127, "", "a stale target runs no programs")

    def place_file(self, name: str, data: bytes, local: Path) -> str:
        raise AssertionError("a stale target is given no file")


def test_stale_server_with_other_args_is_not_measured(tmp_path: Path) -> None:
    port = free_port()
    old = start_emulator(port, steps=1, topk=1, draft=2)
    try:
        plan = make_plan(read_study_file(str(write_study(tmp_path, port=port))))
        (tmp_path / "old.log").write_text("")
        target = StaleTarget(plan.target, f"http://127.0.0.1:{port}", tmp_path / "old.log")
        objective = Objective(plan, ServerLaunch(plan, target, should_stop=lambda: False))
        study = optuna.create_study(direction="maximize")
        study.enqueue_trial({"speculative-num-steps": 3, "speculative-eagle-topk": 1,
                             "speculative-num-draft-tokens": 4})
        study.optimize(objective, n_trials=1)
        t = study.trials[0]
        assert t.state == optuna.trial.TrialState.FAIL
        assert t.user_attrs["reason"] == "wrong_args"
        assert "speculative-num-steps: requested 3, running 1" in t.user_attrs["detail"]
        assert "metrics" not in t.user_attrs
        # an infrastructure failure: the same config is queued once more
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == 0
    finally:
        old.kill()


@pytest.mark.slow
def test_foreign_process_on_the_port_is_named_and_never_killed(tmp_path: Path) -> None:
    port = free_port()
    with holding([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port) as squatter:
        study = write_study(tmp_path, launches=1, port=port)
        r = run_autotune("run", "--study", str(study), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        trials = status(study)["trials"]
        assert trials[0]["reason"] == "port_busy"
        assert f"port {port} on 127.0.0.1 is held by pid {squatter.pid}" in trials[0]["detail"]
        assert "http.server" in trials[0]["detail"]
        assert squatter.poll() is None, "autotune killed a process it did not start"
