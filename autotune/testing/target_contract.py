"""The interface every target kind keeps, as tests (after optuna's testing/pytest_storages.py): deploy a server and
read its log, stop it, place a file the server reads, run a program with the engine's python.

A test module runs the suite for a kind by subclassing ``TargetContract`` with a ``target`` fixture (a target of
that kind on this machine, an SSH kind through an sshd on 127.0.0.1, stopped and closed after the test); the server
it deploys is the SGLang emulator on the target's ``server_port``:

    class TestLocal(TargetContract):
        @pytest.fixture
        def target(self):
            ...
"""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from autotune.engines import SGLang
from autotune.run.health import wait_ready
from autotune.targets import KINDS, Target

#: seconds a deployed emulator may take to answer ready
READY_TIMEOUT = 60.0


def emulator_argv(port: int) -> list[str]:
    """The SGLang emulator on ``port``, started fast."""
    return [sys.executable, "-m", "autotune.sim", "--port", str(port), "--host", "127.0.0.1", "--model-path", "/m",
            "--tp-size", "4", "--speculative-algorithm", "EAGLE", "--sim-time-scale", "0.01", "--sim-speedup", "20"]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _eventually(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class TargetContract:
    """The suite; a subclass supplies the ``target`` fixture."""

    @pytest.fixture
    def target(self) -> Target:
        raise NotImplementedError("a test module gives each target kind its target")

    def test_registered_under_its_kind(self, target: Target) -> None:
        assert KINDS[target.spec.kind].target is type(target)

    def test_deploy_logs_and_stop(self, target: Target, tmp_path: Path) -> None:
        engine = SGLang()
        log = tmp_path / "logs" / "trial-0.log"
        deployment = target.deploy(emulator_argv(target.spec.server_port), {"AUTOTUNE_CONTRACT": "1"}, log)
        wait_ready(deployment, engine, interval=0.05, timeout=READY_TIMEOUT)
        assert deployment.exit_status() is None
        assert deployment.base_url == target.base_url()
        assert httpx.get(target.base_url() + "/server_info", timeout=5).status_code == 200

        def logged() -> bool:
            deployment.read_log()
            return log.is_file() and "fired up and ready to roll" in log.read_text()

        assert _eventually(logged), "the server's log reaches the deployment's log file"
        target.stop()
        assert not _listening(target.spec.server_port), "a stopped server leaves its port"
        assert _eventually(lambda: deployment.exit_status() is not None), "a stopped server has an exit status"

    def test_place_file_where_the_server_reads_it(self, target: Target, tmp_path: Path) -> None:
        beside = tmp_path / "study" / "schedule.json"
        for data in (b'{"first": 1}\n', b'{"second": 2}\n'):
            path = target.place_file("schedule.json", data, beside)
            assert Path(path).is_absolute() and Path(path).read_bytes() == data  # the suite's hosts are this machine

    def test_run_engine_program_with_the_engines_python(self, target: Target) -> None:
        question = {"op": "resolve", "module": "autotune_contract_no_engine", "factory": "make", "resolve": "resolve",
                    "result": "result", "args": [], "env": {}, "model_config": None, "platform": None,
                    "override": None}
        done = target.run_engine_program(sys.executable, "engine_resolve", json.dumps(question).encode(), timeout=60)
        assert done.status == 0, done
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["answer"] == "unavailable" and "autotune_contract_no_engine" in answer["reason"]

    def test_run_engine_program_ends_by_its_deadline(self, target: Target) -> None:
        question = {"op": "resolve", "module": "subprocess", "factory": "call", "resolve": "x", "result": "x",
                    "args": ["sleep", "30"], "env": {}, "model_config": None, "platform": None, "override": None}
        start = time.monotonic()
        done = target.run_engine_program(sys.executable, "engine_resolve", json.dumps(question).encode(), timeout=1)
        assert done.status == 124 and time.monotonic() - start < 20

    def test_rendered_names_a_file_and_its_text(self, target: Target) -> None:
        name, text = target.rendered(emulator_argv(target.spec.server_port), {"AUTOTUNE_CONTRACT": "1"})
        assert name and "/" not in name and "autotune.sim" in text
