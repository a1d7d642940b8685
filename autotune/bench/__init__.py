"""Measurement: prompts (workload.py), one timed streamed request (client.py), levels and repeats (measure.py)
and their statistics (stats.py)."""
from __future__ import annotations

from autotune.bench.client import RequestRecord
from autotune.bench.measure import Bench, LevelResult, Measurement

__all__ = ["Bench", "LevelResult", "Measurement", "RequestRecord"]
