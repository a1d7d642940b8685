"""Remote commands over the connection: ``sh -c SCRIPT`` with a deadline, its output and exit status.

Remote shell commands are built by ``sh_command``/``shlex.quote`` for every value and run under ``sh -c`` (the login
shell only ever sees one quoted word), so no study value is ever parsed by a shell.
"""
from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

import paramiko

from autotune.errors import TrialFailure
from autotune.targets.completed import TOO_LONG, Completed
from autotune.targets.ssh.connection import Connection, OpenFailed, RemoteTimeout

DEFAULT_TIMEOUT = 30.0      # default deadline of one remote command


def sh_command(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line, every word quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


class Commands(Connection):
    """Running shell commands on the target."""

    def run(self, script: str, *, timeout: float = DEFAULT_TIMEOUT, retry: bool = True, stdin: bytes | None = None,
            what: str | None = None, limit: int | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Completed:
        """Run the POSIX shell ``script`` (``sh -c``) and wait for it at most ``timeout`` seconds; with ``limit``,
        each of its outputs is read up to that many bytes (its channel closed past it: status ``TOO_LONG``). Raises
        ``TrialFailure("interrupted")`` as soon as ``should_stop()`` says so."""
        command = "sh -c " + shlex.quote(script)
        label = what or f"remote command {script.split(None, 1)[0] if script.strip() else ''!r}"
        return self.call(lambda t: self._exec(t, command, timeout, stdin, limit, should_stop), label, retry=retry)

    def run_argv(self, argv: Sequence[str], **kwargs: Any) -> Completed:
        return self.run(sh_command(argv), **kwargs)

    def _exec(self, transport: paramiko.Transport, command: str, timeout: float, stdin: bytes | None,
              limit: int | None, should_stop: Callable[[], bool]) -> Completed:
        chan = self._open_session(transport)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            # Waiting happens in chan.recv with a short timeout (paramiko's buffer condition), never in select()
            # on Channel.fileno(): paramiko closes that pipe's raw fds while its reader thread may still write to
            # them, and under load the numbers are reused by other sockets (the SSH socket itself, once).
            chan.settimeout(0.02)
            while True:
                try:
                    data = chan.recv(65536)
                    if data:
                        out += data
                except TimeoutError:
                    pass
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if limit is not None and max(len(out), len(err)) > limit:
                    return Completed(TOO_LONG, "", f"autotune: the program wrote more than {limit} bytes")
                if should_stop():
                    raise TrialFailure("interrupted", "stop requested while a program ran on the target")
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise EOFError("the SSH connection closed")
                if chan.closed and not chan.exit_status_ready():
                    raise EOFError("the channel closed without an exit status")
                if time.monotonic() > deadline:
                    raise RemoteTimeout(timeout)
            status = chan.recv_exit_status()
            if status == -1 and not self.alive(transport):
                # no exit status because the connection died under the command (paramiko closes the channels
                # a moment before it marks the transport inactive); a live connection means a remote signal
                raise EOFError("the SSH connection closed during the command")
            return Completed(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        finally:
            chan.close()

    def open_exec(self, script: str) -> paramiko.Channel:
        """Start ``sh -c script`` and return its open channel (for long-lived remote processes like the lock)."""
        def go(t: paramiko.Transport) -> paramiko.Channel:
            chan = self._open_session(t)
            chan.exec_command("sh -c " + shlex.quote(script))
            return chan
        return self.call(go, "starting a remote process")

    def _open_session(self, transport: paramiko.Transport) -> paramiko.Channel:
        try:
            return transport.open_session(timeout=self.spec.connect_timeout)
        except paramiko.SSHException as e:
            if "Timeout" in str(e) or not transport.is_active():
                raise
            raise OpenFailed(str(e)) from None
