"""A shared GPU host through the real sshd: autotune's directory on the target is checked the way OpenSSH's StrictModes
checks a path and used without following links, a planted link, a swapped parent directory and a forged backup are
each refused with nothing overwritten and the unit left running, and the lock keeps apart every tuner of one server,
whoever runs it and from whatever workdir."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import UserError
from autotune.run.health import wait_ready
from autotune.targets.process import ProcessTarget
from autotune.targets.programs import hostlock
from autotune.targets.ssh import DEFAULT_WORKDIR
from autotune.targets.systemd import SystemdTarget
from autotune.testing.sshd import SSHServer
from tests.support.cli import run_autotune
from tests.support.ssh import Unit, children, main_pid, pid_alive, remote_study, server_argv, spec_factory, wait_for

ENGINE = SGLang()
NOBODY = 65534
FIX = "give [target] workdir a directory of your own"


def as_nobody(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


def test_the_default_workdir_is_the_remote_users_own() -> None:
    assert DEFAULT_WORKDIR.startswith("~/")


def test_a_missing_workdir_is_created_private(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec(workdir=str(tmp_path / "fresh" / "work"))))
    target.preflight(server_argv(target.spec.server_port))
    for d in (tmp_path / "fresh", tmp_path / "fresh" / "work", Path(target.directory)):
        assert d.is_dir() and d.stat().st_mode & 0o777 == 0o700, oct(d.stat().st_mode)


@pytest.mark.parametrize("make_bad, why", [
    (lambda d: (d.mkdir(), d.chmod(0o777)), "is writable by other users"),
    (lambda d: (d.mkdir(), as_nobody(d)), "belongs to another user"),
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
    assert "\n" not in message and why in message and str(workdir) in message and FIX in message
    # nor does a deploy (a study started before someone changed the directory) use it
    with pytest.raises(UserError):
        target.deploy(server_argv(target.spec.server_port), {}, tmp_path / "t.log")
    assert not list(Path(os.path.realpath(workdir)).glob("port-*/server.pid"))


@pytest.mark.parametrize("make_bad, why", [
    (lambda p: p.chmod(0o775), "is writable by other users"),   # a group may swap what is in it
    (lambda p: p.chmod(0o757), "is writable by other users"),
    (as_nobody, "belongs to another user"),                       # its owner may
])
def test_a_workdir_under_a_directory_someone_else_could_change_is_refused(make_bad, why: str, make_spec, cleanup,
                                                                         tmp_path: Path) -> None:
    parent = tmp_path / "projects"
    workdir = parent / "me" / "autotune"
    workdir.mkdir(parents=True, mode=0o700)
    make_bad(parent)
    target = cleanup(ProcessTarget(make_spec(workdir=str(workdir))))
    with pytest.raises(UserError) as e:
        target.preflight(server_argv(target.spec.server_port))
    message = str(e.value)
    assert "\n" not in message and f"{parent} (on the way to {workdir}) {why}" in message and FIX in message
    assert not Path(target.directory).exists()


def test_sticky_parents_and_links_the_user_placed_are_fine(make_spec, cleanup, tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may add entries, nobody may rename or remove another's
    real = tmp_path / "real-home"
    real.mkdir()
    (tmp_path / "home").symlink_to(real)  # a link the user placed in a directory only they can change
    for workdir in (shared / "work", tmp_path / "home" / "work"):
        target = cleanup(ProcessTarget(make_spec(workdir=str(workdir))))
        target.preflight(server_argv(target.spec.server_port))
        assert Path(target.directory).is_dir()
    assert (real / "work").is_dir()


def test_a_link_another_user_planted_in_a_sticky_directory_is_refused(make_spec, cleanup, tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    (tmp_path / "mine").mkdir()
    planted = shared / "work"
    planted.symlink_to(tmp_path / "mine")  # the user's own directory: the walk beyond the link would trust it
    os.lchown(planted, NOBODY, NOBODY)     # but another user placed the link, and may point it anywhere
    target = cleanup(ProcessTarget(make_spec(workdir=str(planted / "autotune"))))
    with pytest.raises(UserError) as e:
        target.preflight(server_argv(target.spec.server_port))
    message = str(e.value)
    assert "\n" not in message
    assert f"{planted} (on the way to {planted}/autotune) is a symbolic link another user placed in a sticky " \
           "directory" in message
    assert not (tmp_path / "mine" / "autotune").exists()
    # the user's own link there is followed
    os.lchown(planted, os.getuid(), os.getgid())
    target = cleanup(ProcessTarget(make_spec(workdir=str(planted / "autotune"))))
    target.preflight(server_argv(target.spec.server_port))
    assert (tmp_path / "mine" / "autotune").is_dir()


def test_a_link_someone_else_could_have_placed_is_refused(make_spec, cleanup, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    (tmp_path / "mine").mkdir()
    (open_dir / "link").symlink_to(tmp_path / "mine")
    open_dir.chmod(0o777)  # whoever can write here can point the link anywhere
    workdir = open_dir / "link" / "work"
    target = cleanup(ProcessTarget(make_spec(workdir=str(workdir))))
    with pytest.raises(UserError, match="is writable by other users"):
        target.preflight(server_argv(target.spec.server_port))
    assert not (tmp_path / "mine" / "work").exists()


def test_env_reaches_the_server_through_no_command_line(make_spec, cleanup, tmp_path: Path) -> None:
    target = cleanup(ProcessTarget(make_spec(env={"TARGET_TOKEN": "target-secret-4711"})))
    deployment = target.deploy(server_argv(target.spec.server_port), {"HF_TOKEN": "hf-secret-0815"},
                               tmp_path / "t.log")
    wait_ready(deployment, ENGINE, interval=0.05, timeout=60)
    server = children(deployment.pgid)[0]
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert b"HF_TOKEN=hf-secret-0815" in environ and b"TARGET_TOKEN=target-secret-4711" in environ
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            assert b"hf-secret-0815" not in argv and b"target-secret-4711" not in argv, argv
    # no file carried them: they went to the supervisor on its standard input
    assert not [p for p in Path(target.directory).iterdir() if b"hf-secret-0815" in p.read_bytes()]


def _systemd_study(tmp_path: Path, sshd: SSHServer, unit: Unit) -> Path:
    study = remote_study(tmp_path, sshd, launches=1, target="\n".join([
        'kind = "ssh-systemd"', f'unit = "{unit.name}"', f'unit_dir = "{unit.root / "system"}"']))
    text = study.read_text()
    text = text.replace(f'workdir = "{tmp_path / "remote-work"}"', f'workdir = "{tmp_path / "w" / "work"}"')
    port = next(line for line in text.splitlines() if line.startswith("server_port = "))
    study.write_text(text.replace(port, f"server_port = {unit.port}"))
    return study


def _tuned(unit: Unit, unit_spec, tmp_path: Path) -> SystemdTarget:
    """The unit running a trial's config, as a study left it (--no-restore)."""
    target = SystemdTarget(unit_spec(workdir=str(tmp_path / "w" / "work")))
    try:
        d = target.deploy(server_argv(unit.port, "--served-model-name", "trial"), {}, tmp_path / "trial.log")
        wait_ready(d, ENGINE, interval=0.05, timeout=60)
    finally:
        target.close()
    return target


