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
from collections import deque
from types import TracebackType


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue: deque[tuple[float, bytes]] = deque()
    arrived = asyncio.Event()
    done = False

    async def deliver() -> None:
        while True:
            while not queue:
                if done:
                    return
                arrived.clear()
                await arrived.wait()
            at, data = queue.popleft()
            wait = at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if writer.is_closing():
                return
            writer.write(data)

    sender = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(65536):
            queue.append((loop.time() + delay, data))
            arrived.set()
    except OSError:
        pass
    finally:
        done = True
        arrived.set()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await sender
        with contextlib.suppress(OSError):
            await asyncio.sleep(delay)
            writer.close()


async def serve(listen_port: int, target_port: int, delay: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)  # the SYN's way there
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        for w in (writer, up_writer):
            w.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port, backlog=1024)
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
