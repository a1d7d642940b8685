"""A whole measurement: warm-up, single stream, each concurrency level in steady state, repeated until precise.

Levels run in order of concurrency, single stream first, so a caller can stop a clearly worse config after the
cheap early stages (``on_level`` may raise ``optuna.TrialPruned``). Repeats continue until the 95% confidence
interval of the caller's objective is within the tolerance, or the repeat cap is hit.

The figures (README, "What is measured"):

* single stream: one request at a time; completion tokens over the requests' whole time (prefill included), as the
  server timed each request where the engine reports it (SGLang's e2e_latency, llama.cpp's timings), else from
  sending to the last token. Neither the transport nor the client can change it: the server's timing does not see
  them, and on the client's clock a late chunk only makes a request longer.
* concurrency c: steady-state output throughput. c requests are kept in flight (a new one is sent as soon as one
  finishes). The first request of each slot asks for a graded share of max_tokens (1/c, 2/c, ... of it), so
  completions are spread over time as they are in a long-running closed loop rather than marching in one
  synchronized wave; these ramp requests are not measured. Once the last of them finishes the window opens; it
  closes when ``window_generations`` x c requests have finished inside it, and the requests still in flight are
  cut off (the tail, where fewer than c would be in flight, is never measured). The figure is the tokens that
  arrived inside the window over its length; the prefill of every replacing request falls inside it, as in steady
  state.

Confidence intervals, pooled over repeats: the single stream's from the spread of its requests' rates, which are
independent; a concurrency level's by batch means, from the spread of the throughput over equal parts of the
window, one generation (c requests' time) each. Requests in flight together are not independent: an interval from
the spread of their latencies held the truth in only about half of the launches that checked it against the
emulator's truth; batches of a generation did in 93-94%.

The client knows when it is the bottleneck: a level in which more of each request's time was spent outside the
server (transport, client; from the server's own timing of each request where the engine reports it, else the
client's event-loop lag) than half the tolerance fails as ``client_bound``: an infrastructure failure, never the
config's.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotune.bench.client import RequestRecord, stream_one
from autotune.bench.stats import mean, percentile, relative_half_width
from autotune.bench.workload import PromptStream
from autotune.engines import Engine
from autotune.errors import TrialFailure
from autotune.study import WorkloadSpec

#: how often a running level checks that the server is still alive and that no stop was requested
WATCH_INTERVAL = 0.25
#: seconds a server whose requests failed has to be seen dead (its process exits a moment after its sockets close)
DEATH_GRACE = 1.0
#: how often the client's event loop is sampled for lag (seconds)
LAG_PROBE = 0.005
#: the fewest batches a concurrency level's window is cut into for its interval: a window of fewer generations has
#: batches shorter than a request, which share requests, and its interval errs wide (over stored one-generation
#: windows, 4 batches gave a half-width of about 12% that held the truth 95-100% of the time), never narrow
MIN_BATCHES = 4


@dataclass
class ClientLoad:
    """How busy the client was during a level: its event loop's mean lag and its process's CPU share."""

    loop_lag: float = 0.0           # seconds a timer fired late, on average
    cpu: float = 0.0                # process CPU seconds per wall second (1.0 = one core busy)


@dataclass
class LevelResult:
    concurrency: int
    records: list[RequestRecord]
    #: the steady-state window, seconds since the level started (concurrency levels only)
    window: tuple[float, float] | None = None
    load: ClientLoad = field(default_factory=ClientLoad)

    @property
    def measured(self) -> list[RequestRecord]:
        """The requests whose latency and acceptance count: every finished one of the single stream; those that
        finished inside the window of a concurrency level."""
        done = [r for r in self.records if r.complete and not r.ramp]
        if self.window is None:
            return done
        a, b = self.window
        return [r for r in done if r.end is not None and a < r.end <= b]

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.ok]

    @property
    def tokens(self) -> float:
        """Tokens counted: all of the single stream's; those that arrived inside a concurrency level's window."""
        if self.window is None:
            return float(sum(r.tokens for r in self.measured))
        a, b = self.window
        return float(sum(r.tokens_by(b) - r.tokens_by(a) for r in self.records if r.ok))

    def batch_rates(self) -> list[float]:
        """A concurrency level's throughput over equal parts of its window, one generation each (at least
        MIN_BATCHES parts); their mean is the level's figure."""
        if self.window is None:
            return []
        a, b = self.window
        parts = max(MIN_BATCHES, round(len(self.measured) / self.concurrency))
        edges = [a + (b - a) * i / parts for i in range(parts + 1)]
        return [LevelResult(self.concurrency, self.records, (lo, hi)).output_tok_s
                for lo, hi in itertools.pairwise(edges)]

    @property
    def server_timed(self) -> bool:
        """Whether the single stream's figure comes from the server's own timing of every request."""
        return self.window is None and bool(self.measured) and all(r.server_e2e for r in self.measured)

    @property
    def seconds(self) -> float:
        """The time the tokens were counted over."""
        if self.window is None:
            return sum((r.server_e2e if self.server_timed else r.e2e) or 0.0 for r in self.measured)
        return self.window[1] - self.window[0]

    @property
    def output_tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_share(self) -> float | None:
        """The share of the measured requests' time spent outside the server: the transport and the client, from
        the server's own timing of each request (None when the engine reports none). A slot's idle time between
        requests counts as outside time."""
        timed = [r for r in self.measured if r.server_e2e is not None and r.e2e]
        if not timed:
            return None
        outside = sum(max(0.0, r.e2e - r.server_e2e) + (r.gap or 0.0) for r in timed)  # type: ignore[operator]
        return outside / sum(r.e2e + (r.gap or 0.0) for r in timed)  # type: ignore[operator]


