"""What a study found, read from its record: the launches that count, each config's estimate pooled over its
launches and the pick settled by intervals (tally.py), the objective's values and constraints from a measurement
(score.py), the best config as JSON, a command line or a unit (best.py), an adaptive speculative schedule from the
per-level estimates (adaptive_schedule.py) and the adaptive server measured against the best fixed config
(adaptive_versus_fixed.py), and when the measuring client, not the config, was the limit (client_limit.py)."""
from autotune.results import adaptive_schedule, adaptive_versus_fixed, best, client_limit, score, tally
from autotune.results.tally import Estimate, LevelBest, Pick

__all__ = ["Estimate", "LevelBest", "Pick", "adaptive_schedule", "adaptive_versus_fixed", "best", "client_limit",
           "score", "tally"]
