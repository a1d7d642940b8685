"""Studies through the product's own trial path with a surrogate launch (no server): a made-up landscape of
figures per config stands in for the emulator, so the search's choices over a whole study take a second or so."""
from __future__ import annotations

import optuna

from autotune.run import queue
from autotune.run.plan import Plan
from autotune.run.pruning import make_pruner
from autotune.search import make_sampler
from autotune.run.trial import Launch, Objective, run_trials
from autotune.run.trial.surrogate import Noise, SurrogateLaunch
from autotune.run.study_truth import ConfigTruth

#: steps 1-6, topk 1-8 and up to 16 draft tokens: trees of every width, small enough to enumerate
SPACE = """
[space.speculative-num-steps]
type = "int"
low = 1
high = 6
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2, 4, 8]
[space.speculative-num-draft-tokens]
type = "int"
low = 2
high = 16
"""
#: figures exactly as the landscape states them
EXACT = Noise(single=0.0, concurrent=0.0, bias=0.0)


def run(plan: Plan, truth: dict[str, ConfigTruth], launch: Launch | None = None) -> optuna.Study:
    """A whole study of ``plan`` whose launches measure ``truth`` exactly (or as ``launch`` does), as the tuner runs
    one."""
    spec = plan.spec
    study = optuna.create_study(directions=spec.directions, sampler=make_sampler(spec, plan.space, 0),
                                pruner=make_pruner(spec))
    queue.start(study, plan)
    run_trials(study, plan, plan.budget, Objective(plan, launch or SurrogateLaunch(plan, truth, EXACT, seed=1)))
    return study
