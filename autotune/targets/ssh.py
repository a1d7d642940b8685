"""One SSH connection per remote target (paramiko): exec, SFTP and port forwarding (forward.py) share it.

Everything a remote target does goes through ``SSHConnection``:

* It is opened lazily and kept (with transport keepalives); exec channels, the SFTP session and forwarded
  connections all share it.
* Every remote call has a deadline. When a call fails because the connection is gone (or a silent network stops
  answering: a timed-out call is followed by a short liveness probe), the connection is reopened with exponential
  backoff for at most ``spec.reconnect_timeout`` seconds and an idempotent call is retried once; when that budget is
  spent the call raises ``TrialFailure("ssh_lost", ...)``. A non-idempotent call (starting a server) is not retried:
  it raises ssh_lost at once and the next call reconnects. A failure of one channel on a connection that still
  answers (a refused or raced channel open, a closed SFTP session) is retried without dropping the connection, so
  forwarded requests in flight are never cut by someone else's hiccup.
* Host keys are checked against ``spec.known_hosts`` and nothing else: an unknown key and a changed key are refused
  with a one-line ``UserError`` that shows the fingerprint and the command to fix it. Nothing is ever added to
  known_hosts by the tuner.
* Authentication: ``spec.key_file``, the ssh-agent, and (when no key file is named) the default identities in
  ~/.ssh. A password or key passphrase is read only from the environment variable ``spec.password_env`` names; it is
  handed to paramiko and never logged or stored.
* Remote shell commands are built by ``sh_command``/``shlex.quote`` for every value and run under ``sh -c`` (the
  login shell only ever sees one quoted word), so no study value is ever parsed by a shell.
"""
from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import shlex
import socket
import stat as stat_mod
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.tables import PLAIN_TOKEN, Reader
from autotune.targets.base import TargetSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

KEEPALIVE = 15.0            # seconds between transport keepalive packets
PROBE_TIMEOUT = 5.0         # a live connection opens a channel within this long
DEFAULT_TIMEOUT = 30.0      # default deadline of one remote command
SFTP_TIMEOUT = 30.0         # deadline of one SFTP request
BACKOFF_FIRST = 0.5         # first pause between reconnection attempts; doubles up to BACKOFF_MAX
BACKOFF_MAX = 8.0
READ_LIMIT = 4 << 20        # at most this much log is fetched by one read
USER_NAME = re.compile(r"\A[a-z_][a-z0-9_.-]*\Z")
#: private to the remote user (created 0700; see remote.guard_lines)
DEFAULT_WORKDIR = "~/.cache/autotune"


