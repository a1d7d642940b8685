"""Measurement: the traffic and its prompts (traffic.py, workload.py, workload_view.py), a timed streamed request's
record (client.py), levels and repeats (measure.py), a concurrency level as a job for the load generator
(generator.py) and the load generator itself (loadgen.py, shipped to a host as source), where it runs
(measuring.py), figures checked before they are believed (plausible.py), the tuner's own bounded reads of a server
(bounded.py), the memory a level needs (capacity.py) and the statistics (stats.py)."""
from __future__ import annotations

from autotune.bench import loadgen, measuring
from autotune.bench.client import RequestRecord
from autotune.bench.generator import Shape
from autotune.bench.measure import Bench, LevelResult, Measurement
from autotune.bench.workload import PromptStream, load_prompts

__all__ = ["Bench", "LevelResult", "Measurement", "PromptStream", "RequestRecord", "Shape", "load_prompts",
           "loadgen", "measuring"]
