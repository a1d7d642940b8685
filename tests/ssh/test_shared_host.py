"""A shared GPU host through the real sshd: autotune's directory on the target is private and checked before use,
a planted backup is never installed, and secrets reach the server without passing through a command line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import UserError
from autotune.health import wait_ready
from autotune.targets.process import ProcessTarget
from autotune.targets.ssh import DEFAULT_WORKDIR
from autotune.targets.systemd import SystemdTarget
from autotune.testing.sshd import SSHServer
from tests.support.ssh import Unit, main_pid, server_argv, spec_factory

ENGINE = SGLang()
NOBODY = 65534


def test_the_default_workdir_is_the_remote_users_own() -> None:
    assert DEFAULT_WORKDIR.startswith("~/")


def test_a_missing_workdir_is_created_private(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec(workdir=str(tmp_path / "fresh" / "work"))))
    target.preflight(server_argv(target.spec.server_port))
    for d in (tmp_path / "fresh" / "work", Path(target.directory)):
        assert d.is_dir() and d.stat().st_mode & 0o777 == 0o700, oct(d.stat().st_mode)


@pytest.mark.parametrize("make_bad, why", [
    (lambda d: (d.mkdir(), d.chmod(0o777)), "is writable by other users"),
    (lambda d: (d.mkdir(), os.chown(d, NOBODY, NOBODY)), "belongs to another user"),
    (lambda d: (d.with_name("elsewhere").mkdir(), d.symlink_to(d.with_name("elsewhere"))), "is a symbolic link"),
])
def test_a_workdir_someone_else_could_control_is_refused(make_bad, why: str, make_spec, cleanup,
                                                          tmp_path: Path) -> None:
    workdir = tmp_path / "shared"
    make_bad(workdir)
    target = cleanup(ProcessTarget(make_spec(workdir=str(workdir))))
    with pytest.raises(UserError) as e:
        target.preflight(server_argv(target.spec.server_port))
    message = str(e.value)
    assert "\n" not in message and why in message and str(workdir) in message
    assert "give [target] workdir a directory of your own" in message
    # nor does a deploy (a study started before someone changed the directory) use it
    with pytest.raises(UserError):
        target.deploy(server_argv(target.spec.server_port), {}, tmp_path / "t.log")
    assert not list(Path(os.path.realpath(workdir)).glob("port-*/server.pid"))


def test_env_reaches_the_server_through_no_command_line(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec(env={"TARGET_TOKEN": "target-secret-4711"})))
    deployment = target.deploy(server_argv(target.spec.server_port), {"HF_TOKEN": "hf-secret-0815"},
                               tmp_path / "t.log")
    wait_ready(deployment, ENGINE, interval=0.05, timeout=60)
    environ = Path(f"/proc/{deployment.pgid}/environ").read_bytes().split(b"\0")
    assert b"HF_TOKEN=hf-secret-0815" in environ and b"TARGET_TOKEN=target-secret-4711" in environ
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            assert b"hf-secret-0815" not in argv and b"target-secret-4711" not in argv, argv
    # the file that carried them is gone once the server started
    assert not list(Path(target.directory).glob("env-*"))


def test_a_planted_backup_is_never_installed(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(SystemdTarget(unit_spec()))
    target.deploy(server_argv(unit.port, "--served-model-name", "one"), {"HF_TOKEN": "hf-secret-0815"},
                  tmp_path / "a.log")
    assert Path(target.dropin_path).stat().st_mode & 0o777 == 0o600, "a drop-in with Environment= is private"
    evil = tmp_path / "evil.sh"
    backup = json.loads(Path(target.backup_path).read_text())
    backup["dropin"] = f"[Service]\nExecStartPre=+{evil}\n"
    Path(target.backup_path).write_text(json.dumps(backup))
    with pytest.raises(UserError) as e:
        cleanup(SystemdTarget(unit_spec())).restore([], {}, tmp_path / "restore.log")
    assert "holds a drop-in autotune did not write" in str(e.value) and "ExecStartPre" in str(e.value)
    assert "ExecStartPre" not in Path(target.dropin_path).read_text()
    assert main_pid(unit.root, unit.name)  # the unit still runs the trial's config


def test_a_host_without_sftp_is_refused_at_preflight(cleanup, tmp_path: Path) -> None:
    server = SSHServer(tmp_path / "nosftp", sftp=False).start()
    try:
        target = cleanup(ProcessTarget(spec_factory(server, tmp_path / "work")(tunnel=False)))
        with pytest.raises(UserError) as e:
            target.preflight(server_argv(target.spec.server_port))
        assert "\n" not in str(e.value) and "no SFTP session" in str(e.value) and "Subsystem sftp" in str(e.value)
    finally:
        server.stop()
