"""The ssh-process target: the server runs on a remote host as a plain process group started over SSH.

Remote layout (``DIR`` = ``<workdir>/port-<server_port>``)::

    DIR/server.pid                   the running start: {"pgid", "start", "exit", "log", "argv"} (JSON)
    DIR/server-<stamp>.log           one log per start (stdout and stderr)
    DIR/server-<stamp>.exit          the server's exit status, written when it ends (negative: killed by signal)
    DIR/lock, DIR/holder.json        the one-tuner-per-target lock (see ``RemoteLock``)

A start runs ``nohup env K=V... python3 -c SUPERVISOR PIDFILE EXITFILE ARGV...`` in the background. The supervisor
(a few lines of stdlib Python, any python3 >= 3.6 on the target; the system's /usr/bin/python3 is preferred over
whatever the login PATH offers, which on GPU hosts is often a slow pyenv/conda shim) makes itself a session and
process-group leader (setsid), writes the pid file, forks and execs ARGV unchanged (no shell ever sees an
argument), waits for it and writes its exit status (``-N`` when signal N killed it, so a SIGKILLed server is told
from one that exited with 137). It survives SIGTERM so that it can record the status when the group is stopped;
only SIGKILL to the whole group (the stop after the grace period) ends it without a record, which ``exit_status``
then reports as -9.

Stopping kills the process group named by the pid file (TERM, KILL after STOP_GRACE) and waits on the target until
nothing listens on the port. Because the pid file survives the tuner, a server orphaned by a killed tuner is stopped
by the next deploy instead of holding the port (and the GPUs). A port held by anything else fails the trial with
port_busy, naming the holder when the target lets us see it.

The server log reaches the trial's local log file by offset over SFTP: every second in the background (so the file
is complete, as a local server's is, even while the benchmark runs) and on every ``read_log``. Polls of a running
deployment are SFTP reads only (exit file, /proc/PGID/stat); no shell runs per poll.
"""
from __future__ import annotations

import json
import posixpath
import re
import secrets
import time
from contextlib import AbstractContextManager
from pathlib import Path

from autotune.errors import TrialFailure, UserError
from autotune.lock import holder_description
from autotune.study import TargetSpec
from autotune.targets.base import Deployment, Target
from autotune.targets.logfollow import LogFollower
from autotune.targets.remote_lock import RemoteLock
from autotune.targets.ssh import READ_LIMIT, SSHConnection, sh_command

STOP_GRACE = 10.0      # seconds between SIGTERM and SIGKILL
PORT_WAIT = 30.0       # seconds to wait for the port to be released once the group is gone
LAUNCH_WAIT = 10.0     # seconds to wait for the supervisor to write the pid file
LOG_FOLLOW_INTERVAL = 1.0  # seconds between background fetches of the server log into the trial's log file

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: runs on the target: supervises one server start (argv: PIDFILE EXITFILE ARGV...)
SUPERVISOR = r"""
import json, os, shutil, signal, sys, time
pidfile, exitfile, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
def put(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)
exe = argv[0]
found = (os.path.isfile(exe) and os.access(exe, os.X_OK)) if "/" in exe else shutil.which(exe)
if not found:
    msg = "server command not found on the target: %s" % exe
    sys.stderr.write("autotune: %s\n" % msg)
    put(pidfile, json.dumps({"error": msg}))
    sys.exit(127)
try:
    os.setsid()
except OSError:
    pass
with open("/proc/self/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
signal.signal(signal.SIGTERM, lambda *a: None)
signal.signal(signal.SIGINT, lambda *a: None)
put(pidfile, json.dumps({"pgid": os.getpid(), "start": start, "exit": exitfile, "argv": argv,
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
code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
put(exitfile, "%d\n" % code)
"""

