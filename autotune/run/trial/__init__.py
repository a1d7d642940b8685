"""One trial, as data flows: the decision before anything is deployed (decision.py), then a launch that measures
the config (launch.py's interface: a real server, server.py, or the truth plus noise, surrogate.py), scored and
recorded by the objective (objective.py); the loop's one step, from the admission to the client check, is step.py's, for
the tuner and the benches alike."""
from autotune.run.trial.decision import Decision, decide
from autotune.run.trial.launch import Launch, Measured
from autotune.run.trial.objective import Objective
from autotune.run.trial.server import ServerLaunch
from autotune.run.trial.step import Step, run_trials, trial_step
from autotune.run.trial.surrogate import Noise, SurrogateLaunch

__all__ = ["Decision", "Launch", "Measured", "Noise", "Objective", "ServerLaunch", "Step", "SurrogateLaunch", "decide",
           "run_trials", "trial_step"]
