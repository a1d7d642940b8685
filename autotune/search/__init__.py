"""How the next config is chosen: the sampler (sampling.py) and the tuner's own proposals beside it (propose.py:
the whole space's best by a small Gaussian process, local_model.py, over a physics prior, physics.py, and the
space's geometry, neighbours.py; a launch for each width no measurement has covered, coverage.py; within the memory
boundary, feasibility.py; confirmations), under one set of switches (settings.py)."""
from autotune.search.physics import Observation, Physics
from autotune.search.propose import Proposal, confirmation, propose
from autotune.search.sampling import (
    DEFAULT_STARTUP_TRIALS,
    MODEL_BASED,
    check_sampler,
    initial_design,
    make_sampler,
    startup_launches,
)
from autotune.search.settings import SearchSettings

__all__ = ["DEFAULT_STARTUP_TRIALS", "MODEL_BASED", "Observation", "Physics", "Proposal", "SearchSettings",
           "check_sampler", "confirmation", "initial_design", "make_sampler", "propose", "startup_launches"]