@dataclass
class Measurement:
    repeats: list[list[LevelResult]] = field(default_factory=list)   # repeat -> levels, single stream first
    precision: float | None = None   # relative half-width of the objective's 95% interval after the last repeat

    @property
    def concurrencies(self) -> list[int]:
        return [lv.concurrency for lv in self.repeats[0]] if self.repeats else []

    def level(self, concurrency: int) -> list[LevelResult]:
        """That level's result in every repeat."""
        return [lv for rep in self.repeats for lv in rep if lv.concurrency == concurrency]

    def summary(self, concurrency: int) -> dict[str, Any]:
        """One level's figures over all repeats: throughput, per-request speed, latency percentiles, acceptance,
        and how busy the client was."""
        runs = self.level(concurrency)
        records = [r for lv in runs for r in lv.records]
        ok = [r for lv in runs for r in lv.measured]
        decode = [d for d in (r.decode_tok_s for r in ok) if d is not None]
        ttft = [r.ttft * 1000 for r in ok if r.ttft is not None]
        itl = [g * 1000 for r in ok for g in r.itl]
        e2e = [r.e2e for r in ok if r.e2e is not None]
        verified = [r for r in ok if r.verify_steps]
        seconds = sum(lv.seconds for lv in runs)
        shares = [s for s in (lv.client_share for lv in runs) if s is not None]
        single = concurrency == 1
        timed = single and all(lv.server_timed for lv in runs)
        # the interval's samples: the single stream's requests are independent, a concurrency level's are not
        if single:
            samples = [r.tokens / ((r.server_e2e if timed else r.e2e) or math.inf) for r in ok]
        else:
            samples = [x for lv in runs for x in lv.batch_rates()]
        out: dict[str, Any] = {
            "concurrency": concurrency,
            "requests": len(records),
            "measured": len(ok),
            "errors": sum(1 for r in records if not r.ok),
            "output_tok_s": sum(lv.tokens for lv in runs) / seconds if seconds > 0 else None,
            "output_tok_s_rel_ci": relative_half_width(samples),
            "server_timed": timed,
            "window_s": None if single else round(seconds, 3),
            "decode_tok_s": mean(decode),
            "decode_tok_s_p50": percentile(decode, 50),
            "decode_tok_s_rel_ci": relative_half_width(decode),
            "accept_length": (sum(r.tokens for r in verified) / sum(r.verify_steps for r in verified))
            if verified else None,
            "client_share": max(shares) if shares else None,
            "client_loop_lag_ms": round(max((lv.load.loop_lag for lv in runs), default=0.0) * 1000, 3),
            "client_cpu": round(max((lv.load.cpu for lv in runs), default=0.0), 3),
        }
        for name, values in (("ttft_ms", ttft), ("itl_ms", itl), ("e2e_ms", [x * 1000 for x in e2e])):
            for q in (50, 90, 99):
                out[f"{name}_p{q}"] = percentile(values, q)
        return out

    def summaries(self) -> list[dict[str, Any]]:
        """Every level's summary, lowest concurrency first (what the trial records and scores)."""
        return [self.summary(c) for c in self.concurrencies]

    def records(self) -> list[dict[str, Any]]:
        return [dict(r.to_json(), repeat=i) for i, rep in enumerate(self.repeats) for lv in rep for r in lv.records]


