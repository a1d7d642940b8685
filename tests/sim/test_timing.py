"""Generation tracks the model's timing over real HTTP, --sim-speedup times faster, without drift."""
from __future__ import annotations

import asyncio
import json
import time

import httpx

from autotune.sim import model
from autotune.sim.profile import load_profile

from .conftest import QWEN

STEPS = 3
SPEEDUP = 20


def modelled(concurrency: int, prompt: int, output: int) -> tuple[float, float]:
    profile = load_profile("qwen122b")
    cfg = model.Config(tp=4, spec=model.Spec(STEPS, 1, STEPS + 1), max_running_requests=48)
    plan = model.memory_plan(profile, cfg)
    return (model.single_stream_tok_s(profile, cfg, plan, prompt, output) * SPEEDUP,
            model.concurrent_tok_s(profile, cfg, plan, concurrency, prompt, output) * SPEEDUP)


async def stream(client: httpx.AsyncClient, text: str, max_new_tokens: int, arrivals: list) -> list:
    """(arrival time, completion_tokens) of every chunk of one streamed /generate; also appended to ``arrivals``."""
    seen = []
    async with client.stream("POST", "/generate", json={
            "text": text, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                seen.append((time.monotonic(), json.loads(line[6:])["meta_info"]["completion_tokens"]))
    previous = 0
    for t, n in seen:
        arrivals.append((t, n - previous))
        previous = n
    return seen


async def measure(url: str) -> tuple[list[float], float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        singles = []
        for i in range(2):
            seen = await stream(client, f"story {i}", 1500, [])
            (t0, n0), (t1, n1) = seen[0], seen[-1]
            singles.append((n1 - n0) / (t1 - t0))
        arrivals: list = []
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with gate:
                await stream(client, f"req {i} abc", 128, arrivals)

        tic = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(160)))
        elapsed = time.monotonic() - tic
        lo, hi = tic + 0.3 * elapsed, tic + 0.8 * elapsed  # steady state: no ramp-up, no drain
        concurrent = sum(n for t, n in arrivals if lo <= t < hi) / (hi - lo)
    return singles, concurrent


def test_measured_rates_track_the_model(emulator):
    emu = emulator(*QWEN, "--sim-time-scale", "0.01", "--sim-speedup", str(SPEEDUP), "--sim-noise", "0",
                   "--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(STEPS),
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(STEPS + 1)).wait_ready()
    singles, concurrent = asyncio.run(measure(emu.url))
    single_model, _ = modelled(1, 2, 1500)
    _, concurrent_model = modelled(32, 4, 128)
    for rate in singles:
        assert abs(rate / single_model - 1) < 0.05, (rate, single_model)
    assert abs(concurrent / concurrent_model - 1) < 0.12, (concurrent, concurrent_model)
