"""A trial's measurement step for the benches: the truth plus noise instead of a server.

The study's truth (autotune/run/study_truth.py: what a perfect client measures on the emulator for the study's workload)
with the measurement's own error added: each launch's single-stream figure off by a normal error of sd ``single``,
each concurrency level's by ``concurrent``, and each config by a fixed bias of sd ``bias`` (the same at every launch
of it). The sds are what real runs of the bench show (scripts/bench_sample_efficiency.py measures them). Everything
else is the product's own trial: the decisions, the queue, pruning, scoring and the record.

The noise of a config's n-th launch depends only on the seed, the config and n, never on the order the search
visits configs in: two search setups that launch the same config see the same figures for it (common random
numbers), so setups differ by what they do, not by their luck.
"""
from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.engines import ServerInfo
from autotune.errors import TrialFailure, UserError
from autotune.run.plan import Plan
from autotune.record import write
from autotune.results.score import metrics_of, relative_precision
from autotune.studyfile.space import Candidate
from autotune.run.study_truth import ConfigTruth
from autotune.run.trial.launch import Launch, Measured, OnLevel, OnPhase

#: a 95% interval's half-width in standard deviations
Z95 = 1.96


@dataclass(frozen=True)
class Noise:
    """Relative standard deviations of a surrogate launch's figures."""

    single: float = 0.01        # the single stream's figure, per launch
    concurrent: float = 0.017   # a concurrency level's figure, per launch
    bias: float = 0.005         # each config's own, fixed over its launches


class SurrogateLaunch(Launch):
    """Launches nothing: each trial's figures are ``truth``'s for its config, plus ``noise``."""

    target_name = "surrogate"

    def __init__(self, plan: Plan, truth: Mapping[str, ConfigTruth], noise: Noise, seed: int) -> None:
        if plan.spec.objective == "capacity":
            raise UserError(f"{plan.spec.path}: objective \"capacity\" is measured on a server: the surrogate has "
                            "throughput figures but no latencies to judge the SLO by")
        self.plan = plan
        self.truth = truth
        self.noise = noise
        self.seed = seed
        self._launches: dict[str, int] = {}
        self._config: tuple[str, ConfigTruth] | None = None

    def start(self, trial: optuna.Trial, candidate: Candidate, on_phase: OnPhase) -> ServerInfo:
        write.launched(trial, ["surrogate"], "")
        row = self.truth.get(candidate.key)
        if row is None:
            raise KeyError(f"the truth has no row for {candidate.key}")
        if not row.fits:
            raise TrialFailure("oom_startup", "the truth says the config does not fit in memory")
        self._config = candidate.key, row
        write.verified(trial, candidate.key, {"max_running_requests": row.max_running_requests})
        return ServerInfo(applied=candidate.tuned(self.plan.space.names),
                          max_running_requests=row.max_running_requests, max_total_num_tokens=None)

    def measure(self, trial: optuna.Trial, info: ServerInfo, on_level: OnLevel) -> Measured:
        assert self._config is not None
        key, row = self._config
        n = self._launches[key] = self._launches.get(key, 0) + 1
        spec = self.plan.spec
        levels: list[dict[str, Any]] = []
        for step, c in enumerate(spec.levels):
            sd = self.noise.single if c == 1 else self.noise.concurrent
            bias = self._draw(key, 0, c) * self.noise.bias
            figure = row.level_tok_s[c] * (1 + bias + self._draw(key, n, c) * sd)
            levels.append({"concurrency": c, "output_tok_s": figure, "output_tok_s_rel_ci": Z95 * sd,
                           "accept_length": row.accept_length, "errors": 0, "ttft_ms_p99": None,
                           "itl_ms_p99": None})
            on_level(step, c, list(levels))
        precision = relative_precision(spec.objective, levels, spec.workload.mix)
        return Measured(metrics_of(levels, 1, info), levels, precision)

    def finish(self, trial: optuna.Trial, candidate: Candidate) -> None:
        """Nothing to keep: no server ran."""

    def _draw(self, key: str, launch: int, concurrency: int) -> float:
        """A standard normal draw for a config's launch (0: its fixed bias) at one level."""
        return random.Random(zlib.crc32(f"{self.seed} {key} {launch} {concurrency}".encode())).gauss(0.0, 1.0)

