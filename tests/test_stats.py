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
           error: str | None = None) -> RequestRecord:
    step = (e2e - ttft) / max(tokens - 1, 1)
    return RequestRecord(concurrency=c, start=start, ttft=ttft, e2e=e2e, tokens=tokens,
                         trace=[(ttft + i * step, i + 1) for i in range(tokens)],
                         accept_length=None if verify is None else tokens / verify, verify_steps=verify,
                         finish_reason="length", error=error)


def test_level_summary_from_known_records() -> None:
    single = LevelResult(1, [record(1, 0.0, 0.1, 1.1, 101, verify=40), record(1, 1.1, 0.1, 1.1, 101, verify=60)],
                         wall=2.2)
    busy = LevelResult(4, [record(4, 0.0, 0.2, 2.2, 101, verify=50) for _ in range(3)]
                       + [record(4, 0.0, 0.2, 1.0, 5, error="http 500: boom")], wall=2.2)  # no window: all at once
    m = Measurement(repeats=[[single, busy]])
    s = m.summary(1)
    assert s["decode_tok_s"] == pytest.approx(100.0)       # 100 tokens after the first, in 1.0 s
    assert s["output_tok_s"] == pytest.approx(202 / 2.2)
    assert s["accept_length"] == pytest.approx(202 / 100)  # tokens over verify steps, over all requests
    assert s["ttft_ms_p50"] == pytest.approx(100.0)
    b = m.summary(4)
    assert b["errors"] == 1 and b["requests"] == 4
    assert b["output_tok_s"] == pytest.approx(303 / 2.2)   # failed requests' tokens do not count
    assert b["decode_tok_s"] == pytest.approx(50.0)
    assert b["itl_ms_p50"] == pytest.approx(20.0)


def test_throughput_counts_only_the_window_at_full_load() -> None:
    # two requests in flight; the third is sent at 1.0 s, when the first finishes: the window is [0, 1.0 s]
    first = record(2, 0.0, 0.0, 1.0, 101)       # 100 tokens/s from t=0
    second = record(2, 0.0, 0.0, 2.0, 101)      # 50 tokens/s from t=0
    third = record(2, 1.0, 0.0, 1.0, 101)       # sent at 1.0 s; the tail after it is not the config at 2 in flight
    level = LevelResult(2, [first, second, third], wall=2.0, full_load=1.0)
    assert first.tokens_by(1.0) == 101 and second.tokens_by(1.0) == 51 and third.tokens_by(1.0) == 1
    assert level.output_tok_s == pytest.approx((101 + 51 + 1) / 1.0)
