"""Warm start: a new study (another engine version, another host, another model) begins with the configs an
earlier study found best, measured afresh. Only configs cross over, never their values: another host or version is
another landscape, and the new study's figures alone decide."""
from __future__ import annotations

from autotune.results import tally
from autotune.errors import UserError
from autotune.run.plan import Plan
from autotune.record import TrialRecord
from autotune.search import Proposal
from autotune.record.storage import load_existing_study
from autotune.studyfile.spec import read_study_file


def warm_configs(old: str, plan: Plan, limit: int) -> list[Proposal]:
    """The best configs of study ``old`` (a name under ./studies or a study file) that the new study's space holds:
    confirmed ones (measured by more than one launch) first, then by their pooled estimate; at most ``limit``, none
    equal to the new study's baseline; each a "warm_start" proposal whose origin names its trial."""
    spec = read_study_file(old)
    if spec.path.resolve() == plan.spec.path.resolve():
        raise UserError(f"--warm-start {old}: that is this study; warm start from an earlier one")
    study = load_existing_study(spec.name, spec.storage)
    trials = study.get_trials(deepcopy=False)
    ranked = sorted(tally.estimates(study).values(), key=lambda e: (e.launches > 1, e.value), reverse=True)
    space = plan.space
    seen = {plan.baseline.key}
    out: list[Proposal] = []
    for estimate in ranked:
        rec = TrialRecord.of(trials[estimate.trials[0]])
        params = {name: rec.params[name] for name in space.names if name in rec.params}
        # the new study may tune other flags, or narrower ranges
        if set(params) == set(space.names) and space.is_new(params, seen):
            out.append(Proposal(space.internal(params), "warm_start", f"study {spec.name}, trial {rec.number}"))
        if len(out) >= limit:
            break
    return out
