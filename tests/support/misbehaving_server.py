"""A server that answers like SGLang until it misbehaves in one chosen way: the tuner must end each such trial with a
named reason within a bound, and go on.

    python tests/support/misbehaving_server.py --port PORT [--misbehave MODE] [SGLang's/the emulator's flags ...]

A study's ``[engine] command`` starts it with the study's flags, as it would start SGLang or the emulator; every flag
it does not know is reported back by /server_info as SGLang reports its arguments, so the tuner verifies and measures
it like any SGLang. ``--misbehave`` picks the mode (``MODES``; ``none``: a server that behaves). It frames HTTP by
hand on raw asyncio streams: what no framework would send (a bad chunk, a wrong Content-Length, a header without
end) is what it is for.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: mode -> what it does
MODES = {
    "none": "behaves: every answer as SGLang gives it",
    "trickle": "/server_info: one byte a second, without end",
    "endless-body": "/server_info: a chunked body that never ends, as fast as it can",
    "endless-stream": "/generate: tokens counted on past max_new_tokens, without end",
    "endless-events": "/generate: events without end, the token count standing still",
    "trickle-stream": "/generate: one token every 1.5 s",
    "giant-event": "/generate: an event that never ends (no blank line)",
    "giant-header": "/generate: a header line that never ends",
    "too-many-tokens": "/generate: the last event says 1e30 completion tokens",
    "negative-latency": "/generate: the last event says e2e_latency -1e308",
    "zero-latency": "/generate: the last event says e2e_latency 0",
    "nan-latency": "/generate: the last event says e2e_latency NaN",
    "high-accept": "/generate: an accept length above the draft tokens (one verify step for every token)",
    "low-accept": "/generate: an accept length below 1 (ten verify steps for every token)",
    "bad-chunking": "/generate: a chunk whose size is not hexadecimal",
    "bad-content-length": "/generate: Content-Length: ten",
    "wrong-content-length": "/generate: a Content-Length shorter than the body that follows it at once",
    "other-answer": "/generate: every request answered with the answer to the first one (its length)",
}
#: seconds per token of a server that behaves
TOKEN_S = 0.002
#: bytes written at a time where a mode writes without end
BLOCK = 1 << 16


class Server:
    def __init__(self, mode: str, args: dict[str, Any]) -> None:
        self.mode = mode
        self.args = args
        self.first: dict[str, Any] | None = None  # the first /generate request (other-answer)

    # -- HTTP --------------------------------------------------------------------------------------------------

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                body = await reader.readexactly(length) if length else b""
                if not await self.route(method, path.split("?")[0], body, writer):
                    break
        with contextlib.suppress(ConnectionError):
            writer.close()

    async def route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open."""
        if path in ("/health", "/ready", "/health_generate", "/flush_cache"):
            return await self.send(w, 200, b"")
        if path in ("/server_info", "/get_server_info"):
            return await self.server_info(w)
        if path == "/generate" and method == "POST":
            return await self.generate(json.loads(body or b"{}"), w)
        return await self.send(w, 404, b'{"detail":"Not Found"}')

    async def send(self, w: asyncio.StreamWriter, status: int, body: bytes) -> bool:
        w.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (status, len(body), body))
        await w.drain()
        return True

    async def server_info(self, w: asyncio.StreamWriter) -> bool:
        if self.mode == "trickle":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            while True:
                w.write(b"1\r\n \r\n")
                await w.drain()
                await asyncio.sleep(1.0)
        if self.mode == "endless-body":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            block = b"%x\r\n%s\r\n" % (BLOCK, b" " * BLOCK)
            while True:
                w.write(block)
                await w.drain()
        info = {k.replace("-", "_"): v for k, v in self.args.items()}
        info.update(max_running_requests=16, max_total_num_tokens=100000, version="misbehaving",
                    internal_states=[{"effective_max_running_requests_per_dp": 16}])
        return await self.send(w, 200, json.dumps(info).encode())

    # -- /generate ---------------------------------------------------------------------------------------------

    async def generate(self, body: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        if self.mode == "other-answer":
            self.first = self.first or body
            body = self.first
        asked = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
        if self.mode == "giant-header":
            w.write(b"HTTP/1.1 200 OK\r\nx-junk: ")
            while True:
                w.write(b"a" * BLOCK)
                await w.drain()
        events = self.events(asked)
        if self.mode in ("bad-content-length", "wrong-content-length"):
            body = b"".join(events)  # in one write: the bytes past the length arrive with the rest
            declared = b"ten" if self.mode == "bad-content-length" else b"%d" % body.index(b"\n\n")
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %s\r\n\r\n%s"
                    % (declared, body))
            await w.drain()
            return False
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        if self.mode == "bad-chunking":
            w.write(b"zz\r\n")
        if self.mode == "giant-event":
            w.write(b"%x\r\ndata: {\"text\": \"\r\n" % len(b"data: {\"text\": \""))
            chunk = b"%x\r\n%s\r\n" % (BLOCK, b"a" * BLOCK)
            while True:
                w.write(chunk)
                await w.drain()
        async for event in self.paced(events):
            w.write(b"%x\r\n%s\r\n" % (len(event), event))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def paced(self, events: Any) -> Any:
        for event in events:
            await asyncio.sleep(1.5 if self.mode == "trickle-stream" else TOKEN_S)
            yield event

    def events(self, asked: int) -> Any:
        """The SSE events of one request of ``asked`` tokens, as this mode makes them."""
        start = time.monotonic()
        n = 0
        while True:
            n = 1 if self.mode == "endless-events" else n + 1
            finished = n >= asked and self.mode not in ("endless-stream", "endless-events")
            meta: dict[str, Any] = {"id": "x", "completion_tokens": n, "finish_reason": None}
            if finished:
                meta.update(self.last_meta(n, time.monotonic() - start + TOKEN_S))
            yield b"data: " + json.dumps({"text": "a" * n, "meta_info": meta}).encode() + b"\n\n"
            if finished:
                yield b"data: [DONE]\n\n"
                return

    def last_meta(self, n: int, seconds: float) -> dict[str, Any]:
        draft = int(self.args.get("speculative-num-draft-tokens", 2))
        verify = max(1, math.ceil((n - 1) / min(2, draft)))
        latency: float = {"negative-latency": -1e308, "zero-latency": 0.0, "nan-latency": math.nan}.get(
            self.mode, seconds)
        tokens: float = 1e30 if self.mode == "too-many-tokens" else n
        verify = {"high-accept": 1, "low-accept": 10 * n}.get(self.mode, verify)
        return {"finish_reason": {"type": "length", "length": n}, "completion_tokens": tokens,
                "e2e_latency": latency, "spec_verify_ct": verify, "spec_accept_length": n / verify}