class Bench:
    """Measures one server with one workload."""

    def __init__(
        self,
        base_url: str,
        engine: Engine,
        workload: WorkloadSpec,
        prompts: list[str],
        headers: dict[str, str] | None = None,
        check: Callable[[], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        seed: int | None = None,
        max_error_rate: float = 0.0,
        levels: tuple[int, ...] | None = None,
    ) -> None:
        """``check`` raises ``TrialFailure`` if the server died (it is polled while requests run); a level whose
        share of failed requests exceeds ``max_error_rate`` fails the measurement. ``levels``: the concurrency levels
        to measure (default: the single stream and the workload's)."""
        self.base_url = base_url
        self.engine = engine
        self.workload = workload
        self.prompts = PromptStream(prompts, seed)
        self.headers = headers or {}
        self.check = check or (lambda: None)
        self.should_stop = should_stop
        self.max_error_rate = max_error_rate
        self.levels = sorted(levels or {1, *workload.concurrency})
        #: the most of a request's time the transport and the client may take before figures are off by more than
        #: the workload tolerates
        self.client_limit = workload.tolerance / 2
        #: what has been measured so far (also after a failure part-way)
        self.measurement = Measurement()

    def run(
        self,
        on_level: Callable[[int, int, Measurement], None] | None = None,
        precision_of: Callable[[Measurement], float | None] | None = None,
    ) -> Measurement:
        """Warm up, then measure every level, repeating as the workload asks.

        ``on_level(step, concurrency, measurement)`` runs after each level of the first repeat; ``precision_of``
        gives the relative half-width of the objective's 95% interval from what is measured so far, and decides
        whether to repeat (without it, the workload's min_repeats are run).
        """
        return asyncio.run(self._run(on_level, precision_of))

    async def _run(self, on_level: Callable[[int, int, Measurement], None] | None,
                   precision_of: Callable[[Measurement], float | None] | None) -> Measurement:
        w = self.workload
        m = self.measurement = Measurement()
        limits = httpx.Limits(max_connections=max(self.levels) + 4, max_keepalive_connections=max(self.levels) + 4)
        timeout = httpx.Timeout(w.request_timeout, connect=10.0)
        async with httpx.AsyncClient(base_url=self.base_url, headers=self.headers, limits=limits,
                                     timeout=timeout) as client:
            if w.warmup:
                await self._single(client, LevelResult(1, []), w.warmup)
            for repeat in range(w.max_repeats):
                results: list[LevelResult] = []
                m.repeats.append(results)
                for step, c in enumerate(self.levels):
                    await self._flush()
                    level = LevelResult(c, [])
                    results.append(level)
                    if c == 1:
                        await self._single(client, level, w.requests)
                    else:
                        await self._steady(client, level, w.window_generations * c)
                    self._judge(level)
                    self._judge_client(level)
                    if repeat == 0 and on_level is not None:
                        on_level(step, c, m)
                if precision_of is not None:
                    m.precision = precision_of(m)
                if repeat + 1 >= w.min_repeats and (precision_of is None or
                                                    (m.precision is not None and m.precision <= w.tolerance)):
                    break
        return m

    async def _flush(self) -> None:
        """Empty the prefix cache between levels where the engine can (prompts never repeat anyway)."""
        with (httpx.Client(base_url=self.base_url, headers=self.headers, timeout=10.0) as sync,
              contextlib.suppress(httpx.HTTPError)):
            self.engine.flush_cache(sync)

    def _request(self, client: httpx.AsyncClient, rec: RequestRecord, t0: float) -> Awaitable[None]:
        w = self.workload
        return stream_one(client, self.engine, self.prompts.next(), rec, w.temperature, t0,
                          first_token_timeout=w.request_timeout, stall_timeout=w.stall_timeout)

    async def _single(self, client: httpx.AsyncClient, level: LevelResult, n: int) -> None:
        """``n`` requests one after another."""
        t0 = time.perf_counter()
        closed = asyncio.Event()

        async def one_at_a_time() -> None:
            for _ in range(n):
                if closed.is_set():
                    return
                rec = RequestRecord(1, time.perf_counter() - t0, max_tokens=self.workload.max_tokens)
                level.records.append(rec)
                await self._request(client, rec, t0)

        await self._supervise(level, [one_at_a_time()], closed)

    async def _steady(self, client: httpx.AsyncClient, level: LevelResult, requests: int) -> None:
        """``level.concurrency`` requests in flight until ``requests`` have finished inside the steady-state window
        (see the module's docstring)."""
        c, max_tokens = level.concurrency, self.workload.max_tokens
        t0 = time.perf_counter()
        ramp_left = c
        finished = 0
        start: float | None = None
        closed = asyncio.Event()

        async def slot(i: int) -> None:
            nonlocal ramp_left, finished, start
            last_end: float | None = None
            first = True
            while not closed.is_set():
                size = max(1, round(max_tokens * (i + 1) / c)) if first else max_tokens
                rec = RequestRecord(c, time.perf_counter() - t0, max_tokens=size, ramp=first)
                if last_end is not None:
                    rec.gap = max(0.0, rec.start - last_end)
                level.records.append(rec)
                await self._request(client, rec, t0)
                now = time.perf_counter() - t0
                last_end = rec.end if rec.end is not None else now
                if first:
                    ramp_left -= 1
                    if ramp_left == 0:
                        start = now
                elif start is not None and rec.complete and rec.end is not None and rec.end > start:
                    finished += 1
                    if finished >= requests and not closed.is_set():
                        level.window = (start, now)
                        closed.set()
                first = False

        await self._supervise(level, [slot(i) for i in range(c)], closed)

    async def _supervise(self, level: LevelResult, work: list[Awaitable[None]], closed: asyncio.Event) -> None:
        """Run ``work`` while watching the server, stop requests and failures, and the client's own load; when
        ``closed`` is set, cut off whatever is still in flight. ``work`` must return once ``closed`` is set: it is
        set before the work is cancelled too, since a cancellation that lands in a connection attempt can come back
        as a failed request (anyio reports it as "All connection attempts failed") instead of ending the task; a
        worker that went on would send request after request to a server that is gone."""
        tasks = [asyncio.ensure_future(w) for w in work]
        probe = asyncio.ensure_future(self._probe_lag(level.load))
        closing = asyncio.ensure_future(closed.wait())
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            while not all(t.done() for t in tasks) and not closed.is_set():
                await asyncio.wait([*tasks, closing], timeout=WATCH_INTERVAL, return_when=asyncio.FIRST_COMPLETED)
                for t in tasks:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                self.check()
                if self.should_stop():
                    raise TrialFailure("interrupted",
                                       f"stop requested while measuring concurrency {level.concurrency}")
                if level.failed and (any((r.error or "").startswith("stalled") for r in level.failed)
                                     or len(level.failed) > self.max_error_rate * max(len(level.records), 10)):
                    self._judge(level)  # failing fast: the rest would only fail or wait out their timeouts too
        finally:
            closed.set()
            in_flight = [r for r in level.records if r.ok and r.finish_reason is None]
            for t in (*tasks, probe, closing):
                t.cancel()
            await asyncio.gather(*tasks, probe, closing, return_exceptions=True)
            elapsed = time.perf_counter() - wall
            level.load.cpu = (time.process_time() - cpu) / elapsed if elapsed > 0 else 0.0
            for r in in_flight:  # cut off, whatever the cancellation was reported as
                r.error, r.cancelled = None, True

    @staticmethod
    async def _probe_lag(load: ClientLoad) -> None:
        """Sample how late the event loop wakes a timer (a busy client processes every chunk late)."""
        loop = asyncio.get_running_loop()
        late: list[float] = []
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_PROBE)
            late.append(max(0.0, loop.time() - asked - LAG_PROBE))
            load.loop_lag = sum(late) / len(late)

    def _judge(self, result: LevelResult) -> None:
        """Fail the measurement when requests failed: the server died, stalled or answered with errors."""
        failed = result.failed
        if not failed:
            return
        self.check()  # a dead server explains the failures best
        if len(failed) / len(result.records) <= self.max_error_rate:
            return
        # a dying server's requests fail a moment before its process is seen to exit: give it that moment
        deadline = time.monotonic() + DEATH_GRACE
        while time.monotonic() < deadline:
            time.sleep(0.05)
            self.check()
        stalled = [r for r in failed if r.error and r.error.startswith("stalled")]
        example = (stalled or failed)[0].error
        reason = "stalled" if stalled else "errors"
        raise TrialFailure(reason, f"{len(failed)} of {len(result.records)} requests failed at concurrency "
                                   f"{result.concurrency}: {example}")

    def _judge_client(self, level: LevelResult) -> None:
        """Fail as ``client_bound`` when the client (or the transport) took too much of the requests' time (a single
        stream the server timed itself is immune to both)."""
        if level.server_timed:
            return
        share = level.client_share
        if share is None:
            times = [r.e2e for r in level.measured if r.e2e]
            share = level.load.loop_lag / (sum(times) / len(times)) if times else None
            how = "its event loop ran late by that share of a request's time"
        else:
            how = "by the server's own timing of each request"
        if share is None or share <= self.client_limit:
            return
        raise TrialFailure("client_bound", (
            f"concurrency {level.concurrency}: the client fell behind the server: {share:.1%} of each request's "
            f"time was spent outside the server ({how}; at most {self.client_limit:.1%} keeps the figure within "
            f"the tolerance); it reached {level.output_tok_s:.0f} tok/s with {level.load.cpu:.0%} of a CPU core "
            f"busy and its event loop {level.load.loop_lag * 1000:.1f} ms late on average. Measure from closer to "
            "the server, with less load on this machine, or with longer requests (max_tokens)"))
