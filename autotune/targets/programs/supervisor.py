"""Starts and supervises one server start on the target (ssh-process): ``supervisor.py WORKDIR SUBDIR`` with the
start on standard input as JSON: {"argv", "env", "files": {NAME: TEXT}, "mask": [SECRET...], "stamp"}.

Nothing of the start is on a command line: the secrets in it (values the server reads from its environment or from
``files``) reach the server through this program's standard input. In WORKDIR/SUBDIR, checked and then used through
one open directory (safedir.py) that the server also runs in, it writes ``files`` (0600), creates
``server-STAMP.log`` and starts a daemon that makes itself a session and process-group leader, writes ``server.pid``
({"pgid", "start", "exit", "log", "since", "token", "files"}: no argument, no secret), and forks and execs ARGV
unchanged (no shell ever sees an argument) with ``AUTOTUNE_LAUNCH=TOKEN`` added to its environment (ports.py tells
the start's processes by it). The daemon copies the server's output into the log with every ``mask`` value replaced
by ``***``, waits for the server and writes its exit status to ``server-STAMP.exit`` (``-N`` when signal N killed
it, so a SIGKILLed server is told from one that exited with 137), then removes ``files``. It ignores SIGTERM and
SIGINT so that it can record the status when the group is stopped; only SIGKILL to the whole group ends it without
a record. This program prints the pid record, or {"error": ...} when the command cannot be found or the daemon does
not start, and exits once the daemon runs.

Runs with the target's python3 (>= 3.6, standard library only).
"""
import json
import os
import secrets
import select
import shutil
import signal
import sys
import time
from typing import Dict, List

from autotune.targets.programs import safedir

PID_FILE = "server.pid"
TOKEN_VAR = "AUTOTUNE_LAUNCH"
MASK = b"***"
#: a secret shorter than this is not masked inside other text (it would mask ordinary words and numbers)
SHORTEST = 4
START_WAIT = 10.0       # seconds the starting program waits for the daemon's record
DRAIN = 0.5             # seconds of output still copied after the server exited (its children may be writing)
LINE_LIMIT = 1 << 16    # an unterminated line is copied (masked) once it is this long


def found(exe: str, path: str) -> bool:
    if "/" in exe:
        return os.path.isfile(exe) and os.access(exe, os.X_OK)
    return shutil.which(exe, path=path) is not None


def start_time(pid: str = "self") -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, an identity."""
    with open("/proc/%s/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class Masker:
    """Copies output to a file with the secrets replaced, whole lines at a time (a secret is never split)."""

    def __init__(self, fd: int, secret_values: List[str]) -> None:
        self.fd = fd
        values = {v.encode() for v in secret_values if len(v) >= SHORTEST}
        self.secrets = sorted(values, key=len, reverse=True)
        self.pending = b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        end = self.pending.rfind(b"\n") + 1
        if end == 0 and len(self.pending) < LINE_LIMIT:
            return
        chunk, self.pending = (self.pending[:end], self.pending[end:]) if end else (self.pending, b"")
        self.write(chunk)

    def flush(self) -> None:
        chunk, self.pending = self.pending, b""
        self.write(chunk)

    def write(self, chunk: bytes) -> None:
        for value in self.secrets:
            chunk = chunk.replace(value, MASK)
        while chunk:
            chunk = chunk[os.write(self.fd, chunk):]


def supervise(dfd: int, request: Dict[str, object], log_fd: int, report: int, names: Dict[str, str],
              where: str) -> None:
    """The daemon: record the start, run the server with its output masked into the log, record its exit.
    ``names`` holds the log's and the exit file's names in ``dfd``, whose path is ``where``."""
    os.setsid()
    signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGINT, lambda *a: None)
    argv = [str(a) for a in request["argv"]]  # type: ignore[union-attr]
    token = secrets.token_hex(8)
    record = {"pgid": os.getpid(), "start": start_time(), "exit": where + names["exit"], "log": where + names["log"],
              "since": time.time(), "token": token, "files": sorted(request.get("files") or {})}  # type: ignore
    safedir.write_file(dfd, PID_FILE, json.dumps(record).encode())
    os.write(report, json.dumps(record).encode())
    os.close(report)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})  # type: ignore[union-attr]
    env[TOKEN_VAR] = token
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.close(out_r)
        os.close(out_w)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            sys.stderr.write("autotune: cannot start %s: %s\n" % (argv[0], e.strerror))
            sys.stderr.flush()
        os._exit(127)
    os.close(out_w)
    masker = Masker(log_fd, [str(s) for s in request.get("mask") or []])  # type: ignore[union-attr]
    status = None
    drain_until = None
    while True:
        ready, _, _ = select.select([out_r], [], [], 0.2)
        if ready:
            data = os.read(out_r, 65536)
            if not data:
                break  # every writer closed the output
            masker.feed(data)
        if status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = raw
                drain_until = time.monotonic() + DRAIN
        elif drain_until is not None and time.monotonic() > drain_until and not ready:
            break
    if status is None:
        while True:
            try:
                status = os.waitpid(pid, 0)[1]
                break
            except InterruptedError:
                continue
    masker.flush()
    safedir.write_file(dfd, names["exit"], ("%d\n" % exit_code(status)).encode())
    for name in record["files"]:
        safedir.remove_file(dfd, name)


def main(args: List[str]) -> int:
    os.umask(0o077)
    workdir, subdir = args[0], args[1]
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    argv = [str(a) for a in request["argv"]]
    stamp = str(request["stamp"])
    names = {"log": "server-%s.log" % stamp, "exit": "server-%s.exit" % stamp}
    try:
        dfd = safedir.open_private(workdir, subdir)
        os.fchdir(dfd)  # the server runs in its directory (relative paths in its command line start there)
        path = (request.get("env") or {}).get("PATH") or os.environ.get("PATH") or os.defpath
        if not found(argv[0], path):
            print(json.dumps({"error": "server command not found on the target: %s" % argv[0]}))
            return 127
        safedir.remove_file(dfd, PID_FILE)
        for name, text in (request.get("files") or {}).items():
            if not safedir.write_file(dfd, name, str(text).encode(), 0o600, exclusive=True):
                raise safedir.Refused("autotune: %s/%s/%s exists already" % (workdir, subdir, name))
        log_fd = safedir.create_file(dfd, names["log"])
    except safedir.Refused as e:
        sys.stderr.write("%s\n" % e)
        return safedir.REFUSED
    except (OSError, ValueError) as e:
        print(json.dumps({"error": "cannot start the server in %s/%s: %s" % (workdir, subdir, e)}))
        return 1
    where = "%s/%s/" % (workdir.rstrip("/"), subdir)
    report_r, report_w = os.pipe()
    if os.fork() == 0:
        os.close(report_r)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        try:
            supervise(dfd, request, log_fd, report_w, names, where)
        except BaseException as e:  # the daemon has nobody to tell but the log
            sys.stderr.write("autotune: the server supervisor failed: %s\n" % type(e).__name__)
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    os.close(report_w)
    os.close(log_fd)
    ready, _, _ = select.select([report_r], [], [], START_WAIT)
    data = os.read(report_r, 65536) if ready else b""
    if not data:
        print(json.dumps({"error": "the server supervisor did not start within %g s (see %s on the target)"
                                   % (START_WAIT, where + names["log"])}))
        return 1
    print(data.decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
