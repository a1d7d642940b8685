"""Measurement -> metrics -> objective values and constraint values.

Objective modes:
- single: single-stream output tok/s (one request at a time, tokens over the whole request time; what an
  interactive user feels);
- concurrent: steady-state output tok/s at the study's highest concurrency level (what a busy server delivers);
- weighted: geometric mean of both, each relative to the baseline trial (1.10 = 10% better than today's config);
- pareto: both, as two objectives (Optuna keeps the front);
- mix: each level's throughput relative to the baseline's, weighted by the level's share of the time;
- capacity: output tok/s at the highest load found to meet the latency SLO of [constraints] (bench/capacity.py
  probes it within one server start); 0 when not even the lowest load meets it.
Constraints follow Optuna's convention: a value > 0 is violated. Every trial carries the same constraint keys.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.engines import ServerInfo
from autotune.studyfile.spec import ConstraintSpec

#: the bound on levels not yet measured allows their figure to come out this much higher than the streams' rate so far
BOUND_MARGIN = 0.2

#: objectives relative to the baseline's figures (a trial waits for the baseline to be measured)
RELATIVE = ("weighted", "mix")

METRIC_NAMES = {
    "single": ["single_tok_s"],
    "concurrent": ["concurrent_tok_s"],
    "weighted": ["gain_vs_baseline"],
    "pareto": ["single_tok_s", "concurrent_tok_s"],
    "mix": ["mix_gain_vs_baseline"],
    "capacity": ["capacity_tok_s"],
}


def metrics_of(levels: Sequence[Mapping[str, Any]], repeats: int, info: ServerInfo | None) -> dict[str, Any]:
    """The flat figures every trial records (single_tok_s, concurrent_tok_s, max_running_requests, ...), from the
    per-level summaries of a measurement (``Measurement.summaries``), lowest concurrency first."""
    top = levels[-1]["concurrency"]
    busy = levels[-1]
    single = levels[0] if levels[0]["concurrency"] == 1 else {}
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
        "repeats": repeats,
        "level_output_tok_s": {str(lv["concurrency"]): lv["output_tok_s"] for lv in levels},
    }


def reference_of(metrics: dict[str, Any]) -> dict[str, Any]:
    """What the weighted objective divides by: the baseline's figures."""
    return {
        "single_tok_s": metrics["single_tok_s"],
        "concurrent_tok_s": metrics["concurrent_tok_s"],
        "level_output_tok_s": dict(metrics["level_output_tok_s"]),
    }


def objective_values(mode: str, metrics: dict[str, Any], reference: dict[str, Any] | None,
                     mix: Mapping[int, float] | None = None) -> list[float]:
    """The objective: a figure (single, concurrent), both (pareto), or a gain over the baseline (weighted: the
    geometric mean of both; mix: each level's throughput relative to the baseline's, weighted by its share)."""
    if mode == "mix":
        levels = metrics["level_output_tok_s"]
        refs = (reference or {}).get("level_output_tok_s", {})
        return [sum(share * (levels.get(str(c)) or 0.0) / (refs.get(str(c)) or 1.0)
                    for c, share in (mix or {}).items())]
    s, c = metrics["single_tok_s"] or 0.0, metrics["concurrent_tok_s"] or 0.0
    if mode == "capacity":
        return [metrics.get("capacity_tok_s") or 0.0]
    if mode == "single":
        return [s]
    if mode == "concurrent":
        return [c]
    if mode == "pareto":
        return [s, c]
    s0, c0 = _reference(reference)
    return [math.sqrt(max(s, 0.0) / s0 * max(c, 0.0) / c0)]


def relative_precision(mode: str, levels: Sequence[Mapping[str, Any]], mix: Mapping[int, float] | None = None
                       ) -> float | None:
    """Relative half-width of the objective's 95% interval from the per-level summaries so far (None: unknown).

    Single-stream speed and concurrent throughput are independent measurements; their relative errors combine as
    for a product: sqrt(a^2 + b^2), halved under the geometric mean of the weighted and pareto modes. A mix is a
    weighted sum of independent levels: sqrt(sum((share * error)^2)).
    """
    ci = {lv["concurrency"]: lv.get("output_tok_s_rel_ci") for lv in levels}
    if mode == "mix":
        errors = [(share, ci.get(c)) for c, share in (mix or {}).items()]
        if any(e is None for _, e in errors):
            return None
        return math.sqrt(sum((share * e) ** 2 for share, e in errors))  # type: ignore[operator]
    s = ci.get(1)
    c = ci[max(ci)]
    if mode == "single":
        return s
    if mode == "concurrent":
        return c
    if s is None or c is None:
        return None
    return 0.5 * math.sqrt(s * s + c * c)


