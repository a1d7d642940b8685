"""What the ssh-* targets share: one SSH connection, the one-tuner lock on the target, the server's URL (through a
port forward with ``tunnel``), the preflight checks, and running the remote programs (targets/programs/) with the
target's python3.
"""
from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from autotune.errors import TrialFailure, UserError
from autotune.lock import holder_description
from autotune.targets.base import Target
from autotune.targets.forward import LocalForward
from autotune.targets.programs import source
from autotune.targets.remote_lock import RemoteLock
from autotune.targets.ssh import Completed, SSHConnection, SSHSpec, sh_command

#: shell lines that set $PY to a python3 on the target (the system's first: no pyenv/conda shim, which on GPU hosts
#: is often slow to start), or fail
FIND_PYTHON = (
    'PY=; for c in /usr/bin/python3 /usr/local/bin/python3 python3; do '
    'if command -v "$c" >/dev/null 2>&1; then PY=$(command -v "$c"); break; fi; done; '
    '[ -n "$PY" ] || { echo "autotune: python3 is not installed on the target (needed for its helpers)" >&2; '
    'exit 127; }'
)


#: exit status of a guard line that refused a directory (its reason is on stderr)
REFUSED = 96


def guard_lines(*directories: str) -> list[str]:
    """Shell lines run before autotune uses its directories on the target: each is created private (umask 077) if
    missing, and one that is a symbolic link, belongs to another user or is writable by others is refused (exit
    ``REFUSED``, one line on stderr). On a shared host another user who made the directory first could otherwise plant
    or swap what autotune reads, installs and signals from there (a backup, an upload, a pid file)."""
    lines = ["umask 077"]
    for d in directories:
        q = sh_command([d])
        fix = "give [target] workdir a directory of your own"

        def refuse(why: str, q: str = q, d: str = d, fix: str = fix) -> str:
            return f"{{ echo {sh_command([f'autotune: {d} {why}: refusing to use it ({fix})'])} >&2; exit {REFUSED}; }}"
        lines += [
            f"[ ! -L {q} ] || {refuse('is a symbolic link')}",
            f"mkdir -p {q} 2>/dev/null; [ -d {q} ] || {refuse('cannot be created')}",
            f"[ -O {q} ] || {refuse('belongs to another user')}",
            f'[ -z "$(find {q} -maxdepth 0 -perm /022 2>/dev/null)" ] || {refuse("is writable by other users")}',
        ]
    return lines


def program_line(name: str, *args: object) -> str:
    """A shell line running remote program ``name`` with ``args`` (quoted) by ``$PY`` (FIND_PYTHON sets it)."""
    return f'"$PY" -c {sh_command([source(name), *[str(a) for a in args]])}'


class RemoteTarget(Target):
    """A target on a host reached over SSH; subclasses say where on the target their files live (``directory``)."""

    spec: SSHSpec

    def __init__(self, spec: SSHSpec, cwd: Path | None = None, conn: SSHConnection | None = None) -> None:
        super().__init__(spec, cwd)
        self.conn = conn or SSHConnection(spec)
        self._forward: LocalForward | None = None

    @property
    def directory(self) -> str:
        """This target's own directory on the host (under ``workdir``)."""
        raise NotImplementedError

    def base_url(self) -> str:
        """http://127.0.0.1:<forwarded port> with ``tunnel`` (the same port for the target's whole life);
        otherwise http://host:server_port."""
        if self.spec.tunnel:
            if self._forward is None or self._forward.closed:
                self._forward = LocalForward(self.conn, "127.0.0.1", self.spec.server_port)
            return self._forward.url
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.spec.server_port}"

    def guard(self) -> list[str]:
        """guard_lines for the workdir and this target's directory in it."""
        return guard_lines(self.conn.resolve(self.spec.workdir), self.directory)

    def ensure_private(self) -> None:
        """Run the guard on its own, before files are written there over SFTP; a refused directory stops the run
        (it is the host's setup, not a config's fault)."""
        self._refused(self.conn.run("\n".join(self.guard()), what="checking the workdir"))

    def _refused(self, result: Completed) -> None:
        if result.status == REFUSED:
            raise UserError(f"target {self.spec.name}: {result.detail().removeprefix('autotune: ')}")

    def lock(self, holder: str) -> AbstractContextManager[None]:
        return RemoteLock(self.conn, self.directory, self.spec.identity, holder_description(holder))

    def close(self) -> None:
        if self._forward is not None:
            self._forward.close()
        self.conn.close()

    def run_program(self, name: str, *args: object, timeout: float, what: str) -> dict[str, Any]:
        """Run remote program ``name`` and return the JSON object it prints last."""
        script = "\n".join([*self.guard(), FIND_PYTHON, program_line(name, *args)])
        result = self.conn.run(script, timeout=timeout, what=what)
        self._refused(result)
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TrialFailure("deploy_failed", f"{what} on {self.spec.host} failed "
                                                f"(python3 on the target?): {result.detail()}") from None

    def port_state(self, wait: float = 0.0) -> dict[str, Any]:
        """Whether something listens on the server port on the target (waiting up to ``wait`` seconds for it to be
        released), and who holds it when the target lets us see that: {"listening": bool, "holder": str | None}."""
        return self.run_program("ports", "port", self.spec.server_port, wait, timeout=wait + 30,
                                what="checking the server port")

    def check_sftp(self) -> None:
        """autotune moves files and follows logs over SFTP: a host whose sshd offers no SFTP subsystem is refused
        here, in one line, instead of failing every trial as ssh_lost."""
        try:
            self.conn.sftp(lambda s: s.normalize("."), "opening an SFTP session", retry=False)
        except TrialFailure as e:
            raise UserError(f"target {self.spec.name} ({self.conn.label}): no SFTP session ({e.detail}); autotune "
                            "needs the host's SFTP subsystem (sshd_config: Subsystem sftp ...) for logs and files"
                            ) from None

    def check_host(self, command: list[str], extra: list[str] | None = None, search_path: str | None = None) -> None:
        """Connect (host key and authentication problems surface here) and check on the target, in one command,
        that python3 and flock exist, ``directory`` can be made and the server command exists (found from it, on the
        PATH of a non-interactive SSH session, or on ``search_path``). ``extra`` shell lines may add checks that
        print a message to stderr and exit non-zero. Raises ``UserError`` naming the target and the problem."""
        q = sh_command
        workdir = self.directory
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
            "command -v flock >/dev/null 2>&1 || { echo 'autotune: flock (util-linux) is not installed' >&2; exit 1; }",
            *self.guard(),
            f"cd {q([workdir])} || {{ echo {q([f'autotune: cannot enter workdir {workdir}'])} >&2; exit 1; }}",
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
