"""The engine on an ssh-process target asked before each launch, through the real test sshd: the question runs
on the host with the python of the study's server command, and the study shows what the host decided."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.testing.sshd import SSHServer
from tests.support.cli import finished_ok, run_autotune, status
from tests.support.host_resolution import assert_host_decided, host_space
from tests.support.ssh import remote_study


@pytest.mark.slow
def test_the_host_prunes_and_rewrites_over_ssh(sshd: SSHServer, tmp_path: Path) -> None:
    study = remote_study(tmp_path, sshd, launches=4, sampler="grid", space=host_space(),
                         args={"sim-fault": "force-arg:page-size=16"})
    finished_ok(run_autotune("run", "--study", str(study), cwd=tmp_path))
    assert_host_decided(status(study), (tmp_path / "t.log").read_text())
