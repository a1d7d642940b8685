"""A TCP proxy on 127.0.0.1 that delays every byte by a fixed time in each direction: a network's round trip
(what `tc netem delay` does), without a network namespace.

    python -m tests.support.delay_proxy LISTEN_PORT TARGET_PORT DELAY_MS

Bytes keep their order and are never held longer than the delay (no bandwidth limit), so a stream that the server
paces arrives paced the same, DELAY_MS later. ``DelayProxy`` runs it as a child process for a test.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from types import TracebackType


class _Leg(asyncio.Protocol):
    """One side of a proxied connection: what it receives is written to the other side ``delay`` seconds later.
    Deliveries are timer callbacks on the event loop (no task per chunk), so the proxy itself adds next to
    nothing to the delay."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.transport: asyncio.Transport | None = None
        self.peer: _Leg | None = None
        self.early: list[bytes] = []  # what arrived before the other side was connected
        self.connecting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + self.delay, self._deliver, data)

    def _deliver(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)
        elif not self.peer.transport.is_closing():
            self.peer.transport.write(data)

    def eof_received(self) -> bool:
        asyncio.get_running_loop().call_later(self.delay, self._close_peer)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        asyncio.get_running_loop().call_later(self.delay, self._close_peer)

    def _close_peer(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(listen_port: int, target_port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()

    def client_side() -> _Leg:
        leg = _Leg(delay)

        async def connect() -> None:
            await asyncio.sleep(delay)  # the SYN's way there
            try:
                _, upstream = await loop.create_connection(lambda: _Leg(delay), "127.0.0.1", target_port)
            except OSError:
                if leg.transport is not None:
                    leg.transport.close()
                return
            leg.peer, upstream.peer = upstream, leg
            for data in leg.early:
                upstream.transport.write(data)  # type: ignore[union-attr]
            leg.early.clear()

        leg.connecting = loop.create_task(connect())
        return leg

    server = await loop.create_server(client_side, "127.0.0.1", listen_port, backlog=1024)
    async with server:
        await server.serve_forever()


class DelayProxy:
    """The proxy as a child process: ``with DelayProxy(port, target, 0.02) as p: ... http://127.0.0.1:{p.port}``."""

    def __init__(self, port: int, target_port: int, delay: float) -> None:
        self.port, self.target_port, self.delay = port, target_port, delay
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DelayProxy:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.delay_proxy", str(self.port),
                                      str(self.target_port), str(self.delay * 1000)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError("the delay proxy did not start")

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))
