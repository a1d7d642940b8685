"""One-off commands on a study's target, beside the tuner: `autotune apply` (deploy a measured config),
`autotune restore` (put back what ran before tuning) and `autotune bench` (measure what runs now)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from optuna.trial import FrozenTrial

from autotune.bench.measure import Bench
from autotune.bringup import deploy_trial, restore_original, server_info
from autotune.errors import TrialFailure, UserError
from autotune.logs import setup as setup_logging
from autotune.plan import Plan
from autotune.record import TrialRecord
from autotune.score import metrics_of
from autotune.storage import load_existing_study
from autotune.targets import Target, make_target
from autotune import results

T = TypeVar("T")


def apply(plan: Plan, storage: str, number: int | None = None) -> FrozenTrial:
    """Deploy the best (or the chosen) measured trial's config and wait until it is healthy."""
    study = load_existing_study(plan.spec.name, storage)
    if number is None:
        trial = results.best(study)
        if trial is None:
            raise UserError(f"study {plan.spec.name!r} has no feasible measured trial to apply")
    else:
        trials = study.get_trials(deepcopy=False)
        if not 0 <= number < len(trials):
            raise UserError(f"study {plan.spec.name!r} has no trial {number} (trials 0-{len(trials) - 1})")
        trial = trials[number]
    rec = TrialRecord.of(trial)
    if rec.command is None or rec.config is None:
        raise UserError(f"trial {rec.number} never deployed a server ({rec.reason or rec.state.name})")
    _on_target(plan, lambda target: deploy_trial(plan, target, rec, plan.logs_dir / "apply.log"),
               f"trial {rec.number} did not come up")
    return trial


def restore(plan: Plan) -> None:
    """Put the target back as it was before tuning (the backed-up unit, or the study's fixed args)."""
    _on_target(plan, lambda target: restore_original(plan, target), "the original config did not come up")


def bench(plan: Plan) -> dict[str, Any]:
    """Measure the server deployed on the target now, with the study's workload; deploys nothing."""
    target = make_target(plan.target, cwd=plan.spec.directory)
    try:
        base_url = target.base_url()
        try:
            info = server_info(base_url, plan.engine, plan.headers)
        except TrialFailure as e:
            raise UserError(f"no {plan.engine.kind} server answers at {base_url}: {e.detail}") from None
        try:
            # prompts in a fixed order (seed 0): two runs against the same server send the same requests
            m = Bench(base_url, plan.engine, plan.spec.workload, plan.prompts, headers=plan.headers, seed=0,
                      levels=plan.spec.levels).run()
        except TrialFailure as e:
            raise UserError(f"measurement failed: {e}") from None
        return {"url": base_url, "server": {n: info.applied.get(n) for n in plan.space.names},
                "metrics": metrics_of(m, info), "levels": [m.summary(c) for c in m.concurrencies]}
    finally:
        target.close()


def _on_target(plan: Plan, action: Callable[[Target], T], failed: str) -> T:
    """Run ``action`` holding the target's lock; a server that does not come up is one line."""
    setup_logging(plan.spec.directory / f"{plan.spec.name}.log")
    target = make_target(plan.target, cwd=plan.spec.directory)
    try:
        with target.lock(plan.spec.name):
            return action(target)
    except TrialFailure as e:
        raise UserError(f"{failed}: {e}") from None
    finally:
        target.close()
