"""Measurement -> metrics -> objective values and constraint values.

Objective modes:
- single: single-stream output tok/s (one request at a time, tokens over the whole request time; what an
  interactive user feels);
- concurrent: steady-state output tok/s at the study's highest concurrency level (what a busy server delivers);
- weighted: geometric mean of both, each relative to the baseline trial (1.10 = 10% better than today's config);
- pareto: both, as two objectives (Optuna keeps the front).
Constraints follow Optuna's convention: a value > 0 is violated. Every trial carries the same constraint keys.
"""
from __future__ import annotations

import math
from typing import Any

from autotune.bench.measure import Measurement
from autotune.engines import ServerInfo
from autotune.study import ConstraintSpec

METRIC_NAMES = {
    "single": ["single_tok_s"],
    "concurrent": ["concurrent_tok_s"],
    "weighted": ["gain_vs_baseline"],
    "pareto": ["single_tok_s", "concurrent_tok_s"],
}


def metrics_of(m: Measurement, info: ServerInfo | None) -> dict[str, Any]:
    """The flat figures every trial records (DESIGN.md: single_tok_s, concurrent_tok_s, max_running_requests...)."""
    top = max(m.concurrencies)
    levels = [m.summary(c) for c in m.concurrencies]
    busy = levels[-1]
    single = levels[0] if m.concurrencies[0] == 1 else {}
    return {
        "single_tok_s": single.get("output_tok_s"),
        "single_decode_tok_s": single.get("decode_tok_s"),
        "concurrent_tok_s": busy["output_tok_s"],
        "concurrency": top,
        "accept_length": single.get("accept_length", busy["accept_length"]),
        "concurrent_accept_length": busy["accept_length"],
        "ttft_p99_ms": max((lv["ttft_ms_p99"] or 0.0) for lv in levels),
        "itl_p99_ms": max((lv["itl_ms_p99"] or 0.0) for lv in levels),
        "errors": sum(lv["errors"] for lv in levels),
        "max_running_requests": info.max_running_requests if info else None,
        "max_total_num_tokens": info.max_total_num_tokens if info else None,
        "repeats": len(m.repeats),
        "level_output_tok_s": {str(lv["concurrency"]): lv["output_tok_s"] for lv in levels},
    }


def reference_of(metrics: dict[str, Any]) -> dict[str, Any]:
    """What the weighted objective divides by: the baseline's figures."""
    return {
        "single_tok_s": metrics["single_tok_s"],
        "concurrent_tok_s": metrics["concurrent_tok_s"],
        "level_output_tok_s": dict(metrics["level_output_tok_s"]),
    }


def objective_values(mode: str, metrics: dict[str, Any], reference: dict[str, Any] | None) -> list[float]:
    s, c = metrics["single_tok_s"] or 0.0, metrics["concurrent_tok_s"] or 0.0
    if mode == "single":
        return [s]
    if mode == "concurrent":
        return [c]
    if mode == "pareto":
        return [s, c]
    s0, c0 = _reference(reference)
    return [math.sqrt(max(s, 0.0) / s0 * max(c, 0.0) / c0)]


def relative_precision(mode: str, m: Measurement) -> float | None:
    """Relative half-width of the objective's 95% interval from everything measured so far (None: unknown).

    Single-stream speed and concurrent throughput are independent measurements; their relative errors combine as
    for a product: sqrt(a^2 + b^2), halved under the geometric mean of the weighted and pareto modes.
    """
    s = m.summary(1)["output_tok_s_rel_ci"]
    c = m.summary(max(m.concurrencies))["output_tok_s_rel_ci"]
    if mode == "single":
        return s
    if mode == "concurrent":
        return c
    if s is None or c is None:
        return None
    return 0.5 * math.sqrt(s * s + c * c)


def stage_value(mode: str, concurrency: int, m: Measurement, reference: dict[str, Any] | None) -> float | None:
    """The intermediate value reported to the pruner after a level: the objective as far as it is known, with the
    level just measured standing in for the highest one. None when the stage says nothing about the objective."""
    single = m.summary(1)["output_tok_s"] or 0.0
    if mode == "single":
        return single
    if mode == "pareto":
        return None
    s0, _ = _reference(reference)
    if concurrency == 1:
        return single / s0 if mode == "weighted" else None
    level = m.summary(concurrency)["output_tok_s"] or 0.0
    ref_level = (reference or {}).get("level_output_tok_s", {}).get(str(concurrency)) or 1.0
    if mode == "concurrent":
        return level / ref_level
    return math.sqrt(single / s0 * level / ref_level)


def constraint_keys(spec: ConstraintSpec) -> list[str]:
    keys = ["failed"]
    keys += [k for k in ("min_running_requests", "max_ttft_p99_ms", "max_itl_p99_ms") if getattr(spec, k) is not None]
    return keys


def constraint_values(spec: ConstraintSpec, metrics: dict[str, Any] | None) -> dict[str, float]:
    """Optuna constraint values (> 0 violated). ``metrics`` None means the config failed: everything violated."""
    if metrics is None:
        return {k: 1.0 for k in constraint_keys(spec)}
    out = {"failed": 0.0}
    if spec.min_running_requests is not None:
        mrr = metrics.get("max_running_requests")
        out["min_running_requests"] = float(spec.min_running_requests - (mrr if mrr is not None else 0))
    if spec.max_ttft_p99_ms is not None:
        out["max_ttft_p99_ms"] = float(metrics["ttft_p99_ms"] - spec.max_ttft_p99_ms)
    if spec.max_itl_p99_ms is not None:
        out["max_itl_p99_ms"] = float(metrics["itl_p99_ms"] - spec.max_itl_p99_ms)
    return out


def violated(constraints: dict[str, float]) -> list[str]:
    return [k for k, v in constraints.items() if v > 0]


def _reference(reference: dict[str, Any] | None) -> tuple[float, float]:
    if not reference:
        return 1.0, 1.0
    return (reference.get("single_tok_s") or 1.0), (reference.get("concurrent_tok_s") or 1.0)
