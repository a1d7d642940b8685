"""A local port forward through a target's SSH connection (what ``ssh -L`` does), surviving reconnections."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

import paramiko

from autotune.errors import TrialFailure, UserError
from autotune.targets.ssh import LINK_ERRORS, SSHConnection, describe_error

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
