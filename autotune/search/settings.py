"""How the tuner's own search behaves: one value passed in with the plan, never module state, so a bench can run
the product's search with other settings side by side (scripts/bench_sample_efficiency.py's setups)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchSettings:
    """The search's switches. The defaults were chosen by measurement (docs/sampler.md, docs/search-priors.md)."""

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
    #: the least variance of the log value the model assumes (a landscape measured flat so far may still not be)
    min_signal: float = 1e-4
    #: where the tuner's own next config comes from: "local" (a neighbour of the leader or of its close rivals,
    #: ranked by the model) or "global" (every unmeasured valid config, by expected improvement times the chance
    #: that it fits in memory)
    scope: str = "global"
    #: how many of the engine's starting points a study measures after the baseline (None: all of them), or which
    #: (their places in the engine's list: SGLang's first chain, 3 steps, and its first tree, topk 2 at 5 steps)
    starting_points: int | tuple[int, ...] | None = (0, 3)
    #: launches before the tuner's own proposals begin (None: the study's startup_trials)
    model_from: int | None = None
    #: after a launch that ran out of memory, measure the same tree just below it next (fewer draft tokens, then
    #: fewer steps) before anything else
    shrink_after_oom: bool = False
    #: a config that ran out of memory counts in the objective's model at the worst value seen (False: only the
    #: feasibility model learns from it)
    oom_in_model: bool = False
    #: how the whole-space model ranks configs: "ei" (expected improvement over the leader) or "ucb" (mean plus
    #: ``kappa`` standard deviations)
    acquisition: str = "ei"
    #: with the whole-space model, every this many of the tuner's own launches is a neighbour of the leader ranked by
    #: the local model instead (0: never)
    local_every: int = 0
    #: the whole-space model's coordinates: "places" (each flag's place inside the range the others leave it, as the
    #: local model has them), "linear" or "log" (each flag's value over its whole range as written), "draft-linear"
    #: or "draft-log" (only a flag whose range depends on others, like draft tokens, over its whole range)
    geometry: str = "places"
    #: the global model's prior mean: what the study's launches say steps, topk and draft tokens do (physics.py)
    physics: bool = True
    #: distinct trees launched before the physics prior is used (3: from the opening on; a prior that mispredicts is
    #: set aside, ``physics_misses``)
    physics_from: int = 3
    #: the chance of fitting given to a config neither above a memory failure nor below a config that started, where
    #: a failure reaches it (with ``boundary`` "line": where no line through its width's evidence separates them)
    fit_unknown: float = 0.5
    #: when each value of a categorical flag (topk) no launch has measured gets a launch at the model's best config
    #: there: "late" (``cover_room`` launches before the confirmations begin, or at the latest in their place),
    #: "early" (as soon as the tuner's own proposals begin) or "off"
    cover: str = "late"
    #: with cover "late": launches left after the coverage for following up what it found, before the confirmations
    cover_room: int = 6
    #: what covers a value of a categorical flag: "measurement" (a launch that measured a config there) or "launch"
    #: (any launch there, even one that ran out of memory or crashed before measuring: the rule before)
    cover_by: str = "measurement"
    #: a coverage or starting-point launch that ran out of memory is followed at once by the model's best config of
    #: the same value below the new boundary
    follow_oom: bool = True
    #: a coverage launch goes to the model's best config (by its mean) among those whose chance of fitting is at
    #: least this (0, or none is: the best mean times chance)
    cover_fit: float = 0.5
    #: how a memory failure puts configs in doubt (feasibility.py): "line" (configs of its draft tree's width and
    #: wider ones, each by the share of that width's boundary lines under which it fits), "topk" (the same configs,
    #: ``fit_unknown`` each) or "one" (every config, ``fit_unknown``, once any failure is seen: the rule before)
    boundary: str = "line"
    #: launches the physics prior may miss (measured outside the interval the model predicted with it) before the
    #: study's search sets it aside and leans on the data-only model (0: never)
    physics_misses: int = 1
    #: a measurement's own relative noise, added to the model's uncertainty in a prediction's 95% interval
    prediction_noise: float = 0.02

    def confirm_reserve(self, budget: int) -> int:
        """Launches kept for confirmations: none in a very short study."""
        return min(self.confirm_at_most, budget // 6)
