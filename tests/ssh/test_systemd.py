"""ssh-systemd target through the real sshd, with stand-in systemctl/journalctl/sudo (systemd cannot run here):
backup once, quoted drop-in, restart, journal of this start only, exit status, restore."""
from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import TrialFailure, UserError
from autotune.run.health import wait_ready
from autotune.targets.systemd import SystemdTarget
from autotune.targets.unitfile import environment_line, exec_line
from autotune.testing.ports import free_port
from tests.support import fake_systemd
from tests.support.ssh import Unit, cmdline, main_pid, port_open, server_argv, stand_in, wait_for

ENGINE = SGLang()
NASTY = "a b 'c' \"d\" $(touch {m}) `touch {m}` ; touch {m} | & > {m}.2 $HOME ${{HOME}} %s %% %n \\ end"


@pytest.mark.slow
def test_deploy_backs_up_once_renders_a_quoted_dropin_reads_this_start_and_restores(
        unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    nasty = NASTY.format(m=marker)
    target = cleanup(SystemdTarget(unit_spec()))
    argv = server_argv(unit.port, "--served-model-name", "trial-1 " + nasty)
    log = tmp_path / "trial-1.log"
    deployment = target.deploy(argv, {"AUTOTUNE_TEST_ENV": "v 1%$HOME"}, log)

    # the backup: the unit as it was, on the target and locally
    backup = json.loads(Path(target.backup_path).read_text())
    assert backup["fragment"] == unit.text and backup["dropin"] is None
    assert backup["active_state"] == "active"
    assert "ExecStart=" in backup["systemctl_cat"]
    assert target.local_backup_path.read_text() == Path(target.backup_path).read_text()

    # the drop-in: ExecStart reset, then every word quoted; the unit file itself untouched
    dropin = Path(target.dropin_path).read_text().splitlines()
    assert Path(target.dropin_path).name == "zz-autotune.conf"
    assert dropin.index("ExecStart=") < next(i for i, line in enumerate(dropin) if line.startswith("ExecStart=\""))
    exec_start = next(line for line in dropin if line.startswith("ExecStart=\""))
    assert "$$(touch" in exec_start and "%%s %%%% %%n" in exec_start and '\\"d\\"' in exec_start
    assert 'Environment="AUTOTUNE_TEST_ENV=v 1%%$HOME"' in dropin
    assert unit.path.read_text() == unit.text

    wait_ready(deployment, ENGINE, interval=0.05, timeout=60)
    pid = main_pid(unit.root, unit.name)
    assert cmdline(pid) == argv  # every argument arrived literally; none ran as shell
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"AUTOTUNE_TEST_ENV=v 1%$HOME" in environ and b"ORIGINAL_ENV=1" in environ
    assert not marker.exists() and not Path(f"{marker}.2").exists()

    # the journal of this start only: not the original server's lines, not systemd's own messages
    deployment.read_log()
    text = log.read_text()
    assert "trial-1" in text
    assert "original-config" not in text and "Stopped" not in text
    assert f"Started {unit.name}." in text  # systemd's own messages about this start are included
    assert "original-config" in stand_in(unit.root, "journalctl", "-u", unit.name, "-o", "cat").stdout

    # more deploys, also from a restarted tuner: the backup stays the pre-tuning original
    taken = Path(target.backup_path).read_bytes()
    d2 = target.deploy(server_argv(unit.port, "--served-model-name", "trial-2"), {}, tmp_path / "trial-2.log")
    wait_ready(d2, ENGINE, interval=0.05, timeout=60)
    restarted = cleanup(SystemdTarget(unit_spec()))
    d3 = restarted.deploy(server_argv(unit.port, "--served-model-name", "trial-3"), {}, tmp_path / "trial-3.log")
    wait_ready(d3, ENGINE, interval=0.05, timeout=60)
    d3.read_log()
    assert "trial-3" in (tmp_path / "trial-3.log").read_text()
    assert "trial-2" not in (tmp_path / "trial-3.log").read_text()
    assert Path(target.backup_path).read_bytes() == taken
    assert d2.exit_status() is not None  # that start is over

    # restore: the drop-in goes, the original command line runs again, the backup is archived
    restored = restarted.restore([], {}, tmp_path / "restore.log")
    assert restored is not None
    wait_ready(restored, ENGINE, interval=0.05, timeout=60)
    assert not Path(target.dropin_path).exists()
    assert cmdline(main_pid(unit.root, unit.name)) == unit.original
    assert unit.path.read_text() == unit.text
    assert not Path(target.backup_path).exists()
    assert list(Path(target.directory).glob("backup.restored-*.json"))
    assert not target.local_backup_path.exists()


def test_exit_status_and_stop(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(SystemdTarget(unit_spec(tunnel=False)))
    d = target.deploy(server_argv(unit.port, "--served-model-name", "killed"), {}, tmp_path / "a.log")
    wait_ready(d, ENGINE, interval=0.05, timeout=60)
    assert d.exit_status() is None
    os.kill(main_pid(unit.root, unit.name), signal.SIGKILL)
    assert wait_for(lambda: d.exit_status() is not None)
    assert d.exit_status() == -signal.SIGKILL
    assert "Main process exited, code=killed, status=9/SIGKILL" in d.read_log()

    d = target.deploy(["sh", "-c", "echo about to fail; exit 3"], {}, tmp_path / "b.log")
    assert wait_for(lambda: d.exit_status() is not None)
    assert d.exit_status() == 3
    assert "about to fail" in d.read_log()

    d = target.deploy(server_argv(unit.port), {}, tmp_path / "c.log")
    wait_ready(d, ENGINE, interval=0.05, timeout=60)
    target.stop()
    assert not port_open(unit.port)
    assert d.exit_status() in (0, -signal.SIGTERM)


def test_sudo_runs_the_privileged_steps(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    sudo_log = unit.root / "sudo.log"
    sudo_log.unlink(missing_ok=True)
    target = cleanup(SystemdTarget(unit_spec(sudo=True)))
    d = target.deploy(["sh", "-c", "echo with-sudo; exec sleep 60"], {}, tmp_path / "a.log")
    assert "with-sudo" in wait_for(d.read_log)  # type: ignore[operator]
    assert d.exit_status() is None
    restored = target.restore([], {}, tmp_path / "r.log")
    assert restored is not None
    calls = [json.loads(line) for line in sudo_log.read_text().splitlines()]
    install = next(c for c in calls if c[0] == "install")
    # fed on its standard input: no copy of the drop-in is left anywhere for anyone to swap or read
    assert install == ["install", "-D", "-m", "0644", "/dev/stdin", target.dropin_path]
    assert not [p for p in Path(target.directory).iterdir() if p.name != "backup.restored" and "upload" in p.name]
    assert ["systemctl", "daemon-reload"] in calls and ["systemctl", "start", unit.name] in calls
    assert any(c[0] == "journalctl" for c in calls) and any(c[:2] == ["systemctl", "show"] for c in calls)
    assert ["rm", "-f", "--", target.dropin_path] in calls
    assert not Path(target.dropin_path).exists()
    assert cmdline(main_pid(unit.root, unit.name)) == unit.original


def test_lost_remote_backup_is_put_back_from_the_local_copy(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(SystemdTarget(unit_spec()))
    target.deploy(server_argv(unit.port, "--served-model-name", "one"), {}, tmp_path / "a.log")
    original = Path(target.backup_path).read_text()
    Path(target.backup_path).unlink()
    # a drop-in of ours is in place now; a fresh backup would record it, the local copy must win
    again = cleanup(SystemdTarget(unit_spec()))
    again.deploy(server_argv(unit.port, "--served-model-name", "two"), {}, tmp_path / "b.log")
    assert Path(target.backup_path).read_text() == original
    assert json.loads(original)["dropin"] is None


def test_unknown_unit_is_a_user_error(make_spec, fake_systemd_root: Path, cleanup, tmp_path: Path) -> None:
    target = cleanup(SystemdTarget(make_spec(kind="ssh-systemd", unit="no-such-unit.service",
                                             unit_dir=str(fake_systemd_root / "system"))))
    with pytest.raises(UserError, match="not loaded"):
        target.deploy(server_argv(free_port()), {}, tmp_path / "a.log")


def test_foreign_port_holder_is_port_busy(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(SystemdTarget(unit_spec()))
    stand_in(unit.root, "systemctl", "stop", unit.name)
    with socket.socket() as foreign:
        foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        foreign.bind(("127.0.0.1", unit.port))
        foreign.listen(1)
        with pytest.raises(TrialFailure) as e:
            target.deploy(server_argv(unit.port), {}, tmp_path / "a.log")
    assert e.value.reason == "port_busy" and f"pid {os.getpid()}" in e.value.detail


WORDS = ["/usr/bin/server", "plain", "a b", 'q"uote', "sin'gle", "$HOME", "${HOME}", "$$", "50%", "%n",
         "back\\slash", "trailing\\", ";", "\\;", "new\nline", "tab\there", "ünïcode", "--flag=x y"]


def test_exec_line_round_trips_through_systemd_parsing_rules() -> None:
    line = exec_line(WORDS)
    env_line = environment_line("A", "b c%$HOME\"")
    argv, env = fake_systemd.command_line("x.service", {"ExecStart": [line], "Environment": [env_line]})
    assert argv == WORDS
    assert env["A"] == "b c%$HOME\""


@pytest.mark.parametrize("bad", ["-/usr/bin/x", "@/usr/bin/x", "/opt/my server/bin", "$PYTHON", "/usr/%n"])
def test_exec_line_refuses_executables_systemd_would_misread(bad: str) -> None:
    with pytest.raises(TrialFailure) as e:
        exec_line([bad, "--port", "1"])
    assert e.value.reason == "deploy_failed"


def test_preflight_and_rendered_dropin(unit: Unit, unit_spec, make_spec, fake_systemd_root: Path, cleanup) -> None:
    target = cleanup(SystemdTarget(unit_spec()))
    argv = server_argv(unit.port, "--served-model-name", "a b")
    target.preflight(argv)
    cleanup(SystemdTarget(unit_spec(sudo=True))).preflight(argv)
    with pytest.raises(UserError, match="cannot be an ExecStart= executable"):
        target.preflight(["$PYTHON", "-m", "x"])
    with pytest.raises(UserError, match="server command not found"):
        target.preflight(["/nonexistent/python3", "-m", "x"])
    missing = cleanup(SystemdTarget(make_spec(kind="ssh-systemd", unit="no-such-unit.service",
                                              unit_dir=str(fake_systemd_root / "system"))))
    with pytest.raises(UserError, match="not loaded"):
        missing.preflight(argv)
    name, text = target.rendered(argv, {"K": "v"})
    assert name == "zz-autotune.conf"
    assert "ExecStart=\n" in text and '"a b"' in text and 'Environment="K=v"' in text


def test_a_file_the_server_reads_goes_beside_the_units_dropin(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    # an adaptive schedule: the unit's user reads it, whoever that is, from the unit's drop-in directory
    target = cleanup(SystemdTarget(unit_spec()))
    local = tmp_path / "s-adaptive-trial-0004.json"
    path = target.place_file(local.name, b'{"1": {"candidate_steps": [3]}}', local)
    assert path == f"{target.dropin_dir}/s-adaptive-trial-0004.json" and not local.exists()
    assert Path(path).stat().st_mode & 0o777 == 0o644
    d = target.deploy(["sh", "-c", f"cat {path}; echo; exec sleep 60"], {}, tmp_path / "a.log")
    assert '{"1": {"candidate_steps": [3]}}' in wait_for(d.read_log)  # type: ignore[operator]
