"""The probes of a capacity measurement: the most load one server start serves within a latency SLO.

The probe sequence, all within one server start:

1. Climb: the study's concurrency levels (``[workload] concurrency``), lowest first, each a steady-state level as
   any objective measures it (measure.py). The climb stops at the first level that breaks the SLO.
2. Narrow: bisect between the last level that met the SLO (0 when the lowest level broke it) and the first that
   broke it, probing the whole number halfway, at most ``NARROW_PROBES`` times (between 8 and 16: 12, then 10 or
   14, then one of 9, 11, 13, 15), so that the load found is within an eighth of the ladder's gap.
3. The capacity is the highest load probed that met the SLO below the first one that broke it; when no level
   breaks it, the top of the ladder (the capacity is at least that). None: not even the lowest load met it.

What the SLO judges, from the requests of a level's window (``Measurement.summary``, pooled as the level's other
figures are): TTFT p99, the 99th percentile of the measured requests' times from sending to their first token; ITL
p99, the 99th percentile of every gap between successive token-carrying events of those requests, pooled over
the requests. A speculative step that accepts several tokens arrives as one event: the gap before it is one
interval, not divided among its tokens (a user sees the burst arrive at once and waits the whole gap for it).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.studyfile.spec import StudySpec

#: the most bisection probes after the climb
NARROW_PROBES = 3


@dataclass(frozen=True)
class SLO:
    """Latency bounds in milliseconds (None: not bounded)."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    def meets(self, summary: Mapping[str, Any]) -> bool:
        """Whether a level's figures (``Measurement.summary``) are within the bounds (a level without a figure
        for a bounded latency does not meet it)."""
        for bound, figure in ((self.ttft_p99_ms, summary.get("ttft_ms_p99")),
                              (self.itl_p99_ms, summary.get("itl_ms_p99"))):
            if bound is not None and (figure is None or figure > bound):
                return False
        return True


@dataclass
class Ladder:
    """The probe sequence of one capacity measurement (see the module's docstring)."""

    levels: Sequence[int]
    slo: SLO
    narrow: int = NARROW_PROBES
    #: load -> whether it met the SLO, in the order probed
    met: dict[int, bool] = field(default_factory=dict)

    def first(self) -> int:
        return min(self.levels)

    def next(self, load: int, summary: Mapping[str, Any]) -> int | None:
        """Judge the load just measured; the next load to probe, or None when the capacity is found."""
        self.met[load] = self.slo.meets(summary)
        good, bad = self.bracket()
        if bad is None:
            above = [c for c in sorted(self.levels) if c > good]
            return above[0] if above else None
        narrowed = sum(1 for c in self.met if c not in self.levels)
        if bad - good <= 1 or narrowed >= self.narrow:
            return None
        return (good + bad) // 2

    def bracket(self) -> tuple[int, int | None]:
        """(the highest load that met the SLO below the lowest that broke it or 0, the lowest that broke it)."""
        broke = [c for c, ok in self.met.items() if not ok]
        bad = min(broke) if broke else None
        good = max((c for c, ok in self.met.items() if ok and (bad is None or c < bad)), default=0)
        return good, bad

    @property
    def capacity(self) -> int | None:
        """The highest load found to meet the SLO (None: none did)."""
        good = self.bracket()[0]
        return good or None

    def curve(self, summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every probed load, lowest first: its throughput, its p99s, and whether it met the SLO."""
        by_load = {s["concurrency"]: s for s in summaries}
        return [{"concurrency": c, "output_tok_s": by_load[c]["output_tok_s"],
                 "ttft_ms_p99": by_load[c].get("ttft_ms_p99"), "itl_ms_p99": by_load[c].get("itl_ms_p99"),
                 "meets_slo": self.met[c]} for c in sorted(self.met) if c in by_load]


def capacity_ladder(spec: StudySpec) -> Ladder | None:
    """The probe sequence of a capacity study's launches (None for the other objectives)."""
    slo = spec.constraints.slo
    if spec.objective != "capacity" or slo is None:
        return None
    return Ladder(spec.levels, SLO(*slo))


def capacity_record(ladder: Ladder, summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a trial records of its capacity measurement (``record.write.slo_capacity``)."""
    load = ladder.capacity
    at = next((s for s in summaries if s["concurrency"] == load), None)
    return {"slo": {"ttft_p99_ms": ladder.slo.ttft_p99_ms, "itl_p99_ms": ladder.slo.itl_p99_ms},
            "concurrency": load, "output_tok_s": at["output_tok_s"] if at else 0.0,
            "below_top": ladder.bracket()[1] is not None, "curve": ladder.curve(summaries)}
