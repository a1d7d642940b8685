"""Helpers of the SSH target tests: the emulator's command line on the 'remote' side (this machine), a test sshd
whose sessions see stand-in systemctl/journalctl/sudo (fake_systemd.py), target specs pointing at it, and a
stand-in systemd service. The fixtures that use them are in tests/ssh/conftest.py.

Setup this needs (CI does the same in .ci/run):
    apt-get update && apt-get install -y --no-install-recommends openssh-server
    mkdir -p /run/sshd            (done by SSHServer.start)
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


from autotune.targets import KINDS, TargetSpec
from autotune.testing.ports import free_port
from autotune.testing.sshd import SSHServer
from tests.support import requires
from autotune.testing.studies import write_study

FAKE_SYSTEMD = Path(__file__).resolve().parent / "fake_systemd.py"
REPO = Path(__file__).resolve().parents[2]
STAND_INS = ("systemctl", "journalctl", "sudo")


def server_argv(port: int, *extra: str) -> list[str]:
    """The command line of the SGLang emulator on ``port``, started fast (startup x0.01, tokens x20)."""
    return [sys.executable, "-m", "autotune.sim", "--port", str(port), "--host", "127.0.0.1",
            "--model-path", "/m", "--tp-size", "4", "--speculative-algorithm", "EAGLE",
            "--sim-time-scale", "0.01", "--sim-speedup", "20", *extra]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def cmdline(pid: int) -> list[str]:
    """The argv of process ``pid`` (the 'remote' side is this machine)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stand_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the stand-in systemctl/journalctl (tests/support/fake_systemd.py) on state under ``root`` directly."""
    return subprocess.run([sys.executable, str(FAKE_SYSTEMD), *args], capture_output=True, text=True,
                          env={**os.environ, "AUTOTUNE_FAKE_SYSTEMD": str(root)}, timeout=60, check=False)


def main_pid(root: Path, unit: str) -> int:
    """The MainPID the stand-in systemd reports for ``unit``."""
    out = stand_in(root, "systemctl", "show", unit, "-p", "MainPID", "--value").stdout
    return int(out.strip() or 0)


def _install_stand_ins(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in STAND_INS:
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SYSTEMD))} {tool} "
                        "\"$@\"\n")
        path.chmod(0o755)


def start_sshd(root: Path, systemd_root: Path) -> SSHServer:
    """A test sshd under ``root`` whose sessions see the stand-ins (state under ``systemd_root``); skips the test
    when OpenSSH is not installed."""
    requires.sshd()
    bin_dir = root / "bin"
    _install_stand_ins(bin_dir)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    server = SSHServer(root / "sshd", set_env={
        # stand-ins first: only sessions of this test sshd see them
        # (this Python's directory last: the target helpers need some python3 when the system has none)
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:{Path(sys.executable).parent}",
        "AUTOTUNE_FAKE_SYSTEMD": str(systemd_root),
        # bash sources $HOME/.bashrc for every ssh command; root's here runs `pyenv init` (~0.3 s a command).
        # An empty home keeps the tests fast; the remote side runs this checkout's Python by absolute path,
        # with this checkout's code (the emulator), whatever the installed copy is.
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
    })
    return server.start()


SpecFactory = Callable[..., TargetSpec]


def spec_factory(server: SSHServer, workdir: Path) -> SpecFactory:
    """``make(**overrides)``: a target spec (ssh-process unless ``kind`` says otherwise) for ``server``."""
    def make(**overrides: object) -> TargetSpec:
        values: dict[str, object] = {
            "name": "test", "host": server.host, "port": server.port, "user": "root",
            "key_file": str(server.user_key), "known_hosts": str(server.known_hosts), "workdir": str(workdir),
            "server_port": free_port(), "tunnel": True, "connect_timeout": 5.0, "reconnect_timeout": 10.0,
        }
        kind = str(overrides.pop("kind", "ssh-process"))
        values.update(overrides)
        return KINDS[kind].spec(**values)  # type: ignore[arg-type]
    return make


@dataclass
class Unit:
    name: str
    port: int
    original: list[str]
    path: Path
    text: str
    root: Path


def running_unit(systemd_root: Path) -> Iterator[Unit]:
    """A stand-in service that runs the 'original' server before tuning starts; stopped when the generator ends."""
    name = f"sglang-test-{uuid.uuid4().hex[:8]}.service"
    port = free_port()
    original = server_argv(port, "--served-model-name", "original-config")
    text = ("[Unit]\nDescription=SGLang under test\n\n[Service]\nType=simple\n"
            f"ExecStart={' '.join(original)}\nEnvironment=ORIGINAL_ENV=1\nRestart=no\n\n"
            "[Install]\nWantedBy=multi-user.target\n")
    path = systemd_root / "system" / name
    path.write_text(text)
    assert stand_in(systemd_root, "systemctl", "daemon-reload").returncode == 0
    assert stand_in(systemd_root, "systemctl", "start", name).returncode == 0
    wait_for(lambda: port_open(port), timeout=60)
    yield Unit(name, port, original, path, text, systemd_root)
    stand_in(systemd_root, "systemctl", "stop", name)


def remote_study(directory: Path, server: SSHServer, *, launches: int, target: str = "",
                 args: dict[str, object] | None = None, **kwargs: object) -> Path:
    """A small study whose [target] is the test sshd (the emulator runs 'remotely', through SSH). Tokens come at the
    model's own speed, 96 to a request: through the tunnel on a busy machine a request spends tens of milliseconds
    in the client and the forward, which made 48-token requests at twice the speed client-bound (26-33% of their
    time, against the 25% the tolerance allows), and a client_bound level is retried as a new trial."""
    path = write_study(directory, launches=launches, args={"sim-speedup": 1, **(args or {})},
                       workload="max_tokens = 96\nconcurrency = [1, 4]\nrequests = 4\n"
                                "window_generations = 1\nwarmup = 1\ntolerance = 0.5",
                       **kwargs)  # type: ignore[arg-type]
    text = path.read_text()
    port = re.search(r"server_port = (\d+)", text).group(1)  # type: ignore[union-attr]
    block = "\n".join([
        "[target]",
        target or 'kind = "ssh-process"',
        f'host = "{server.host}"',
        f"port = {server.port}",
        'user = "root"',
        f'key_file = "{server.user_key}"',
        f'known_hosts = "{server.known_hosts}"',
        f'workdir = "{directory / "remote-work"}"',
        "tunnel = true",
        "connect_timeout = 5",
        "reconnect_timeout = 20",
        f"server_port = {port}",
        "",
    ])
    text = re.sub(r"\[target\]\nkind = \"local\"\nserver_port = \d+\n", block, text)
    # systemd does not search the login PATH: the emulator by absolute path, as a real unit would name it
    text = text.replace('command = ["autotune-sim"]', f'command = {json.dumps([sys.executable, "-m", "autotune.sim"])}')
    path.write_text(text)
    return path
