"""A whole measurement: warm-up, single stream, each concurrency level in steady state, repeated until precise.

Levels run in order of concurrency, single stream first, so a caller can stop a clearly worse config after the
cheap early stages (``on_level`` may raise ``optuna.TrialPruned``). Repeats continue until the 95% confidence
interval of the caller's objective is within the tolerance, or the repeat cap is hit.

The figures (docs/measurement.md):

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

A capacity objective (capacity.py) measures the same steady-state levels, but chooses them as it goes: it climbs
the study's levels until one breaks the SLO, then bisects; later repeats measure the capacity load alone.

A concurrency level runs in the load generator program (generator.py: one or more processes, on this machine or on
the target host); its slots send each next request one round trip ahead of the end of the current one, so the
server holds c requests whatever the way to it. The single stream runs here, on the same client.

The client knows when it is the bottleneck: a level in which the server held fewer than c requests for more than
half the tolerance of its window (the server's own timing of each request, placed where the request's last event
arrived; where the engine reports no timing, the slots' own idle time and the client's event-loop lag) fails as
``client_bound``: an infrastructure failure, never the config's.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import statistics
import time
from collections.abc import Callable
from collections.abc import Generator as Generator_
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotune.bench import bounded
from autotune.bench.capacity import Ladder
from autotune.bench.client import RequestRecord
from autotune.bench.generator import Run, Shape, job, to_record, to_records
from autotune.bench.stats import mean, percentile, relative_half_width
from autotune.bench.traffic import TrafficRequest, raw
from autotune.bench.workload import PromptStream
from autotune.bench.measuring import Generator, local
from autotune.engines import Engine
from autotune.errors import TrialFailure
from autotune.studyfile.spec import WorkloadSpec
from autotune.bench import loadgen

#: how often a running level checks that the server is still alive and that no stop was requested
WATCH_INTERVAL = 0.25
#: seconds a server whose requests failed has to be seen dead (its process exits a moment after its sockets close)
DEATH_GRACE = 1.0
#: a worker process this busy (CPU seconds per second) has no time left: the client, not the way to the server
CPU_BOUND = 0.85
#: a worker's event loop this late (seconds, on average) handles every event late
LAG_BOUND = 0.002
#: prompts handed to a level's generator, in generations of the level's concurrency beyond its window (the ramp,
#: the requests in flight when it closes, those sent ahead); past them it tags prompts it already sent
SPARE_GENERATIONS = 3
#: seconds the server has to flush its cache between levels
FLUSH_SECONDS = 10.0
#: seconds a load generator told to stop at its level's deadline has to send what it has
LEVEL_GRACE = 10.0
#: a concurrency level ends within this many of its longest request's deadlines, and its window's generations: the
#: ramp's, the window's own and the one cut off at its end (a load generator that hangs is not waited for)
LEVEL_DEADLINES = 2
#: the fewest batches a concurrency level's window is cut into for its interval: a window of fewer generations has
#: batches shorter than a request, which share requests, and its interval errs wide (over stored one-generation
#: windows, 4 batches gave a half-width of about 12% that held the truth 95-100% of the time), never narrow
MIN_BATCHES = 4


@dataclass
class ClientLoad:
    """How busy the client was during a level: its event loop's mean lag and its process's CPU share."""

    loop_lag: float = 0.0           # seconds a timer fired late, on average (the worst worker's)
    cpu: float = 0.0                # process CPU seconds per wall second (1.0 = one core busy; the busiest worker's)
    processes: int = 1              # the load generator's worker processes
    where: str = "this machine"     # where the load generator ran


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
        """How far the client fell short of the load it was to put on the server, from the server's own timing of
        each request (None when the engine reports none).

        Single stream: the share of the requests' time spent outside the server. Concurrency c: the share of the
        window in which the server held fewer than c requests. Each request was held by the server for its own
        timing of it, ending where its last event arrived here (every request's way back takes about as long, so
        the count is the server's, shifted by that way); a request cut off at the end was held from its start plus
        the level's typical time outside the server. The round trip therefore costs nothing when the slots send
        ahead of it; a client that handles events late, or sends late, leaves the server short."""
        if self.window is None:
            timed = [r for r in self.measured if r.server_e2e is not None and r.e2e]
            if not timed:
                return None
            outside = sum(max(0.0, r.e2e - r.server_e2e) + (r.gap or 0.0) for r in timed)  # type: ignore[operator]
            return outside / sum(r.e2e + (r.gap or 0.0) for r in timed)  # type: ignore[operator]
        held = self.server_held
        return None if held is None else max(0.0, 1.0 - held)

    @property
    def server_held(self) -> float | None:
        """A concurrency level's mean count of requests in the server over its window, as a share of c (1.0: c all
        the time), from the server's own timing of each request (see ``client_share``); None without it."""
        if self.window is None:
            return None
        timed = [r for r in self.records if r.ok and r.server_e2e is not None and r.end is not None]
        if not timed:
            return None
        lead = outside_time(timed)
        spans = [(r.end - r.server_e2e, r.end) for r in timed]  # type: ignore[operator]
        spans += [(r.start + lead, math.inf) for r in self.records if r.ok and r.cancelled]
        return 1.0 - self._shortfall(spans, clip=False)

    @property
    def idle_share(self) -> float:
        """The share of the window in which the client itself had fewer than c requests in flight (its slots stood
        empty between requests)."""
        if self.window is None:
            return 0.0
        spans = [(r.start, r.end if r.end is not None and not r.cancelled else math.inf)
                 for r in self.records if r.ok]
        return self._shortfall(spans)

    def _shortfall(self, spans: list[tuple[float, float]], clip: bool = True) -> float:
        assert self.window is not None
        a, b = self.window
        held = sum(max(0.0, min(hi, b) - max(lo, a)) for lo, hi in spans)
        short = 1.0 - held / (self.concurrency * (b - a)) if b > a else 0.0
        return max(0.0, short) if clip else short


