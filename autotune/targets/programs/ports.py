"""Port state and stopping a recorded process group, on the target (and on this machine for the local target).

    ports.py port PORT WAIT                             -> {"listening", "holder"}
    ports.py stop WORKDIR SUBDIR GRACE PORT WAIT        -> {"listening", "holder", "stopped"}

prints one JSON object. ``port`` waits up to WAIT seconds for PORT to be released. ``stop`` stops the process group
the supervisor's pid file (``server.pid`` in WORKDIR/SUBDIR, read without following links after the directory is
checked: safedir.py) names, if it is still the one recorded there: its leader must have the recorded start time, so a
pid reused by an unrelated process is never signalled. A group whose leader has exited cannot be told apart from a
later group that reused the id by the leader, so then only the members that carry the start's token in their
environment and started after it are stopped. SIGTERM, SIGKILL after GRACE seconds; then the pid file and the
start's secret files are removed and the port is waited for (briefly, when nothing of ours was stopped: a port held
then is someone else's).

Everything comes from /proc: no ss/lsof/fuser needed. Runs with the target's python3 (>= 3.6, standard library).
"""
import contextlib
import json
import os
import signal
import sys
import time
from typing import Dict, List, Optional, Set

from autotune.targets.programs import safedir

#: the environment variable a supervised start carries its token in (the supervisor sets it)
TOKEN_VAR = "AUTOTUNE_LAUNCH"
PID_FILE = "server.pid"


def listening(port: int) -> Set[str]:
    """Socket inodes listening on ``port`` (IPv4 or IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            if len(p) > 9 and p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(p[9])
    return inodes


def holder(inodes: Set[str]) -> Optional[str]:
    """'pid N (command line)' of a process that has one of ``inodes`` open; None if none can be seen."""
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
                    return "pid %s (%s)" % (pid, cmd[:160])
        except OSError:
            continue
    return None


def port_holder(port: int) -> Optional[str]:
    """Who listens on ``port``, if anyone can be seen."""
    return holder(listening(port))


def stat(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...] (start time at index 19); None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None


def members(pgid: int) -> List[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            s = stat(int(pid))
            if s and int(s[2]) == pgid and s[0] != "Z":
                out.append(int(pid))
    return out


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether process ``pid``'s environment holds ``entry`` (False when it cannot be read: another user's)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def recorded_members(pgid: int, start: Optional[str], token: Optional[str]) -> Optional[List[int]]:
    """The live processes of the group a record names: None when its leader lives with the recorded start time (the
    whole group is ours: signal the group); else the members that can be shown to be ours (the leader exited: the
    token in their environment and a start no earlier than the recorded one); [] when there are none."""
    if pgid <= 1 or start is None:
        return []
    leader = stat(pgid)
    if leader is not None:
        return None if leader[19] == start and members(pgid) else []
    if not token:
        return []
    entry = ("%s=%s" % (TOKEN_VAR, token)).encode()
    out = []
    for pid in members(pgid):
        s = stat(pid)
        if s is not None and int(s[19]) >= int(start) and environ_has(pid, entry):
            out.append(pid)
    return out


def kill_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, SIGKILL it after ``grace`` seconds, until no member is left (or 10 s after SIGKILL)."""
    for sig, limit in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
        deadline = time.time() + limit
        while members(pgid) and time.time() < deadline:
            time.sleep(0.05)
        if not members(pgid):
            return


def kill_processes(pids: List[int], grace: float) -> None:
    """SIGTERM each of ``pids``, SIGKILL those left after ``grace`` seconds."""
    for sig, limit in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.time() + limit
        while [p for p in pids if alive(p)] and time.time() < deadline:
            time.sleep(0.05)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return


def alive(pid: int) -> bool:
    s = stat(pid)
    return s is not None and s[0] != "Z"


def wait_free(port: int, wait: float) -> Dict[str, object]:
    deadline = time.time() + wait
    inodes = listening(port)
    while inodes and time.time() < deadline:
        time.sleep(0.1)
        inodes = listening(port)
    return {"listening": bool(inodes), "holder": holder(inodes)}


def stop(workdir: str, subdir: str, grace: float, port: int, wait: float) -> Dict[str, object]:
    dfd = safedir.open_private(workdir, subdir)
    try:
        rec = json.loads((safedir.read_file(dfd, PID_FILE, "%s/%s/" % (workdir, subdir)) or b"{}").decode())
    except ValueError:
        rec = {}
    pgid = int(rec.get("pgid") or 0)
    stopped = None
    ours = recorded_members(pgid, rec.get("start"), rec.get("token"))
    if ours is None:
        kill_group(pgid, grace)
        stopped = pgid
    elif ours:
        kill_processes(ours, grace)
        stopped = pgid
    safedir.remove_file(dfd, PID_FILE)
    for name in rec.get("files") or []:
        with contextlib.suppress(OSError, ValueError):
            safedir.remove_file(dfd, str(name))
    out = wait_free(port, wait if stopped else min(wait, 1.0))
    out["stopped"] = stopped
    return out


def main(args: List[str]) -> int:
    if args[0] == "port":
        print(json.dumps(wait_free(int(args[1]), float(args[2]))))
    elif args[0] == "stop":
        try:
            print(json.dumps(stop(args[1], args[2], float(args[3]), int(args[4]), float(args[5]))))
        except safedir.Refused as e:
            sys.stderr.write("%s\n" % e)
            return safedir.REFUSED
    else:
        sys.stderr.write("usage: ports.py port PORT WAIT | stop WORKDIR SUBDIR GRACE PORT WAIT\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