#: runs on the target: port state and stopping a recorded process group (argv: port PORT WAIT | stop PIDFILE
#: GRACE PORT WAIT); prints one JSON object
HELPER = r"""
import json, os, signal, sys, time
def listening(port):
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
def holder(inodes):
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
def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
def members(pgid):
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            s = stat(int(pid))
            if s and int(s[2]) == pgid and s[0] != "Z":
                out.append(int(pid))
    return out
def wait_free(port, wait):
    deadline = time.time() + wait
    inodes = listening(port)
    while inodes and time.time() < deadline:
        time.sleep(0.1)
        inodes = listening(port)
    return {"listening": bool(inodes), "holder": holder(inodes)}
cmd = sys.argv[1]
if cmd == "port":
    print(json.dumps(wait_free(int(sys.argv[2]), float(sys.argv[3]))))
elif cmd == "stop":
    pidfile, grace, port, wait = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    stopped = None
    try:
        with open(pidfile) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {}
    pgid = int(rec.get("pgid") or 0)
    if pgid > 1:
        leader = stat(pgid)
        ours = (leader is not None and leader[19] == rec.get("start")) or (leader is None and members(pgid))
        if ours and members(pgid):
            for sig, limit in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(pgid, sig)
                except OSError:
                    pass
                deadline = time.time() + limit
                while members(pgid) and time.time() < deadline:
                    time.sleep(0.05)
                if not members(pgid):
                    break
            stopped = pgid
    try:
        os.remove(pidfile)
    except OSError:
        pass
    # a port held although nothing of ours was stopped is someone else's: do not wait long for it
    out = wait_free(port, wait if stopped else min(wait, 1.0))
    out["stopped"] = stopped
    print(json.dumps(out))
"""


#: shell lines that set $PY to a python3 on the target (the system's first: no pyenv/conda shim), or fail
FIND_PYTHON = (
    'PY=; for c in /usr/bin/python3 /usr/local/bin/python3 python3; do '
    'if command -v "$c" >/dev/null 2>&1; then PY=$(command -v "$c"); break; fi; done; '
    '[ -n "$PY" ] || { echo "autotune: python3 is not installed on the target (needed for its helpers)" >&2; '
    'exit 127; }'
)


def helper_script(*args: object) -> str:
    """A shell script that runs HELPER with ``args`` (quoted) and prints its JSON answer."""
    return f'{FIND_PYTHON}\n"$PY" -c {sh_command([HELPER, *[str(a) for a in args]])}'


def remote_port_state(conn: SSHConnection, spec: TargetSpec, wait: float = 0.0) -> dict[str, object]:
    """Whether something listens on ``spec.server_port`` on the target (waiting up to ``wait`` seconds for it to
    be released), and who holds it when the target lets us see that: {"listening": bool, "holder": str | None}."""
    result = conn.run(helper_script("port", spec.server_port, wait), timeout=wait + 30, what="checking the server port")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TrialFailure("deploy_failed", f"checking port {spec.server_port} on {spec.host} failed "
                                            f"(python3 on the target's PATH?): {result.detail()}") from None


def remote_preflight(conn: SSHConnection, spec: TargetSpec, command: list[str], workdir: str,
                     extra: list[str] | None = None, search_path: str | None = None) -> None:
    """Connect (host key and authentication problems surface here) and check on the target, in one command,
    that python3 and flock exist, ``workdir`` can be made and the server command exists (found from workdir, on
    the PATH of a non-interactive SSH session, or on ``search_path``). ``extra`` shell lines may add checks that
    print a message to stderr and exit non-zero. Raises ``UserError`` naming the target and the problem."""
    q = sh_command
    exe = command[0] if command else ""
    if "/" in exe:
        found = f"[ -x {q([exe])} ]"
    elif search_path:
        found = f"(PATH={q([search_path])}; command -v {q([exe])} >/dev/null 2>&1)"
    else:
        found = f"command -v {q([exe])} >/dev/null 2>&1"
    where = f" (searched {search_path}: give an absolute path)" if search_path and "/" not in exe else ""
    script = "\n".join([
        FIND_PYTHON,
        "command -v flock >/dev/null 2>&1 || { echo 'autotune: flock (util-linux) is not installed' >&2; exit 1; }",
        (f"mkdir -p {q([workdir])} && cd {q([workdir])} || "
        f"{{ echo {q([f'autotune: cannot create workdir {workdir}'])} >&2; exit 1; }}"),
        f"{found} || {{ echo {q([f'autotune: server command not found: {exe}{where}'])} >&2; exit 1; }}",
        *(extra or []),
    ])
    try:
        result = conn.run(script, what="checking the target")
    except TrialFailure as e:
        raise UserError(f"target {spec.name}: {e.detail}") from None
    if not result.ok:
        raise UserError(f"target {spec.name} ({conn.label}): {result.detail().removeprefix('autotune: ')}")


