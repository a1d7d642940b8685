"""Supervises one server start on the target (ssh-process): ``supervisor.py PIDFILE EXITFILE ARGV...``.

Makes itself a session and process-group leader, writes PIDFILE ({"pgid", "start", "exit", "argv", "log",
"since"}), forks and execs ARGV unchanged (no shell ever sees an argument), waits for it and writes its exit status
to EXITFILE (``-N`` when signal N killed it, so a SIGKILLed server is told from one that exited with 137). It ignores
SIGTERM and SIGINT so that it can record the status when the group is stopped; only SIGKILL to the whole group ends
it without a record. A command that cannot be found is written to PIDFILE as {"error": ...} (exit status 127).

Runs with the target's python3 (>= 3.6, standard library only).
"""
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from typing import List


def put(path: str, text: str) -> None:
    """Write ``path`` whole: a temporary beside it, then a rename."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def found(exe: str) -> bool:
    if "/" in exe:
        return os.path.isfile(exe) and os.access(exe, os.X_OK)
    return shutil.which(exe) is not None


def start_time(pid: str = "self") -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, an identity."""
    with open("/proc/%s/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main(args: List[str]) -> int:
    pidfile, exitfile, argv = args[0], args[1], args[2:]
    exe = argv[0]
    if not found(exe):
        msg = "server command not found on the target: %s" % exe
        sys.stderr.write("autotune: %s\n" % msg)
        put(pidfile, json.dumps({"error": msg}))
        return 127
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGINT, lambda *a: None)
    put(pidfile, json.dumps({"pgid": os.getpid(), "start": start_time(), "exit": exitfile, "argv": argv,
                             "log": os.path.realpath("/proc/self/fd/1"), "since": time.time()}))
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(exe, argv)
        except OSError as e:
            sys.stderr.write("autotune: cannot start %s: %s\n" % (exe, e.strerror))
            sys.stderr.flush()
        os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    put(exitfile, "%d\n" % exit_code(status))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
