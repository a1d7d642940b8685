"""Statistics against hand-computed values."""
from __future__ import annotations

import math

import pytest

from autotune.bench.client import RequestRecord
from autotune.bench.measure import LevelResult, Measurement
from autotune.bench.stats import ci95, percentile, relative_half_width, t95


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile(values, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_confidence_interval_uses_student_t() -> None:
    mean, half = ci95([10.0, 12.0, 11.0, 13.0])
    sd = math.sqrt(((10 - 11.5) ** 2 + (12 - 11.5) ** 2 + (11 - 11.5) ** 2 + (13 - 11.5) ** 2) / 3)
    assert mean == 11.5
    assert half == pytest.approx(3.182 * sd / 2)
    assert ci95([1.0]) is None
    assert relative_half_width([100.0, 100.0, 100.0]) == 0.0
    assert t95(1) == 12.706 and t95(1000) == pytest.approx(1.96, abs=0.01)


def record(c: int, start: float, ttft: float, e2e: float, tokens: int, verify: int | None = None,
           error: str | None = None, server_e2e: float | None = None, gap: float | None = None,
           ramp: bool = False) -> RequestRecord:
    step = (e2e - ttft) / max(tokens - 1, 1)
    return RequestRecord(concurrency=c, start=start, max_tokens=tokens, ttft=ttft, e2e=e2e, tokens=tokens,
                         trace=[(ttft + i * step, i + 1) for i in range(tokens)],
                         accept_length=None if verify is None else tokens / verify, verify_steps=verify,
                         finish_reason="length", error=error, server_e2e=server_e2e, gap=gap, ramp=ramp)


def test_single_stream_is_tokens_over_whole_request_time() -> None:
    single = LevelResult(1, [record(1, 0.0, 0.1, 1.1, 101, verify=40), record(1, 1.1, 0.1, 1.1, 101, verify=60)])
    m = Measurement(repeats=[[single]])
    s = m.summary(1)
    assert s["output_tok_s"] == pytest.approx(202 / 2.2)   # prefill included: 202 tokens in 2 x 1.1 s
    assert s["decode_tok_s"] == pytest.approx(100.0)       # 100 tokens after the first, in 1.0 s
    assert s["accept_length"] == pytest.approx(202 / 100)  # tokens over verify steps, over all requests
    assert s["ttft_ms_p50"] == pytest.approx(100.0)
    assert s["output_tok_s_rel_ci"] == 0.0                  # both requests ran at the same rate
    # a burst that delivers the tokens late cannot make the figure larger: the request only ends later
    burst = record(1, 0.0, 1.0, 1.1, 101)
    assert LevelResult(1, [burst]).output_tok_s == pytest.approx(101 / 1.1)
    assert burst.decode_tok_s == pytest.approx(1000.0)      # (what a decode-speed figure would have reported)
    # where the server timed each request, its timing counts: the client's and the transport's time do not
    timed = [record(1, 0.0, 0.1, 1.1, 101, server_e2e=1.0), record(1, 1.1, 0.1, 1.2, 101, server_e2e=1.0)]
    m = Measurement(repeats=[[LevelResult(1, timed)]])
    assert m.summary(1)["output_tok_s"] == pytest.approx(202 / 2.0) and m.summary(1)["server_timed"]


def test_concurrency_counts_tokens_inside_the_steady_state_window() -> None:
    # two slots; window from 1.0 s to 2.0 s
    ramp = record(2, 0.0, 0.0, 1.0, 51, ramp=True)            # a ramp request: never measured
    long = record(2, 0.0, 0.0, 2.0, 101)                      # 50 tokens/s: 50 of its tokens fall in the window
    inside = record(2, 1.0, 0.0, 1.0, 101)                    # finishes at 2.0 s: all 100 after its first token
    cut = record(2, 1.5, 0.0, 1.0, 101)                       # in flight at 2.0 s: half of it arrived
    cut.cancelled, cut.finish_reason = True, None
    failed = record(2, 1.2, 0.0, 0.1, 5, error="http 500: boom")
    level = LevelResult(2, [ramp, long, inside, cut, failed], window=(1.0, 2.0))
    assert long.tokens_by(1.0) == 51 and inside.tokens_by(1.0) == 1 and cut.tokens_by(2.0) == 51
    assert level.tokens == (101 - 51) + (101 - 1) + 51       # arrivals inside the window, failed requests excluded
    assert level.output_tok_s == pytest.approx(level.tokens / 1.0)
    assert [r is inside or r is long for r in level.measured] == [True, True]  # finished inside, not ramp, not cut
    assert level.failed == [failed] and not cut.complete


def test_a_concurrency_levels_interval_comes_from_its_throughput_over_each_generation() -> None:
    # two slots, each sending 1-second requests back to back over a 4-second window: 4 generations, 4 batches;
    # every request takes as long as the others, so their latencies alone would claim an exact figure
    tokens = {0: [100, 100, 100, 100], 1: [100, 120, 80, 100]}
    recs = [record(2, float(i), 0.01, 0.98, tokens[slot][i]) for slot in (0, 1) for i in range(4)]
    level = LevelResult(2, recs, window=(0.0, 4.0))
    assert level.batch_rates() == pytest.approx([200.0, 220.0, 180.0, 200.0])
    s = Measurement(repeats=[[level]]).summary(2)
    assert s["output_tok_s"] == pytest.approx(200.0)
    sd = math.sqrt((20 ** 2 + 20 ** 2) / 3)
    assert s["output_tok_s_rel_ci"] == pytest.approx(3.182 * sd / 2 / 200)
    # a window of one generation is still cut into four (an interval too wide, never too narrow)
    assert len(LevelResult(2, recs[:1] + recs[4:5], window=(0.0, 1.0)).batch_rates()) == 4


def test_client_share_from_the_servers_own_timing() -> None:
    # two slots; each request took 1.0 s at the client, 0.97 s at the server, and its slot stood empty 0.01 s before
    # the next: the server held each slot's request 0.97 s of every 1.01 s
    recs = [record(2, 1.01 * i, 0.0, 1.0, 101, server_e2e=0.97, gap=0.01) for _ in range(2) for i in range(4)]
    level = LevelResult(2, recs, window=(0.0, 3.03))
    assert level.client_share == pytest.approx(0.04 / 1.01)
    assert LevelResult(2, [record(2, 0.0, 0.0, 1.0, 101)], window=(0.0, 2.0)).client_share is None