def remote_base_url(conn: SSHConnection, spec: TargetSpec) -> str:
    """http://127.0.0.1:<forwarded port> with ``tunnel``; otherwise http://host:server_port."""
    if spec.tunnel:
        return conn.forward(spec.server_port).url
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return f"http://{host}:{spec.server_port}"


class ProcessDeployment(Deployment):
    """One start of the server on the target, watched through SFTP (no command runs per poll)."""

    def __init__(self, conn: SSHConnection, record: dict[str, object], remote_log: str, base_url: str,
                 log_path: Path) -> None:
        self.conn = conn
        self.pgid = int(record["pgid"])  # type: ignore[arg-type]
        self.start = str(record.get("start", ""))
        self.exit_file = str(record["exit"])
        self.remote_log = remote_log
        self.base_url = base_url
        self.log_path = log_path
        self._offset = 0
        self._status: int | None = None
        self._generation = conn.generation
        self._follower = LogFollower(self._fetch_log, log_path, LOG_FOLLOW_INTERVAL, f"pgid-{self.pgid}")

    def reconnected(self) -> bool:
        """Whether the SSH connection was reopened since this start (requests through the tunnel in flight at
        that moment failed for the connection's sake, not the server's)."""
        return self.conn.generation != self._generation

    def exit_status(self) -> int | None:
        if self._status is not None:
            return self._status
        status = self._recorded()
        if status is None:
            if self._supervisor_alive():
                return None
            # gone without a record: only SIGKILL to the whole group stops the supervisor before it writes one
            status = self._recorded()
            if status is None:
                status = -9
        self._status = status
        self._follower.stop()
        return status

    def stop_following(self) -> None:
        self._follower.stop()

    def _recorded(self) -> int | None:
        data = self.conn.read_bytes(self.exit_file)
        if not data or not data.strip():
            return None
        try:
            return int(data.strip())
        except ValueError:
            return None

    def _supervisor_alive(self) -> bool:
        path = f"/proc/{self.pgid}/stat"
        try:
            data = self.conn.read_bytes(path)
        except OSError:  # an SFTP server that cannot see /proc (chroot, hardening): ask a shell
            result = self.conn.run(f"cat {sh_command([path])} 2>/dev/null || true", what="checking the server")
            data = result.stdout.encode()
        if not data:
            return False
        fields = data.decode("utf-8", "replace").rsplit(")", 1)[-1].split()
        return len(fields) > 19 and fields[0] != "Z" and fields[19] == self.start

    def read_log(self) -> str:
        return self._follower.read()

    def _fetch_log(self) -> str:
        """New whole lines of the remote log since the previous fetch (by offset, over SFTP)."""
        data = self.conn.read_bytes(self.remote_log, offset=self._offset, limit=READ_LIMIT) or b""
        end = data.rfind(b"\n") + 1
        if end == 0 and (len(data) >= READ_LIMIT or self._status is not None):
            end = len(data)  # one huge line, or the unterminated last line of a server that has exited
        chunk = data[:end]
        self._offset += len(chunk)
        return chunk.decode("utf-8", "replace")


