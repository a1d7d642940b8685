"""The closed-loop load generator of one concurrency level, on this machine or on the target host.

    loadgen.py      reads a job (one JSON line) on stdin; prints JSON lines on stdout: {"progress": {...}} about
                    four times a second while the level runs, then {"result": {...}}. A line "stop" on stdin, or
                    the end of stdin (the caller went away), ends the level early.

The level's ``concurrency`` slots are divided between ``processes`` worker processes (forked; 0 picks what the
machine can spare), each with its own event loop; this process only coordinates them. Each request asks for its own
size (the job's ``requests``: the workload's lengths); slot i's first asks for (i+1)/c of it (the ramp); a slot
sends its next request as soon as its current one ends, or, when the lead is worth it, that long before the current
one is due to end (judged by its own token rate since a quarter of it arrived), so the request reaches the server as
the previous one leaves it and the server holds ``concurrency`` requests whatever the way to it. A request that ends
before its size (a natural end) was not predictable: its end neither teaches the slot how late predictions run nor
steers the margin. Predictions err both ways, and one that errs early makes the server hold more than c (and read
fast) while one that errs late costs no more than waiting for the end: the slots send ``margin`` later than that,
steered so that on average each request enters the server as the one before it on its slot leaves. The lead is the
time a request spends outside the server (the way there and back, both ends' HTTP handling): ``lead`` from the
caller at first, then the median over the last requests of their time here less the server's own timing of them (the
number at ``seconds_key`` in the last event).

One steady-state window for all processes: it opens when the last ramp request ends and closes when
``window_requests`` requests have finished inside it; the workers are then stopped and every request still in flight
is cut off. Times are seconds on the machine's monotonic clock since the coordinator's start, the same in every
process. The result holds every request (its slot, start, size, token trace, its last event's raw JSON for the
caller's engine to read) and the window.

The client is as cheap per event as the standard library allows: asyncio protocols on keep-alive connections, HTTP
and server-sent events framed by hand, one clock reading per read from the socket, the cumulative token count read
from each event by the position of its key (``tokens_key``; "": each event carrying text is one token), never a JSON
parse on the hot path. With ``finish_apart`` (an OpenAI stream, whose usage chunk, and SGLang's speculative figures,
follow the finishing one) the last event naming a finish reason and the few after it are kept.

Nothing a server sends can hold it: a request ends within ``request_timeout`` and SECONDS_PER_TOKEN for each token it
asks for; a response's head, an event and a stream's events have caps, and an unfinished event is searched and
copied once (linear in its bytes). A response no server may give (framing it broke, a part past its cap, tokens past
those asked, bytes no request asked for) fails its request with ``BAD`` and its connection is dropped: no exception
reaches the event loop.

Runs with the target's python3 (>= 3.6, standard library only).
"""
import asyncio
import contextlib
import json
import math
import os
import select
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

#: how often a worker looks for stalled requests, and how often progress is printed (seconds)
WATCH_S = 0.25
#: below this lead, a slot waits for the end of its request: a prediction's error would cost more than it saves
MIN_LEAD_S = 0.002
#: how long a slot waits after a request that failed before its first event
FAILED_PAUSE_S = 0.05
#: the lead is the median time outside the server of this many last requests
LEARN_FROM = 31
#: the most one request's end counts as later (or earlier) than predicted
MAX_LATE_S = 0.1
#: how much of each request's overlap with the one before it on its slot moves ``margin`` (see ``Client.overlap``)
MARGIN_GAIN = 0.25
#: the most ``margin`` grows to (seconds)
MAX_MARGIN_S = 1.0
#: how often a worker's event loop is sampled for lag (seconds)
LAG_PROBE_S = 0.02
#: the most processes the default picks
MAX_AUTO_PROCESSES = 16
#: a request ends within the job's ``request_timeout`` and this many seconds for each token it asks for, whatever
#: the server sends meanwhile (a stream that trickles on without end)
SECONDS_PER_TOKEN = 1.0
#: the most bytes of a response's head (its status line and headers), and of its trailer
MAX_HEAD = 64 << 10
#: the most bytes of a chunk-size line
MAX_CHUNK_LINE = 1024
#: the most bytes of one server-sent event: this, and so many more for each token the request asks for (an SGLang
#: event carries the whole text so far)
MAX_EVENT = 1 << 20
EVENT_BYTES_PER_TOKEN = 256
#: data events a stream may hold beyond two for each token asked (a role chunk, a finish chunk, a usage chunk)
EXTRA_EVENTS = 16
#: the most bytes of an error answer's body kept (its first line is what is shown)
MAX_ERROR_BODY = 4096
#: how the error of a request begins whose response no server may give (the level fails as ``bad_response``)
BAD = "bad response: "
HEX = b"0123456789abcdefABCDEF"

