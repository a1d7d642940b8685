"""An independent reference load generator for SGLang's native streaming ``POST /generate`` endpoint, and a single
stream of OpenAI chat requests (``POST /v1/chat/completions``, SGLang and llama-server alike).

It shares no code with autotune (stdlib only, nothing imported from ``autotune``): raw ``asyncio`` sockets, a
minimal HTTP/1.1 client (status line, headers, chunked or Content-Length bodies) and a minimal server-sent-events
parser. One TCP connection per request (``Connection: close``). Tests use it to cross-check autotune's figures.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

REQUEST_TIMEOUT_S = 600.0  # single requests (single_stream, the probe); closed_loop's window bounds the rest


class StreamError(Exception):
    """A non-200 answer or a malformed response or event stream."""


# What one failed request may raise (IncompleteReadError is an EOFError; TimeoutError is an OSError).
REQUEST_ERRORS = (StreamError, OSError, EOFError, ValueError)


@dataclass
class Stream:
    """One request: when it was written, each token-carrying event as (arrival time, cumulative tokens), and when
    its final event (the one with a finish_reason) arrived, None if it never did. Times are time.perf_counter()."""

    sent: float = 0.0
    events: list[tuple[float, int]] = field(default_factory=list)
    finished: float | None = None
    server_seconds: float | None = None  # meta_info.e2e_latency of the final event: the server's own timing

    def tokens_at(self, t: float) -> int:
        """Cumulative tokens at the last event that arrived at or before ``t`` (0 if none had; counts only grow)."""
        return max((tokens for when, tokens in self.events if when <= t), default=0)


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The response body as it arrives: decoded chunked transfer-encoding, a Content-Length body, or up to EOF."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()  # "<hex size>[;extensions]\r\n"
            if not size_line.endswith(b"\n"):
                raise StreamError("connection closed inside a chunk header")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:  # last chunk; skip any trailer lines up to the blank line
                while (await reader.readline()).strip():
                    pass
                return
            data = await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise StreamError("chunk data not followed by CRLF")
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def _sse(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[float, str]]:
    """(arrival time, data) per server-sent event: its ``data:`` lines joined by newlines, dispatched at the blank
    line that ends it; the time is when the bytes holding that blank line arrived. Other fields are ignored."""
    pending, data_lines = b"", []
    async for chunk in chunks:
        now = time.perf_counter()
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode()
            if not line:
                if data_lines:
                    yield now, "\n".join(data_lines)
                data_lines = []
            elif line.startswith("data:"):
                value = line[len("data:"):]
                data_lines.append(value[1:] if value.startswith(" ") else value)


async def _request(base_url: str, prompt: str, max_tokens: int, headers: dict[str, str] | None,
                   stream: Stream) -> None:
    """Send one streaming /generate request and fill ``stream`` as events arrive; raise unless the answer is a 200
    event stream of JSON events with non-decreasing meta_info.completion_tokens, a final event, then [DONE]."""
    url = urlsplit(base_url)
    body = json.dumps({"text": prompt, "stream": True, "sampling_params": {
        "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}).encode()
    head = [f"POST {url.path.rstrip('/')}/generate HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Accept: text/event-stream", "Connection: close",
            *(f"{name}: {value}" for name, value in (headers or {}).items())]
    reader, writer = await asyncio.open_connection(url.hostname, url.port or (443 if url.scheme == "https" else 80),
                                                   ssl=url.scheme == "https")
    try:
        stream.sent = time.perf_counter()
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status_line = await reader.readline()  # "HTTP/1.1 200 OK\r\n"
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise StreamError(f"bad status line {status_line!r}")
        response_headers = {}
        while (line := await reader.readline()).strip():
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise StreamError(f"bad header line {line!r}")
            response_headers[name.strip().lower()] = value.strip()
        if parts[1] != b"200":
            text = b"".join([chunk async for chunk in _body(reader, response_headers)])
            raise StreamError(f"HTTP {parts[1].decode()}: {text[:300]!r}")
        if not response_headers.get("content-type", "").startswith("text/event-stream"):
            raise StreamError(f"not an event stream: content-type {response_headers.get('content-type')!r}")
        async for now, data in _sse(_body(reader, response_headers)):
            if data == "[DONE]":
                if stream.finished is None:
                    raise StreamError("[DONE] before an event with a finish_reason")
                return
            if stream.finished is not None:
                raise StreamError(f"event after the final one: {data[:200]!r}")
            try:
                meta = json.loads(data)["meta_info"]
                tokens = meta["completion_tokens"]
            except (ValueError, KeyError, TypeError):
                raise StreamError(f"event without meta_info.completion_tokens: {data[:200]!r}") from None
            previous = stream.events[-1][1] if stream.events else 0
            if not isinstance(tokens, int) or tokens < previous:
                raise StreamError(f"completion_tokens {tokens!r} after {previous}")
            if tokens > previous:
                stream.events.append((now, tokens))
            reason = meta.get("finish_reason")
            if reason is not None:
                if not isinstance(reason, dict) or reason.get("type") == "abort" or not stream.events:
                    raise StreamError(f"finished with {reason!r} after {tokens} tokens")
                stream.finished = now
                latency = meta.get("e2e_latency")
                stream.server_seconds = float(latency) if isinstance(latency, (int, float)) else None
        raise StreamError("stream ended before [DONE]")
    finally:
        writer.close()


def _check_prompts(prompts: list[str]) -> None:
    if not prompts:
        raise ValueError("no prompts given")
    if len(set(prompts)) != len(prompts):
        raise ValueError("prompts must be distinct (no prompt is sent twice)")


def single_stream(base_url: str, prompts: list[str], max_tokens: int,
                  headers: dict[str, str] | None = None) -> dict[str, float]:
    """Send every prompt once, one after another (one request in flight). Raises RuntimeError if one fails.

    output_tok_s is tokens over the requests' time on this client's clock; server_output_tok_s over the time the
    server reported for each (meta_info.e2e_latency; nan if it reported none). decode_tok_s per request is (tokens
    after the first token event) / (last event time - first event time), i.e. (tokens - 1) / (...) when the first
    event carries one token, as SGLang's does."""
    _check_prompts(prompts)

    async def run() -> list[Stream]:
        streams = []
        for prompt in prompts:
            streams.append(Stream())
            await asyncio.wait_for(_request(base_url, prompt, max_tokens, headers, streams[-1]), REQUEST_TIMEOUT_S)
        return streams

    try:
        streams = asyncio.run(run())
    except REQUEST_ERRORS as e:
        raise RuntimeError(f"single_stream request failed: {type(e).__name__}: {e}") from e
    decode = [(s.events[-1][1] - s.events[0][1]) / (s.events[-1][0] - s.events[0][0])
              for s in streams if len(s.events) >= 2]
    tokens = sum(s.events[-1][1] for s in streams)
    timed = all(s.server_seconds for s in streams)
    return {"output_tok_s": tokens / sum(s.finished - s.sent for s in streams),
            "server_output_tok_s": tokens / sum(s.server_seconds for s in streams) if timed else math.nan,
            "decode_tok_s": sum(decode) / len(decode) if decode else math.nan, "requests": len(streams),
            "ttft_s": sum(s.events[0][0] - s.sent for s in streams) / len(streams)}