def _left_running(unit: Unit, target: SystemdTarget, dropin: bytes) -> None:
    assert Path(target.dropin_path).read_bytes() == dropin
    pid = main_pid(unit.root, unit.name)
    assert pid and pid_alive(pid) and "trial" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()


def test_a_planted_symlink_lock_is_refused_and_overwrites_nothing(sshd: SSHServer, unit: Unit, unit_spec,
                                                                  tmp_path: Path) -> None:
    """Another user made the unit's directory in the workdir first and linked the lock's holder file to the
    victim's authorized_keys: `autotune restore` refuses before it takes the lock, in one line."""
    target = _tuned(unit, unit_spec, tmp_path)
    dropin = Path(target.dropin_path).read_bytes()
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA victim\n")
    victim.chmod(0o600)
    directory = Path(target.directory)
    directory.rename(directory.with_name("mine"))
    directory.mkdir()
    for name in ("holder.json", "lock", "backup.json", "server.pid"):
        (directory / name).symlink_to(victim)
    as_nobody(directory)
    study = _systemd_study(tmp_path, sshd, unit)
    r = run_autotune("restore", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 2, r.stderr + r.stdout
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"{directory} belongs to another user" in r.stderr and FIX in r.stderr
    assert victim.read_text() == "ssh-ed25519 AAAA victim\n" and victim.stat().st_mode & 0o777 == 0o600
    _left_running(unit, target, dropin)


def test_a_link_in_autotunes_own_directory_is_never_followed(unit: Unit, unit_spec, cleanup,
                                                             tmp_path: Path) -> None:
    target = _tuned(unit, unit_spec, tmp_path)
    dropin = Path(target.dropin_path).read_bytes()
    victim = tmp_path / "authorized_keys"
    victim.write_text("victim\n")
    backup = Path(target.backup_path)
    backup.unlink()
    backup.symlink_to(victim)
    again = cleanup(SystemdTarget(unit_spec(workdir=str(tmp_path / "w" / "work"))))
    with again.lock("restore"), pytest.raises(UserError) as e:
        again.restore([], {}, tmp_path / "restore.log")
    assert f"{backup} is a symbolic link: refusing to read it" in str(e.value)
    assert victim.read_text() == "victim\n" and backup.is_symlink()
    _left_running(unit, target, dropin)


def test_a_swapped_parent_directory_is_refused(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    """The workdir's parent is writable by a group: someone swapped the workdir for one of their own, with a backup
    that would have the unit preload their library. Refused on the parent, before anything is read."""
    target = _tuned(unit, unit_spec, tmp_path)
    dropin = Path(target.dropin_path).read_bytes()
    parent, work = tmp_path / "w", tmp_path / "w" / "work"
    work.rename(parent / "work.before")
    forged = json.loads((parent / "work.before" / target.subdir / "backup.json").read_text())
    forged["dropin"] = '[Service]\nExecStart=\nExecStart="/bin/sleep" "1"\nEnvironment="LD_PRELOAD=/tmp/evil.so"\n'
    (work / target.subdir).mkdir(parents=True)
    (work / target.subdir / "backup.json").write_text(json.dumps(forged))
    parent.chmod(0o775)
    again = cleanup(SystemdTarget(unit_spec(workdir=str(work))))
    with pytest.raises(UserError) as e, again.lock("restore"):
        again.restore([], {}, tmp_path / "restore.log")
    assert f"{parent} (on the way to {work}) is writable by other users" in str(e.value)
    _left_running(unit, target, dropin)


def test_a_forged_backup_is_refused(unit: Unit, unit_spec, cleanup, tmp_path: Path) -> None:
    """A backup on the target that is not the one autotune took (and kept a copy of) is never installed, however
    much it looks like autotune's own drop-in."""
    target = _tuned(unit, unit_spec, tmp_path)
    dropin = Path(target.dropin_path).read_bytes()
    backup = json.loads(Path(target.backup_path).read_text())
    backup["dropin"] = ("# Written by autotune (test)\n[Service]\nExecStart=\n"
                        f'ExecStart="{sys.executable}" "-m" "autotune.sim"\n'
                        'Environment="LD_PRELOAD=/tmp/evil.so"\n')
    Path(target.backup_path).write_text(json.dumps(backup))
    again = cleanup(SystemdTarget(unit_spec(workdir=str(tmp_path / "w" / "work"))))
    with pytest.raises(UserError) as e:
        again.restore([], {}, tmp_path / "restore.log")
    assert "differs from the copy autotune kept when it took it" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="differs"):  # nor does a new study start from it
        again.deploy(server_argv(unit.port), {}, tmp_path / "next.log")
    _left_running(unit, target, dropin)
    assert "LD_PRELOAD" not in Path(target.dropin_path).read_text()

    # without the local copy (taken on another machine), a backup with a drop-in to put back is refused too
    target.local_backup_path.unlink()
    with pytest.raises(UserError, match="autotune installs only a backup it kept itself"):
        again.restore([], {}, tmp_path / "restore.log")
    _left_running(unit, target, dropin)


def test_the_lock_keeps_apart_tuners_of_one_server_from_any_workdir(make_spec, cleanup, tmp_path: Path) -> None:
    first = cleanup(ProcessTarget(make_spec(workdir=str(tmp_path / "alice"))))
    second = cleanup(ProcessTarget(make_spec(workdir=str(tmp_path / "bob"), server_port=first.spec.server_port)))
    with first.lock("study-A"):
        with pytest.raises(UserError) as e, second.lock("study-B"):
            pass
        assert "busy" in str(e.value) and "study-A" in str(e.value)
    with second.lock("study-B"):  # free again once the first let go
        pass


SQUAT = """
import os, sys, time
from autotune.targets.programs import hostlock
os.setgid(65534); os.setuid(65534)
held, taken = hostlock.bind(sys.argv[1:])
print("taken" if taken else "held", flush=True)
time.sleep(60)
"""


def test_another_users_process_cannot_take_or_fake_the_lock(make_spec, cleanup, tmp_path: Path) -> None:
    """A name held by another user's process (here: not autotune) is named by the kernel's account of it; what it
    claims to be is not trusted, and autotune never takes a name someone holds."""
    target = cleanup(ProcessTarget(make_spec()))
    squatter = subprocess.Popen([sys.executable, "-c", SQUAT, f"port:{target.spec.server_port}"],
                                stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "held"
        with pytest.raises(UserError) as e, target.lock("study-A"):
            pass
        assert f"a process that is not autotune (pid {squatter.pid}, user nobody)" in str(e.value)
    finally:
        squatter.kill()
        squatter.wait()
    wait_for(lambda: hostlock.ask(f"port:{target.spec.server_port}") == {}, timeout=5)
    with target.lock("study-A"):
        answer = hostlock.ask(f"port:{target.spec.server_port}")
        assert answer["user"] == "root" and (answer["holder"] or {}).get("study") == "study-A"


def test_a_host_without_sftp_is_refused_at_preflight(cleanup, tmp_path: Path) -> None:
    server = SSHServer(tmp_path / "nosftp", sftp=False).start()
    try:
        target = cleanup(ProcessTarget(spec_factory(server, tmp_path / "work")(tunnel=False)))
        with pytest.raises(UserError) as e:
            target.preflight(server_argv(target.spec.server_port))
        assert "\n" not in str(e.value) and "no SFTP session" in str(e.value) and "Subsystem sftp" in str(e.value)
    finally:
        server.stop()
