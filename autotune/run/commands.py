"""One-off commands on a study's target, beside the tuner: `autotune apply` (deploy a measured config),
`autotune restore` (put back what ran before tuning), `autotune bench` (measure what runs now) and `autotune check`
(measure what runs now against what the study recorded for that config)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.studyfile import paths
from autotune.bench.measure import Bench
from autotune.run.bringup import deploy_trial, restore_original, server_info
from autotune.errors import TrialFailure, UserError
from autotune.logs import setup as setup_logging
from autotune.run.plan import Plan
from autotune.record import TrialRecord
from autotune.results.score import metrics_of
from autotune.record.storage import load_existing_study
from autotune.targets import Target, make_target
from autotune.bench import measuring
from autotune.bench.measuring import load_generator
from autotune import record
from autotune.results import tally

T = TypeVar("T")


def apply(plan: Plan, storage: str, number: int | None = None) -> FrozenTrial:
    """Deploy the best (or the chosen) measured trial's config and wait until it is healthy."""
    study = load_existing_study(plan.spec.name, storage)
    if number is None:
        trial = tally.best(study)
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
    if rec.state not in (TrialState.COMPLETE, TrialState.PRUNED):
        raise UserError(f"trial {rec.number} was never measured ({rec.reason or rec.state.name.lower()}): apply a "
                        "measured trial (`autotune status` lists them), or the best (no --trial)")
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
                      levels=plan.spec.levels,
                      load=load_generator(target, base_url, plan.spec.workload.client)).run()
        except TrialFailure as e:
            raise UserError(f"measurement failed: {e}") from None
        levels = m.summaries()
        return {"url": base_url, "server": {n: info.applied.get(n) for n in plan.space.names},
                "metrics": metrics_of(levels, len(m.repeats), info), "levels": levels}
    finally:
        measuring.close(target)
        target.close()


def check(plan: Plan, storage: str) -> dict[str, Any]:
    """Measure the server as deployed now and compare each level with the study's record of the config it runs
    (found by the tuned flags /server_info reports). "status": "ok" (every level within or above the recorded 95%
    interval) or "slower" (a level whose new figure, even at the top of its own interval, is below the recorded
    interval, in two measurements one after the other; "measurements" says how many were made, the figures shown are
    the last one's). A config the study never measured is a UserError."""
    study = load_existing_study(plan.spec.name, storage)
    now = bench(plan)
    running = {n: v for n, v in now["server"].items() if v is not None}  # the tuned flags the server reports
    if not running:
        raise UserError(f"the server at {now['url']} reports none of the tuned flags: its config cannot be told")
    same = [rec for rec in record.records(study.get_trials(deepcopy=False)) if rec.feasible and _runs(rec, running)]
    if not same:
        shown = ", ".join(f"{k}={v}" for k, v in running.items())
        raise UserError(f"the server at {now['url']} runs a config study {plan.spec.name!r} has not measured "
                        f"({shown}): nothing to compare with")
    key = same[0].config_key or ""
    levels = _compare(study, key, now["levels"])
    measurements = 1
    if any(lv["verdict"] == "slower" for lv in levels):
        # measured again: a passing burst of load on the host or on the measuring machine must not fail the check
        slower = {lv["concurrency"] for lv in levels if lv["verdict"] == "slower"}
        levels = _compare(study, key, bench(plan)["levels"])
        measurements = 2
        for lv in levels:
            if lv["verdict"] == "slower" and lv["concurrency"] not in slower:
                lv["verdict"] = "ok"
    status = "slower" if any(lv["verdict"] == "slower" for lv in levels) else "ok"
    return {"status": status, "url": now["url"], "server": running, "trial": same[0].number, "levels": levels,
            "measurements": measurements}


def _compare(study: optuna.Study, key: str, measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured level against the study's pooled record of the config ``key`` at that level (levels the study
    has no record of are left out)."""
    levels = []
    for lv in measured:
        c, figure = lv["concurrency"], lv["output_tok_s"] or 0.0
        recorded = tally.level_estimates(study, c).get(key)
        if recorded is None:
            continue
        top = figure * (1 + (lv.get("output_tok_s_rel_ci") or 0.0))
        verdict = "slower" if top < recorded.low else ("faster" if figure > recorded.high else "ok")
        levels.append({"concurrency": c, "now": figure, "recorded": recorded.value, "low": recorded.low,
                       "high": recorded.high, "trials": list(recorded.trials), "verdict": verdict})
    return levels


def _runs(rec: TrialRecord, running: dict[str, Any]) -> bool:
    """Whether the trial measured the tuned flags the server reports (numbers compared as numbers)."""
    if rec.reused_from is not None or not rec.params:
        return False

    def same(a: Any, b: Any) -> bool:
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return str(a) == str(b)
    return all(same(rec.params.get(n), v) for n, v in running.items())


def _on_target(plan: Plan, action: Callable[[Target], T], failed: str) -> T:
    """Run ``action`` holding the target's lock; a server that does not come up is one line."""
    paths.check(plan.spec)
    setup_logging(plan.spec.directory / f"{plan.spec.name}.log")
    target = make_target(plan.target, cwd=plan.spec.directory)
    try:
        with target.lock(plan.spec.name):
            return action(target)
    except TrialFailure as e:
        raise UserError(f"{failed}: {e}") from None
    finally:
        target.close()
