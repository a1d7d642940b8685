"""Stopping a trial early when it can no longer win.

After each measured level the objective reports a bound (score.objective_bound): the most its final objective
could still be, with the levels not measured yet at their physical best. ``BoundPruner`` stops the trial when that
bound is below the best value a completed, feasible trial reached, by more than the measurement's own tolerance (a
config as good as the best, measured a little low, is not stopped). Judging the whole objective, never a part of it,
means a config with a poor single stream but the best concurrent throughput runs to the end under the weighted
objective (its bound after the single stream is high), while one that cannot catch up is stopped as soon as that is
certain.
"""
from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.results.tally import feasible
from autotune.studyfile.spec import StudySpec

#: completed trials needed before anything is pruned
STARTUP = 3


class BoundPruner(optuna.pruners.BasePruner):
    def __init__(self, margin: float, n_startup_trials: int = STARTUP) -> None:
        self.margin = margin
        self.n_startup_trials = n_startup_trials

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if feasible(t)]
        if len(done) < self.n_startup_trials:
            return False
        return trial.intermediate_values[step] < (1 - self.margin) * max(t.values[0] for t in done)


def make_pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    """Stop a config once even its best case cannot beat the best completed trial (``BoundPruner``)."""
    if not spec.pruning:
        return optuna.pruners.NopPruner()
    return BoundPruner(margin=spec.workload.tolerance)
