"""Port state and stopping a recorded process group, on the target (and on this machine for the local target).

    ports.py port PORT WAIT                    -> {"listening", "holder"}
    ports.py stop PIDFILE GRACE PORT WAIT      -> {"listening", "holder", "stopped"}

prints one JSON object. ``port`` waits up to WAIT seconds for PORT to be released. ``stop`` stops the process group
a supervisor's PIDFILE names, if it is still the one recorded there (its leader's start time must match, so a pid
reused by an unrelated process is never signalled): SIGTERM, SIGKILL after GRACE seconds; then removes PIDFILE and
waits for the port (briefly, when nothing of ours was stopped: a port held then is someone else's).

Everything comes from /proc: no ss/lsof/fuser needed. Runs with the target's python3 (>= 3.6, standard library).
"""
import contextlib
import json
import os
import signal
import sys
import time
from typing import Dict, List, Optional, Set


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


def is_recorded_group(pgid: int, start: Optional[str]) -> bool:
    """Whether ``pgid`` is still the group a record names: its leader has the recorded start time, or the leader is
    gone and members remain (they can only be the recorded group's: a group id is not reused while it has
    members)."""
    if pgid <= 1:
        return False
    leader = stat(pgid)
    if leader is not None:
        return start is not None and leader[19] == start and bool(members(pgid))
    return bool(members(pgid))


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


def wait_free(port: int, wait: float) -> Dict[str, object]:
    deadline = time.time() + wait
    inodes = listening(port)
    while inodes and time.time() < deadline:
        time.sleep(0.1)
        inodes = listening(port)
    return {"listening": bool(inodes), "holder": holder(inodes)}


def stop(pidfile: str, grace: float, port: int, wait: float) -> Dict[str, object]:
    try:
        with open(pidfile) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {}
    pgid = int(rec.get("pgid") or 0)
    stopped = None
    if is_recorded_group(pgid, rec.get("start")):
        kill_group(pgid, grace)
        stopped = pgid
    with contextlib.suppress(OSError):
        os.remove(pidfile)
    out = wait_free(port, wait if stopped else min(wait, 1.0))
    out["stopped"] = stopped
    return out


def main(args: List[str]) -> int:
    if args[0] == "port":
        print(json.dumps(wait_free(int(args[1]), float(args[2]))))
    elif args[0] == "stop":
        print(json.dumps(stop(args[1], float(args[2]), int(args[3]), float(args[4]))))
    else:
        sys.stderr.write("usage: ports.py port PORT WAIT | stop PIDFILE GRACE PORT WAIT\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
