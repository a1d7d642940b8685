"""One tuner per server on a remote host, enforced on the host by names only one process can hold (hostlock.py),
held by a remote process that lives exactly as long as the tuner's SSH channel to it."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.targets.lock_holder import describe
from autotune.targets.programs import FIND_PYTHON, program_line
from autotune.targets.programs.hostlock import BUSY
from autotune.targets.programs.safedir import REFUSED
from autotune.targets.ssh import SSHConnection

log = logging.getLogger(__name__)


def busy_message(identity: str, answer: dict[str, object], where: str, me: str | None) -> str:
    """'target X is busy: held by ...' from what hostlock.ask found out about the holder; its user on ``where`` is
    named when it is not ``me``."""
    holder = answer.get("holder")
    if isinstance(holder, dict):
        who = describe(holder)
        if answer.get("user") is not None and answer.get("user") != me:
            who += f", as user {answer['user']} on {where}"
    elif answer.get("pid") is not None:
        who = f"a process that is not autotune (pid {answer['pid']}, user {answer.get('user')}) on {where}"
    else:
        who = describe(None)
    return f"target {identity} is busy: held by {who}"


class RemoteLock:
    """One tuner per server on the host: the remote program ``hostlock.py`` checks autotune's directory (the guard
    runs before the lock), then binds the lock names (the server port, and the unit for ssh-systemd) and holds them
    while it reads its standard input, the tuner's SSH channel.

    The names are released when the tuner releases the lock, exits, is killed, or loses its connection (sshd closes
    the channel, the program sees the end of its input and exits; the kernel frees the names of a killed one). A
    second tuner, as any user and from any workdir on the host or any machine, is refused with the holder named.
    After a reconnection the lock is taken again; if another tuner took it meanwhile, the study stops with that
    holder named."""

    def __init__(self, conn: SSHConnection, where: Callable[[], tuple[str, str]], names: list[str], identity: str,
                 holder: dict[str, object]) -> None:
        self.conn = conn
        self.where = where
        self.names = names
        self.identity = identity
        self.holder = holder
        self._chan: paramiko.Channel | None = None
        self._held = False          # between __enter__ and __exit__
        self._acquiring = False     # guards the watcher while the holder process is being started

    def __enter__(self) -> None:
        try:
            self._acquire()
        except TrialFailure as e:
            raise UserError(f"target {self.identity}: cannot take the lock on the target: {e.detail}") from None
        self._held = True
        self.conn.on_reconnect.append(self._reacquire)
        self.conn.watchers.append(self._watch)

    def __exit__(self, *exc: object) -> None:
        self._held = False
        with contextlib.suppress(ValueError):
            self.conn.on_reconnect.remove(self._reacquire)
        with contextlib.suppress(ValueError):
            self.conn.watchers.remove(self._watch)
        chan, self._chan = self._chan, None
        if chan is not None:
            with contextlib.suppress(Exception):
                chan.shutdown_write()  # the holder sees the end of its input and exits: the names are free
            with contextlib.suppress(Exception):
                chan.close()

    def _script(self) -> str:
        workdir, subdir = self.where()
        return "\n".join([FIND_PYTHON, "exec " + program_line("hostlock", workdir, subdir, json.dumps(self.holder),
                                                             *self.names)])

    def _acquire(self) -> None:
        """Start the holder process; raises UserError when another tuner holds the lock (or the workdir is
        refused), TrialFailure (ssh_lost) when the connection fails meanwhile."""
        self._acquiring = True
        try:
            self._start_holder()
        finally:
            self._acquiring = False

    def _start_holder(self) -> None:
        chan = self.conn.open_exec(self._script())
        timeout = max(10.0, float(self.conn.spec.connect_timeout))
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if chan.recv_ready():
                buf += chan.recv(4096)
                if b"locked\n" in buf:
                    self._chan = chan
                    return
                continue
            if chan.exit_status_ready():
                while chan.recv_ready():
                    buf += chan.recv(4096)
                status = chan.recv_exit_status()
                err = chan.recv_stderr(4096).decode("utf-8", "replace").strip() if chan.recv_stderr_ready() else ""
                chan.close()
                if status == BUSY:
                    try:
                        answer = json.loads(buf.decode("utf-8", "replace").strip().splitlines()[-1])
                    except (ValueError, IndexError):
                        answer = {}
                    raise UserError(busy_message(self.identity, answer, self.conn.spec.host, self.conn.spec.user))
                if status == REFUSED:
                    raise UserError(f"target {self.identity}: {err.splitlines()[-1].removeprefix('autotune: ')}")
                raise UserError(f"target {self.identity}: cannot take the lock on the target "
                                f"(status {status}{': ' + err.splitlines()[-1] if err else ''})")
            time.sleep(0.02)
        chan.close()
        raise UserError(f"target {self.identity}: no answer while taking the lock on the target")

    def _watch(self) -> None:
        """The holder process on the target is gone while the connection lives (killed there, or an earlier
        re-take failed): take the lock again."""
        if not self._held or self._acquiring:
            return
        chan = self._chan
        if chan is None or chan.closed or chan.exit_status_ready() or chan.eof_received:
            log.warning("ssh %s: the lock holder on the target ended; taking the lock again", self.conn.label)
            self._reacquire()

    def _reacquire(self) -> None:
        """After a reconnection (the old holder died with the old connection) or a lost holder: take it again.
        Raises UserError (another tuner took it meanwhile) or TrialFailure (ssh_lost; retried at the next call)."""
        if not self._held or self._acquiring:
            return
        chan, self._chan = self._chan, None
        if chan is not None:
            with contextlib.suppress(Exception):
                chan.close()
        self._acquire()
