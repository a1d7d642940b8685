"""A concurrency level's job for the load generator, and its requests coming back as records.

A level runs in the program ``autotune/targets/programs/loadgen.py``, on this machine or on the target host
(``autotune.targets.measuring`` says where), so the same code generates the load wherever it runs. It is given a job
(the server's address, the request body's template, prompts, the level's concurrency and window, the lead that makes
up for the round trip) and hands back every request as it arrived: slot, start, token trace and the raw JSON of its
last event, which the engine reads here (``to_record``).
"""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

from autotune.bench.client import RequestRecord
from autotune.engines import Engine, StreamUpdate
from autotune.errors import TrialFailure
from autotune.targets.measuring import Generator

#: stand-ins in a request body, replaced by each request's prompt and size
PROMPT_MARK = "\x00autotune-prompt\x00"
TOKENS_MARK = 987654321


def template(engine: Engine, temperature: float) -> list[str]:
    """The engine's streaming request body as three pieces around a prompt (a JSON string) and a size."""
    req = engine.generation_request(PROMPT_MARK, TOKENS_MARK, temperature)
    text = json.dumps(req.body, separators=(",", ":"))
    prompt, size = json.dumps(PROMPT_MARK), str(TOKENS_MARK)
    if text.count(prompt) != 1 or text.count(size) != 1 or text.index(prompt) > text.index(size):
        raise ValueError(f"{engine.kind}: its request body does not hold the prompt before the size once each")
    before, rest = text.split(prompt)
    middle, after = rest.split(size)
    return [before, middle, after]


def job(generator: Generator, engine: Engine, *, concurrency: int, max_tokens: int, temperature: float,
        window_requests: int, prompts: list[str], headers: dict[str, str], processes: int, lead: float,
        request_timeout: float, stall_timeout: float, tag: str) -> dict[str, Any]:
    """What the program needs to run one level (``processes`` 0: what the machine can spare)."""
    req = engine.generation_request("", 1, temperature)
    return {"host": generator.host, "port": generator.port, "path": generator.prefix + req.path,
            "headers": headers, "template": template(engine, temperature), "tokens_key": engine.stream_tokens_key,
            "seconds_key": engine.stream_seconds_key,
            "concurrency": concurrency, "max_tokens": max_tokens, "window_requests": window_requests,
            "prompts": prompts, "processes": processes, "lead": lead, "request_timeout": request_timeout,
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


def to_records(engine: Engine, concurrency: int, wire: list[dict[str, Any]]) -> list[RequestRecord]:
    """The program's requests as records, read by the engine, each with the time its slot stood empty before it."""
    records = [to_record(engine, concurrency, w) for w in wire]
    last_end: dict[int, float] = {}
    for w, rec in sorted(zip(wire, records, strict=True), key=lambda p: p[1].start):
        end = last_end.get(w["slot"])
        if end is not None:
            rec.gap = max(0.0, rec.start - end)
        last_end[w["slot"]] = rec.end if rec.end is not None else rec.start
    return records


def to_record(engine: Engine, concurrency: int, w: dict[str, Any]) -> RequestRecord:
    rec = RequestRecord(concurrency, w["start"], max_tokens=w["size"], ramp=w["ramp"])
    rec.error, rec.cancelled = w["error"], w["cancelled"]
    for t, n in w["trace"]:
        if n > rec.tokens:
            if rec.ttft is None:
                rec.ttft = t
            rec.tokens = n
            rec.trace.append((t, n))
    rec.e2e = w["e2e"]
    if w["last"] is not None:
        try:
            update = engine.parse_event(json.loads(w["last"]))
        except ValueError:
            update = StreamUpdate(error=f"unparsable event: {w['last'][:120]}")
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
    return rec

