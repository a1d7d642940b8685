"""The truth for a study's workload (`autotune sim surface --study`), worked out once per config and workload in a
test session: several tests, and several settings of one test, ask for the same figures."""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from autotune.run.plan import Plan, make_plan
from autotune.studyfile.spec import read_study_file
from autotune.run.study_truth import study_surface

_found: dict[str, dict[str, Any]] = {}


def _key(plan: Plan) -> str:
    """What the truth depends on: the engine (its command and args, --sim-speedup included), the space, and the
    workload's requests, max_tokens, levels, sampling and ends, and a capacity study's SLO; not the study's name, file
    or target."""
    spec, w = plan.spec, plan.spec.workload
    slo = spec.constraints.slo if spec.objective == "capacity" else None
    return json.dumps([spec.engine.kind, spec.engine.command, sorted(spec.engine.args.items()), repr(spec.space),
                       plan.prompts, w.max_tokens, sorted(set(w.concurrency)), w.temperature, w.top_p,
                       w.forced_length, slo], default=str)


def surface(plan: Plan) -> dict[str, Any]:
    """`study_surface(plan)`, computed on the first call for its config and workload."""
    key = _key(plan)
    if key not in _found:
        _found[key] = study_surface(plan)
    return _found[key]


def level_truth(plan: Plan) -> dict[int, float]:
    """The baseline config's true tok/s at each concurrency level of the study's workload (1 included)."""
    return {int(c): v for c, v in surface(plan)["configs"][0]["level_tok_s"].items()}


def _surface_of(study: str) -> dict[str, Any]:
    return study_surface(make_plan(read_study_file(study)))


def work_out(studies: list[Path], workers: int = 2) -> None:
    """Compute the truths of these study files not known yet, ``workers`` at a time (each a whole core's work for a
    second or a few), so that none is computed later beside a measurement."""
    plans = {str(p): make_plan(read_study_file(str(p))) for p in studies}
    todo: dict[str, str] = {}
    for path, plan in plans.items():
        if _key(plan) not in _found:
            todo.setdefault(_key(plan), path)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for key, result in zip(todo, pool.map(_surface_of, todo.values()), strict=True):
            _found[key] = result
