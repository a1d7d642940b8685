"""Generation tracks the model's timing over real HTTP, --sim-speedup times faster, without drift.

Tolerances are loose on purpose: these check behaviour (the speedup is honoured, nothing drifts) on a shared CI
box; the precise figures are scripts/bench_measurement.py's job."""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from autotune.sim import model
from autotune.sim.profile import load_profile
from tests.support.emulator import QWEN

STEPS = 3
SPEEDUP = 20


def modelled(concurrency: int, prompt: int, output: int) -> tuple[float, float]:
    profile = load_profile("qwen122b")
    cfg = model.Config(tp=4, spec=model.Spec(STEPS, 1, STEPS + 1), max_running_requests=48)
    plan = model.memory_plan(profile, cfg)
    return (model.single_stream_tok_s(profile, cfg, plan, prompt, output) * SPEEDUP,
            model.concurrent_tok_s(profile, cfg, plan, concurrency, prompt, output) * SPEEDUP)


COMPLETION_TOKENS = re.compile(r'"completion_tokens":(\d+)')


async def stream(client: httpx.AsyncClient, text: str, max_new_tokens: int, arrivals: list) -> list:
    """(arrival time, completion_tokens) of every chunk of one streamed /generate; also appended to ``arrivals``."""
    seen = []
    async with client.stream("POST", "/generate", json={
            "text": text, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):  # a regex, not json.loads: the client's CPU is part of the measurement
                seen.append((time.monotonic(), int(COMPLETION_TOKENS.search(line).group(1))))
    previous = 0
    for t, n in seen:
        arrivals.append((t, n - previous))
        previous = n
    return seen


async def single_rates(url: str, tokens: int) -> list[tuple[float, float]]:
    """For two streams one after the other: (tokens after the first / time after the first token, the
    least-squares slope of tokens over time, which one scheduling hiccup of this shared box cannot skew)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        rates = []
        for i in range(2):
            seen = await stream(client, f"story {i}", tokens, [])
            (t0, n0), (t1, n1) = seen[0], seen[-1]
            ts = [t - t0 for t, _ in seen]
            ns = [n for _, n in seen]
            mt, mn = sum(ts) / len(ts), sum(ns) / len(ns)
            slope = sum((t - mt) * (n - mn) for t, n in zip(ts, ns, strict=True)) / sum((t - mt) ** 2 for t in ts)
            rates.append(((n1 - n0) / (t1 - t0), slope))
        return rates


async def concurrent_rate(url: str, concurrency: int, requests: int, tokens: int) -> float:
    """Output tokens per second with ``concurrency`` streams in flight, over the steady middle of the run."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        arrivals: list = []
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                await stream(client, f"req {i} abc", tokens, arrivals)

        tic = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(requests)))
        elapsed = time.monotonic() - tic
        lo, hi = tic + 0.3 * elapsed, tic + 0.8 * elapsed  # no ramp-up, no drain
        return sum(n for t, n in arrivals if lo <= t < hi) / (hi - lo)


def eagle_server(emulator, speedup: float, *extra: str):
    return emulator(*QWEN, "--sim-time-scale", "0.01", "--sim-speedup", str(speedup), "--speculative-algorithm",
                    "EAGLE", "--speculative-num-steps", str(STEPS), "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(STEPS + 1), *extra).wait_ready()


@pytest.mark.alone
def test_single_stream_rate_tracks_the_model_at_speedup_20(emulator):
    emu = eagle_server(emulator, SPEEDUP, "--sim-noise", "0")
    expected = modelled(1, 2, 1500)[0]
    for first_to_last, slope in asyncio.run(single_rates(emu.url, 1500)):
        assert abs(slope / expected - 1) < 0.10, (slope, first_to_last, expected)
        assert abs(first_to_last / expected - 1) < 0.15, (slope, first_to_last, expected)


@pytest.mark.alone
def test_concurrent_throughput_tracks_the_model(emulator):
    # Speedup 4 keeps this 2-core box's CPU (client and server, ~10k SSE chunks) out of the measurement.
    emu = eagle_server(emulator, 4, "--sim-seed", "3")
    expected = modelled(32, 4, 128)[1] / SPEEDUP * 4
    rate = asyncio.run(concurrent_rate(emu.url, 32, 160, 128))
    assert abs(rate / expected - 1) < 0.20, (rate, expected)
