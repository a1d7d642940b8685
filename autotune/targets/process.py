"""The ssh-process target: the server runs on a remote host as a plain process group started over SSH.

Remote layout (``DIR`` = ``<workdir>/port-<server_port>``, private to the SSH user)::

    DIR/server.pid                   the running start: {"pgid", "start", "exit", "log", "since", "token", "files"}
    DIR/server-<stamp>.log           one log per start (stdout and stderr, its secrets masked)
    DIR/server-<stamp>.exit          the server's exit status, written when it ends (negative: killed by signal)
    DIR/secret-<stamp>.<ext>         the secret flags the engine reads from a file (0600), while the server runs

A start runs programs/supervisor.py with the start (argv, environment, secret file, the secrets to mask) on its
standard input, never on a command line, where ``ps`` shows it to every user of the host. The supervisor checks DIR,
writes the secret file, makes itself a process-group leader, writes the pid file, execs ARGV unchanged and records
its exit status. Only SIGKILL to the whole group (the stop after the grace period) ends it without a record, which
``exit_status`` then reports as -9.

Stopping (programs/ports.py) kills the process group named by the pid file (TERM, KILL after STOP_GRACE) and waits
on the target until nothing listens on the port. Because the pid file survives the tuner, a server orphaned by a
killed tuner is stopped by the next deploy instead of holding the port (and the GPUs). A port held by anything else
fails the trial with port_busy, naming the holder when the target lets us see it.

The server log reaches the trial's local log file by offset over SFTP: every second in the background (so the file
is complete, as a local server's is, even while the benchmark runs) and on every ``read_log``. Polls of a running
deployment are SFTP reads only (exit file, /proc/PGID/stat); no shell runs per poll. These reads follow what the
supervisor created in DIR, which only the SSH user (or root) can change.
"""
from __future__ import annotations

import json
import posixpath
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import TrialFailure
from autotune.targets.base import Deployment
from autotune.targets.logfollow import LogFollower
from autotune.targets.remote import RemoteTarget
from autotune.targets.ssh import READ_LIMIT, SSHConnection, SSHSpec, sh_command

STOP_GRACE = 10.0      # seconds between SIGTERM and SIGKILL
PORT_WAIT = 30.0       # seconds to wait for the port to be released once the group is gone
LAUNCH_WAIT = 10.0     # seconds the supervisor waits for its daemon to start (programs/supervisor.py START_WAIT)
LOG_FOLLOW_INTERVAL = 1.0  # seconds between background fetches of the server log into the trial's log file

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ProcessSpec(SSHSpec):
    """kind = "ssh-process": the SSH options only."""

    kind = "ssh-process"


class ProcessDeployment(Deployment):
    """One start of the server on the target, watched through SFTP (no command runs per poll)."""

    def __init__(self, conn: SSHConnection, record: dict[str, object], remote_log: str, base_url: str,
                 log_path: Path, masked: tuple[str, ...] = ()) -> None:
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
        self._follower = LogFollower(self._fetch_log, log_path, LOG_FOLLOW_INTERVAL, f"pgid-{self.pgid}", masked)

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


class ProcessTarget(RemoteTarget):
    """kind = "ssh-process": start the server argv over SSH in its own process group, with a pid file and logs in
    ``workdir``."""

    def __init__(self, spec: SSHSpec, cwd: Path | None = None, conn: SSHConnection | None = None) -> None:
        super().__init__(spec, cwd, conn)
        self.current: ProcessDeployment | None = None

    @property
    def subdir(self) -> str:
        return f"port-{self.spec.server_port}"

    @property
    def pid_file(self) -> str:
        return posixpath.join(self.directory, "server.pid")

    def preflight(self, command: list[str]) -> None:
        self.check_host(command)

    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> ProcessDeployment:
        if not argv:
            raise TrialFailure("deploy_failed", "empty server command")
        launch = self.start_command(argv, env)
        bad = [k for k in launch.env if not _ENV_NAME.fullmatch(k)]
        if bad:
            raise TrialFailure("deploy_failed", f"invalid environment variable name {bad[0]!r}")
        if self.current is not None:
            self.current.stop_following()
        state = self._stop_recorded()
        if state.get("listening"):
            holder = state.get("holder") or "another process"
            raise TrialFailure("port_busy", f"port {self.spec.server_port} on {self.spec.host} is held by {holder}")
        stamp = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        files = {}
        path = None
        if launch.file is not None:
            name = f"secret-{stamp}{launch.file.suffix}"
            files[name] = launch.file.text
            path = posixpath.join(self.directory, name)
        request = {"argv": launch.command(path), "env": launch.env, "files": files, "mask": list(launch.secrets),
                   "stamp": stamp}
        record = self.run_program("supervisor", self.workdir, self.subdir, stdin=json.dumps(request).encode(),
                                  timeout=LAUNCH_WAIT + 20, retry=False, what="starting the server")
        if "error" in record:
            raise TrialFailure("deploy_failed", str(record["error"]))
        self.current = ProcessDeployment(self.conn, record, str(record["log"]), self.base_url(), log_path,
                                         launch.secrets)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop_following()
        self.current = None
        self._stop_recorded()

    def _stop_recorded(self) -> dict[str, object]:
        """Stop the process group the pid file names (this tuner's server or an orphan of an earlier one) and wait
        for the port; returns {"listening", "holder", "stopped"}."""
        return self.run_program("ports", "stop", self.workdir, self.subdir, STOP_GRACE, self.spec.server_port,
                                PORT_WAIT, timeout=STOP_GRACE + PORT_WAIT + 30, what="stopping the server")

    def close(self) -> None:
        if self.current is not None:
            self.current.stop_following()
        super().close()
