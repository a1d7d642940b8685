"""A whole measurement: warm-up, single stream, each concurrency level, repeated until the result is precise.

Levels run in order of concurrency, single stream first, so a caller can stop a clearly worse config after the
cheap early stages (``on_level`` may raise ``optuna.TrialPruned``). Repeats continue until the 95% confidence
interval of the caller's objective is within the tolerance, or the repeat cap is hit.

Confidence intervals come from the spread between requests, pooled over repeats: a single-stream figure is a mean
of per-request decode speeds; a concurrent throughput with c requests always in flight is, by Little's law,
c x tokens / mean end-to-end latency, so its relative interval is that of the mean latency.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
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


@dataclass
class LevelResult:
    concurrency: int
    records: list[RequestRecord]
    wall: float = 0.0               # seconds from the first request sent to the last one finished
    full_load: float = 0.0          # seconds from the first request sent until the last one was sent

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def output_tok_s(self) -> float:
        """Output tokens per second while the level had all its requests in flight.

        The window ends when the last request is sent: up to then ``concurrency`` requests are always in flight;
        after it the load tails off as they finish, which says nothing about the config at this concurrency.
        """
        if self.full_load > 0:
            return sum(r.tokens_by(self.full_load) for r in self.ok) / self.full_load
        return sum(r.tokens for r in self.ok) / self.wall if self.wall > 0 else 0.0


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
        """One level's figures over all repeats: throughput, per-request speed, latency percentiles, acceptance."""
        runs = self.level(concurrency)
        records = [r for lv in runs for r in lv.records]
        ok = [r for r in records if r.ok]
        decode = [d for d in (r.decode_tok_s for r in ok) if d is not None]
        ttft = [r.ttft * 1000 for r in ok if r.ttft is not None]
        itl = [g * 1000 for r in ok for g in r.itl]
        e2e = [r.e2e * 1000 for r in ok if r.e2e is not None]
        verified = [r for r in ok if r.verify_steps]
        throughputs = [lv.output_tok_s for lv in runs]
        out: dict[str, Any] = {
            "concurrency": concurrency,
            "requests": len(records),
            "errors": len(records) - len(ok),
            "output_tok_s": mean(throughputs),
            "output_tok_s_rel_ci": relative_half_width([r.e2e for r in ok if r.e2e is not None]),
            "decode_tok_s": mean(decode),
            "decode_tok_s_p50": percentile(decode, 50),
            "decode_tok_s_rel_ci": relative_half_width(decode),
            "accept_length": (sum(r.tokens for r in verified) / sum(r.verify_steps for r in verified))
            if verified else None,
        }
        for name, values in (("ttft_ms", ttft), ("itl_ms", itl), ("e2e_ms", e2e)):
            for q in (50, 90, 99):
                out[f"{name}_p{q}"] = percentile(values, q)
        return out

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
    ) -> None:
        """``check`` raises ``TrialFailure`` if the server died (it is polled while requests run); a level whose
        share of failed requests exceeds ``max_error_rate`` fails the measurement."""
        self.base_url = base_url
        self.engine = engine
        self.workload = workload
        self.prompts = PromptStream(prompts, seed)
        self.headers = headers or {}
        self.check = check or (lambda: None)
        self.should_stop = should_stop
        self.max_error_rate = max_error_rate
        #: what has been measured so far (also after a failure part-way)
        self.measurement = Measurement()

    @property
    def levels(self) -> list[int]:
        return sorted({1, *self.workload.concurrency})

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
                await self._level(client, LevelResult(1, []), w.warmup)
            for repeat in range(w.max_repeats):
                results: list[LevelResult] = []
                m.repeats.append(results)
                for step, c in enumerate(self.levels):
                    await self._flush(client)
                    level = LevelResult(c, [])
                    results.append(level)
                    await self._level(client, level, w.requests if c == 1 else max(w.requests, 2 * c))
                    self._judge(level)
                    if repeat == 0 and on_level is not None:
                        on_level(step, c, m)
                if precision_of is not None:
                    m.precision = precision_of(m)
                if repeat + 1 >= w.min_repeats and (precision_of is None or
                                                    (m.precision is not None and m.precision <= w.tolerance)):
                    break
        return m

    async def _flush(self, client: httpx.AsyncClient) -> None:
        """Empty the prefix cache between levels where the engine can (prompts never repeat anyway)."""
        with (httpx.Client(base_url=self.base_url, headers=self.headers, timeout=10.0) as sync,
              contextlib.suppress(httpx.HTTPError)):
            self.engine.flush_cache(sync)

    async def _level(self, client: httpx.AsyncClient, level: LevelResult, n: int) -> None:
        """Run ``n`` requests with ``level.concurrency`` in flight, recording into ``level`` as they finish (so a
        measurement that fails part-way keeps what it measured)."""
        concurrency = level.concurrency
        queue = [self.prompts.next() for _ in range(n)]
        queue.reverse()
        records = level.records
        t0 = time.perf_counter()
        w = self.workload

        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                if not queue:
                    level.full_load = time.perf_counter() - t0
                records.append(await stream_one(
                    client, self.engine, prompt, w.max_tokens, w.temperature, concurrency, t0,
                    first_token_timeout=w.request_timeout, stall_timeout=w.stall_timeout))

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            while not all(t.done() for t in workers):
                await asyncio.wait(workers, timeout=WATCH_INTERVAL)
                self.check()
                if self.should_stop():
                    raise TrialFailure("interrupted", f"stop requested while measuring concurrency {concurrency}")
                if any(r.error and r.error.startswith("stalled") for r in records):
                    self._judge(level)  # a stalled stream: the rest would only wait out their timeouts too
        finally:
            for t in workers:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            level.wall = max((r.start + (r.e2e or 0.0) for r in records), default=0.0)

    def _judge(self, result: LevelResult) -> None:
        """Fail the measurement when requests failed: the server died, stalled or answered with errors."""
        failed = [r for r in result.records if not r.ok]
        if not failed:
            return
        self.check()  # a dead server explains the failures best
        if len(failed) / len(result.records) <= self.max_error_rate:
            return
        stalled = [r for r in failed if r.error and r.error.startswith("stalled")]
        example = (stalled or failed)[0].error
        reason = "stalled" if stalled else "errors"
        raise TrialFailure(reason, f"{len(failed)} of {len(result.records)} requests failed at concurrency "
                                   f"{result.concurrency}: {example}")