def by_category(records: list[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Per category of the data: the requests measured, their mean output length, their acceptance (tokens over
    verify steps, from each request's own counts; None where the engine gives none) and their mean decode speed."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({r.category or "(none)" for r in records}):
        rs = [r for r in records if (r.category or "(none)") == name]
        verified = [r for r in rs if r.verify_steps]
        decode = [d for d in (r.decode_tok_s for r in rs) if d is not None]
        out[name] = {"measured": len(rs), "tokens_mean": round(sum(r.tokens for r in rs) / len(rs), 1),
                     "accept_length": _rounded(sum(r.tokens for r in verified) / sum(r.verify_steps for r in verified))
                     if verified else None,
                     "decode_tok_s": _rounded(mean(decode))}
    return out


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def outside_time(records: list[RequestRecord]) -> float:
    """The typical time a request spends outside the server (the way there and back, and the client): the median of
    each server-timed request's time on the client less the server's."""
    timed = [r.e2e - r.server_e2e for r in records if r.e2e is not None and r.server_e2e is not None]
    return max(0.0, statistics.median(timed)) if timed else 0.0


@dataclass
class Measurement:
    repeats: list[list[LevelResult]] = field(default_factory=list)   # repeat -> levels, single stream first
    precision: float | None = None   # relative half-width of the objective's 95% interval after the last repeat

    @property
    def concurrencies(self) -> list[int]:
        """The levels measured, lowest first."""
        return sorted({lv.concurrency for rep in self.repeats for lv in rep})

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
            "client_processes": max((lv.load.processes for lv in runs), default=1),
            "server_held": _rounded(min((h for h in (lv.server_held for lv in runs) if h is not None), default=None)),
        }
        for name, values in (("ttft_ms", ttft), ("itl_ms", itl), ("e2e_ms", [x * 1000 for x in e2e])):
            for q in (50, 90, 99):
                out[f"{name}_p{q}"] = percentile(values, q)
        if any(r.category for r in ok):
            out["categories"] = by_category(ok)
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
        prompts: list[str] | list[TrafficRequest],
        headers: dict[str, str] | None = None,
        check: Callable[[], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        seed: int | None = None,
        max_error_rate: float = 0.0,
        levels: tuple[int, ...] | None = None,
        load: Generator | None = None,
        processes: int | None = None,
        ladder: Ladder | None = None,
        most_accepted: int | None = None,
    ) -> None:
        """``check`` raises ``TrialFailure`` if the server died (it is polled while requests run); a level whose
        share of failed requests exceeds ``max_error_rate`` fails the measurement. ``levels``: the concurrency levels
        to measure (default: the single stream and the workload's). ``load``: where the concurrency levels' load
        generator runs (default: on this machine, sending to ``base_url``); ``processes`` its worker processes
        (default: the workload's; 0: what the machine can spare). ``ladder``: measure a capacity instead, climbing
        and narrowing the load as it says (capacity.py); later repeats measure the capacity load alone. ``prompts``:
        the workload's requests (a string is a raw prompt of the workload's max_tokens). ``most_accepted``: the most
        tokens one verify step yields under the server's config (``Engine.most_accepted``; None: unknown); a request
        whose figures no server can produce fails the level (plausible.py)."""
        self.base_url = base_url
        self.engine = engine
        self.workload = workload
        items = [p if isinstance(p, TrafficRequest) else raw(p) for p in prompts]
        self.prompts: PromptStream[TrafficRequest] = PromptStream(items, seed)
        self.shape = shape_of(workload)
        #: the requests' endpoint and stream format (one dataset holds one kind)
        self.kind = self.shape.request(engine, items[0])
        self.headers = headers or {}
        self.check = check or (lambda: None)
        self.should_stop = should_stop
        self.max_error_rate = max_error_rate
        self.levels = sorted(levels or {1, *workload.concurrency})
        self.ladder = ladder
        self.most_accepted = most_accepted
        self.load = load or local(base_url)
        self.processes = workload.processes if processes is None else processes
        #: the most of the server's load the client may fall short by before figures are off by more than the
        #: workload tolerates
        self.client_limit = workload.tolerance / 2
        #: what has been measured so far (also after a failure part-way)
        self.measurement = Measurement()
        #: how long before a request's end its slot sends the next (the round trip to the load generator's server)
        self.lead: float | None = None
        self._repeat = 0

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
        url = local(self.base_url)
        client = loadgen.Client(asyncio.get_running_loop(), self._job(url, 1, 0, []), time.monotonic(),
                                lambda req: None)
        try:
            if w.warmup:
                await self._single(client, LevelResult(1, []), w.warmup)
            for repeat in range(w.max_repeats):
                self._repeat = repeat
                results: list[LevelResult] = []
                m.repeats.append(results)
                todo = self._levels(repeat)
                step = 0
                c = _following(todo, None)
                while c is not None:
                    await self._flush()
                    level = LevelResult(c, [])
                    results.append(level)
                    if c == 1:
                        await self._single(client, level, w.requests)
                    else:
                        await self._steady(level, w.window_generations * c)
                    self._judge(level)
                    self._judge_client(level)
                    if repeat == 0 and on_level is not None:
                        on_level(step, c, m)
                    step += 1
                    c = _following(todo, m if self.ladder is not None and repeat == 0 else None)
                if not results:
                    m.repeats.pop()
                    break
                if precision_of is not None:
                    m.precision = precision_of(m)
                if repeat + 1 >= w.min_repeats and (precision_of is None or
                                                    (m.precision is not None and m.precision <= w.tolerance)):
                    break
        finally:
            client.close()
        return m

    def _levels(self, repeat: int) -> Generator_[int, Measurement, None]:
        """The levels of a repeat, in order: the study's; with a capacity ladder, its probes (each chosen from the
        measurement sent back after the one before), then in later repeats the capacity load alone."""
        ladder = self.ladder
        if ladder is None:
            yield from self.levels
            return
        if repeat > 0:
            if ladder.capacity is not None:
                yield ladder.capacity
            return
        load: int | None = ladder.first()
        while load is not None:
            m = yield load
            load = ladder.next(load, m.summary(load))

    async def _flush(self) -> None:
        """Empty the prefix cache between levels where the engine can (prompts never repeat anyway), within
        FLUSH_SECONDS."""
        with (bounded.client(self.base_url, self.headers, timeout=FLUSH_SECONDS) as sync,
              contextlib.suppress(httpx.HTTPError, bounded.Overran)):
            await asyncio.to_thread(bounded.within, FLUSH_SECONDS, lambda: self.engine.flush_cache(sync))

    def _requests(self, n: int) -> list[list[Any]]:
        """The next ``n`` requests as the load generator sends them, each never sent before in this trial."""
        out = []
        for _ in range(n):
            item, round_ = self.prompts.next_request()
            out.append(self.shape.parts(self.engine, item, f"[request {self.prompts.issued}] " if round_ > 1 else ""))
        return out

    def _job(self, where: Generator, concurrency: int, window: int, requests: list[list[Any]]) -> dict[str, Any]:
        w = self.workload
        near = where.where != "this machine"
        return job(
            where, self.engine, self.shape, concurrency=concurrency, window_requests=window, requests=requests,
            kind=self.kind, headers=self.headers, processes=self.processes,
            lead=0.0 if near and self.lead is None else (self.lead or 0.0), request_timeout=w.request_timeout,
            stall_timeout=w.stall_timeout, tag=f"c{concurrency} r{self._repeat}")

    async def _single(self, client: loadgen.Client, level: LevelResult, n: int) -> None:
        """``n`` requests one after another, on this machine."""
        cpu, wall = time.process_time(), time.monotonic()
        client.t0 = wall
        following = loadgen.request_bodies(self._requests(n), f"single r{self._repeat}")
        try:
            for _ in range(n):
                size, body, label = following()
                req = loadgen.Request(0, size, False, body(size), label)
                client.start(req)
                try:
                    while not req.finished:
                        await asyncio.wait([req.release], timeout=WATCH_INTERVAL)  # type: ignore[list-item]
                        client.watch()
                        self._watch(level)
                finally:
                    if not req.finished:
                        client.close()
                        client.active.clear()
                    level.records.append(to_record(self.engine, 1, req.wire(), self.most_accepted))
                if not level.records[-1].ok:
                    break
        finally:
            elapsed = time.monotonic() - wall
            level.load.cpu = (time.process_time() - cpu) / elapsed if elapsed > 0 else 0.0
        if self.load.where == "this machine":
            self._learn_lead(level.records)

    def _learn_lead(self, records: list[RequestRecord]) -> None:
        timed = [r for r in records if r.complete and r.server_e2e is not None]
        if timed:
            self.lead = outside_time(timed)

    def _watch(self, level: LevelResult) -> None:
        """Between waits: the server still alive, no stop requested."""
        self.check()
        if self.should_stop():
            raise TrialFailure("interrupted", f"stop requested while measuring concurrency {level.concurrency}")

    async def _steady(self, level: LevelResult, requests: int) -> None:
        """``level.concurrency`` requests in flight until ``requests`` have finished inside the steady-state window
        (see the module's docstring), in the load generator program."""
        c = level.concurrency
        budget = (self.workload.window_generations + SPARE_GENERATIONS) * c
        parts = self._requests(budget)
        job = self._job(self.load, c, requests, parts)
        w = self.workload
        longest = w.request_timeout + loadgen.SECONDS_PER_TOKEN * max(int(p[3]) for p in parts)
        limit = (w.window_generations + LEVEL_DEADLINES) * longest
        deadline, overdue = time.monotonic() + limit, False
        late = TrialFailure("stalled", f"concurrency {c} not done within {limit:.0f} s ({w.window_generations} + "
                                       f"{LEVEL_DEADLINES} times its longest request's deadline)")
        run = await asyncio.to_thread(Run, self.load, job)
        result: dict[str, Any] | None = None
        try:
            stopping = False
            while result is None:
                if time.monotonic() > deadline:
                    if overdue:
                        raise late  # told to stop, the load generator sent nothing
                    run.stop()  # it sends what it has
                    stopping = overdue = True
                    deadline = time.monotonic() + LEVEL_GRACE
                for message in run.take():
                    if "result" in message:
                        result = message["result"]
                    elif "progress" in message and not stopping and self._failing(message["progress"]):
                        run.stop()  # fail fast: the rest would only fail or wait out their timeouts too
                        stopping = True
                if result is not None:
                    break
                if run.ended.is_set() and not run.pending:
                    break
                try:
                    self._watch(level)
                except TrialFailure:
                    run.stop()
                    await asyncio.to_thread(run.ended.wait, 10)
                    self._take_result(level, run, None)
                    raise
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(run.close)
        if result is None:
            self._watch(level)
            detail = run.process.errors().strip().splitlines()
            raise TrialFailure("tuner_error", f"the load generator on {self.load.where} ended without a result"
                                              + (f": {detail[-1][:300]}" if detail else ""))
        self._take_result(level, run, result)
        if overdue:
            self._judge(level)  # failed requests say best why it was late
            raise late

    def _take_result(self, level: LevelResult, run: Run, result: dict[str, Any] | None) -> None:
        if result is None:
            result = next((m["result"] for m in run.take() if "result" in m), None)
            if result is None:
                return
        level.records = to_records(self.engine, level.concurrency, result["records"], self.most_accepted)
        level.window = tuple(result["window"]) if result["window"] else None  # type: ignore[assignment]
        level.load = ClientLoad(loop_lag=result["lag"], cpu=result["cpu"], processes=result["processes"],
                                where=self.load.where)
        timed = [r for r in level.records if r.complete and r.server_e2e is not None]
        if timed:
            self.lead = outside_time(timed)

    def _failing(self, progress: dict[str, Any]) -> bool:
        failed = progress["failed"]
        return (bool(progress["stalled"] or progress["bad"])
                or failed > self.max_error_rate * max(progress["finished"] + failed, 10))

    def _judge(self, result: LevelResult) -> None:
        """Fail the measurement when requests failed: the server died, stalled or answered with errors; whatever
        the error rate allowed, when it answered what no server may (``bad_response``)."""
        failed = result.failed
        if not failed:
            return
        self.check()  # a dead server explains the failures best
        bad = [r for r in failed if r.error and r.error.startswith(loadgen.BAD)]
        if bad:
            raise TrialFailure("bad_response", f"{len(bad)} of {len(result.records)} requests at concurrency "
                                               f"{result.concurrency}: {bad[0].error[len(loadgen.BAD):]}")
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
        """Fail as ``client_bound`` when the server held fewer requests than the level asks for, for longer than the
        tolerance allows (a single stream the server timed itself is immune to the client and the transport)."""
        if level.server_timed:
            return
        if level.window is None:
            if level.concurrency > 1:
                raise TrialFailure("client_bound", f"concurrency {level.concurrency}: the load generator ended "
                                                   "before its window was complete")
            return
        share = level.client_share
        how = "by the server's own timing of each request"
        held = level.server_held
        if held is not None and held - 1.0 > self.workload.tolerance:
            raise TrialFailure("client_bound", (
                f"concurrency {level.concurrency}: the server held {held - 1.0:.1%} more than {level.concurrency} "
                f"requests on average ({how}; at most the tolerance, {self.workload.tolerance:.1%}): the slots "
                "sent ahead too early, the time outside the server varying too much from one "
                f"request to the next; it reached {level.output_tok_s:.0f} tok/s. Run the load generator closer to "
                'the server ([workload] client = "target"), with less other load on its machine'))
        if share is None:
            times = [r.e2e for r in level.measured if r.e2e]
            lag = level.load.loop_lag / (sum(times) / len(times)) if times else 0.0
            share = max(level.idle_share, lag)
            how = "by its slots' idle time and its event loop's lag"
        if share <= self.client_limit:
            return
        raise TrialFailure("client_bound", client_bound_detail(level, share, how, self.client_limit))


def shape_of(workload: WorkloadSpec) -> Shape:
    """How the workload's requests are sent where the data says nothing of their length and sampling."""
    return Shape(max_tokens=workload.max_tokens, temperature=workload.temperature, top_p=workload.top_p,
                 ignore_eos=workload.forced_length)


def _following(levels: Generator_[int, Measurement, None], sent: Measurement | None) -> int | None:
    """The next level of a repeat (``Bench._levels``), ``sent`` back to a capacity ladder; None: the repeat is done."""
    try:
        return levels.send(sent)  # type: ignore[arg-type]
    except StopIteration:
        return None


def client_bound_detail(level: LevelResult, share: float, how: str, limit: float) -> str:
    """What the client reached, the limit it hit, and what to change."""
    load = level.load
    where = f"{load.processes} process{'es' if load.processes > 1 else ''} on {load.where}"
    if load.cpu >= CPU_BOUND:
        limit_hit = (f"the CPU: its busiest process kept {load.cpu:.0%} of a core busy; give it more processes "
                     "([workload] processes, --processes) or a machine with cores to spare, or run it on the target "
                     '([workload] client = "target")')
    elif load.loop_lag >= LAG_BOUND:
        limit_hit = (f"its event loop, {load.loop_lag * 1000:.1f} ms late on average: give it more processes "
                     "([workload] processes, --processes) or less other work on its machine")
    else:
        limit_hit = ('the way to the server (neither CPU nor event loop was short): run the load generator on the '
                     'target ([workload] client = "target") or measure from closer to the server')
    return (f"concurrency {level.concurrency}: the client fell behind the server: the server held fewer than "
            f"{level.concurrency} requests for {share:.1%} of the window ({how}; at most {limit:.1%} keeps the "
            f"figure within the tolerance); it reached {level.output_tok_s:.0f} tok/s with {where}. The limit was "
            f"{limit_hit}; or allow more ([workload] tolerance), or ask less of it (a lower --sim-speedup, longer "
            "requests)")
