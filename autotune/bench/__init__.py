"""Measurement: prompts (workload.py), a timed streamed request's record (client.py), levels and repeats
(measure.py), a concurrency level in the load generator (generator.py) and their statistics (stats.py)."""
from __future__ import annotations

from autotune.bench.client import RequestRecord
from autotune.bench.measure import Bench, LevelResult, Measurement

__all__ = ["Bench", "LevelResult", "Measurement", "RequestRecord"]
