"""Noise-free figures for every valid config of a space (``autotune sim surface``).

``surface`` (``--profile``): the performance model's closed form for the default space: decode speed of one stream
and steady output throughput at one concurrency, for the profile's own request shape. Quick, for a whole space.
``study_surface`` (``--study``): the truth for a study's workload (truth.py): the emulator's own scheduler driven
by a perfect client with the study's prompts, max_tokens and concurrency levels, at the study's --sim-speedup. It
is what autotune's measurements of that study are checked against.
"""
from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.sim import model, truth
from autotune.sim.args import build_parser
from autotune.sim.profile import Profile, load_profile
from autotune.sim.tokens import encode

if TYPE_CHECKING:
    from autotune.plan import Plan

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


#: a study's surface is worked out config by config (about 1 s each, on every core): a larger space is refused
MAX_STUDY_CONFIGS = 2000
#: more configs than this are worked out in a process pool
PARALLEL_FROM = 4


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


def is_emulator(command: list[str]) -> bool:
    """Whether a study's server command starts the emulator (autotune-sim or python -m autotune.sim)."""
    return bool(command) and (Path(command[0]).name == "autotune-sim" or "autotune.sim" in command[1:3])


def study_surface(plan: Plan) -> dict[str, Any]:
    """The truth for the study's workload, for every distinct config of its space (the baseline first)."""
    spec, w = plan.spec, plan.spec.workload
    if spec.engine.kind != "sglang" or not is_emulator(spec.engine.command):
        raise SpaceError(f"{spec.path}: the study's server is not the emulator ({' '.join(spec.engine.command)}); "
                         "`sim surface --study` states the truth of autotune-sim only")
    candidates = {plan.baseline.key: plan.baseline}
    for params in plan.space.configs():
        if len(candidates) > MAX_STUDY_CONFIGS:
            raise SpaceError(f"{spec.path}: more than {MAX_STUDY_CONFIGS} distinct configs; narrow the [space]")
        try:
            candidate = plan.space.candidate(params)
        except Exception:  # the engine rejects it: no figures to state
            continue
        candidates.setdefault(candidate.key, candidate)
    first = plan.engine.render([], plan.baseline.args)
    vocab = load_profile(build_parser().parse_args(first).sim_profile).model.vocab_size
    lengths = [len(encode(p, vocab)) for p in plan.prompts]
    levels = sorted({1, *w.concurrency})
    argvs = [plan.engine.render([], c.args) for c in candidates.values()]
    jobs = (argvs, [lengths] * len(argvs), [w.max_tokens] * len(argvs), [levels] * len(argvs),
            [w.temperature] * len(argvs))
    if len(argvs) > PARALLEL_FROM:
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            found = list(pool.map(truth.figures, *jobs, chunksize=4))
    else:
        found = list(map(truth.figures, *jobs))
    rows = []
    for (key, candidate), fig in zip(candidates.items(), found, strict=True):
        rows.append({
            "params": candidate.tuned(plan.space.names),
            "baseline": key == plan.baseline.key,
            "single_tok_s": round(fig.single_tok_s, 2),
            "concurrent_tok_s": round(fig.level_tok_s[max(levels)], 2),
            "level_tok_s": {str(c): round(v, 2) for c, v in fig.level_tok_s.items()},
            "accept_length": round(fig.accept_length, 3),
            "max_running_requests": fig.max_running_requests,
            "fits": fig.fits,
        })
    return {"study": spec.name, "speedup": truth.server(first)[2], "max_tokens": w.max_tokens,
            "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1), "concurrency": levels, "configs": rows}


def format_study_table(result: dict[str, Any]) -> str:
    """A readable table of ``study_surface``: tok/s per level, the best of each level marked."""
    rows, levels = result["configs"], [str(c) for c in result["concurrency"]]
    fitting = [r for r in rows if r["fits"]]
    best = {c: max(fitting, key=lambda r: r["level_tok_s"][c], default=None) for c in levels}
    names = list(rows[0]["params"]) if rows else []
    widths = [max(len(n), 6) for n in names]
    lines = [f"study {result['study']}: truth at --sim-speedup {result['speedup']:g}, max_tokens "
             f"{result['max_tokens']}, prompts of {result['prompt_tokens_mean']} tokens on average; "
             f"{len(rows)} configs, {len(fitting)} fit",
             " ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True)) + " "
             + " ".join(f"{'c' + c + ' tok/s':>11}" for c in levels) + "  accept  max_run"]
    for r in rows:
        marks = "".join(f"  <- best c{c}" for c in levels if best[c] is r) + ("  (baseline)" if r["baseline"] else "")
        lines.append(" ".join(f"{v!s:>{w}}" for v, w in zip(r["params"].values(), widths, strict=True)) + " "
                     + " ".join(f"{r['level_tok_s'][c]:>11.1f}" for c in levels)
                     + f"  {r['accept_length']:>6.2f}  {r['max_running_requests']:>7}"
                     + ("" if r["fits"] else "  does not fit") + marks)
    return "\n".join(lines)