Wire = Dict[str, Any]
#: an OpenAI stream's event naming a finish reason; one that names none; a chat event carrying text
FINISH = b'"finish_reason":'
NO_FINISH = b'"finish_reason":null'
#: an OpenAI stream's error event (SGLang follows it with a usage chunk, which must not hide it)
ERROR = b'{"error"'
#: the most events kept from the one naming a finish reason (or an error) on (an OpenAI stream's usage chunk,
#: SGLang's sglext)
CLOSING_EVENTS = 4
TEXT = b'"content":"'


def _value_at(payload: bytes, key: bytes, chars: bytes) -> bytes:
    """The characters from ``chars`` right after the last ``"key":`` in a JSON event (b"" if none). Inside a JSON
    string every quote is escaped, so an unescaped ``"key":`` is the real key."""
    i = payload.rfind(key)
    if i < 0 or (i > 0 and payload[i - 1] == 92):  # 92: a backslash
        return b""
    j = i + len(key)
    n = len(payload)
    while j < n and payload[j] in b" \t":
        j += 1
    k = j
    while k < n and payload[k] in chars:
        k += 1
    return payload[j:k]


def tokens_in(payload: bytes, key: bytes) -> Optional[int]:
    """The integer value of ``key`` (given as ``b'"name":'``) in a JSON event, or None."""
    digits = _value_at(payload, key, b"0123456789")
    return int(digits[:19]) if digits else None  # more digits than 19 are a count past any request's size


def seconds_in(payload: bytes, key: bytes) -> Optional[float]:
    """The number value of ``key`` (given as ``b'"name":'``) in a JSON event, or None."""
    number = _value_at(payload, key, b"0123456789.eE+-")
    try:
        return float(number) if number else None
    except ValueError:
        return None


