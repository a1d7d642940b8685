"""Noise-free figures for every valid config of a space (``autotune sim surface --profile``): the performance
model's closed form for the default space, decode speed of one stream and steady output throughput at one
concurrency, for the profile's own request shape. Quick, for a whole space. (The truth for a study's own workload,
``--study``, is truth.py's, driven from the tuner's side by autotune/run/study_truth.py.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autotune.sim import model
from autotune.sim.profile import Profile, load_profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

STEPS, TOPK, DRAFT = "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"
DEFAULT_SPACE: dict[str, list[int]] = {
    STEPS: list(range(1, 9)),
    TOPK: [1, 2, 4, 8],
    DRAFT: list(range(2, 33)),
}


class SpaceError(ValueError):
    """A --space (or a study) that cannot be surveyed; the message says what is wrong."""


def valid_configs(space: dict[str, list[int]] | None = None) -> list[tuple[int, int, int]]:
    """(steps, topk, draft) triples SGLang accepts: topk 1 collapses to draft = steps + 1 (listed once) and a
    tree needs draft - 1 <= topk + (steps - 1) * topk^2 (otherwise "selected index k out of range")."""
    space = space or DEFAULT_SPACE
    seen: list[tuple[int, int, int]] = []
    for steps in space[STEPS]:
        for topk in space[TOPK]:
            if topk == 1:
                if (steps, 1, steps + 1) not in seen:
                    seen.append((steps, 1, steps + 1))
                continue
            for draft in space[DRAFT]:
                if draft >= 2 and draft - 1 <= topk + (steps - 1) * topk * topk:
                    seen.append((steps, topk, draft))
    return seen


def surface(profile: str | Profile, concurrency: int = 32, space: dict[str, list[int]] | None = None,
            prompt_tokens: int | None = None, output_tokens: int | None = None) -> dict[str, Any]:
    """Figures at speedup 1 for each valid config, with the profile's reference tp and SGLang's defaults.

    ``concurrent_tok_s`` is the steady output throughput with ``concurrency`` requests in flight (queueing
    beyond max_running_requests), for the profile's [workload] prompt/output lengths unless given."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    configs = []
    for steps, topk, draft in valid_configs(space):
        cfg = model.Config(tp=prof.timing.reference_tp, spec=model.Spec(steps, topk, draft),
                           max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS)
        fig = model.figures(prof, cfg, concurrency, prompt_tokens, output_tokens)
        configs.append({
            "params": {STEPS: steps, TOPK: topk, DRAFT: draft},
            "single_tok_s": round(fig.single_tok_s, 2),
            "concurrent_tok_s": round(fig.concurrent_tok_s, 2),
            "accept_length": round(fig.accept_length, 3),
            "max_running_requests": fig.max_running_requests,
            "fits": fig.fits,
        })
    return {"profile": prof.name, "concurrency": concurrency, "configs": configs}


def parse_space(text: str) -> dict[str, list[int]]:
    """A --space: a JSON object {name: [values] | {"low": a, "high": b}} or a study .toml with [space.*] tables.

    Names not given keep the default space's values."""
    path = Path(text)
    try:
        if text.endswith(".toml") and path.exists():
            data = tomllib.loads(path.read_text()).get("space", {})
        else:
            data = json.loads(text)
    except (OSError, ValueError) as e:
        raise SpaceError(f"cannot read --space {text!r}: {e}") from None
    if not isinstance(data, dict):
        raise SpaceError("--space must be an object of parameter -> values")
    space = dict(DEFAULT_SPACE)
    for name, spec in data.items():
        if name not in DEFAULT_SPACE:
            continue
        if isinstance(spec, list):
            values = spec
        elif isinstance(spec, dict) and "choices" in spec:
            values = spec["choices"]
        elif isinstance(spec, dict) and "low" in spec and "high" in spec:
            values = list(range(int(spec["low"]), int(spec["high"]) + 1, int(spec.get("step", 1))))
        else:
            raise SpaceError(f"--space {name}: expected a list, {{low, high}} or {{choices}}")
        if not values or not all(isinstance(v, int) and v > 0 for v in values):
            raise SpaceError(f"--space {name}: values must be positive integers")
        space[name] = sorted(set(values))
    return space


def format_table(result: dict[str, Any]) -> str:
    """A readable table, best single-stream and best concurrent configs marked."""
    rows = result["configs"]
    fitting = [r for r in rows if r["fits"]]
    best_single = max(fitting, key=lambda r: r["single_tok_s"], default=None)
    best_conc = max(fitting, key=lambda r: r["concurrent_tok_s"], default=None)
    c = result["concurrency"]
    lines = [f"profile {result['profile']}: {len(rows)} valid configs, {len(fitting)} fit",
             (f"{'steps':>5} {'topk':>4} {'draft':>5} {'accept':>7} {'single tok/s':>12} {f'c{c} tok/s':>10} "
             f"{'max_run':>7}  fits")]
    for r in rows:
        p = r["params"]
        mark = ("  <- best single" if r is best_single else "") + (f"  <- best c{c}" if r is best_conc else "")
        lines.append(f"{p[STEPS]:>5} {p[TOPK]:>4} {p[DRAFT]:>5} {r['accept_length']:>7.2f} {r['single_tok_s']:>12.1f} "
                     f"{r['concurrent_tok_s']:>10.1f} {r['max_running_requests']:>7}  {'yes' if r['fits'] else 'no'}"
                     f"{mark}")
    return "\n".join(lines)