def objective_bound(mode: str, levels: tuple[int, ...], concurrency: int, measured: Mapping[int, float | None],
                    reference: dict[str, Any] | None, max_running: int | None,
                    mix: Mapping[int, float] | None = None) -> float | None:
    """The most the final objective can still be, given the levels measured so far (``measured``: output tok/s by
    concurrency, up to ``concurrency``): what the pruner judges, so that a config is never dropped on a part of the
    objective while the rest could still make it competitive. ``levels``: every level the trial will measure. None
    when nothing bounds it (pareto).

    The levels still to come are bounded by what a stream can do: a request shares the server with the others, so
    it runs no faster than one alone (the single stream) or than at any lower concurrency measured, and at most
    ``max_running`` of the requests in flight run at once (the rest queue). Throughput at level C is therefore at
    most min(C, mrr) times the per-request rate of the last level measured. A margin of a fifth covers the noise of
    the figures the bound is built from."""
    if mode == "pareto":
        return None
    top = max(levels)
    if mode == "single":
        return measured.get(1) if concurrency == 1 else None
    figures = {c: v or 0.0 for c, v in measured.items() if c <= concurrency}
    running = max_running or top
    per_request = figures[concurrency] / min(concurrency, running)

    def bound(c: int) -> float:
        return figures[c] if c in figures else per_request * min(c, running) * (1 + BOUND_MARGIN)
    if mode == "mix":
        refs = (reference or {}).get("level_output_tok_s", {})
        return sum(share * bound(c) / (refs.get(str(c)) or 1.0) for c, share in (mix or {}).items())
    concurrent = bound(top)
    if mode == "concurrent":
        return concurrent  # the objective is the figure itself, not relative to the baseline
    s0, c0 = _reference(reference)
    single = figures.get(1)
    if single is None:
        return None
    return math.sqrt(max(single, 0.0) / s0 * max(concurrent, 0.0) / c0)


def capacity_metrics(metrics: dict[str, Any], levels: Sequence[Mapping[str, Any]], load: int | None
                     ) -> dict[str, Any]:
    """A capacity measurement's flat figures: ``metrics_of``'s, with the capacity load and its throughput, and the
    p99s the SLO constraints judge taken at that load (at the lowest load probed when none met the SLO, so that the
    bound it broke is the one violated)."""
    by_load = {lv["concurrency"]: lv for lv in levels}
    at = by_load[load] if load is not None else levels[0]
    return {**metrics, "capacity_concurrency": load,
            "capacity_tok_s": at["output_tok_s"] if load is not None else 0.0,
            "ttft_p99_ms": at.get("ttft_ms_p99") or 0.0, "itl_p99_ms": at.get("itl_ms_p99") or 0.0}


def capacity_precision(levels: Sequence[Mapping[str, Any]], load: int | None) -> float | None:
    """The relative half-width of the capacity's throughput interval (0 when there is no capacity to refine)."""
    if load is None:
        return 0.0
    return next(lv.get("output_tok_s_rel_ci") for lv in levels if lv["concurrency"] == load)


def capacity_bound(levels: Sequence[Mapping[str, Any]], meets: Callable[[Mapping[str, Any]], bool], top: int,
                   max_running: int | None) -> float | None:
    """The most a capacity measurement's objective can still be after the loads probed so far (``levels``): the
    capacity lies below the lowest load that broke the SLO (or at most at ``top``, the ladder's top), and a load L
    above the highest load g that met it serves at most min(L, mrr) times g's per-request rate (as for
    ``objective_bound``), with the same margin; the capacity is g itself or such an L. None while no load has met
    the SLO."""
    judged = {lv["concurrency"]: (lv, meets(lv)) for lv in levels}
    broke = [c for c, (_, ok) in judged.items() if not ok]
    ceiling = min(broke) - 1 if broke else top
    good = [c for c, (_, ok) in judged.items() if ok and c <= ceiling]
    if not good:
        return None
    g = max(good)
    running = max_running or ceiling
    per_request = (judged[g][0]["output_tok_s"] or 0.0) / min(g, running)
    reach = per_request * min(ceiling, running) * (1 + BOUND_MARGIN) if ceiling > g else 0.0
    return max(judged[g][0]["output_tok_s"] or 0.0, reach)


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
