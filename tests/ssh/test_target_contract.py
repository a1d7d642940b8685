"""Every target kind keeps the target interface (autotune/testing/target_contract.py): local on this machine, the SSH
kinds through the real sshd on 127.0.0.1 (ssh-systemd under the stand-in systemctl); a kind added to KINDS without
its class here fails."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.targets import KINDS, Target, make_target
from autotune.targets.local import LocalSpec
from autotune.testing.ports import free_port
from autotune.testing.target_contract import TargetContract
from tests.support.ssh import SpecFactory


class TestLocal(TargetContract):
    kind = "local"

    @pytest.fixture
    def target(self, cleanup: Callable[[object], object], tmp_path: Path) -> Target:
        return cleanup(make_target(LocalSpec(name="test", server_port=free_port()), cwd=tmp_path))  # type: ignore


class TestProcess(TargetContract):
    kind = "ssh-process"

    @pytest.fixture
    def target(self, make_spec: SpecFactory, cleanup: Callable[[object], object]) -> Target:
        return cleanup(make_target(make_spec(kind=self.kind)))  # type: ignore[return-value]


class TestSystemd(TargetContract):
    kind = "ssh-systemd"

    @pytest.fixture
    def target(self, unit_spec: SpecFactory, cleanup: Callable[[object], object]) -> Target:
        return cleanup(make_target(unit_spec()))  # type: ignore[return-value]


def test_every_target_kind_keeps_the_contract() -> None:
    assert {c.kind for c in TargetContract.__subclasses__()} == set(KINDS)
