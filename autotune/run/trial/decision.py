"""The seam of a trial: what happens to a proposed config, before anything is deployed.

Every path that runs trials (the tuner's objective, the benches' surrogate) asks this one function, so the rules
are written once:

* ``invalid``: the engine would reject the config (SGLang's tree rules, say): recorded as infeasible, never deployed;
* ``host_rejected``: the engine on the target, asked before the launch (hostresolve.py), rejects it: the same, with
  its own message. A config it rewrites goes on as rewritten: the checks below see what will really run;
* ``wait``: another worker is measuring the same effective config under an earlier trial: wait for its result
  instead of measuring it twice at once (Optuna's constant liar makes this rarer, not impossible);
* ``reuse``: that effective config was measured (or found infeasible) already: its result is copied, no launch;
* ``too_large``: the config is at least as large, in every flag the engine's memory need grows with, as a config
  that ran out of memory (search/feasibility.py): rejected without a launch, like an invalid config;
* ``given_up``: the config's launch failed for the infrastructure even after its retry: rejected without a launch,
  like an invalid config, so the sampler learns to avoid it;
* ``launch``: measure it.

The baseline, confirmations and the adaptive server (built from the study's measurements so far, with its schedule
file) are launched whatever was measured before: they measure on purpose.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial, TrialState

from autotune import record
from autotune.results import tally
from autotune.results.adaptive_schedule import Schedule
from autotune.engines import Args, ArgValue
from autotune.errors import HostRejected, InvalidConfig
from autotune.search.feasibility import Feasibility
from autotune.studyfile.space import Candidate, ServerFile

if TYPE_CHECKING:
    from autotune.run.plan import Plan

#: the engine on the target asked about a candidate: the args it will run (raises ``HostRejected``)
HostCheck = Callable[[Candidate], Args]

#: trial states whose result a later identical config can reuse
REUSABLE = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class Decision:
    """What happens to one proposed config."""

    kind: str                           # "invalid" | "host_rejected" | "wait" | "reuse" | "too_large" | "given_up"
    #                                     | "launch"
    candidate: Candidate | None = None  # the effective config (None when invalid)
    prior: FrozenTrial | None = None    # the trial waited for, reused, given up on, or that ran out of memory
    detail: str = ""                    # why the engine (or the one on the target) rejects the config
    rewritten: Candidate | None = None  # the config the rules predicted, when the engine on the target rewrote it


def decide(plan: Plan, trials: Sequence[FrozenTrial], number: int, params: dict[str, ArgValue], *,
           baseline: bool = False, confirmation: bool = False, schedule: Schedule | None = None,
           host: HostCheck | None = None) -> Decision:
    """What happens to ``params`` (the tuned flags' values) proposed as trial ``number`` of a study whose trials are
    ``trials``; ``baseline``: the study's fixed args, whatever ``params`` says; ``schedule``: the adaptive server
    that runs it (its deploy args name its file); ``host``: asks the engine on the target (not an adaptive
    server: its schedule file is placed only at its launch)."""
    try:
        if schedule is not None:
            rules = plan.engine.adaptive
            assert rules is not None
            name = str(schedule.args[rules.file_flag])
            candidate = plan.space.adaptive(schedule.args, ServerFile(rules.file_flag, name,
                                                                      json.dumps(schedule.document, indent=1)))
        else:
            candidate = plan.space.baseline() if baseline else plan.space.candidate(params)
    except InvalidConfig as e:
        return Decision("invalid", detail=str(e))
    predicted = None
    if host is not None and schedule is None:
        try:
            args = host(candidate)
        except HostRejected as e:
            return Decision("host_rejected", candidate, detail=str(e))
        if args != candidate.args:
            predicted, candidate = candidate, replace(candidate, args=args, key=plan.space.key(args))
    if baseline or confirmation or schedule is not None:
        return Decision("launch", candidate, rewritten=predicted)
    twin = next((t for t in trials if t.state == TrialState.RUNNING and t.number < number
                 and record.config_keys(t)[0] == candidate.key), None)
    if twin is not None:
        return Decision("wait", candidate, twin, rewritten=predicted)
    prior = next((t for t in trials if t.state in REUSABLE and t.number != number
                  and candidate.key in record.config_keys(t)), None)
    if prior is not None:
        return Decision("reuse", candidate, prior, rewritten=predicted)
    oom = Feasibility(plan.engine, trials).known_oom(candidate.args)
    if oom is not None:
        return Decision("too_large", candidate, oom, rewritten=predicted)
    gone = tally.given_up(list(trials)).get(candidate.key)
    if gone is not None:
        return Decision("given_up", candidate, gone, rewritten=predicted)
    return Decision("launch", candidate, rewritten=predicted)
