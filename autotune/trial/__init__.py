"""One trial, as data flows: the decision before anything is deployed (decision.py), then a launch that measures
the config (launch.py's interface: a real server, server.py, or the truth plus noise, surrogate.py), scored and
recorded by the objective (objective.py)."""
from autotune.trial.decision import Decision, decide
from autotune.trial.launch import Launch, Measured
from autotune.trial.objective import Objective
from autotune.trial.server import ServerLaunch

__all__ = ["Decision", "Launch", "Measured", "Objective", "ServerLaunch", "decide"]
