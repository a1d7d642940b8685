"""One tuner per remote target, enforced on the target itself by an flock that dies with the tuner's connection."""
from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import shlex
import time

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.lock import describe
from autotune.targets.ssh import SSHConnection

log = logging.getLogger(__name__)

class RemoteLock:
    """One tuner per target, enforced ON the target: ``flock -n LOCKFILE`` held by a remote process for as long as
    the tuner's SSH connection lives.

    The holder runs ``flock -n -E 75 LOCKFILE sh -c 'write holder file; echo locked; exec cat'``: ``cat`` reads the
    channel until it closes, so the lock is released when the tuner releases it, exits, is killed, or loses its
    connection (sshd closes the channel). A second tuner, from any machine, gets exit status 75 and is refused
    with the holder description written beside the lock file. After a reconnection the lock is taken again; if
    another tuner took it meanwhile, the study stops with that holder named.
    """

    BUSY = 75

    def __init__(self, conn: SSHConnection, directory: str, identity: str, holder: dict[str, object]) -> None:
        self.conn = conn
        self.directory = directory
        self.identity = identity
        self.holder = holder
        self._chan: paramiko.Channel | None = None
        self._held = False          # between __enter__ and __exit__
        self._acquiring = False     # guards the watcher while the holder process is being started

    @property
    def lock_file(self) -> str:
        return posixpath.join(self.conn.resolve(self.directory), "lock")

    @property
    def holder_file(self) -> str:
        return posixpath.join(self.conn.resolve(self.directory), "holder.json")

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
                chan.shutdown_write()  # cat sees end of input and exits: the lock is free
            with contextlib.suppress(Exception):
                chan.close()

    def _script(self) -> str:
        d = self.conn.resolve(self.directory)
        inner = 'printf "%s\\n" "$1" > "$2" && echo locked && exec cat'
        return (
            f"mkdir -p {shlex.quote(d)} && exec flock -n -E {self.BUSY} {shlex.quote(self.lock_file)} "
            f"sh -c {shlex.quote(inner)} sh {shlex.quote(json.dumps(self.holder))} {shlex.quote(self.holder_file)}"
        )

    def _acquire(self) -> None:
        """Start the holder process; raises UserError when another tuner holds the lock, TrialFailure (ssh_lost)
        when the connection fails meanwhile."""
        self._acquiring = True
        try:
            self._start_holder()
        finally:
            self._acquiring = False

    def _start_holder(self) -> None:
        chan = self.conn.open_exec(self._script())
        timeout = max(5.0, float(self.conn.spec.connect_timeout))
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if chan.recv_ready():
                buf += chan.recv(1024)
                if b"locked\n" in buf:
                    self._chan = chan
                    return
                continue
            if chan.exit_status_ready():
                status = chan.recv_exit_status()
                err = chan.recv_stderr(4096).decode("utf-8", "replace").strip() if chan.recv_stderr_ready() else ""
                chan.close()
                if status == self.BUSY:
                    raise UserError(f"target {self.identity} is busy: held by {describe(self._current_holder())}")
                raise UserError(f"target {self.identity}: cannot take the lock {self.lock_file} on the target "
                                f"(status {status}{': ' + err if err else ''}; is flock from util-linux installed?)")
            time.sleep(0.02)
        chan.close()
        raise UserError(f"target {self.identity}: no answer while taking the lock {self.lock_file}")

    def _current_holder(self) -> dict[str, object] | None:
        try:
            text = self.conn.read_text(self.holder_file)
            return json.loads(text) if text else None
        except (ValueError, TrialFailure, OSError):
            return None

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
