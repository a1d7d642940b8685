"""The local target: the server runs on this machine as its own process group.

Each start gets a new session (so the whole tree can be signalled at once and a Ctrl-C to the tuner does not reach
it), its output goes through the tuner into the trial's log file with the start's secrets masked as it is written,
and it is recorded in a pid file (no argument, no secret in it) so that a server orphaned by a killed tuner is found
and stopped by the next one instead of holding the port (and, on a GPU host, its memory). Secret flags reach the
server off its command line where the engine allows it (targets/launch.py): through its environment, or a file in
a private directory that lives as long as the start.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from autotune import redact
from autotune.errors import TrialFailure, UserError
from autotune.targets.lock_holder import holder_description, state_dir
from autotune.targets.base import Deployment, Target, TargetSpec
from autotune.targets.completed import MAX_OUTPUT, Completed
from autotune.targets.local_lock import HostLock
from autotune.targets.local_program import run_program
from autotune.targets.programs import engine_program_lines
from autotune.targets.programs.ports import kill_group, port_holder

STOP_GRACE = 10.0      # seconds between SIGTERM and SIGKILL
PORT_WAIT = 30.0       # seconds to wait for the port to be released after the tree is gone


def _copy_masked(source: IO[bytes], log_path: Path, masked: tuple[str, ...]) -> None:
    """Copy a server's output into its log line by line, every secret masked before it is written."""
    values = sorted((v.encode() for v in masked if len(v) >= redact.SHORTEST), key=len, reverse=True)
    with source:
        log: IO[bytes] | None = open(log_path, "ab")  # noqa: SIM115 - closed below, or when a write fails
        for line in source:
            if log is None:
                continue  # the log cannot be written (a full disk): read on, so that the server never blocks
            data = line
            for value in values:
                data = data.replace(value, redact.MASK.encode())
            try:
                log.write(redact.mask(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
                log.flush()
            except OSError:
                with contextlib.suppress(OSError):
                    log.close()
                log = None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()


class LocalDeployment(Deployment):
    def __init__(self, proc: subprocess.Popen[bytes], base_url: str, log_path: Path, masked: tuple[str, ...] = (),
                 secret_dir: str | None = None) -> None:
        self.proc = proc
        self.base_url = base_url
        self.log_path = log_path
        self.secret_dir = secret_dir
        self._offset = 0
        assert proc.stdout is not None
        self._copier = threading.Thread(target=_copy_masked, args=(proc.stdout, log_path, masked), daemon=True,
                                        name=f"log-{proc.pid}")
        self._copier.start()

    def finish(self) -> None:
        """After the server's process group is gone: the last of its output into the log, its secret file away."""
        self._copier.join(5)
        if self.secret_dir is not None:
            shutil.rmtree(self.secret_dir, ignore_errors=True)

    def exit_status(self) -> int | None:
        status = self.proc.poll()
        if status is not None:
            self._copier.join(2)  # its last lines are in the log before anyone reads why it ended
        return status

    def read_log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return ""
        # only hand out whole lines, so a fatal line is never matched half-written
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode("utf-8", "replace")


@dataclass(frozen=True)
class LocalSpec(TargetSpec):
    """kind = "local": the server runs on this machine (only the common options)."""

    kind = "local"


class LocalTarget(Target):
    keeps_server = False

    def __init__(self, spec: TargetSpec, cwd: Path | None = None) -> None:
        super().__init__(spec, cwd)
        self.cwd = cwd
        self.current: LocalDeployment | None = None

    @property
    def _pidfile(self) -> Path:
        """Where this port's running server is recorded (in the user's state directory, made on first use)."""
        return state_dir() / f"local-{self.spec.server_port}.pid"

    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.server_port}"

    def lock(self, holder: str) -> AbstractContextManager[None]:
        return HostLock(self.spec.identity, [f"port:{self.spec.server_port}"], holder_description(holder))

    def preflight(self, command: list[str]) -> None:
        if resolve_command(command[0], self.cwd) is None:
            where = f" (relative to {self.cwd})" if "/" in command[0] and self.cwd else " on PATH"
            raise UserError(f"server command not found{where}: {command[0]}")

    def place_file(self, name: str, data: bytes, local: Path) -> str:
        """Beside the study: ``local`` itself."""
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
        return str(local.resolve())

    def run_engine_program(self, command: str, program: str, stdin: bytes, timeout: float,
                           should_stop: Callable[[], bool] = lambda: False) -> Completed:
        return run_program(["sh", "-c", engine_program_lines(command, program)], stdin, cwd=self.cwd,
                           env={**os.environ, **self.spec.env}, timeout=timeout, limit=MAX_OUTPUT,
                           should_stop=should_stop)

    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> LocalDeployment:
        self.stop()
        self._stop_orphan()
        port = self.spec.server_port
        if port_open(port):
            raise TrialFailure("port_busy",
                               f"port {port} on 127.0.0.1 is held by {port_holder(port) or 'another process'}")
        executable = resolve_command(argv[0], self.cwd)
        if executable is None:
            raise TrialFailure("deploy_failed", f"server command not found: {argv[0]}")
        launch = self.start_command(argv, env)
        secret_dir = path = None
        if launch.file is not None:
            secret_dir = tempfile.mkdtemp(prefix="autotune-secret-")  # 0700, this user's
            path = os.path.join(secret_dir, f"secret{launch.file.suffix}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(launch.file.text)
        command = launch.command(path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.Popen(
                [executable, *command[1:]], cwd=self.cwd, env={**os.environ, **launch.env},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as e:
            if secret_dir is not None:
                shutil.rmtree(secret_dir, ignore_errors=True)
            raise TrialFailure("deploy_failed", f"cannot start {argv[0]}: {e.strerror}") from None
        self._pidfile.write_text(json.dumps({"pid": proc.pid, "start": start_time(proc.pid),
                                             "secret_dir": secret_dir}))
        self.current = LocalDeployment(proc, self.base_url(), log_path, launch.secrets, secret_dir)
        return self.current

    def stop(self) -> None:
        if self.current is None:
            return
        current, self.current = self.current, None
        kill_group(current.proc.pid, STOP_GRACE)
        current.proc.poll()  # reap the leader
        current.finish()
        self._pidfile.unlink(missing_ok=True)
        wait_port_free(self.spec.server_port)

    def restore(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        """A local server is only ever the tuner's own: nothing runs after the study."""
        self.stop()

    def _stop_orphan(self) -> None:
        """Stop a server a previous (killed) tuner started on this port, if it is still running."""
        try:
            record = json.loads(self._pidfile.read_text())
        except (OSError, ValueError):
            return
        pid = int(record.get("pid", 0))
        # the same process, not one that reused its pid: a group leader with the recorded start time
        if pid > 0 and _is_group_leader(pid) and record.get("start") and start_time(pid) == record["start"]:
            kill_group(pid, STOP_GRACE)
            wait_port_free(self.spec.server_port)
        secret_dir = record.get("secret_dir")
        if isinstance(secret_dir, str) and os.path.basename(secret_dir).startswith("autotune-secret-"):
            with contextlib.suppress(OSError):
                shutil.rmtree(secret_dir)
        self._pidfile.unlink(missing_ok=True)


def resolve_command(command: str, cwd: Path | None) -> str | None:
    """The executable for ``command``: a name on PATH, or a path (relative ones from ``cwd``)."""
    if "/" not in command:
        return shutil.which(command)
    path = Path(command).expanduser()
    if not path.is_absolute() and cwd is not None:
        path = cwd / path
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid, it names one
    process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def wait_port_free(port: int, timeout: float = PORT_WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while port_open(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
