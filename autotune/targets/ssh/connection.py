"""The SSH link of a target: opened lazily, kept alive, reopened with backoff, and the retry wrapper every remote call
goes through.

* The connection is opened on first use and kept (with transport keepalives); exec channels (commands.py), the SFTP
  session (files.py) and forwarded connections (forward.py) all share it.
* Every remote call has a deadline. When a call fails because the connection is gone (or a silent network stops
  answering: a timed-out call is followed by a short liveness probe), the connection is reopened with exponential
  backoff for at most ``spec.reconnect_timeout`` seconds and an idempotent call is retried once; when that budget is
  spent the call raises ``TrialFailure("ssh_lost", ...)``. A non-idempotent call (starting a server) is not retried:
  it raises ssh_lost at once and the next call reconnects. A failure of one channel on a connection that still
  answers (a refused or raced channel open, a closed SFTP session) is retried without dropping the connection, so
  forwarded requests in flight are never cut by someone else's hiccup.
* Host keys: hostkeys.py. Authentication: ``spec.key_file``, the ssh-agent, and (when no key file is named) the
  default identities in ~/.ssh. A password or key passphrase is read only from the environment variable
  ``spec.password_env`` names; it is handed to paramiko and never logged or stored.
"""
from __future__ import annotations

import contextlib
import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.targets.ssh.hostkeys import (
    UnknownHostKey,
    changed_key_message,
    known_hosts_path,
    trust_only_known,
    unknown_key_message,
)
from autotune.targets.ssh.spec import SSHSpec

log = logging.getLogger("autotune.targets.ssh")

T = TypeVar("T")

KEEPALIVE = 15.0            # seconds between transport keepalive packets
PROBE_TIMEOUT = 5.0         # a live connection opens a channel within this long
SFTP_TIMEOUT = 30.0         # deadline of one SFTP request
BACKOFF_FIRST = 0.5         # first pause between reconnection attempts; doubles up to BACKOFF_MAX
BACKOFF_MAX = 8.0


class _QuietRefusedForwards(logging.Filter):
    """paramiko logs every refused direct-tcpip channel at ERROR; through a tunnel that is every readiness poll
    of a server that is still starting, so those lines are dropped (the HTTP client sees the refusal anyway)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED: Connection refused: Connect failed" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedForwards())

# errors that mean "the connection (or the network under it) failed", as opposed to a remote error answer
LINK_ERRORS = (paramiko.SSHException, EOFError, TimeoutError, ConnectionError)


class OpenFailed(paramiko.SSHException):
    """A session channel was refused (nothing ran on it)."""


class RemoteTimeout(Exception):
    """A remote command outlived its deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds


def describe_error(e: BaseException) -> str:
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if isinstance(e, TimeoutError):
        return "timed out"
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:200]


