"""A concurrency level's job for the load generator, and its requests coming back as records.

A level runs in the program ``autotune/bench/loadgen.py``, on this machine or on the target host
(``autotune.bench.measuring`` says where), so the same code generates the load wherever it runs. It is given a job
(the server's address, the request body's template, prompts, the level's concurrency and window, the lead that makes
up for the round trip) and hands back every request as it arrived: slot, start, token trace and the raw JSON of its
last event, which the engine reads here (``to_record``).
"""
from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from autotune.bench.client import RequestRecord
from autotune.bench.plausible import doubt
from autotune.bench.traffic import TrafficRequest
from autotune.engines import Engine, GenerationRequest, Sampling, StreamUpdate
from autotune.errors import TrialFailure
from autotune.bench.measuring import Generator
from autotune.bench.loadgen import BAD

#: stand-ins in a request body: where a tag goes (in front of its first text) and its size
PROMPT_MARK = "\x00autotune-prompt\x00"
TOKENS_MARK = 987654321


@dataclass(frozen=True)
class Shape:
    """How a workload's requests are sent: their defaults where the data says nothing."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    ignore_eos: bool = True

    def sampling(self, item: TrafficRequest) -> Sampling:
        return Sampling(temperature=self.temperature if item.temperature is None else item.temperature,
                        top_p=self.top_p if item.top_p is None else item.top_p, ignore_eos=self.ignore_eos)

    def request(self, engine: Engine, item: TrafficRequest, tag: str = "") -> GenerationRequest:
        """The engine's request for ``item`` with the marks in place of its size and in front of its first text."""
        if item.messages is not None:
            messages = [(role, (PROMPT_MARK + tag + text) if i == 0 else text)
                        for i, (role, text) in enumerate(item.messages)]
            return engine.chat_request(messages, TOKENS_MARK, self.sampling(item))
        return engine.generation_request(PROMPT_MARK + tag + (item.prompt or ""), TOKENS_MARK, self.temperature,
                                         self.sampling(item))

    def parts(self, engine: Engine, item: TrafficRequest, tag: str = "") -> list[Any]:
        """A request as sent by the load generator: [before the tag, up to the size, after the size, the size, its
        category ("" for none)]."""
        req = self.request(engine, item, tag)
        text = json.dumps(req.body, separators=(",", ":"))
        mark, size = json.dumps(PROMPT_MARK)[1:-1], str(TOKENS_MARK)
        if text.count(mark) != 1 or text.count(size) != 1 or text.index(mark) > text.index(size):
            raise ValueError(f"{engine.kind}: its request body does not hold the prompt before the size once each")
        before, rest = text.split(mark)
        middle, after = rest.split(size)
        return [before, middle, after, item.output_tokens(self.max_tokens), item.category or ""]


def job(generator: Generator, engine: Engine, shape: Shape, *, concurrency: int, window_requests: int,
        requests: list[list[Any]], kind: GenerationRequest, headers: dict[str, str], processes: int, lead: float,
        request_timeout: float, stall_timeout: float, tag: str) -> dict[str, Any]:
    """What the program needs to run one level (``processes`` 0: what the machine can spare); ``requests`` from
    ``Shape.parts``, ``kind`` one of them as the engine builds it (its path and stream format)."""
    return {"host": generator.host, "port": generator.port, "path": generator.prefix + kind.path,
            "headers": headers, "tokens_key": engine.stream_tokens_key if kind.tokens_key is None else kind.tokens_key,
            "seconds_key": engine.stream_seconds_key, "finish_apart": kind.finish_apart,
            "concurrency": concurrency, "window_requests": window_requests,
            "requests": requests, "processes": processes, "lead": lead, "request_timeout": request_timeout,
            "stall_timeout": stall_timeout, "tag": tag}