@dataclass(frozen=True)
class SSHSpec(TargetSpec):
    """The options of a target reached over SSH (the ssh-* kinds subclass it)."""

    host: str = ""
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    #: name of a local environment variable holding the SSH password or key passphrase (never the secret itself)
    password_env: str | None = None
    #: reach server_port through SSH port forwarding (the server may listen on the target's loopback only)
    tunnel: bool = False
    #: logs, pid files, the lock and backups on the target
    workdir: str = DEFAULT_WORKDIR
    connect_timeout: float = 10.0
    #: how long to keep reconnecting (with backoff) after the connection drops before failing with ssh_lost
    reconnect_timeout: float = 60.0

    keys = (*TargetSpec.keys, "host", "port", "user", "key_file", "known_hosts", "password_env", "tunnel", "workdir",
            "connect_timeout", "reconnect_timeout")

    @classmethod
    def read(cls, table: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
        host = reader.get(table, where, "host", str, None)
        if host is None:
            reader.fail(where, "host", f"is required for kind = {cls.kind!r}")
        if not PLAIN_TOKEN.match(host):
            reader.fail(where, "host", f"must be a host name or address, got {host!r}")
        user = reader.get(table, where, "user", str, None)
        if user is not None and not USER_NAME.match(user):
            reader.fail(where, "user", f"must be a login name, got {user!r}")
        workdir = reader.get(table, where, "workdir", str, DEFAULT_WORKDIR)
        if not workdir.startswith(("/", "~/")) or not PLAIN_TOKEN.match(workdir.lstrip("~")):
            reader.fail(where, "workdir", "must be an absolute path of plain characters, or one under ~/ (the SSH "
                                          f"user's own home), got {workdir!r}")
        password_env = reader.get(table, where, "password_env", str, None)
        if password_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", password_env):
            reader.fail(where, "password_env",
                        "names an environment variable (the password itself never goes in a study)")
        return {
            **super().read(table, where, reader), "host": host, "user": user, "workdir": workdir,
            "port": reader.integer(table, where, "port", 22, low=1, high=65535),
            "key_file": reader.get(table, where, "key_file", str, None),
            "known_hosts": reader.get(table, where, "known_hosts", str, "~/.ssh/known_hosts"),
            "password_env": password_env, "tunnel": reader.get(table, where, "tunnel", bool, False),
            "connect_timeout": reader.number(table, where, "connect_timeout", 10.0, low=0.5, high=300),
            "reconnect_timeout": reader.number(table, where, "reconnect_timeout", 60.0, low=0, high=3600),
        }

    @property
    def identity(self) -> str:
        return f"{self.user or ''}@{self.host}:{self.port}:{self.server_port}"


class _QuietRefusedForwards(logging.Filter):
    """paramiko logs every refused direct-tcpip channel at ERROR; through a tunnel that is every readiness poll
    of a server that is still starting, so those lines are dropped (the HTTP client sees the refusal anyway)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED: Connection refused: Connect failed" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedForwards())

# errors that mean "the connection (or the network under it) failed", as opposed to a remote error answer
LINK_ERRORS = (paramiko.SSHException, EOFError, TimeoutError, ConnectionError)


@dataclass(frozen=True)
class Completed:
    """A finished remote command."""

    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    def detail(self) -> str:
        """One line saying what went wrong (stderr, else stdout)."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1][:300] if text else f"exit status {self.status}"


def sh_command(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line, every word quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def _expand_local(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


def _host_name(host: str, port: int) -> str:
    """The name a host key is filed under in known_hosts (``[host]:port`` for ports other than 22)."""
    return host if port == 22 else f"[{host}]:{port}"


def _key_type_flag(key: paramiko.PKey) -> str:
    name = key.get_name()
    if "ed25519" in name:
        return "ed25519"
    if "ecdsa" in name:
        return "ecdsa"
    if "rsa" in name:
        return "rsa"
    return name


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class _RefuseUnknown(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key so the refusal can show its fingerprint."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class SSHConnection:
    """The one SSH connection of a target, reopened on demand. Thread-safe for the calls below."""

    def __init__(self, spec: SSHSpec, *, keepalive: float = KEEPALIVE) -> None:
        self.spec = spec
        self.keepalive = keepalive
        #: deadline of one SFTP request, and of the liveness probe after a timed-out call
        self.sftp_timeout = SFTP_TIMEOUT
        self.probe_timeout = PROBE_TIMEOUT
        self.label = f"{spec.user + '@' if spec.user else ''}{spec.host}:{spec.port}"
        self.known_hosts = _expand_local(spec.known_hosts) or os.path.expanduser("~/.ssh/known_hosts")
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_generation = -1
        self._lock = threading.RLock()
        self._closed = False
        #: increases with every (re)connection
        self.generation = 0
        #: called (under the connection lock) after every reconnection, e.g. to take the remote lock again
        self.on_reconnect: list[Callable[[], None]] = []
        #: called (under the connection lock) whenever the live transport is handed out; cheap local checks only
        self.watchers: list[Callable[[], None]] = []
        self._home: str | None = None

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
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
            self._sftp = None
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
            self._client = None

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
        if os.path.exists(self.known_hosts):
            try:
                client.load_host_keys(self.known_hosts)
            except (OSError, paramiko.SSHException, ValueError) as e:
                raise UserError(f"ssh: cannot read known_hosts file {self.known_hosts}: {e}") from None
        client.set_missing_host_key_policy(_RefuseUnknown())
        password = None
        if spec.password_env:
            password = os.environ.get(spec.password_env)
            if password is None:
                raise UserError(f"ssh: target {spec.name} sets password_env = {spec.password_env!r}, "
                                f"but that environment variable is not set")
        key_file = _expand_local(spec.key_file)
        if key_file and not os.path.exists(key_file):
            raise UserError(f"ssh: key_file {key_file} of target {spec.name} does not exist")
        timeout = float(spec.connect_timeout)
        try:
            client.connect(
                spec.host, port=spec.port, username=spec.user, key_filename=key_file, password=password,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                allow_agent=True, look_for_keys=key_file is None,
            )
        except _UnknownHostKey as e:
            client.close()
            raise UserError(self._unknown_key_message(e.hostname, e.key)) from None
        except paramiko.BadHostKeyException as e:
            client.close()
            raise UserError(self._changed_key_message(e.key, e.expected_key)) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = [f"key file {key_file}"] if key_file else ["~/.ssh default keys"]
            how.append("ssh-agent" if os.environ.get("SSH_AUTH_SOCK") else "no ssh-agent (SSH_AUTH_SOCK unset)")
            if password is not None:
                how.append(f"password from ${spec.password_env}")
            user = spec.user or _local_user()
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

    def _unknown_key_message(self, hostname: str, key: paramiko.PKey) -> str:
        spec = self.spec
        kh = self.known_hosts
        return (
            f"ssh: host key of {hostname} is not known (not in {kh}); the server offers {key.get_name()} "
            f"{key.fingerprint}. Compare that fingerprint with the host's own (on the host: ssh-keygen -lf "
            f"/etc/ssh/ssh_host_{_key_type_flag(key)}_key.pub), then trust it with: "
            f"ssh-keyscan -p {spec.port} -t {_key_type_flag(key)} {shlex.quote(spec.host)} >> {shlex.quote(kh)}"
        )

    def _changed_key_message(self, got: paramiko.PKey, expected: paramiko.PKey) -> str:
        spec = self.spec
        name = _host_name(spec.host, spec.port)
        kh = self.known_hosts
        return (
            f"ssh: REFUSED: the host key of {name} has CHANGED (possible man-in-the-middle attack): {kh} has "
            f"{expected.get_name()} {expected.fingerprint}, the server offers {got.get_name()} {got.fingerprint}. "
            f"If the host was reinstalled and the new fingerprint is its own, remove the old entry with: "
            f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(kh)} and add the new one with: "
            f"ssh-keyscan -p {spec.port} -t {_key_type_flag(got)} {shlex.quote(spec.host)} >> {shlex.quote(kh)}"
        )

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
            except _RemoteTimeout as e:
                if self.alive(transport):
                    raise TrialFailure("deploy_failed", f"{what} did not finish within {e.seconds:g} s on "
                                                        f"{self.label}") from None
                cause: BaseException = e
            except TimeoutError as e:
                # an SFTP request or a channel open went unanswered: a dead link, or a stuck SFTP session
                if self.alive(transport):
                    self._reset_sftp()
                    if retry and attempt == 0:
                        continue
                    raise TrialFailure("ssh_lost", f"{what}: no answer from {self.label} within "
                                                   f"{self.sftp_timeout:g} s") from None
                cause = e
            except LINK_ERRORS as e:
                if self.alive(transport):
                    self._reset_sftp()
                    # a channel that never opened ran nothing: even a non-idempotent call may try again
                    if (retry or isinstance(e, _OpenFailed)) and attempt == 0:
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

    def _reset_sftp(self) -> None:
        with self._lock:
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
            self._sftp = None

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

    # -- exec ----------------------------------------------------------------------------------------------
    def run(self, script: str, *, timeout: float = DEFAULT_TIMEOUT, retry: bool = True, stdin: bytes | None = None,
            what: str | None = None) -> Completed:
        """Run the POSIX shell ``script`` (``sh -c``) and wait for it at most ``timeout`` seconds."""
        command = "sh -c " + shlex.quote(script)
        label = what or f"remote command {script.split(None, 1)[0] if script.strip() else ''!r}"
        return self.call(lambda t: self._exec(t, command, timeout, stdin), label, retry=retry)

    def run_argv(self, argv: Sequence[str], **kwargs: Any) -> Completed:
        return self.run(sh_command(argv), **kwargs)

    def _exec(self, transport: paramiko.Transport, command: str, timeout: float, stdin: bytes | None) -> Completed:
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
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise EOFError("the SSH connection closed")
                if chan.closed and not chan.exit_status_ready():
                    raise EOFError("the channel closed without an exit status")
                if time.monotonic() > deadline:
                    raise _RemoteTimeout(timeout)
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
            raise _OpenFailed(str(e)) from None

    # -- SFTP ----------------------------------------------------------------------------------------------
    def _sftp_client(self, transport: paramiko.Transport) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None or self._sftp_generation != self.generation:
                if self._sftp is not None:
                    with contextlib.suppress(Exception):
                        self._sftp.close()
                client = paramiko.SFTPClient.from_transport(transport)
                if client is None:
                    raise paramiko.SSHException("the server refused the SFTP subsystem")
                self._sftp = client
                self._sftp_generation = self.generation
            channel = self._sftp.get_channel()
            if channel is not None:
                channel.settimeout(self.sftp_timeout)
            return self._sftp

    def sftp(self, fn: Callable[[paramiko.SFTPClient], T], what: str, *, retry: bool = True) -> T:
        """Run ``fn(sftp)`` with the reconnecting wrapper (SFTP calls are serialised)."""
        def go(t: paramiko.Transport) -> T:
            with self._lock:
                return fn(self._sftp_client(t))
        return self.call(go, what, retry=retry)

    def home(self) -> str:
        if self._home is None:
            self._home = self.sftp(lambda s: s.normalize("."), "finding the home directory")
        return self._home

    def resolve(self, path: str) -> str:
        """A remote path with a leading ``~`` replaced by the remote user's home."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return posixpath.join(self.home(), path[2:])
        return path

    def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        """The file's bytes from ``offset`` (at most ``limit``); None when it does not exist."""
        def go(s: paramiko.SFTPClient) -> bytes | None:
            try:
                f = s.open(path, "rb")
            except FileNotFoundError:
                return None
            with f:
                if offset:
                    f.seek(offset)
                return f.read(limit) if limit is not None else f.read()
        return self.sftp(go, f"reading {path}")

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", "replace")

    def stat(self, path: str) -> paramiko.SFTPAttributes | None:
        def go(s: paramiko.SFTPClient) -> paramiko.SFTPAttributes | None:
            try:
                return s.stat(path)
            except FileNotFoundError:
                return None
        return self.sftp(go, f"stat {path}")

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        def go(s: paramiko.SFTPClient) -> None:
            parts = [p for p in path.split("/") if p]
            current = "/" if path.startswith("/") else ""
            for part in parts:
                current = posixpath.join(current, part) if current else part
                try:
                    attrs = s.stat(current)
                except FileNotFoundError:
                    try:
                        s.mkdir(current, mode)
                    except OSError:
                        if not _is_dir(s, current):  # made by someone else meanwhile is fine
                            raise
                    continue
                if not stat_mod.S_ISDIR(attrs.st_mode or 0):
                    raise NotADirectoryError(f"{current} is not a directory")
        self.sftp(go, f"creating {path}")

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644, *, exclusive: bool = False) -> bool:
        """Write a file atomically (a temporary beside it, then rename). With ``exclusive``, never replace an
        existing file: returns False if ``path`` already exists."""
        def go(s: paramiko.SFTPClient) -> bool:
            if exclusive:
                try:
                    f = s.open(path, "wxb")
                except OSError:
                    if _exists(s, path):
                        return False
                    raise
                with f:
                    f.write(data)
                s.chmod(path, mode)
                return True
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            with s.open(tmp, "wb") as f:
                f.write(data)
            s.chmod(tmp, mode)
            s.posix_rename(tmp, path)
            return True
        return self.sftp(go, f"writing {path}")

    def remove(self, path: str) -> bool:
        def go(s: paramiko.SFTPClient) -> bool:
            try:
                s.remove(path)
            except FileNotFoundError:
                return False
            return True
        return self.sftp(go, f"removing {path}")

    def rename(self, src: str, dst: str) -> None:
        self.sftp(lambda s: s.posix_rename(src, dst), f"renaming {src}")


class _OpenFailed(paramiko.SSHException):
    """A session channel was refused (nothing ran on it)."""


class _RemoteTimeout(Exception):
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


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _exists(s: paramiko.SFTPClient, path: str) -> bool:
    try:
        s.stat(path)
    except FileNotFoundError:
        return False
    return True


def _is_dir(s: paramiko.SFTPClient, path: str) -> bool:
    try:
        return stat_mod.S_ISDIR(s.stat(path).st_mode or 0)
    except FileNotFoundError:
        return False