class Connection:
    """The link of one target, reopened on demand. Thread-safe. Subclasses add what runs over it (commands.py,
    files.py) and drop their sessions in ``_reset_sessions``."""

    def __init__(self, spec: SSHSpec, *, keepalive: float = KEEPALIVE) -> None:
        self.spec = spec
        self.keepalive = keepalive
        #: deadline of one SFTP request, and of the liveness probe after a timed-out call
        self.sftp_timeout = SFTP_TIMEOUT
        self.probe_timeout = PROBE_TIMEOUT
        self.label = f"{spec.user + '@' if spec.user else ''}{spec.host}:{spec.port}"
        self.known_hosts = known_hosts_path(spec)
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.RLock()
        self._closed = False
        #: increases with every (re)connection
        self.generation = 0
        #: called (under the connection lock) after every reconnection, e.g. to take the remote lock again
        self.on_reconnect: list[Callable[[], None]] = []
        #: called (under the connection lock) whenever the live transport is handed out; cheap local checks only
        self.watchers: list[Callable[[], None]] = []

    # -- connection life -----------------------------------------------------------------------------------
    def transport(self) -> paramiko.Transport:
        """The live transport, connecting (with backoff) if there is none."""
        with self._lock:
            if self._closed:
                raise TrialFailure("ssh_lost", f"the SSH connection to {self.label} was closed")
            transport = self._client.get_transport() if self._client is not None else None
            if transport is not None and transport.is_active():
                for watch in list(self.watchers):
                    watch()
                return transport
            first = self._client is None and self.generation == 0
            self.drop()
            self._connect_with_backoff(first)
            transport = self._client.get_transport() if self._client is not None else None
            assert transport is not None
            return transport

    def connect(self) -> None:
        """Connect now (so that host key and authentication problems show before anything else)."""
        self.transport()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.drop()

    def drop(self, generation: int | None = None) -> None:
        """Forget the current connection (if it is still ``generation``)."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self._reset_sessions()
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
            self._client = None

    def _reset_sessions(self) -> None:
        """Close the long-lived sessions kept on the connection (none here)."""

    def _connect_with_backoff(self, first: bool) -> None:
        budget = max(0.0, float(self.spec.reconnect_timeout))
        deadline = time.monotonic() + budget
        delay = BACKOFF_FIRST
        attempts = 0
        while True:
            attempts += 1
            try:
                self._client = self._open_client()
            except UserError:
                raise
            except (*LINK_ERRORS, OSError) as e:
                last = describe_error(e)
                if time.monotonic() + delay > deadline:
                    what = "cannot connect to" if first else "lost the SSH connection to"
                    raise TrialFailure(
                        "ssh_lost",
                        f"{what} {self.label} and could not (re)connect within {budget:g} s "
                        f"({attempts} attempt{'s' if attempts > 1 else ''}): {last}",
                    ) from None
                log.info("ssh %s: connection attempt %d failed (%s); retrying in %.1f s", self.label, attempts,
                         last, delay)
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            self.generation += 1
            if not first:
                log.warning("ssh %s: reconnected after %d attempt(s)", self.label, attempts)
                for hook in list(self.on_reconnect):
                    hook()
            return

    def _open_client(self) -> paramiko.SSHClient:
        spec = self.spec
        client = paramiko.SSHClient()
        trust_only_known(client, self.known_hosts)
        password = None
        if spec.password_env:
            password = os.environ.get(spec.password_env)
            if password is None:
                raise UserError(f"ssh: target {spec.name} sets password_env = {spec.password_env!r}, "
                                f"but that environment variable is not set")
        key_file = os.path.expanduser(spec.key_file) if spec.key_file else None
        if key_file and not os.path.exists(key_file):
            raise UserError(f"ssh: key_file {key_file} of target {spec.name} does not exist")
        timeout = float(spec.connect_timeout)
        try:
            client.connect(
                spec.host, port=spec.port, username=spec.user, key_filename=key_file, password=password,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                allow_agent=True, look_for_keys=key_file is None,
            )
        except UnknownHostKey as e:
            client.close()
            raise UserError(unknown_key_message(spec, self.known_hosts, e.hostname, e.key)) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise UserError(changed_key_message(spec, self.known_hosts, e.key, e.expected_key)) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = [f"key file {key_file}"] if key_file else ["~/.ssh default keys"]
            how.append("ssh-agent" if os.environ.get("SSH_AUTH_SOCK") else "no ssh-agent (SSH_AUTH_SOCK unset)")
            if password is not None:
                how.append(f"password from ${spec.password_env}")
            user = spec.user or getpass.getuser()
            raise UserError(f"ssh: authentication as {user} on {spec.host}:{spec.port} failed "
                            f"(tried {', '.join(how)}): {e}") from None
        except socket.gaierror as e:
            client.close()
            raise UserError(f"ssh: cannot resolve host {spec.host!r} of target {spec.name}: {e.strerror}") from None
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, int(self.keepalive)))
        sock = transport.sock
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                # forwarded streams are many small packets: Nagle's algorithm would hold each behind the last ACK
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    # -- the retry wrapper ---------------------------------------------------------------------------------
    def call(self, fn: Callable[[paramiko.Transport], T], what: str, *, retry: bool = True) -> T:
        """Run ``fn(transport)``; on a dropped connection reconnect (bounded backoff) and, if ``retry``, run it
        once more. Raises ``TrialFailure("ssh_lost")`` when the connection cannot be had, ``deploy_failed`` when a
        command outlives its deadline on a live connection.

        A failure of one channel on a connection that still answers (a refused or raced channel open, a closed
        SFTP session) never drops the connection: port forwards and other channels in use keep working."""
        for attempt in range(2):
            transport = self.transport()
            generation = self.generation
            try:
                return fn(transport)
            except RemoteTimeout as e:
                if self.alive(transport):
                    raise TrialFailure("deploy_failed", f"{what} did not finish within {e.seconds:g} s on "
                                                        f"{self.label}") from None
                cause: BaseException = e
            except TimeoutError as e:
                # an SFTP request or a channel open went unanswered: a dead link, or a stuck SFTP session
                if self.alive(transport):
                    self._reset_sessions()
                    if retry and attempt == 0:
                        continue
                    raise TrialFailure("ssh_lost", f"{what}: no answer from {self.label} within "
                                                   f"{self.sftp_timeout:g} s") from None
                cause = e
            except LINK_ERRORS as e:
                if self.alive(transport):
                    self._reset_sessions()
                    # a channel that never opened ran nothing: even a non-idempotent call may try again
                    if (retry or isinstance(e, OpenFailed)) and attempt == 0:
                        log.info("ssh %s: %s failed on a live connection (%s); retrying", self.label, what,
                                 describe_error(e))
                        continue
                    raise TrialFailure("ssh_lost", f"{what} failed on {self.label}: {describe_error(e)}") from None
                cause = e
            except OSError as e:
                if transport.is_active():
                    raise  # a remote error answer (e.g. an SFTP "no such file"), not a connection problem
                cause = e
            log.warning("ssh %s: %s failed (%s); reconnecting", self.label, what, describe_error(cause))
            self.drop(generation)
            if not retry or attempt == 1:
                raise TrialFailure("ssh_lost", f"connection to {self.label} dropped during {what}: "
                                               f"{describe_error(cause)}")
        raise AssertionError("unreachable")

    def alive(self, transport: paramiko.Transport) -> bool:
        """Whether the connection still answers: a channel open gets a reply (even a refusal) within
        ``probe_timeout``. Only a closed transport or silence means it is gone."""
        if not transport.is_active():
            return False
        try:
            chan = transport.open_session(timeout=self.probe_timeout)
        except paramiko.ChannelException:
            return transport.is_active()  # refused, so the server answered
        except paramiko.SSHException as e:
            # "Timeout opening channel." is silence; anything else on an active transport is a channel-level
            # failure (paramiko reports concurrent channel-open failures through one shared slot)
            return transport.is_active() and "Timeout" not in str(e)
        except (EOFError, OSError):
            return False
        chan.close()
        return True