def closed_loop(base_url: str, prompts: list[str], max_tokens: int, concurrency: int, ramp_s: float, window_s: float,
                headers: dict[str, str] | None = None, stagger_s: float | None = None) -> dict[str, object]:
    """Keep ``concurrency`` requests in flight and count the output tokens that arrive in a window.

    Worker i sends its first request at i * stagger_s / concurrency, where stagger_s is one request's duration: given,
    or timed with a probe request sent alone first (it uses one prompt). Each worker then sends its next request as
    soon as the previous one ends. The window opens ramp_s after worker 0's first request and lasts window_s; when it
    closes, in-flight requests are cancelled (connections closed). Failed requests are counted in ``errors``.
    Choose ramp_s longer than one request so that every worker has started before the window opens."""
    _check_prompts(prompts)
    return asyncio.run(_closed_loop(base_url, prompts, max_tokens, concurrency, ramp_s, window_s, headers, stagger_s))


async def _closed_loop(base_url: str, prompts: list[str], max_tokens: int, concurrency: int, ramp_s: float,
                       window_s: float, headers: dict[str, str] | None, stagger_s: float | None) -> dict[str, object]:
    unused, streams, errors = iter(prompts), [], []

    def next_prompt() -> str:
        prompt = next(unused, None)
        if prompt is None:
            elapsed = time.perf_counter() - start
            raise ValueError(f"closed_loop ran out of prompts: all {len(prompts)} were sent after {elapsed:.1f} s of a "
                             f"{ramp_s + window_s:.1f} s run ({len(errors)} failed); it needs about "
                             f"{math.ceil(len(prompts) * (ramp_s + window_s) / elapsed) + concurrency}")
        return prompt

    start = time.perf_counter()
    if stagger_s is None:
        probe, prompt = Stream(), next_prompt()
        try:
            await asyncio.wait_for(_request(base_url, prompt, max_tokens, headers, probe), REQUEST_TIMEOUT_S)
        except REQUEST_ERRORS as e:
            raise RuntimeError(f"closed_loop probe request failed: {type(e).__name__}: {e}") from e
        stagger_s = probe.finished - probe.sent

    async def worker(i: int) -> None:
        await asyncio.sleep(i * stagger_s / concurrency)
        while True:
            prompt = next_prompt()
            streams.append(Stream())
            try:
                await _request(base_url, prompt, max_tokens, headers, streams[-1])
            except REQUEST_ERRORS as e:
                errors.append(f"{type(e).__name__}: {e}")

    start = time.perf_counter()  # worker 0 connects and writes its first request right away
    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    done, pending = await asyncio.wait(tasks, timeout=ramp_s + window_s, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:  # workers only end by raising (out of prompts, or a bug)
        task.result()
    begin, end = start + ramp_s, start + ramp_s + window_s
    counts = [s.tokens_at(end) - s.tokens_at(begin) for s in streams]
    return {"output_tok_s": sum(counts) / window_s, "window_s": window_s, "tokens_in_window": sum(counts),
            "completed_in_window": sum(1 for s in streams if s.finished is not None and begin < s.finished <= end),
            "requests_in_window": sum(1 for n in counts if n > 0), "requests_sent": len(streams),
            "stagger_s": stagger_s, "errors": len(errors), "first_error": errors[0] if errors else None}


async def _chat(base_url: str, request: dict[str, object]) -> tuple[float, float, dict]:
    """Send one non-streaming chat request; (sent, answered, the answer's JSON); raise unless it is a 200 JSON answer
    with ``usage.completion_tokens``."""
    url = urlsplit(base_url)
    body = json.dumps({**request, "stream": False}).encode()
    head = [f"POST {url.path.rstrip('/')}/v1/chat/completions HTTP/1.1", f"Host: {url.netloc}",
            "Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"]
    reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
    try:
        sent = time.perf_counter()
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        parts = (await reader.readline()).split(None, 2)
        response_headers = {}
        while (line := await reader.readline()).strip():
            name, _, value = line.decode("latin-1").partition(":")
            response_headers[name.strip().lower()] = value.strip()
        text = b"".join([chunk async for chunk in _body(reader, response_headers)])
        answered = time.perf_counter()
        if len(parts) < 2 or parts[1] != b"200":
            raise StreamError(f"HTTP {parts[1:2]!r}: {text[:300]!r}")
        answer = json.loads(text)
        if not isinstance(answer.get("usage", {}).get("completion_tokens"), int):
            raise StreamError(f"an answer without usage.completion_tokens: {text[:300]!r}")
        return sent, answered, answer
    finally:
        writer.close()


def chat_single_stream(base_url: str, requests: list[dict[str, object]]) -> dict[str, float]:
    """Send every chat request (OpenAI's JSON: ``messages``, ``max_tokens``, sampling) once, one after another, and
    return ``output_tok_s``: the completion tokens over the requests' time on this client's clock, with the 95%
    interval of the mean of each request's own rate (``ci_low``, ``ci_high``), and, where the server reports them
    (llama-server's ``timings``), ``accepted_per_token``: drafted tokens accepted per token."""
    if not requests:
        raise ValueError("no requests given")

    async def run() -> list[tuple[float, float, dict]]:
        return [await asyncio.wait_for(_chat(base_url, r), REQUEST_TIMEOUT_S) for r in requests]

    try:
        answers = asyncio.run(run())
    except REQUEST_ERRORS as e:
        raise RuntimeError(f"chat request failed: {type(e).__name__}: {e}") from e
    tokens = sum(a["usage"]["completion_tokens"] for _, _, a in answers)
    accepted = [a.get("timings", {}).get("draft_n_accepted") for _, _, a in answers]
    low, high = _interval([a["usage"]["completion_tokens"] / (done - sent) for sent, done, a in answers])
    return {"output_tok_s": tokens / sum(done - sent for sent, done, _ in answers), "tokens": tokens,
            "ci_low": low, "ci_high": high,
            "accepted_per_token": (sum(accepted) / tokens if tokens and all(isinstance(n, int) for n in accepted)
                                   else math.nan)}


def chat_waves(base_url: str, requests: list[dict[str, object]], concurrency: int) -> dict[str, float]:
    """The chat requests in waves of ``concurrency`` sent together, each wave waited for whole: ``output_tok_s`` is
    the completion tokens over the waves' time, with the 95% interval of the mean of each wave's rate. Waves, not a
    steady closed loop: a simpler measure than autotune's, the same for every server it compares."""
    if len(requests) < concurrency:
        raise ValueError(f"fewer requests ({len(requests)}) than one wave of {concurrency}")
    waves = [requests[i:i + concurrency] for i in range(0, len(requests) - concurrency + 1, concurrency)]

    async def wave(batch: list[dict[str, object]]) -> tuple[int, float]:
        start = time.perf_counter()
        answers = await asyncio.wait_for(asyncio.gather(*(_chat(base_url, r) for r in batch)), REQUEST_TIMEOUT_S)
        return sum(a["usage"]["completion_tokens"] for _, _, a in answers), time.perf_counter() - start

    async def run() -> list[tuple[int, float]]:
        return [await wave(batch) for batch in waves]

    try:
        done = asyncio.run(run())
    except REQUEST_ERRORS as e:
        raise RuntimeError(f"chat request failed: {type(e).__name__}: {e}") from e
    low, high = _interval([tokens / seconds for tokens, seconds in done])
    return {"output_tok_s": sum(t for t, _ in done) / sum(s for _, s in done), "ci_low": low, "ci_high": high,
            "waves": len(done)}


#: Student's t at 97.5% by degrees of freedom (1-30); beyond, the normal's 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _interval(samples: list[float]) -> tuple[float, float]:
    """The 95% interval of the samples' mean (nan, nan for fewer than two)."""
    n = len(samples)
    if n < 2:
        return math.nan, math.nan
    mean = sum(samples) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return mean - half, mean + half
