"""ssh-process target through a real sshd: deploy, readiness, logs, exit status, stop, orphans, port_busy, tunnel,
quoting."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import TrialFailure, UserError
from autotune.run.health import wait_ready
from autotune.tables import Reader
from autotune.targets import make_target, parse_target
from autotune.targets.process import ProcessTarget
from autotune.targets.systemd import SystemdTarget
from tests.support.ssh import children, cmdline, pid_alive, server_argv, wait_for

ENGINE = SGLang()
READY = "/health_generate"  # SGLang answers 200 here once it can generate


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_pid(deployment: object) -> int:
    """The server process: the one child of the remote supervisor."""
    pgid = deployment.pgid  # type: ignore[attr-defined]
    return int(wait_for(lambda: children(pgid) and children(pgid)[0]))  # type: ignore[arg-type]


def deploy_ready(target: ProcessTarget, argv: list[str], log: Path, env: dict[str, str] | None = None):
    deployment = target.deploy(argv, env or {}, log)
    wait_ready(deployment, ENGINE, interval=0.05, timeout=60)
    return deployment


def test_deploy_wait_ready_read_log_stop(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec(tunnel=True)
    target = cleanup(ProcessTarget(spec))
    log = tmp_path / "logs" / "trial-0.log"
    deployment = deploy_ready(target, server_argv(spec.server_port), log, {"AUTOTUNE_TEST_ENV": "x y"})

    # the server log comes over SFTP into the local log file (SGLang, like the emulator, answers ready a moment
    # before it logs the line)
    def logged() -> bool:
        deployment.read_log()
        return "fired up and ready to roll" in log.read_text()

    wait_for(logged, timeout=10)
    # through the tunnel: a local port that is not the server's
    assert deployment.base_url == target.base_url()
    local_port = int(deployment.base_url.rsplit(":", 1)[1])
    assert local_port != spec.server_port
    assert httpx.get(deployment.base_url + READY, timeout=5).status_code == 200
    assert deployment.exit_status() is None

    pid = server_pid(deployment)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"AUTOTUNE_TEST_ENV=x y" in environ
    # its own session and process group, recorded in the pid file; one log file per start in workdir
    assert os.getsid(pid) == deployment.pgid == os.getpgid(pid)
    assert os.readlink(f"/proc/{pid}/cwd") == target.directory  # relative paths in its command line start there
    record = json.loads(Path(target.pid_file).read_text())
    assert record["pgid"] == deployment.pgid
    assert Path(deployment.remote_log).is_file()

    target.stop()
    assert not pid_alive(pid)
    assert not port_open(spec.server_port)
    assert not Path(target.pid_file).exists()
    status = deployment.exit_status()
    assert status is not None and status in (0, -signal.SIGTERM)


def test_exit_status_tells_signals_from_exit_codes(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec()))
    d = target.deploy(["sh", "-c", "echo started; exit 137"], {}, tmp_path / "a.log")
    assert wait_for(lambda: d.exit_status() is not None)
    assert d.exit_status() == 137
    assert "started" in d.read_log()

    d = target.deploy(["sh", "-c", "echo started; kill -9 $$"], {}, tmp_path / "b.log")
    assert wait_for(lambda: d.exit_status() is not None)
    assert d.exit_status() == -signal.SIGKILL

    # a real server killed from outside
    spec = target.spec
    d = deploy_ready(target, server_argv(spec.server_port), tmp_path / "c.log")
    os.kill(server_pid(d), signal.SIGKILL)
    assert wait_for(lambda: d.exit_status() is not None)
    assert d.exit_status() == -signal.SIGKILL


def test_server_that_fails_at_startup_is_caught_by_wait_ready(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec()
    target = cleanup(ProcessTarget(spec))
    # one GPU cannot hold the 122B model's weights: the emulator fails like SGLang does
    d = target.deploy(server_argv(spec.server_port, "--tp-size", "1"), {}, tmp_path / "a.log")
    with pytest.raises(TrialFailure) as e:
        wait_ready(d, ENGINE, interval=0.05, timeout=60)
    assert e.value.reason == "oom_startup"
    assert "out of memory" in (tmp_path / "a.log").read_text()
    assert wait_for(lambda: d.exit_status() is not None, timeout=20)


def test_orphan_of_a_killed_tuner_is_stopped_by_the_next_deploy(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec()
    first = ProcessTarget(spec)
    d1 = deploy_ready(first, server_argv(spec.server_port), tmp_path / "1.log")
    orphan = server_pid(d1)
    first.close()  # the tuner is gone; the server keeps running (and holds the port)
    assert pid_alive(orphan) and port_open(spec.server_port)

    second = cleanup(ProcessTarget(spec))
    d2 = deploy_ready(second, server_argv(spec.server_port), tmp_path / "2.log")
    assert not pid_alive(orphan)
    assert server_pid(d2) != orphan


def test_foreign_port_holder_is_port_busy_and_named(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec()
    target = cleanup(ProcessTarget(spec))
    with socket.socket() as foreign:
        foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        foreign.bind(("127.0.0.1", spec.server_port))
        foreign.listen(1)
        started = time.monotonic()
        with pytest.raises(TrialFailure) as e:
            target.deploy(server_argv(spec.server_port), {}, tmp_path / "a.log")
        assert time.monotonic() - started < 10
    assert e.value.reason == "port_busy"
    assert f"pid {os.getpid()}" in e.value.detail
    assert str(spec.server_port) in e.value.detail


def test_missing_server_command_is_deploy_failed(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec()))
    with pytest.raises(TrialFailure) as e:
        target.deploy(["/nonexistent/bin/server", "--port", "1"], {}, tmp_path / "a.log")
    assert e.value.reason == "deploy_failed"
    assert "/nonexistent/bin/server" in e.value.detail


def _one_generation(base_url: str, max_tokens: int = 32) -> tuple[int, float]:
    request = ENGINE.generation_request("Hello", max_tokens, 0.0)
    started = time.perf_counter()
    tokens = 0
    with httpx.Client(base_url=base_url, timeout=30) as client, \
            client.stream("POST", request.path, json=request.body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                update = ENGINE.parse_event(json.loads(line[6:]))
                tokens = update.tokens or tokens
    return tokens, time.perf_counter() - started


def test_tunnel_on_and_off(make_spec, cleanup, tmp_path: Path) -> None:
    tunneled = make_spec(tunnel=True)
    direct = replace(tunneled, tunnel=False)
    target = cleanup(ProcessTarget(tunneled))
    deploy_ready(target, server_argv(tunneled.server_port), tmp_path / "a.log")
    other = cleanup(ProcessTarget(direct))
    assert other.base_url() == f"http://127.0.0.1:{tunneled.server_port}"
    assert target.base_url() != other.base_url()

    timings = {}
    for name, url in (("tunnel", target.base_url()), ("direct", other.base_url())):
        tokens, seconds = _one_generation(url)
        assert tokens == 32
        timings[name] = seconds
    print(f"one /generate of 32 tokens: tunnel {timings['tunnel'] * 1000:.1f} ms, "
          f"direct {timings['direct'] * 1000:.1f} ms")

    # concurrent streams share the one SSH connection
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(_one_generation(target.base_url(), 16)[0]))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [16] * 8


NASTY = "a b 'c' \"d\" $(touch {m}) `touch {m}` ; touch {m} | & > {m}.2 $HOME %s %% \\ end"


def test_arguments_reach_the_server_literally(make_spec, cleanup, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    nasty = NASTY.format(m=marker)
    spec = make_spec()
    target = cleanup(ProcessTarget(spec))
    argv = server_argv(spec.server_port, "--served-model-name", nasty)
    d = deploy_ready(target, argv, tmp_path / "a.log", {"AUTOTUNE_TEST_Q": nasty})
    pid = server_pid(d)
    assert cmdline(pid) == argv
    assert f"AUTOTUNE_TEST_Q={nasty}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not marker.exists() and not Path(f"{marker}.2").exists()


def test_make_target_and_new_spec_keys(tmp_path: Path) -> None:
    v = Reader(tmp_path / "s.toml")
    table = {"kind": "ssh-systemd", "host": "gpu1", "unit": "sglang.service", "unit_dir": "/etc/systemd/system",
             "reconnect_timeout": 5, "password_env": "GPU1_SSH_PASSWORD"}
    spec = parse_target("default", table, "target", v)
    assert (spec.unit_dir, spec.reconnect_timeout, spec.password_env) == ("/etc/systemd/system", 5, "GPU1_SSH_PASSWORD")
    assert isinstance(make_target(spec), SystemdTarget)
    process = {k: val for k, val in table.items() if k not in ("unit", "unit_dir")}
    assert isinstance(make_target(parse_target("default", {**process, "kind": "ssh-process"}, "target", v)),
                      ProcessTarget)
    with pytest.raises(Exception, match="password_env"):
        parse_target("default", {"kind": "ssh-process", "host": "gpu1", "password_env": "hunter2 !"}, "target", v)
    with pytest.raises(Exception, match=r"\[target\] unit: only applies to kind = ssh-systemd, not 'ssh-process'"):
        parse_target("default", {**table, "kind": "ssh-process"}, "target", v)


def test_preflight_checks_the_target_before_a_study_starts(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec()
    target = cleanup(ProcessTarget(spec))
    target.preflight(server_argv(spec.server_port))
    assert Path(target.directory).is_dir()
    with pytest.raises(UserError, match="server command not found: /nonexistent/bin/server"):
        target.preflight(["/nonexistent/bin/server"])
    with pytest.raises(UserError, match="server command not found: no-such-server-command"):
        target.preflight(["no-such-server-command"])
    unknown = cleanup(ProcessTarget(make_spec(known_hosts=str(tmp_path / "empty_known_hosts"))))
    with pytest.raises(UserError, match="not known"):
        unknown.preflight(server_argv(spec.server_port))


def test_a_file_the_server_reads_goes_to_the_targets_directory_on_the_host(make_spec, cleanup,
                                                                            tmp_path: Path) -> None:
    # an adaptive schedule: the server on the host reads it from there, not from this machine
    spec = make_spec(tunnel=True)
    target = cleanup(ProcessTarget(spec))
    schedule = {"1": {"candidate_steps": [3]}, "9": {"candidate_steps": [1, 2]}}
    local = tmp_path / "here" / "s-adaptive-trial-0004.json"
    path = target.place_file(local.name, json.dumps(schedule).encode(), local)
    assert path == f"{target.directory}/s-adaptive-trial-0004.json" and not local.exists()
    assert json.loads(target.read_file(local.name)) == schedule
    argv = server_argv(spec.server_port, "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "3", "--speculative-adaptive",
                       "--speculative-adaptive-config", path)
    deployment = deploy_ready(target, argv, tmp_path / "trial-4.log")
    info = httpx.get(f"{deployment.base_url}/server_info", timeout=5).json()
    assert info["speculative_adaptive"] is True and info["speculative_adaptive_config"] == path
