"""Fixtures for the SSH target tests: a real sshd on 127.0.0.1 (session-scoped), target specs pointing at it,
stand-in systemctl/journalctl/sudo for its sessions and a service under them (helpers in tests/support/ssh.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotune.testing.sshd import SSHServer
from tests.support.ssh import SpecFactory, Unit, running_unit, spec_factory, start_sshd


@pytest.fixture(scope="session")
def fake_systemd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake-systemd")
    (root / "system").mkdir()
    return root


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, fake_systemd_root: Path) -> Iterator[SSHServer]:
    server = start_sshd(tmp_path_factory.mktemp("ssh"), fake_systemd_root)
    yield server
    server.stop()


@pytest.fixture
def private_sshd(tmp_path: Path, fake_systemd_root: Path) -> Iterator[SSHServer]:
    """An sshd of this test's own, for tests that cut, pause or kill connections."""
    server = start_sshd(tmp_path / "private", fake_systemd_root)
    yield server
    server.stop()


@pytest.fixture
def make_spec(sshd: SSHServer, tmp_path: Path) -> SpecFactory:
    return spec_factory(sshd, tmp_path / "remote-work")


@pytest.fixture
def make_private_spec(private_sshd: SSHServer, tmp_path: Path) -> SpecFactory:
    return spec_factory(private_sshd, tmp_path / "remote-work")


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


@pytest.fixture
def unit(fake_systemd_root: Path) -> Iterator[Unit]:
    """A service that runs the 'original' server before tuning starts."""
    yield from running_unit(fake_systemd_root)


@pytest.fixture
def unit_spec(make_spec: SpecFactory, unit: Unit) -> SpecFactory:
    """Specs of an ssh-systemd target that tunes ``unit``."""
    def make(**overrides: object):
        values = {"kind": "ssh-systemd", "unit": unit.name, "unit_dir": str(unit.root / "system"),
                  "server_port": unit.port, "tunnel": True}
        values.update(overrides)
        return make_spec(**values)
    return make
