"""The programs shipped to the target (targets/programs/), run here as the target would run them: the stop signals
only a process group it can show to be the recorded one, and the workdir's files are never reached through a link."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.targets.programs import hostlock, ports, safedir, script
from tests.support import requires
from tests.support.ssh import pid_alive, wait_for

#: starts a process group, leaves one member behind and exits: a group whose leader is gone
ORPHAN_GROUP = """
import os, subprocess, sys, time
os.setsid()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ, **{env}),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(os.getpid(), child.pid, flush=True)
"""


def _orphaned_group(env: dict[str, str]) -> tuple[int, int]:
    """(the group id, its surviving member) of a group whose leader has exited."""
    out = subprocess.run([sys.executable, "-c", ORPHAN_GROUP.format(env=env)], capture_output=True, text=True,
                         check=True, timeout=30).stdout.split()
    pgid, member = int(out[0]), int(out[1])
    wait_for(lambda: ports.stat(pgid) is None or ports.stat(pgid)[0] == "Z", timeout=5)
    return pgid, member


def _pid_file(directory: Path, record: dict[str, object]) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / "server.pid").write_text(json.dumps(record))


@pytest.mark.parametrize("carries_token", [False, True])
def test_a_group_whose_leader_exited_is_stopped_only_when_its_members_prove_they_are_ours(
        carries_token: bool, tmp_path: Path) -> None:
    pgid, member = _orphaned_group({ports.TOKEN_VAR: "t0k3n"} if carries_token else {})
    try:
        # the record names that group id and a start no later than the member's: without the leader, only the
        # launch token in the member's environment tells the recorded group from a later one that reused the id
        start = ports.stat(member)[19]
        _pid_file(tmp_path / "port-1", {"pgid": pgid, "start": str(int(start) - 1), "token": "t0k3n"})
        out = ports.stop(str(tmp_path), "port-1", 1.0, 1, 0.1)
        assert pid_alive(member) is not carries_token
        assert out["stopped"] == (pgid if carries_token else None)
        assert not (tmp_path / "port-1" / "server.pid").exists()
    finally:
        if pid_alive(member):
            os.kill(member, 9)


def test_a_pid_reused_by_another_process_is_never_signalled(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"])
    try:
        wait_for(lambda: os.getpgid(other.pid) == other.pid, timeout=5)
        _pid_file(tmp_path / "port-1", {"pgid": other.pid, "start": "1", "token": "x"})  # an older start
        assert ports.stop(str(tmp_path), "port-1", 1.0, 1, 0.1)["stopped"] is None
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_pid_file_and_secret_files_are_removed_without_following_links(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    d = tmp_path / "port-1"
    d.mkdir(mode=0o700)
    (d / "server.pid").symlink_to(victim)
    with pytest.raises(safedir.Refused, match=r"server\.pid is a symbolic link"):
        ports.stop(str(tmp_path), "port-1", 1.0, 1, 0.1)
    assert victim.read_text() == "keep me"
    (d / "server.pid").unlink()

    _pid_file(d, {"pgid": 0, "files": ["secret-1.yaml", "../victim"]})
    (d / "secret-1.yaml").write_text("api-key: x")
    ports.stop(str(tmp_path), "port-1", 1.0, 1, 0.1)
    assert not (d / "secret-1.yaml").exists() and victim.read_text() == "keep me"


def test_files_are_written_whole_and_never_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    fd = safedir.open_private(str(tmp_path / "work"), "unit-x.service")
    try:
        d = tmp_path / "work" / "unit-x.service"
        (d / "backup.json").symlink_to(victim)
        with pytest.raises(safedir.Refused, match="is a symbolic link"):
            safedir.read_file(fd, "backup.json")
        assert safedir.write_file(fd, "backup.json", b"{}", exclusive=True) is False  # something is there
        assert safedir.write_file(fd, "backup.json", b"{}")  # replaced: the link, not its target
        assert victim.read_text() == "keep me" and not (d / "backup.json").is_symlink()
        assert (d / "backup.json").stat().st_mode & 0o777 == 0o600
        assert sorted(p.name for p in d.iterdir()) == ["backup.json"]  # no temporary left
        with pytest.raises(ValueError):
            safedir.write_file(fd, "../escape", b"x")
    finally:
        os.close(fd)


def test_programs_run_where_autotune_is_not_installed(tmp_path: Path) -> None:
    """Shipped as one text with the modules they import: a bare python3 (no autotune, no site packages) runs
    them."""
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-I", "-S", "-c", script("workdir"), str(tmp_path / "w"), "port-1", "check"],
                       capture_output=True, text=True, timeout=30, cwd="/", env={}, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {} and (tmp_path / "w" / "port-1").is_dir()
    assert time.monotonic() - started < 10


def test_programs_run_on_the_oldest_python_a_target_may_have(tmp_path: Path) -> None:
    python36 = requires.old_python("3.6")

    def run(name: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([python36, "-I", "-S", "-c", script(name), *args], input=stdin, capture_output=True,
                              text=True, timeout=60, check=False)

    work = str(tmp_path / "w")
    start = {"argv": ["sh", "-c", "echo said sk-old-python-1; exit 3"], "env": {}, "files": {"secret-1.yaml": "x"},
             "mask": ["sk-old-python-1"], "stamp": "s1"}
    r = run("supervisor", work, "port-1", stdin=json.dumps(start))
    assert r.returncode == 0 and json.loads(r.stdout)["exit"].endswith("server-s1.exit"), r.stderr
    d = tmp_path / "w" / "port-1"
    wait_for((d / "server-s1.exit").exists, timeout=10)
    assert (d / "server-s1.exit").read_text() == "3\n" and (d / "server-s1.log").read_text() == "said ***\n"
    assert not (d / "secret-1.yaml").exists()
    assert json.loads(run("ports", "stop", work, "port-1", "1", "1", "0.1").stdout)["stopped"] is None
    assert json.loads(run("workdir", work, "port-1", "write", "b.json", "600", stdin="{}").stdout) == {"written": True}
    held = subprocess.Popen([python36, "-I", "-S", "-c", script("hostlock"), work, "port-1", '{"study": "old"}',
                             "port:1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout is not None and held.stdout.readline() == "locked\n"
        busy = run("hostlock", work, "port-1", "{}", "port:1")
        assert busy.returncode == hostlock.BUSY and json.loads(busy.stdout)["holder"]["study"] == "old"
    finally:
        held.kill()
        held.wait()
