"""Running a study: the plan checked offline (plan.py), the tuner's lifecycle (tuner.py) and one trial after
another (trial/), the queue (queue.py), the budget of launches (budget.py), pruning (pruning.py), several workers
(workers.py), a warm start (warmstart.py), the engine on the target asked about a config (hostresolve.py,
hostrules.py), a server brought up and found ready (bringup.py, health.py), the status line (progress.py), what
makes a resumed study the same study (study_terms.py), the study's truth on the emulator (study_truth.py) and the
one-off commands beside the tuner (commands.py)."""
from autotune.run import hostresolve, queue
from autotune.run.health import wait_ready
from autotune.run.plan import Plan, make_plan
from autotune.run.pruning import make_pruner
from autotune.run.study_truth import by_key, study_surface
from autotune.run.tuner import RunOptions, RunSummary, Tuner

__all__ = ["Plan", "RunOptions", "RunSummary", "Tuner", "by_key", "hostresolve", "make_plan", "make_pruner", "queue",
           "study_surface", "wait_ready"]
