"""Running a study: the plan checked offline (plan.py), the tuner's lifecycle (tuner.py) and one trial after
another (trial/), the queue (queue.py), the budget of launches (budget.py), pruning (pruning.py), several workers
(workers.py), a warm start (warmstart.py), the engine on the target asked about a config (hostresolve.py,
hostrules.py), a server brought up and found ready (bringup.py, health.py), the status line (progress.py), what
makes a resumed study the same study (study_terms.py), the study's truth on the emulator (study_truth.py) and the
one-off commands beside the tuner (commands.py)."""
from autotune.run.plan import Plan, make_plan
from autotune.run.tuner import RunOptions, RunSummary, Tuner

__all__ = ["Plan", "RunOptions", "RunSummary", "Tuner", "make_plan"]