def flags(words: list[str]) -> dict[str, Any]:
    """``--name value`` and bare ``--name`` words as SGLang would take them (numbers as numbers)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        name = words[i].lstrip("-")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            value: Any = words[i + 1]
            with contextlib.suppress(ValueError):
                value = float(value) if "." in value else int(value)
            out[name] = value
            i += 2
        else:
            out[name] = True
            i += 1
    return out


async def serve(host: str, port: int, server: Server) -> None:
    listening = await asyncio.start_server(server.connection, host, port, limit=1 << 20)
    print(f"misbehaving server: {server.mode} on {host}:{port}", file=sys.stderr, flush=True)
    async with listening:
        await listening.serve_forever()


#: this program's path, for a study's [engine] command
PROGRAM = Path(__file__)


class MisbehavingServer:
    """This program as a process of its own (its process group killed at the end), ready on ``port``."""

    def __init__(self, mode: str, port: int, *flags: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, str(PROGRAM), "--port", str(port), "--misbehave", mode, *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # it says so once it listens
        assert b"misbehaving server" in line, line

    def __enter__(self) -> MisbehavingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--misbehave", choices=sorted(MODES), default="none")
    known, rest = parser.parse_known_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(known.host, known.port, Server(known.misbehave, flags(rest))))


if __name__ == "__main__":
    main()
