"""A local port forward to a target: through the target's own SSH connection (paramiko; what ``ssh -L`` does),
surviving reconnections; or through OpenSSH's ``ssh -L`` itself."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.targets.ssh import LINK_ERRORS, SSHConnection, SSHSpec, describe_error

log = logging.getLogger(__name__)
#: bytes read per call in each direction of a forwarded connection
CHUNK = 65536


def _pump(recv: Callable[[int], bytes], send: Callable[[bytes], object], running: Callable[[], bool]) -> None:
    """Copy one direction of a forwarded connection until end of stream, an error on either side, or ``running``
    turns false."""
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        while running():
            data = recv(CHUNK)
            if not data:
                return
            send(data)


class LocalForward:
    """127.0.0.1:<port> on this machine -> ``remote_host:remote_port`` from the target, through the SSH connection.

    Each accepted connection opens a paramiko ``direct-tcpip`` channel (what ``ssh -L`` does); a dropped SSH
    connection is reopened by the next accepted connection, so the local port (and a deployment's base_url) stays
    valid across reconnections. A connection the target cannot complete (nothing listens yet) is closed at once,
    which an HTTP client sees as a failed request.
    """

    def __init__(self, conn: SSHConnection, remote_host: str, remote_port: int) -> None:
        self.conn = conn
        self.remote = (remote_host, remote_port)
        self.closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name=f"ssh-forward-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                client, peer = self._sock.accept()
            except OSError:
                if self.closed:
                    return
                time.sleep(0.05)
                continue
            threading.Thread(target=self._serve, args=(client, peer), daemon=True,
                             name=f"ssh-forward-{self.port}-{peer[1]}").start()

    def _open_channel(self, peer: tuple[str, int]) -> paramiko.Channel | None:
        """A direct-tcpip channel for one accepted connection, or None to refuse it. Only a connection that is
        really gone (closed, or silent) is dropped and reopened; a refusal drops nothing."""
        for _attempt in range(2):
            try:
                transport = self.conn.transport()
            except (TrialFailure, UserError) as e:
                log.warning("ssh forward %s: %s", self.port, e)
                return None
            generation = self.conn.generation
            try:
                return transport.open_channel("direct-tcpip", self.remote, peer,
                                              timeout=self.conn.spec.connect_timeout)
            except paramiko.ChannelException:
                return None  # the target could not connect (nothing listens there yet): refuse this one
            except (*LINK_ERRORS, OSError) as e:
                if self.conn.alive(transport):
                    log.debug("ssh forward %s: %s", self.port, describe_error(e))
                    return None
                self.conn.drop(generation)
        return None

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        chan = self._open_channel(peer)
        if chan is None:
            with contextlib.suppress(OSError):
                client.close()
            return
        # one thread per direction, blocking; no select() on Channel.fileno() (see SSHConnection._exec)
        back = threading.Thread(target=self._to_client, args=(chan, client), daemon=True,
                                name=f"ssh-forward-{self.port}-{peer[1]}-back")
        back.start()
        try:
            with contextlib.suppress(OSError):
                client.setblocking(True)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a chunk is sent when it arrives
            _pump(client.recv, chan.sendall, lambda: not self.closed)
        finally:
            with contextlib.suppress(Exception):
                chan.close()  # ends chan.recv in the other direction
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            back.join(10)
            with contextlib.suppress(OSError):
                client.close()  # only once both directions are done with it

    @staticmethod
    def _to_client(chan: paramiko.Channel, client: socket.socket) -> None:
        try:
            _pump(chan.recv, client.sendall, lambda: True)
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)  # ends client.recv in the serving thread


class OpenSSHForward:
    """127.0.0.1:<port> on this machine -> ``remote_host:remote_port`` from the target, through OpenSSH's own client
    (``ssh -L``): one ControlMaster connection with the target's key, port and known_hosts (host keys checked, never
    added), in a private control directory. The same interface as ``LocalForward``.

    The connection runs ``cat`` on the target with this process holding its input: when autotune ends, however it
    ends, the input closes, the remote command exits and ssh with it, so no forward outlives its tuner.
    """

    def __init__(self, spec: SSHSpec, remote_host: str, remote_port: int, timeout: float | None = None) -> None:
        if spec.password_env:
            raise UserError(f"target {spec.name}: the OpenSSH forward cannot use password_env (ssh reads no password "
                            "from the environment): use a key, or another [workload] client")
        self.closed = False
        self._dir = tempfile.mkdtemp(prefix="autotune-ssh-")
        self.port = _free_port()
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={os.path.expanduser(spec.known_hosts)}", "-o", "ExitOnForwardFailure=yes",
                "-o", "ControlMaster=yes", "-o", f"ControlPath={self._dir}/master", "-o", "ServerAliveInterval=15",
                "-o", f"ConnectTimeout={spec.connect_timeout:g}", "-p", str(spec.port),
                "-L", f"127.0.0.1:{self.port}:{remote_host}:{remote_port}"]
        if spec.key_file:
            argv += ["-i", os.path.expanduser(spec.key_file), "-o", "IdentitiesOnly=yes"]
        if spec.user:
            argv += ["-l", spec.user]
        argv += ["--", spec.host, "cat >/dev/null"]
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
        except OSError as e:
            self._cleanup()
            raise UserError(f"target {spec.name}: cannot run OpenSSH's ssh for the forward: {e.strerror}") from None
        deadline = time.monotonic() + (timeout or spec.connect_timeout + 5)
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                detail = (self._proc.stderr.read() if self._proc.stderr else b"").decode(errors="replace").strip()
                self.close()
                raise TrialFailure("ssh_lost", f"ssh -L to {spec.host}:{spec.port} ended: "
                                               f"{detail.splitlines()[-1] if detail else self._proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        self.close()
        raise TrialFailure("ssh_lost", f"ssh -L to {spec.host}:{spec.port} did not open its forward in time")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._cleanup()

    def _cleanup(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