class Request:
    """One request's state and, once done, its record."""

    __slots__ = ("body", "cancelled", "closing", "conn", "error", "events", "finished", "follows", "label", "last",
                 "last_t", "late_used", "lead", "predicted", "ramp", "ref_n", "ref_t", "release", "sent", "size",
                 "slot", "stale_retry", "start", "status", "timer", "tokens", "trace")

    def __init__(self, slot: int, size: int, ramp: bool, body: bytes, label: str = "") -> None:
        self.slot, self.size, self.ramp, self.body, self.label = slot, size, ramp, body, label
        self.start = 0.0                # seconds since t0 at which it was sent
        self.sent = 0.0                 # monotonic time it was sent
        self.status = 0
        self.error = None               # type: Optional[str]
        self.trace = []                 # type: List[Tuple[float, int]]
        self.last = None                # type: Optional[bytes]
        self.closing = []               # type: List[bytes]  # the last event naming a finish reason, and after it
        self.last_t = None              # type: Optional[float]
        self.events = 0
        self.finished = False           # the response ended (any status)
        self.cancelled = False
        self.release = None             # type: Optional[asyncio.Future]
        self.timer = None               # type: Optional[asyncio.TimerHandle]
        self.ref_t = 0.0                # when a quarter of it had arrived: its rate is judged from there on, past
        self.ref_n = 0                  # the start's bursts (a new connection's setup, queued events caught up)
        self.lead = 0.0
        self.tokens = 0
        self.stale_retry = True
        self.predicted = 0.0            # when it was last predicted to end (monotonic), if it was
        self.late_used = 0.0            # the client's ``late`` that prediction included
        self.follows = None             # type: Optional[Request]  # the slot's request before it, until it ends
        self.conn = None                # type: Optional[Connection]

    def wire(self) -> Wire:
        return {"slot": self.slot, "size": self.size, "ramp": self.ramp, "label": self.label,
                "start": round(self.start, 6),
                "status": self.status, "error": self.error, "cancelled": self.cancelled,
                "e2e": None if self.last_t is None else round(self.last_t, 6),
                "trace": [[round(t, 6), n] for t, n in self.trace],
                "last": None if self.last is None else self.last.decode("utf-8", "replace"),
                "closing": [e.decode("utf-8", "replace") for e in self.closing]}

    @property
    def full(self) -> bool:
        """It ran to its size: its end was predictable from its rate."""
        return self.tokens >= self.size

    def fire(self) -> None:
        """Let the slot send its next request (once)."""
        if self.release is not None and not self.release.done():
            self.release.set_result(None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Bad(Exception):
    """A response no server may give (framing it broke, a part past its cap, more than was asked): the request
    fails with ``BAD`` and the reason, and its connection is dropped."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection carrying one streamed request at a time; frames the response (chunked or
    Content-Length) and its server-sent events by hand, each part within its cap, in time linear in its bytes."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self.transport = None           # type: Optional[asyncio.Transport]
        self.req = None                 # type: Optional[Request]
        self.closed = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.buf = b""
        self.head_done = False
        self.chunked = False
        self.remaining = -1             # Content-Length bytes left, or the current chunk's bytes left
        self.keep = True
        self.sse = bytearray()          # the event not complete yet
        self.error_body = b""
        self.done_flag = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        req = self.req
        if req is not None and not req.finished:
            self.req = None
            if req.status == 200 and self.head_done and not self.chunked and self.remaining < 0:
                self.client.finish(req, None)  # a body that ends with the connection
                return
            if not req.events and not req.status and self.reused and req.stale_retry:
                # the server closed a kept-alive connection before answering: nothing went through, send it again
                req.stale_retry = False
                self.client.resend(req)
                return
            why = "the server closed the connection" if exc is None else "{}: {}".format(type(exc).__name__, exc)
            self.client.finish(req, "connection: " + why)

    def send(self, req: Request) -> None:
        self.req = req
        req.conn = self
        self._reset()
        self.transport.write(self.client.head(len(req.body)) + req.body)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        req = self.req
        if req is None:
            # bytes no request asked for (an answer to another request): a connection out of step is dropped,
            # never handed the next request
            self.abort()
            return
        try:
            self._received(req, data, now)
        except Bad as e:
            self.req = None
            self.client.finish(req, BAD + str(e))
            self.abort()

    def _received(self, req: Request, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise Bad("a response head longer than {} bytes".format(MAX_HEAD))
                self.buf = buf
                return
            if not self._head(buf[:end]):
                return
            buf = buf[end + 4:]
        if self.chunked:
            body, buf = self._chunks(buf)
        elif self.remaining >= 0:
            body, buf = buf[:self.remaining], buf[self.remaining:]
            self.remaining -= len(body)
            self.done_flag = self.remaining <= 0
            if buf:
                raise Bad("{} bytes past its Content-Length".format(len(buf)))
        else:
            body, buf = buf, b""
        self.buf = buf
        if body:
            if req.status == 200:
                self._events(req, body, now)
            elif len(self.error_body) < MAX_ERROR_BODY:
                self.error_body += body[:MAX_ERROR_BODY - len(self.error_body)]
        if self.done_flag and self.req is req:
            self._complete()

    def _chunks(self, buf: bytes) -> Tuple[bytes, bytes]:
        """The chunked body's data in ``buf``, and what is left of ``buf`` (a part of a chunk's framing)."""
        parts = []
        while True:
            if self.remaining > 0:
                take = buf[:self.remaining]
                parts.append(take)
                self.remaining -= len(take)
                buf = buf[len(take):]
                if self.remaining > 0:
                    break
                self.remaining = -2  # the CRLF after the chunk's data
            if self.remaining == -2:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise Bad("a chunk's data not followed by CRLF")
                buf = buf[2:]
                self.remaining = -1
            if self.remaining == -3:  # the trailer after the last chunk: an empty line, or fields and one
                if buf[:2] == b"\r\n":
                    buf = buf[2:]
                else:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        if len(buf) > MAX_HEAD:
                            raise Bad("a trailer longer than {} bytes".format(MAX_HEAD))
                        break
                    buf = buf[end + 4:]
                self.done_flag = True
                break
            eol = buf.find(b"\r\n")
            if eol < 0:
                if len(buf) > MAX_CHUNK_LINE:
                    raise Bad("a chunk-size line longer than {} bytes".format(MAX_CHUNK_LINE))
                break
            size = buf[:eol].split(b";")[0].strip()
            if not size or len(size) > 15 or size.strip(HEX):
                raise Bad("a chunk size that is not hexadecimal: {!r}".format(buf[:eol][:40]))
            buf = buf[eol + 2:]
            self.remaining = int(size, 16) or -3
        return b"".join(parts), buf

    def _head(self, head: bytes) -> bool:
        req = self.req
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            req.status = int(parts[1])  # type: ignore[union-attr]
        except (IndexError, ValueError):
            self.client.finish(req, "connection: bad status line {!r}".format(lines[0][:80]))  # type: ignore
            self.abort()
            return False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length":
                if not value.isdigit() or len(value) > 18 or self.remaining not in (-1, int(value)):
                    raise Bad("a Content-Length that is not one number: {!r}".format(value[:40]))
                self.remaining = int(value)
            elif name == b"connection" and value == b"close":
                self.keep = False
        if self.chunked:
            self.remaining = -1
        self.head_done = True
        if not self.chunked and self.remaining == 0:
            self.done_flag = True
        return True

    def _events(self, req: Request, body: bytes, now: float) -> None:
        """Take the events ``body`` completes; the rest waits in ``sse``. Only the new bytes are searched for an
        event's end, and only a completed event is copied: an event that never ends costs its bytes once, up to
        its cap."""
        pending = self.sse
        scan = max(0, len(pending) - 2)  # an end ("\n\n", "\n\r\n") may begin in the bytes already held
        pending += body
        a, b = pending.rfind(b"\n\n", scan), pending.rfind(b"\n\r\n", scan)
        end = max(a + 2 if a >= 0 else 0, b + 3 if b >= 0 else 0)
        cap = MAX_EVENT + EVENT_BYTES_PER_TOKEN * req.size
        if len(pending) - end > cap:
            raise Bad("an event longer than {} bytes".format(cap))
        if not end:
            return
        data = bytes(pending[:end])
        del pending[:end]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        client = self.client
        for event in data.split(b"\n\n"):
            if len(event) > cap:
                raise Bad("an event longer than {} bytes".format(cap))
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                elapsed = now - req.sent
                req.events += 1
                if req.events > 2 * req.size + EXTRA_EVENTS:
                    raise Bad("more than {} events for {} tokens asked".format(2 * req.size + EXTRA_EVENTS,
                                                                              req.size))
                req.last, req.last_t = payload, elapsed
                if client.finish_apart:
                    if (FINISH in payload and NO_FINISH not in payload) or payload.startswith(ERROR):
                        req.closing = [payload]
                    elif req.closing and len(req.closing) < CLOSING_EVENTS:
                        req.closing.append(payload)
                n = tokens_in(payload, client.tokens_key) if client.tokens_key else (
                    req.tokens + 1 if TEXT in payload else None)
                if n is not None and n > req.tokens:
                    if n > req.size:
                        raise Bad("{} tokens, {} asked".format(n, req.size))
                    if not req.ref_n and n * 4 >= req.size:
                        req.ref_t, req.ref_n = elapsed, n
                    req.tokens = n
                    req.trace.append((elapsed, n))
                    if req.lead:
                        client.ahead(req, elapsed, n)
        client.last_data = now

    def _complete(self) -> None:
        req = self.req
        self.req = None
        if req.status != 200:  # type: ignore[union-attr]
            text = self.error_body.decode("utf-8", "replace").strip()
            self.client.finish(req, "http {}: {}".format(req.status, text[:200]))  # type: ignore[union-attr]
        else:
            self.client.finish(req, None)  # type: ignore[arg-type]
        if self.keep and not self.closed and not self.buf:
            self.reused = True
            self.client.idle.append(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Client:
    """Streamed requests over a pool of keep-alive connections to one server, each timed into a ``Request``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, job: Wire, t0: float,
                 on_done: Callable[[Request], None]) -> None:
        self.loop = loop
        self.host, self.port = job["host"], int(job["port"])
        self.path = job["path"]
        self.tokens_key = ('"' + job["tokens_key"] + '":').encode() if job["tokens_key"] else b""
        self.finish_apart = bool(job.get("finish_apart"))
        self.seconds_key = ('"' + job["seconds_key"] + '":').encode() if job.get("seconds_key") else b""
        #: how long before a request's end its slot sends the next: the time a request spends outside the server
        #: (the way there and back, both ends' HTTP handling), learnt from each finished request's server timing
        self.lead = float(job.get("lead", 0.0))
        self.outside = []               # type: List[float]
        self.errors = []                # type: List[float]
        self.late = 0.0                 # how much later than predicted requests end, on average
        self.margin = None              # type: Optional[float]  # how much later than a lead before the end
        self.first_timeout = float(job["request_timeout"])
        self.stall_timeout = float(job["stall_timeout"])
        self.t0 = t0
        self.on_done = on_done
        self.idle = []                  # type: List[Connection]
        self.active = set()             # type: set
        self.connecting = set()         # type: set
        self.last_data = 0.0
        lines = ["POST {} HTTP/1.1".format(self.path), "Host: {}:{}".format(self.host, self.port),
                 "Content-Type: application/json", "Accept: text/event-stream"]
        lines += ["{}: {}".format(k, v) for k, v in sorted(job.get("headers", {}).items())]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode()

    def head(self, length: int) -> bytes:
        return self._head + str(length).encode() + b"\r\n\r\n"

    def start(self, req: Request, lead: float = 0.0) -> None:
        """Send ``req`` (on an idle connection, or a new one); ``req.release`` fires when the slot may send again."""
        req.release = self.loop.create_future()
        req.lead = lead if lead >= MIN_LEAD_S else 0.0
        req.sent = time.monotonic()
        req.start = req.sent - self.t0
        self.active.add(req)
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.send(req)
                return
        self._connect_soon(req)

    def resend(self, req: Request) -> None:
        req.sent = time.monotonic()
        req.start = req.sent - self.t0
        self._connect_soon(req)

    def _connect_soon(self, req: Request) -> None:
        task = self.loop.create_task(self._connect(req))
        self.connecting.add(task)
        task.add_done_callback(self.connecting.discard)

    async def _connect(self, req: Request) -> None:
        try:
            _, conn = await self.loop.create_connection(lambda: Connection(self), self.host, self.port)
        except (OSError, asyncio.TimeoutError) as e:
            self.finish(req, "connection: {}: {}".format(type(e).__name__, e))
            return
        if req.finished or req.cancelled:
            conn.abort()
            return
        conn.send(req)

    def ahead(self, req: Request, elapsed: float, tokens: int) -> None:
        """Fire the slot ``req.lead`` seconds before ``req`` is due to end, judged by its own token rate so far, and
        ``margin`` later than that.

        The prediction that is judged against the request's end is the last one made before the moment it set (a
        lead before the end) had passed: later events would only make it look surer than it was when it counted."""
        if req.release is None or req.release.done():
            return  # the slot has sent its next request already: the prediction it went by stays the one judged
        if not req.ref_n or (tokens - req.ref_n) * 4 < req.size or elapsed <= req.ref_t or tokens >= req.size:
            return  # too little of it seen yet, or nothing left to predict
        lead = max(self.lead, MIN_LEAD_S)
        now = time.monotonic()
        if req.predicted and req.predicted - lead <= now:
            return  # the moment the last prediction set has passed: that one is judged
        rate = (tokens - req.ref_n) / (elapsed - req.ref_t)
        predicted = req.sent + elapsed + (req.size - tokens) / rate + self.late
        req.predicted, req.late_used = predicted, self.late
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        due = predicted - lead + (lead if self.margin is None else self.margin)
        if due <= now:
            req.fire()
        elif due - now < max(lead, 0.05):
            req.timer = self.loop.call_at(self.loop.time() + (due - now), req.fire)

    def finish(self, req: Request, error: Optional[str]) -> None:
        if req.finished:
            return
        req.finished = True
        if error is not None and req.error is None and not req.cancelled:
            req.error = error
        if req.error is None and req.predicted and req.last_t is not None and not req.cancelled and req.full:
            self.missed(req.sent + req.last_t - (req.predicted - req.late_used))
        if req.error is None and self.seconds_key and req.last is not None and req.last_t is not None:
            server = seconds_in(req.last, self.seconds_key)
            if server is not None and 0.0 < server <= req.last_t:  # a timing no server gives teaches nothing
                self.learn(req, server)
                self.overlap(req, server)
        self.active.discard(req)
        req.fire()
        self.on_done(req)

    def missed(self, error: float) -> None:
        """Take how much later than its rate alone predicted a request ended into ``late``: the mean over the last
        LEARN_FROM (a request that hiccups near its end, after the next was sent, costs the mean more than the
        median)."""
        self.errors.append(max(-MAX_LATE_S, min(MAX_LATE_S, error)))
        if len(self.errors) > LEARN_FROM:
            del self.errors[0]
        self.late = sum(self.errors) / len(self.errors)

    def overlap(self, req: Request, server: float) -> None:
        """Steer ``margin`` by how long ``req`` was in the server together with the slot's request before it (less:
        how long the slot had none there), so that on average a slot's next request enters the server as its last
        leaves it. Predictions err both ways, but one that errs late costs at most the way to the server (the
        request ends and the slot sends then) while one that errs early overlaps without bound: without this the
        server holds more than c on average, and reads fast, whenever the predictions' errors are as long as the
        way to it. Until the first overlap is known, a slot sends when a request is predicted to end."""
        before, req.follows = req.follows, None
        if (before is None or before.error is not None or before.cancelled or before.last_t is None
                or not before.full):
            return
        entered = req.sent + (req.last_t or 0.0) - server
        both = before.sent + before.last_t - entered
        margin = self.lead if self.margin is None else self.margin
        self.margin = max(0.0, min(MAX_MARGIN_S, margin + MARGIN_GAIN * both))

    def learn(self, req: Request, server: float) -> None:
        """Take a finished request into the lead: the median time outside the server of the last LEARN_FROM."""
        self.outside.append((req.last_t or 0.0) - server)
        if len(self.outside) > LEARN_FROM:
            del self.outside[0]
        ordered = sorted(self.outside)
        self.lead = max(0.0, ordered[len(ordered) // 2])

    def watch(self) -> None:
        """Fail requests that waited too long for their first event, or for the next one, or that did not end by
        their deadline (``request_timeout`` and SECONDS_PER_TOKEN for each token asked)."""
        now = time.monotonic()
        for req in list(self.active):
            if req.events:
                waited, limit = now - req.sent - (req.last_t or 0.0), self.stall_timeout
            else:
                waited, limit = now - req.sent, self.first_timeout
            deadline = self.first_timeout + SECONDS_PER_TOKEN * req.size
            if waited > limit:
                self.finish(req, "stalled: no data for {:g} s after {} tokens".format(limit, req.tokens))
            elif now - req.sent > deadline:
                self.finish(req, "stalled: not done {:g} s after it was sent ({:g} s, and {:g} s for each of the {} "
                                 "tokens asked), after {} tokens".format(deadline, self.first_timeout,
                                                                         SECONDS_PER_TOKEN, req.size, req.tokens))
            else:
                continue
            if req.conn is not None:
                req.conn.abort()

    def close(self) -> None:
        """Cut off everything in flight (kept as cancelled: not a failure) and close every connection."""
        for req in list(self.active):
            req.cancelled = True
            req.finished = True
            req.fire()
            self.on_done(req)
            if req.conn is not None:
                req.conn.abort()
        self.active.clear()
        for task in list(self.connecting):
            task.cancel()
        for conn in self.idle:
            conn.abort()


def request_bodies(requests: List[List[Any]], tag: str) -> Callable[[], Tuple[int, Callable[[int], bytes], str]]:
    """A function giving the next request: its size, a function giving its body for a size, and its label, each
    request never sent before: the job's requests in order (``[before the tag, up to the size, after it, size,
    label]``), then the same requests tagged with ``tag`` and a count in front of their first text (a prefix cache
    never matches)."""
    parts = [(a.encode(), b.encode(), c.encode(), int(size), label) for a, b, c, size, label in requests]
    state = {"n": 0}

    def following() -> Tuple[int, Callable[[int], bytes], str]:
        n = state["n"]
        state["n"] = n + 1
        before, middle, after, size, label = parts[n % len(parts)]
        mark = b"" if n < len(parts) else "[{} {}] ".format(tag, n).encode()

        def body(size: int) -> bytes:
            return before + mark + middle + str(int(size)).encode() + after

        return size, body, label

    return following


def ramp_size(slot: int, concurrency: int, size: int) -> int:
    return max(1, round(size * (slot + 1) / concurrency))


# -- a worker process -------------------------------------------------------------------------------------------


def worker(job: Wire, index: int, slots: List[int], t0: float, out: int, control: int) -> None:
    """Run ``slots`` until the coordinator says stop; report each finished request (``r``/``d``/``f`` lines) and, at
    the end, every request (``records`` line) on ``out``."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    c = int(job["concurrency"])
    following = request_bodies(job["requests"][index::max(1, int(job["processes"]))],
                               "{}/{}".format(job.get("tag", "loadgen"), index))
    done = []  # type: List[Request]
    stop = loop.create_future()

    def report(req: Request) -> None:
        done.append(req)
        if req.cancelled:
            return
        if req.ramp:
            line = "r {:.6f}\n".format(req.start + (req.last_t if req.last_t is not None else
                                                    time.monotonic() - req.sent))
        elif req.error is None:
            line = "d {:.6f}\n".format(req.start + (req.last_t or 0.0))
        else:
            line = "f {}\n".format(json.dumps(req.error))
        os.write(out, line.encode())

    client = Client(loop, job, t0, report)

    async def slot(i: int) -> None:
        ramp = True
        before = None  # type: Optional[Request]
        while not stop.done():
            size, body, label = following()
            if ramp:
                size = ramp_size(i, c, size)
            req = Request(i, size, ramp, body(size), label)
            req.follows = before
            client.start(req, client.lead)
            before = req
            await req.release
            if req.error is not None and not req.events:
                await asyncio.sleep(FAILED_PAUSE_S)  # a server that refuses at once is not hammered meanwhile
            ramp = False

    def on_control() -> None:
        data = os.read(control, 4096)
        if not data or b"stop" in data:
            loop.remove_reader(control)
            if not stop.done():
                stop.set_result(None)

    lag = []  # type: List[float]

    async def watch() -> None:
        """Look for stalled requests, and sample how late the event loop wakes a timer (a busy worker handles
        every event late)."""
        last = time.monotonic()
        while not stop.done():
            asked = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            lag.append(max(0.0, loop.time() - asked - LAG_PROBE_S))
            if time.monotonic() - last >= WATCH_S:
                last = time.monotonic()
                client.watch()

    cpu0, wall0 = time.process_time(), time.monotonic()
    loop.add_reader(control, on_control)
    tasks = [loop.create_task(slot(i)) for i in slots] + [loop.create_task(watch())]
    loop.run_until_complete(stop)
    client.close()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    wall = time.monotonic() - wall0
    load = {"cpu": (time.process_time() - cpu0) / wall if wall > 0 else 0.0,
            "lag": sum(lag) / len(lag) if lag else 0.0}
    records = [r.wire() for r in sorted(done, key=lambda r: r.start)]
    os.write(out, b"records " + json.dumps({"records": records, "load": load}).encode() + b"\n")
    loop.close()


# -- the coordinator --------------------------------------------------------------------------------------------


def spare_cpus(sample: float = 0.2) -> float:
    """CPUs left idle by everything else on this machine, from /proc/stat over ``sample`` seconds (all of this
    process's CPUs where /proc/stat cannot be read)."""
    def times() -> Optional[Tuple[int, int]]:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    a = times()
    time.sleep(sample)
    b = times()
    if a is None or b is None or b[0] <= a[0]:
        return float(cpus)
    online = os.cpu_count() or cpus
    return min(float(cpus), online * (b[1] - a[1]) / (b[0] - a[0]))


def auto_processes(concurrency: int) -> int:
    """What the machine can spare: its idle CPUs less one (for the server and the rest), at least one, and no more
    than one per 16 slots."""
    return max(1, min(int(spare_cpus() + 0.5) - 1, math.ceil(concurrency / 16), MAX_AUTO_PROCESSES))


def window_of(records: List[Wire], concurrency: int, wanted: int) -> Optional[List[float]]:
    """The steady-state window: from the end of the last ramp request to the end of the ``wanted``-th request that
    finished after it; None until both exist."""
    ramp = [r for r in records if r["ramp"]]
    if len(ramp) < concurrency:
        return None
    a = max(r["start"] + (r["e2e"] or 0.0) for r in ramp)
    ends = sorted(r["start"] + r["e2e"] for r in records
                  if not r["ramp"] and r["error"] is None and not r["cancelled"] and r["e2e"] is not None
                  and r["start"] + r["e2e"] > a)
    return [a, ends[wanted - 1]] if len(ends) >= wanted else None


def emit(obj: Wire) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def coordinate(job: Wire, stopped: bool = False) -> Wire:
    """Fork the workers, stop them once the window is complete (or when told to), and gather their records."""
    c = int(job["concurrency"])
    n = int(job.get("processes") or 0) or auto_processes(c)
    n = max(1, min(n, c))
    job["processes"] = n
    wanted = int(job["window_requests"])
    t0 = time.monotonic()
    workers = []  # type: List[Tuple[int, int, int]]
    for i in range(n):
        r_out, w_out = os.pipe()
        r_ctl, w_ctl = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r_out)
            os.close(w_ctl)
            for _, fd, ctl in workers:
                os.close(fd)
                os.close(ctl)
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                worker(job, i, list(range(i, c, n)), t0, w_out, r_ctl)
            except BaseException:  # a worker must never return into the coordinator's code
                import traceback
                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(w_out)
        os.close(r_ctl)
        workers.append((pid, r_out, w_ctl))

    ramp_ends = []  # type: List[float]
    ends = []  # type: List[float]
    failed, stalled, bad, first_error = 0, 0, 0, None
    records = []  # type: List[Wire]
    loads = []  # type: List[Wire]
    pending = {fd: b"" for _, fd, _ in workers}
    open_fds = set(pending)
    reason = "asked" if stopped else None
    last_progress = 0.0
    stdin = 0
    watching_stdin = True

    def stop_all() -> None:
        for _, _, ctl in workers:
            with contextlib.suppress(OSError):
                os.write(ctl, b"stop\n")

    if stopped:
        stop_all()

    while open_fds:
        fds = list(open_fds) + ([stdin] if watching_stdin else [])
        ready, _, _ = select.select(fds, [], [], WATCH_S)
        for fd in ready:
            if fd == stdin:
                line = os.read(stdin, 4096)
                if not line or b"stop" in line:
                    watching_stdin = False
                    if not stopped:
                        stopped, reason = True, "asked"
                        stop_all()
                continue
            data = os.read(fd, 1 << 20)
            if not data:
                open_fds.discard(fd)
                continue
            pending[fd] += data
            *lines, pending[fd] = pending[fd].split(b"\n")
            for line in lines:
                kind, _, rest = line.partition(b" ")
                if kind == b"r":
                    ramp_ends.append(float(rest))
                elif kind == b"d":
                    ends.append(float(rest))
                elif kind == b"f":
                    failed += 1
                    error = json.loads(rest.decode())
                    stalled += error.startswith("stalled")
                    bad += error.startswith(BAD)
                    first_error = first_error or error
                elif kind == b"records":
                    part = json.loads(rest.decode())
                    records.extend(part["records"])
                    loads.append(part["load"])
        if not stopped and len(ramp_ends) >= c:
            a = max(ramp_ends)
            if sum(1 for e in ends if e > a) >= wanted:
                stopped, reason = True, "window"
                stop_all()
        now = time.monotonic()
        if now - last_progress >= WATCH_S:
            last_progress = now
            emit({"progress": {"elapsed": round(now - t0, 3), "finished": len(ends), "failed": failed,
                               "stalled": stalled, "bad": bad, "first_error": first_error, "processes": n}})
    for pid, fd, ctl in workers:
        os.close(fd)
        os.close(ctl)
        os.waitpid(pid, 0)
    records.sort(key=lambda r: r["start"])
    return {"records": records, "window": window_of(records, c, wanted), "processes": n, "stopped": reason,
            "cpu": max((x["cpu"] for x in loads), default=0.0), "lag": max((x["lag"] for x in loads), default=0.0),
            "wall": round(time.monotonic() - t0, 3)}


def read_job() -> Tuple[Wire, bytes]:
    """The job (stdin's first line) and whatever came after it (a "stop" the caller may have sent already)."""
    data = b""
    while b"\n" not in data:
        more = os.read(0, 1 << 20)
        if not more:
            break
        data += more
    line, _, rest = data.partition(b"\n")
    return json.loads(line.decode()), rest


def main() -> None:
    job, rest = read_job()
    emit({"result": coordinate(job, stopped=b"stop" in rest)})


if __name__ == "__main__":
    main()
