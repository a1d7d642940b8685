"""One streamed generation over HTTP, timed token by token (async httpx).

Every figure comes from the response itself: completion tokens, and where the engine gives them the verify steps,
accept length and the server's own timing of this request alone, never the server's cumulative counters (which
/flush_cache resets and data-parallel ranks keep apart). The record is filled as the stream arrives, so a request
cut off at the end of a measurement window keeps the tokens it received.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from autotune.engines import Engine, StreamUpdate


@dataclass
class RequestRecord:
    concurrency: int
    start: float                    # seconds since the level started
    max_tokens: int = 0             # what the request asked for
    ttft: float | None = None       # seconds from sending to the first token
    e2e: float | None = None        # seconds from sending to the last event
    tokens: int = 0                 # completion tokens
    #: (seconds since sending, completion tokens so far) at every event that brought tokens
    trace: list[tuple[float, int]] = field(default_factory=list)
    accept_length: float | None = None
    verify_steps: int | None = None
    server_e2e: float | None = None  # the request's duration as the server timed it
    finish_reason: str | None = None
    error: str | None = None        # why the request failed: "http 500: ...", "stalled", "connection: ..."
    ramp: bool = False              # a first request of its slot (steady state not reached yet): not measured
    cancelled: bool = False         # cut off when its level's window closed (not a failure)
    gap: float | None = None        # seconds its slot stood empty before it was sent (concurrency levels)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def complete(self) -> bool:
        """Finished normally (not failed, not cut off)."""
        return self.ok and not self.cancelled and self.finish_reason is not None

    @property
    def end(self) -> float | None:
        """Seconds since the level started at which its last event arrived."""
        return None if self.e2e is None else self.start + self.e2e

    @property
    def itl(self) -> list[float]:
        """Seconds between successive token-carrying events (one event may carry several accepted tokens)."""
        return [b[0] - a[0] for a, b in itertools.pairwise(self.trace)]

    def tokens_by(self, t: float) -> int:
        """Completion tokens this request had received ``t`` seconds after its level started."""
        done = 0
        for at, tokens in self.trace:
            if self.start + at > t:
                break
            done = tokens
        return done

    @property
    def output_tok_s(self) -> float | None:
        """Tokens over the request's whole time, from sending to its last token (prefill included)."""
        if self.e2e is None or self.e2e <= 0 or not self.tokens:
            return None
        return self.tokens / self.e2e

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first, over the time after the first token: the per-request decode speed."""
        if self.ttft is None or self.e2e is None or self.tokens < 2 or self.e2e <= self.ttft:
            return None
        return (self.tokens - 1) / (self.e2e - self.ttft)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def stream_one(
    client: httpx.AsyncClient,
    engine: Engine,
    prompt: str,
    rec: RequestRecord,
    temperature: float,
    t0: float,
    first_token_timeout: float,
    stall_timeout: float,
) -> None:
    """Send one streaming request of ``rec.max_tokens`` tokens and time it into ``rec`` (``t0``: the level's start).
    Never raises for server-side trouble: the record says what failed. Cancelled, it keeps what arrived.

    ``first_token_timeout`` bounds the wait for the first event (it includes queueing behind other requests);
    ``stall_timeout`` bounds every later gap between events.
    """
    req = engine.generation_request(prompt, rec.max_tokens, temperature)
    for attempt in (1, 2):
        sent = time.perf_counter()
        rec.start = sent - t0
        responded = False
        try:
            async with client.stream("POST", req.path, json=req.body) as resp:
                responded = True
                await _read(resp, rec, engine, sent, first_token_timeout, stall_timeout)
        except httpx.HTTPError as e:
            if isinstance(e, httpx.RemoteProtocolError) and attempt == 1 and not responded:
                continue  # the server closed a kept-alive connection before answering: nothing was sent through
            rec.error = f"connection: {type(e).__name__}: {e}"[:200]
        break
    if rec.error is None and rec.finish_reason is None:
        rec.error = f"stream ended without a finished event after {rec.tokens} tokens"


async def _read(resp: httpx.Response, rec: RequestRecord, engine: Engine, sent: float, first_token_timeout: float,
                stall_timeout: float) -> None:
    """Read a streamed response into ``rec`` until it finishes, fails or stalls."""
    if resp.status_code != 200:
        body = (await resp.aread()).decode("utf-8", "replace")
        rec.error = f"http {resp.status_code}: {body.strip()[:200]}"
        return
    lines = resp.aiter_lines()
    while True:
        timeout = stall_timeout if rec.tokens else first_token_timeout
        try:
            line = await asyncio.wait_for(lines.__anext__(), timeout)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            rec.error = f"stalled: no data for {timeout:g} s after {rec.tokens} tokens"
            return
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        now = time.perf_counter()
        try:
            update = engine.parse_event(json.loads(data))
        except ValueError:
            rec.error = f"unparsable event: {data[:120]}"
            return
        _apply(rec, update, now - sent)
        if update.error:
            return


def _apply(rec: RequestRecord, update: StreamUpdate, elapsed: float) -> None:
    if update.tokens is not None and update.tokens > rec.tokens:
        if rec.ttft is None:
            rec.ttft = elapsed
        rec.tokens = update.tokens
        rec.trace.append((round(elapsed, 6), rec.tokens))
    rec.e2e = elapsed
    if update.finished:
        rec.finish_reason = update.finish_reason
        rec.accept_length = update.accept_length
        rec.verify_steps = update.verify_steps
        rec.server_e2e = update.server_seconds
    if update.error:
        rec.error = f"server: {update.error}"[:200]
