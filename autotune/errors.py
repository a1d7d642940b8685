"""Errors that end a command with one clear line, and the failure reasons trials record."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: printed as one line on stderr, exit status 2, no traceback."""


class InvalidConfig(Exception):
    """A candidate config the engine would reject; recorded as infeasible without deploying."""


class HostRejected(InvalidConfig):
    """The engine on the target refused a config when asked before its launch; ``str()`` is its own message."""


class TrialFailure(Exception):
    """A trial ended without a measurement, for a named reason.

    ``reason`` is one of the names in REASONS; ``detail`` is one line a human can act on.
    ``infeasible`` says whether the config itself is to blame (the sampler should learn to avoid it) or the
    infrastructure (the config is retried).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def infeasible(self) -> bool:
        return REASONS[self.reason]


# reason -> whether the config is to blame (True: infeasible, learn from it; False: infrastructure, retry it)
REASONS: dict[str, bool] = {
    "invalid_config": True,      # the engine's own rules reject it; never deployed
    "host_rejected": True,       # the engine on the target refused its arguments when asked; never deployed
    "invalid_args": True,        # the server refused its arguments at start
    "oom_startup": True,         # not enough memory for weights, KV cache or CUDA graphs
    "crashed": True,             # the server died while starting
    "startup_timeout": True,     # never became ready within [health] timeout
    "oom_under_load": True,      # ran out of memory while measured
    "crashed_under_load": True,  # died while measured
    "stalled": True,             # stopped streaming while measured
    "errors": True,              # answered requests with errors while measured
    "bad_response": True,        # answered what no server may: framing it broke, a part past its cap, more tokens
    #                              than asked, a latency or accept length no server can have
    "unresponsive": True,        # did not finish an answer the tuner needs (its configuration) within its deadline
    "constraints": True,         # measured, but outside the study's [constraints]
    "oom_predicted": True,       # at least as large as a config that ran out of memory; never deployed
    "given_up": True,            # failed for the infrastructure after its retry; never deployed again
    "wrong_args": False,         # the server on the port runs other args than requested (a stale server)
    "port_busy": False,          # another process still holds the port
    "ssh_lost": False,           # the SSH connection to the target dropped
    "deploy_failed": False,      # the target could not start the server (missing command, unwritable unit)
    "interrupted": False,        # the tuner was stopped in the middle of the trial
    "baseline_pending": False,   # measured before the baseline it is relative to (another worker's) was
    "stale": False,              # left RUNNING by a tuner that died
    "client_bound": False,       # the measuring client (or the transport) could not keep up with the server
    "tuner_error": False,        # a bug in autotune itself (logged with its traceback)
    "not_stored": False,         # measured, but the study database would not take its figures (a full disk)
}
