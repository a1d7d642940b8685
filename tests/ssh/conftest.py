"""Fixtures for the SSH target tests: a real sshd on 127.0.0.1 (session-scoped), target specs pointing at it, and
stand-in systemctl/journalctl/sudo for its sessions.

Setup this needs (CI does the same in .ci/run):
    apt-get update && apt-get install -y --no-install-recommends openssh-server
    mkdir -p /run/sshd            (done by SSHServer.start)
"""
from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotune.targets import KINDS, TargetSpec
from tests.support.sshd import APT_HINT, SSHServer, find_sshd, free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STAND_INS = ("systemctl", "journalctl", "sudo")


def _install_stand_ins(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = HERE / "fake_systemd.py"
    for tool in STAND_INS:
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))} {tool} \"$@\"\n")
        path.chmod(0o755)


@pytest.fixture(scope="session")
def fake_systemd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake-systemd")
    (root / "system").mkdir()
    return root


def _start_sshd(root: Path, systemd_root: Path) -> SSHServer:
    if find_sshd() is None:
        pytest.skip(f"sshd is not installed and these tests need a real OpenSSH server ({APT_HINT})")
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


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, fake_systemd_root: Path) -> Iterator[SSHServer]:
    server = _start_sshd(tmp_path_factory.mktemp("ssh"), fake_systemd_root)
    yield server
    server.stop()


@pytest.fixture
def private_sshd(tmp_path: Path, fake_systemd_root: Path) -> Iterator[SSHServer]:
    """An sshd of this test's own, for tests that cut, pause or kill connections."""
    server = _start_sshd(tmp_path / "private", fake_systemd_root)
    yield server
    server.stop()


SpecFactory = Callable[..., TargetSpec]


def _spec_factory(server: SSHServer, workdir: Path) -> SpecFactory:
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


@pytest.fixture
def make_spec(sshd: SSHServer, tmp_path: Path) -> SpecFactory:
    return _spec_factory(sshd, tmp_path / "remote-work")


@pytest.fixture
def make_private_spec(private_sshd: SSHServer, tmp_path: Path) -> SpecFactory:
    return _spec_factory(private_sshd, tmp_path / "remote-work")


@pytest.fixture
def cleanup() -> Iterator[Callable[[object], object]]:
    """Register targets to stop and close after the test (whatever it left running)."""
    targets: list[object] = []

    def register(target: object) -> object:
        targets.append(target)
        return target

    yield register
    for target in reversed(targets):
        with contextlib.suppress(Exception):
            target.stop()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            target.close()  # type: ignore[attr-defined]