class Run:
    """One run of the program: the job sent, its lines read on a thread; ``lines`` is polled by the caller."""

    def __init__(self, generator: Generator, job: dict[str, Any]) -> None:
        self.generator = generator
        try:
            self.process = generator.start()
        except OSError as e:
            raise TrialFailure("client_bound", f"cannot start the load generator on {generator.where}: {e}") from e
        self.pending: list[dict[str, Any]] = []
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="loadgen-reader", daemon=True)
        self._thread.start()
        with contextlib.suppress(OSError):  # it died at once: the missing result says so
            self.process.send(json.dumps(job).encode() + b"\n")

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                data = self.process.read()
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                parsed = [json.loads(line) for line in lines if line.strip()]
                with self._lock:
                    self.pending.extend(parsed)
        except (OSError, ValueError, EOFError):
            pass
        finally:
            self.ended.set()

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self.pending = self.pending, []
        return out

    def stop(self) -> None:
        """Ask the program to end the level now (it still sends what it has)."""
        with contextlib.suppress(OSError):
            self.process.send(b"stop\n")

    def close(self) -> None:
        self.process.close_input()
        self.ended.wait(10)
        self.process.kill()


def to_records(engine: Engine, concurrency: int, wire: list[dict[str, Any]],
               most_accepted: int | None = None) -> list[RequestRecord]:
    """The program's requests as records, read by the engine, each with the time its slot stood empty before it."""
    records = [to_record(engine, concurrency, w, most_accepted) for w in wire]
    last_end: dict[int, float] = {}
    for w, rec in sorted(zip(wire, records, strict=True), key=lambda p: p[1].start):
        end = last_end.get(w["slot"])
        if end is not None:
            rec.gap = max(0.0, rec.start - end)
        last_end[w["slot"]] = rec.end if rec.end is not None else rec.start
    return records


def to_record(engine: Engine, concurrency: int, w: dict[str, Any], most_accepted: int | None = None) -> RequestRecord:
    """One request as the engine reads its last events; failed (``BAD``) when its figures cannot be a server's
    (plausible.py; ``most_accepted``: the most tokens a verify step yields under the server's config)."""
    rec = RequestRecord(concurrency, w["start"], max_tokens=w["size"], ramp=w["ramp"], category=w.get("label") or None)
    rec.error, rec.cancelled = w["error"], w["cancelled"]
    for t, n in w["trace"]:
        if n > rec.tokens:
            if rec.ttft is None:
                rec.ttft = t
            rec.tokens = n
            rec.trace.append((t, n))
    rec.e2e = w["e2e"]
    finals = [p for p in dict.fromkeys((*w["closing"], w["last"])) if p is not None]
    if finals:
        update = _merged([_parse(engine, p) for p in finals])
        if update.tokens is not None and update.tokens > rec.tokens:
            if rec.ttft is None:
                rec.ttft = rec.e2e
            rec.tokens = update.tokens
            rec.trace.append((rec.e2e or 0.0, rec.tokens))
        if update.finished:
            rec.finish_reason = update.finish_reason
            rec.accept_length = update.accept_length
            rec.verify_steps = update.verify_steps
            rec.server_e2e = update.server_seconds
        if update.error and rec.error is None:
            rec.error = f"server: {update.error}"[:200]
    if rec.error is None and rec.finish_reason is None and not rec.cancelled:
        rec.error = f"stream ended without a finished event after {rec.tokens} tokens"
    why = doubt(rec, most_accepted)
    if why is not None and (rec.error is None or not rec.error.startswith(BAD)):
        rec.error = BAD + why
    return rec


def _parse(engine: Engine, payload: str) -> StreamUpdate:
    try:
        return engine.parse_event(json.loads(payload))
    except ValueError:
        return StreamUpdate(error=f"unparsable event: {payload[:120]}")


def _merged(updates: list[StreamUpdate]) -> StreamUpdate:
    """The finishing event's figures, completed by the events after it (an OpenAI stream's usage chunk)."""
    out = StreamUpdate()
    for u in updates:
        for name, value in vars(u).items():
            if name == "tokens":
                out.tokens = value if out.tokens is None or (value or 0) > out.tokens else out.tokens
            elif _missing(getattr(out, name)) and not _missing(value):
                setattr(out, name, value)
    return out


def _missing(value: Any) -> bool:
    """Not given (a figure of 0 is given: the checks judge it)."""
    return value is None or value is False
