"""Connection faults against a private sshd: a cut connection is reopened and the deployment is still reachable; an
unreachable host fails with ssh_lost after the backoff budget and never hangs; the lock lives on the target."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import TrialFailure, UserError
from autotune.run.health import wait_ready
from autotune.targets.process import ProcessTarget
from autotune.targets.programs import hostlock
from tests.support.ssh import server_argv, wait_for

ENGINE = SGLang()
READY = "/health_generate"  # SGLang answers 200 here once it can generate
REPO = Path(__file__).resolve().parents[2]


def ready_target(spec, cleanup, tmp_path: Path):
    target = cleanup(ProcessTarget(spec))
    deployment = target.deploy(server_argv(spec.server_port), {}, tmp_path / "trial.log")
    wait_ready(deployment, ENGINE, interval=0.05, timeout=60)
    return target, deployment


def test_cut_connection_is_reopened_and_the_deployment_survives(make_private_spec, private_sshd, cleanup,
                                                                tmp_path: Path) -> None:
    target, deployment = ready_target(make_private_spec(tunnel=True), cleanup, tmp_path)
    generation = target.conn.generation
    assert not deployment.reconnected()
    assert private_sshd.kill_connections() > 0  # the sshd processes serving our connection are gone

    # the next call reconnects; the server (its own session on the target) kept running
    assert deployment.exit_status() is None
    assert target.conn.generation == generation + 1
    assert deployment.reconnected()
    assert isinstance(deployment.read_log(), str)
    # the same base_url still works: the tunnel's local port outlives the connection
    assert httpx.get(deployment.base_url + READY, timeout=10).status_code == 200
    wait_ready(deployment, ENGINE, interval=0.05, timeout=10)


def test_cut_connection_seen_first_by_the_tunnel(make_private_spec, private_sshd, cleanup, tmp_path: Path) -> None:
    target, deployment = ready_target(make_private_spec(tunnel=True), cleanup, tmp_path)
    generation = target.conn.generation
    private_sshd.kill_connections()
    # the connection is seen dead (or already dropped by the tuner's side, which then has no client until it reconnects)
    client = target.conn._client
    wait_for(lambda: target.conn._client is not client or not client.get_transport().is_active(), timeout=5)
    # an HTTP request through the forward reconnects by itself
    assert httpx.get(deployment.base_url + READY, timeout=20).status_code == 200
    assert target.conn.generation == generation + 1
    assert deployment.exit_status() is None


def test_unreachable_target_is_ssh_lost_after_the_backoff_budget(make_private_spec, private_sshd, cleanup,
                                                                 tmp_path: Path) -> None:
    spec = make_private_spec(tunnel=False, connect_timeout=1.0, reconnect_timeout=2.0)
    _, deployment = ready_target(spec, cleanup, tmp_path)
    private_sshd.pause()  # new connections hang before the SSH banner, like a host behind a dead route
    private_sshd.kill_connections()
    started = time.monotonic()
    try:
        with pytest.raises(TrialFailure) as e:
            deployment.exit_status()
        elapsed = time.monotonic() - started
    finally:
        private_sshd.resume()
    assert e.value.reason == "ssh_lost"
    assert "within 2 s" in e.value.detail and "attempt" in e.value.detail
    assert elapsed < spec.reconnect_timeout + spec.connect_timeout + 3
    # once the host answers again, the next call reconnects and the server is still there
    assert deployment.exit_status() is None


def test_silent_connection_is_detected_by_timeout_and_probe(make_private_spec, private_sshd, cleanup,
                                                            tmp_path: Path) -> None:
    target, deployment = ready_target(make_private_spec(tunnel=False), cleanup, tmp_path)
    target.conn.sftp_timeout = 1.0
    target.conn.probe_timeout = 1.0
    serving = private_sshd.connection_pids()
    for pid in serving:  # the connection stays open but nothing answers on it any more
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        assert deployment.exit_status() is None  # timed out, probed, reconnected, retried
    finally:
        for pid in serving:  # SIGKILL ends stopped processes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - started < 10


HOLDER = """
import json, sys, time
from autotune.targets.process import ProcessSpec, ProcessTarget
target = ProcessTarget(ProcessSpec(**json.loads(sys.argv[1])))
lock = target.lock("study-A")
lock.__enter__()
print("held", flush=True)
time.sleep(120)
"""


def test_lock_on_the_target_refuses_a_second_holder_until_the_first_dies(make_spec, cleanup) -> None:
    spec = make_spec()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(asdict(spec))], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = cleanup(ProcessTarget(spec))
        with pytest.raises(UserError) as e, other.lock("study-B"):
            pass
        message = str(e.value)
        assert "busy" in message and "study-A" in message and f"pid {holder.pid}" in message
    finally:
        holder.kill()  # the holder dies without releasing anything
        holder.wait()

    def free() -> bool:
        try:
            with other.lock("study-B"):
                return True
        except UserError:
            return False

    wait_for(free, timeout=15, interval=0.2)


def test_lock_is_taken_again_after_a_reconnection(make_private_spec, private_sshd, cleanup) -> None:
    spec = make_private_spec()
    first = cleanup(ProcessTarget(spec))
    with first.lock("study-A"):
        private_sshd.kill_connections()  # the remote flock holder dies with the connection
        wait_for(lambda: not first.conn._client.get_transport().is_active(), timeout=5)
        first.conn.connect()  # reconnects and takes the lock again
        second = cleanup(ProcessTarget(spec))
        with pytest.raises(UserError, match="study-A"), second.lock("study-B"):
            pass
    with second.lock("study-B"):  # released on exit
        pass


def _holder_pid(spec) -> int | None:
    """The pid of the process holding the target's lock on the host (this machine), as the kernel reports it."""
    return hostlock.ask(f"port:{spec.server_port}").get("pid")  # type: ignore[return-value]


def test_lock_holder_killed_on_the_target_is_replaced(make_spec, cleanup) -> None:
    spec = make_spec()
    first = cleanup(ProcessTarget(spec))
    with first.lock("study-A"):
        before = _holder_pid(spec)
        assert before
        os.kill(before, signal.SIGKILL)  # someone kills the holder process on the target; the connection lives on

        def relocked() -> bool:
            first.conn.exists(first.directory)  # any remote call runs the lock's watcher
            now = _holder_pid(spec)
            return bool(now) and now != before

        wait_for(relocked, timeout=10, interval=0.1)
        second = cleanup(ProcessTarget(spec))
        with pytest.raises(UserError, match="study-A"), second.lock("study-B"):
            pass
