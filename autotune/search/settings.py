"""How the tuner's own search behaves: one value passed in with the plan, never module state, so a bench can run
the product's search with other settings side by side (scripts/bench_sample_efficiency.py's setups)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchSettings:
    """The search's switches. The defaults were chosen by measurement (README, "Choosing the sampler")."""

    #: after the startup launches, one launch in this many is a neighbour of the leader (0: none; 1: every launch)
    neighbour_every: int = 1
    #: when the leader has no unmeasured neighbour left, measure its close rivals' neighbours before the sampler
    rivals_neighbours: bool = True
    #: the most launches kept back at the end of the budget to confirm the leader and its close rivals
    confirm_at_most: int = 3
    #: a flag's values are stepped through in strides of this fraction of them (at least one place)
    stride: float = 1 / 8
    #: the local model ranks candidates by its mean plus this many standard deviations
    kappa: float = 1.0
    #: length scales the local model tries (in places: a whole flag's range is 1); the likeliest is used
    lengthscales: tuple[float, ...] = (0.15, 0.25, 0.4, 0.7, 1.2)
    #: measured values the local model needs before it ranks anything (fewer: a random neighbour)
    min_points: int = 3

    def confirm_reserve(self, budget: int) -> int:
        """Launches kept for confirmations: none in a very short study."""
        return min(self.confirm_at_most, budget // 6)
