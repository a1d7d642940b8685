"""What the ssh-* targets share: one SSH connection, the one-tuner lock on the host, the server's URL (through a
port forward with ``tunnel``), the preflight checks, running the remote programs (targets/programs/) with the
target's python3, and autotune's directory there.

autotune's directory on the target (``workdir``/``subdir``) is only ever used by a remote program that checks the
whole path first (programs/safedir.py: StrictModes' rule for every directory from /, the last two the user's own)
and then reads, writes, renames or removes through the directory it checked, never following a link: there is no
gap between a check and a use for anyone to swap something into.
"""
from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from autotune.errors import TrialFailure, UserError
from autotune.targets.lock_holder import holder_description
from autotune.targets.base import Target
from autotune.targets.completed import MAX_OUTPUT
from autotune.targets.forward import LocalForward
from autotune.targets.programs import FIND_PYTHON, engine_program_lines, program_line
from autotune.targets.programs.safedir import REFUSED
from autotune.targets.remote_lock import RemoteLock
from autotune.targets.ssh import Completed, SSHConnection, SSHSpec, sh_command

__all__ = ["FIND_PYTHON", "REFUSED", "RemoteTarget", "program_line"]


class RemoteTarget(Target):
    """A target on a host reached over SSH; subclasses name their directory under ``workdir`` (``subdir``) and
    the lock names that keep other tuners of the same server off the host (``lock_names``)."""

    spec: SSHSpec

    def __init__(self, spec: SSHSpec, cwd: Path | None = None, conn: SSHConnection | None = None) -> None:
        super().__init__(spec, cwd)
        self.conn = conn or SSHConnection(spec)
        self._forward: LocalForward | None = None

    @property
    def machine(self) -> str:  # type: ignore[override]
        return self.spec.host

    @property
    def subdir(self) -> str:
        """This target's own directory's name in ``workdir``."""
        raise NotImplementedError

    @property
    def lock_names(self) -> list[str]:
        """What two tuners of this target would both use on the host (locked by name there: hostlock.py)."""
        return [f"port:{self.spec.server_port}"]

    @property
    def workdir(self) -> str:
        return self.conn.resolve(self.spec.workdir)

    @property
    def directory(self) -> str:
        """This target's own directory on the host."""
        return posixpath.join(self.workdir, self.subdir)

    def base_url(self) -> str:
        """http://127.0.0.1:<forwarded port> with ``tunnel`` (the same port for the target's whole life);
        otherwise http://host:server_port."""
        if self.spec.tunnel:
            if self._forward is None or self._forward.closed:
                self._forward = LocalForward(self.conn, "127.0.0.1", self.spec.server_port)
            return self._forward.url
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.spec.server_port}"

    # -- autotune's directory on the target --------------------------------------------------------------------
    def _refused(self, result: Completed) -> None:
        if result.status == REFUSED:
            raise UserError(f"target {self.spec.name}: {result.detail().removeprefix('autotune: ')}")

    def in_workdir(self, op: str, *args: object, stdin: bytes | None = None, what: str) -> dict[str, Any]:
        """Run programs/workdir.py's ``op`` in this target's directory; a directory or file another user could
        control is a ``UserError`` (the host's setup, not a config's fault)."""
        return self.run_program("workdir", self.workdir, self.subdir, op, *args, stdin=stdin, what=what)

    def read_file(self, name: str) -> bytes | None:
        """File ``name`` in this target's directory (None when it does not exist)."""
        data = self.in_workdir("read", name, what=f"reading {name}").get("data")
        return None if data is None else base64.b64decode(data)

    def write_file(self, name: str, data: bytes, mode: int = 0o600, *, exclusive: bool = False) -> bool:
        """Write ``name`` in this target's directory whole; with ``exclusive`` never over an existing one (False
        then)."""
        flags = ["exclusive"] if exclusive else []
        return bool(self.in_workdir("write", name, f"{mode:o}", *flags, stdin=data, what=f"writing {name}")
                    .get("written"))

    def place_file(self, name: str, data: bytes, local: Path) -> str:
        """Into this target's directory on the host (``local`` is this machine's path, not the host's)."""
        self.write_file(name, data, 0o644)
        return posixpath.join(self.directory, name)

    def remove_files(self, *names: str) -> list[str]:
        return list(self.in_workdir("remove", *names, what="removing files").get("removed", []))

    def rename_file(self, src: str, dst: str) -> None:
        self.in_workdir("rename", src, dst, what=f"renaming {src}")

    # -- programs, lock, checks --------------------------------------------------------------------------------
    def run_program(self, name: str, *args: object, timeout: float = 60.0, what: str,
                    stdin: bytes | None = None, retry: bool = True) -> dict[str, Any]:
        """Run remote program ``name`` and return the JSON object it prints last."""
        script = "\n".join([FIND_PYTHON, program_line(name, *args)])
        result = self.conn.run(script, timeout=timeout, what=what, stdin=stdin, retry=retry)
        self._refused(result)
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TrialFailure("deploy_failed", f"{what} on {self.spec.host} failed "
                                                f"(python3 on the target?): {result.detail()}") from None

    def run_engine_program(self, command: str, program: str, stdin: bytes, timeout: float,
                           should_stop: Callable[[], bool] = lambda: False) -> Completed:
        """In this target's directory (where its servers start); the study's environment for the server reaches
        the program inside ``stdin`` (engines/ puts it there), never on a command line."""
        q = sh_command
        script = "\n".join([
            f"cd {q([self.directory])} 2>/dev/null || cd || exit 1",
            engine_program_lines(command, program),
        ])
        try:
            return self.conn.run(script, timeout=timeout, what="asking the engine on the target", stdin=stdin,
                                 limit=MAX_OUTPUT, should_stop=should_stop)
        except TrialFailure as e:
            if e.reason != "deploy_failed":  # the connection lost, a stop asked for
                raise
            return Completed(124, "", f"autotune: {e.detail}")  # past its deadline on a live connection

    def lock(self, holder: str) -> AbstractContextManager[None]:
        return RemoteLock(self.conn, lambda: (self.workdir, self.subdir), self.lock_names, self.spec.identity,
                          holder_description(holder))

    def close(self) -> None:
        if self._forward is not None:
            self._forward.close()
        self.conn.close()

    def port_state(self, wait: float = 0.0) -> dict[str, Any]:
        """Whether something listens on the server port on the target (waiting up to ``wait`` seconds for it to be
        released), and who holds it when the target lets us see that: {"listening": bool, "holder": str | None}."""
        return self.run_program("ports", "port", self.spec.server_port, wait, timeout=wait + 30,
                                what="checking the server port")

    def check_sftp(self) -> None:
        """autotune follows logs over SFTP: a host whose sshd offers no SFTP subsystem is refused here, in one line,
        instead of failing every trial as ssh_lost."""
        try:
            self.conn.sftp(lambda s: s.normalize("."), "opening an SFTP session", retry=False)
        except TrialFailure as e:
            raise UserError(f"target {self.spec.name} ({self.conn.label}): no SFTP session ({e.detail}); autotune "
                            "needs the host's SFTP subsystem (sshd_config: Subsystem sftp ...) for logs and files"
                            ) from None

    def check_host(self, command: list[str], extra: list[str] | None = None, search_path: str | None = None) -> None:
        """Connect (host key and authentication problems surface here) and check on the target, in one command,
        that python3 exists, this target's directory is private (created if missing) and the server command exists
        (found from that directory, on the PATH of a non-interactive SSH session, or on ``search_path``). ``extra``
        shell lines may add checks that print a message to stderr and exit non-zero. Raises ``UserError`` naming the
        target and the problem."""
        q = sh_command
        exe = command[0] if command else ""
        if "/" in exe:
            found = f"[ -x {q([exe])} ]"
        elif search_path:
            found = f"(PATH={q([search_path])}; command -v {q([exe])} >/dev/null 2>&1)"
        else:
            found = f"command -v {q([exe])} >/dev/null 2>&1"
        where = f" (searched {search_path}: give an absolute path)" if search_path and "/" not in exe else ""
        self.check_sftp()
        script = "\n".join([
            FIND_PYTHON,
            f"{program_line('workdir', self.workdir, self.subdir, 'check')} >/dev/null || exit $?",
            f"cd {q([self.directory])} || {{ echo {q([f'autotune: cannot enter {self.directory}'])} >&2; exit 1; }}",
            f"{found} || {{ echo {q([f'autotune: server command not found: {exe}{where}'])} >&2; exit 1; }}",
            *(extra or []),
        ])
        try:
            result = self.conn.run(script, what="checking the target")
        except TrialFailure as e:
            raise UserError(f"target {self.spec.name}: {e.detail}") from None
        if not result.ok:
            raise UserError(f"target {self.spec.name} ({self.conn.label}): "
                            f"{result.detail().removeprefix('autotune: ')}")