class ProcessTarget(Target):
    """kind = "ssh-process": start the server argv over SSH in its own process group, with a pid file and logs in
    ``workdir``."""

    def __init__(self, spec: TargetSpec, conn: SSHConnection | None = None) -> None:
        super().__init__(spec)
        self.conn = conn or SSHConnection(spec)
        self.current: ProcessDeployment | None = None

    @property
    def directory(self) -> str:
        return posixpath.join(self.conn.resolve(self.spec.workdir), f"port-{self.spec.server_port}")

    @property
    def pid_file(self) -> str:
        return posixpath.join(self.directory, "server.pid")

    def base_url(self) -> str:
        return remote_base_url(self.conn, self.spec)

    def lock(self, holder: str) -> AbstractContextManager[None]:
        return RemoteLock(self.conn, self.directory, self.spec.identity, holder_description(holder))

    def preflight(self, command: list[str]) -> None:
        remote_preflight(self.conn, self.spec, command, self.directory)

    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> ProcessDeployment:
        if not argv:
            raise TrialFailure("deploy_failed", "empty server command")
        merged = {**self.spec.env, **env}
        bad = [k for k in merged if not _ENV_NAME.match(k)]
        if bad:
            raise TrialFailure("deploy_failed", f"invalid environment variable name {bad[0]!r}")
        if self.current is not None:
            self.current.stop_following()
        state = self._stop_recorded()
        if state.get("listening"):
            holder = state.get("holder") or "another process"
            raise TrialFailure("port_busy", f"port {self.spec.server_port} on {self.spec.host} is held by {holder}")
        stamp = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        d = self.directory
        remote_log = posixpath.join(d, f"server-{stamp}.log")
        exit_file = posixpath.join(d, f"server-{stamp}.exit")
        q = sh_command
        env_words = [f"{k}={v}" for k, v in merged.items()]
        launch = " ".join([
            "nohup", "env", "--", q(env_words) if env_words else "",
            '"$PY"', "-c", q([SUPERVISOR]), q([self.pid_file, exit_file]), q(argv),
            "</dev/null", ">>" + q([remote_log]), "2>&1", "&",
        ])
        no_start = json.dumps({"error": f"the server supervisor did not start within {LAUNCH_WAIT:g} s "
                                        f"(see {remote_log} on the target)"})
        script = "\n".join([
            f"mkdir -p {q([d])} || exit 97",
            f"cd {q([d])} || exit 97",
            FIND_PYTHON,
            f"rm -f {q([self.pid_file])}",
            launch,
            "i=0",
            f"while [ ! -s {q([self.pid_file])} ] && [ $i -lt {int(LAUNCH_WAIT / 0.05)} ]; do "
            "sleep 0.05; i=$((i+1)); done",
            f"cat {q([self.pid_file])} 2>/dev/null || echo {q([no_start])}",
        ])
        result = self.conn.run(script, timeout=LAUNCH_WAIT + 20, retry=False, what="starting the server")
        if result.status == 97:
            raise TrialFailure("deploy_failed", f"cannot create workdir {d} on {self.spec.host}: {result.detail()}")
        try:
            record = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TrialFailure("deploy_failed", f"starting the server on {self.spec.host} failed "
                                                f"(status {result.status}): "
                                                f"{result.detail()}") from None
        if "error" in record:
            raise TrialFailure("deploy_failed", str(record["error"]))
        self.current = ProcessDeployment(self.conn, record, remote_log, self.base_url(), log_path)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop_following()
        self.current = None
        self._stop_recorded()

    def _stop_recorded(self) -> dict[str, object]:
        """Stop the process group the pid file names (this tuner's server or an orphan of an earlier one) and wait
        for the port; returns {"listening", "holder", "stopped"}."""
        script = helper_script("stop", self.pid_file, STOP_GRACE, self.spec.server_port, PORT_WAIT)
        result = self.conn.run(script, timeout=STOP_GRACE + PORT_WAIT + 30, what="stopping the server")
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TrialFailure("deploy_failed", f"stopping the server on {self.spec.host} failed: "
                                                f"{result.detail()}") from None

    def port_state(self, wait: float = 0.0) -> dict[str, object]:
        return remote_port_state(self.conn, self.spec, wait)

    def close(self) -> None:
        if self.current is not None:
            self.current.stop_following()
        self.conn.close()
