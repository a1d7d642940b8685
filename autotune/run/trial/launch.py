"""The measurement step of a trial, behind one small interface: a real server launch (server.py) or the truth plus
noise (surrogate.py, for the benches). The objective runs the same trial either way: the same decisions before,
the same scoring, pruning and record after."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.engines import ServerInfo
from autotune.studyfile.space import Candidate

#: after each level: (step, concurrency, the summaries of the levels measured so far); may raise TrialPruned
OnLevel = Callable[[int, int, list[dict[str, Any]]], None]
#: the trial's phase for the progress display: (name, detail)
OnPhase = Callable[[str, str], None]


@dataclass(frozen=True)
class Measured:
    """What a launch measured: the flat figures, each level's summary (lowest concurrency first) and the relative
    half-width of the objective's 95% interval (None: unknown); a capacity measurement's SLO, load, throughput and
    curve (``record.write.slo_capacity``)."""

    metrics: dict[str, Any]
    levels: list[dict[str, Any]]
    precision: float | None
    capacity: dict[str, Any] | None = None


class Launch(ABC):
    """Brings a candidate up and measures it, for one trial at a time."""

    #: the target's name, recorded with every trial
    target_name: str

    @abstractmethod
    def start(self, trial: optuna.Trial, candidate: Candidate, on_phase: OnPhase) -> ServerInfo:
        """Start ``candidate`` (recording the launch) and return what the running server reports: its applied flags
        and capacity. Raises ``TrialFailure`` (infeasible: the config's fault; else the infrastructure's)."""

    @abstractmethod
    def measure(self, trial: optuna.Trial, info: ServerInfo, on_level: OnLevel) -> Measured:
        """Measure the started server. Raises ``TrialFailure`` like ``start``; ``on_level`` may stop it early."""

    @abstractmethod
    def finish(self, trial: optuna.Trial, candidate: Candidate) -> None:
        """After the trial, however it ended (keep its logs, say)."""
