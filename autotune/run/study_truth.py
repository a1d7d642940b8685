"""The truth for a study on the emulator (``autotune sim surface --study``): for every distinct config of its space,
what a perfect client would measure with the study's own workload (prompts, max_tokens, concurrency levels), at the
study's --sim-speedup, from the emulator's own scheduler on a virtual clock (autotune/sim/virtual_run.py). Measurements
are checked against it, and the benches' surrogate (trial/surrogate.py) adds noise to it instead of launching.

For a capacity study (objective "capacity") every config's row also states its capacity within the study's SLO:
every ladder level's steady state on the virtual clock (sim/virtual_run.py's closed loop, its TTFT and emission gaps per
request), from the lowest up to the first that breaks the SLO, then every whole load between the highest that met
it and that one, halved down to a single step: the highest load that meets the SLO, its throughput and p99s."""
from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.run.plan import Plan
from autotune.sim import virtual_run
from autotune.sim.args import build_parser
from autotune.sim.profile import load_profile
from autotune.sim.openai_api import TEMPLATE_TOKENS_PER_MESSAGE, TEMPLATE_TOKENS_REPLY
from autotune.sim.tokens import encode
from autotune.sim.traffic import category_of

#: a study's truth is worked out config by config (about 1 s each, on every core): a larger space is refused
MAX_STUDY_CONFIGS = 2000
#: more configs than this are worked out in a process pool
PARALLEL_FROM = 4


@dataclass(frozen=True)
class ConfigTruth:
    """One config's noise-free figures for the study's workload (tok/s at the study's --sim-speedup)."""

    params: dict[str, Any]              # the tuned flags
    level_tok_s: dict[int, float]       # output tok/s by concurrency (1: the single stream)
    accept_length: float
    max_running_requests: int
    fits: bool                          # False: the server does not start (out of memory)


def is_emulator(command: list[str]) -> bool:
    """Whether a study's server command starts the emulator (autotune-sim or python -m autotune.sim)."""
    return bool(command) and (Path(command[0]).name == "autotune-sim" or "autotune.sim" in command[1:3])


def study_surface(plan: Plan, runs: virtual_run.Length = virtual_run.FULL) -> dict[str, Any]:
    """The truth for the study's workload, for every distinct config of its space (the baseline first), as the JSON
    document `autotune sim surface --study --json` prints; ``runs``: how long the virtual runs are
    (virtual_run.QUICK for benches over many hosts). Raises ``UserError`` for a study that does not run the emulator
    or whose space is too large to survey."""
    spec, w = plan.spec, plan.spec.workload
    if spec.engine.kind != "sglang" or not is_emulator(spec.engine.command):
        raise UserError(f"{spec.path}: the study's server is not the emulator ({' '.join(spec.engine.command)}); "
                        "`sim surface --study` states the truth of autotune-sim only")
    candidates = {plan.baseline.key: plan.baseline}
    for candidate in plan.space.candidates():  # those the engine rejects have no figures to state
        if len(candidates) > MAX_STUDY_CONFIGS:
            raise UserError(f"{spec.path}: more than {MAX_STUDY_CONFIGS} distinct configs; narrow the [space]")
        candidates.setdefault(candidate.key, candidate)
    first = plan.engine.render([], plan.baseline.args)
    vocab = load_profile(build_parser().parse_args(first).sim_profile).model.vocab_size
    lengths = asks(plan, vocab)
    levels = sorted({1, *w.concurrency})
    argvs = [plan.engine.render([], c.args) for c in candidates.values()]
    n = len(argvs)
    jobs = (argvs, [lengths] * n, [w.max_tokens] * n, [levels] * n, [w.temperature] * n, [0] * n, [runs] * n)
    if len(argvs) > PARALLEL_FROM:
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            found = list(pool.map(virtual_run.figures, *jobs, chunksize=4))
    else:
        found = list(map(virtual_run.figures, *jobs))
    slo = spec.constraints.slo if spec.objective == "capacity" else None
    capacities: list[dict[str, Any] | None] = [None] * n
    if slo is not None:
        speedup = virtual_run.server(first)[2]
        fitting = [i for i, fig in enumerate(found) if fig.fits]
        cap_jobs = ([argvs[i] for i in fitting], [lengths] * len(fitting), [w.max_tokens] * len(fitting),
                    [sorted(set(w.concurrency))] * len(fitting), [w.temperature] * len(fitting),
                    [slo] * len(fitting), [speedup] * len(fitting), [runs] * len(fitting))
        if len(fitting) > PARALLEL_FROM:
            with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                caps = list(pool.map(capacity_truth, *cap_jobs, chunksize=1))
        else:
            caps = list(map(capacity_truth, *cap_jobs))
        for i, cap in zip(fitting, caps, strict=True):
            capacities[i] = cap
    rows = []
    for (key, candidate), fig, cap in zip(candidates.items(), found, capacities, strict=True):
        rows.append({
            "params": candidate.tuned(plan.space.names),
            "baseline": key == plan.baseline.key,
            "single_tok_s": round(fig.single_tok_s, 2),
            "concurrent_tok_s": round(fig.level_tok_s[max(levels)], 2),
            "level_tok_s": {str(c): round(v, 2) for c, v in fig.level_tok_s.items()},
            "accept_length": round(fig.accept_length, 3),
            "max_running_requests": fig.max_running_requests,
            "fits": fig.fits,
            **({"capacity": cap} if slo is not None else {}),
        })
    return {"study": spec.name, "speedup": virtual_run.server(first)[2], "max_tokens": w.max_tokens,
            "prompt_tokens_mean": round(sum(a.prompt_tokens for a in lengths) / len(lengths), 1),
            "concurrency": levels, "configs": rows}


def asks(plan: Plan, vocab: int) -> list[virtual_run.Ask]:
    """The study's requests as the emulator sees them: prompt tokens (with its chat template's), sizes, categories
    (told from the words, as the emulator tells them), sampling and ends."""
    w = plan.spec.workload
    out = []
    for r in plan.prompts:
        if r.messages is not None:
            tokens = sum(TEMPLATE_TOKENS_PER_MESSAGE + len(encode(text, vocab)) for _, text in r.messages)
            tokens += TEMPLATE_TOKENS_REPLY
            instruction = next((text for role, text in reversed(r.messages) if role == "user"), "")
        else:
            tokens, instruction = len(encode(r.text, vocab)), r.text
        out.append(virtual_run.Ask(prompt_tokens=max(1, tokens), max_tokens=r.output_tokens(w.max_tokens),
                             category=category_of(instruction), chat=r.chat,
                             temperature=w.temperature if r.temperature is None else r.temperature,
                             ignore_eos=w.forced_length))
    return out


def capacity_truth(argv: list[str], prompt_lengths: virtual_run.Workload, max_tokens: int, ladder: list[int],
                   temperature: float, slo: tuple[float | None, float | None], speedup: float,
                   runs: virtual_run.Length = virtual_run.FULL) -> dict[str, Any]:
    """One config's capacity within ``slo`` (TTFT p99, ITL p99 in ms; None: unbounded) from the emulator's virtual
    runs: the highest load that meets it (None: not even 1), its tok/s and p99s, and every load worked out."""
    curve: dict[int, dict[str, Any]] = {}

    def meets(c: int) -> bool:
        if c not in curve:
            run = virtual_run.load(argv, prompt_lengths, max_tokens, c, temperature, runs=runs)
            ttft, itl = _p99(run.ttft) * 1000 / speedup, _p99(run.itl) * 1000 / speedup
            curve[c] = {"concurrency": c, "output_tok_s": round(run.tok_s * speedup, 2), "ttft_ms_p99": round(ttft, 3),
                        "itl_ms_p99": round(itl, 3),
                        "meets_slo": all(b is None or x <= b for b, x in zip(slo, (ttft, itl), strict=True))}
        return curve[c]["meets_slo"]
    good, bad = 0, None
    for c in ladder:
        if not meets(c):
            bad = c
            break
        good = c
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    at = curve.get(good, {})
    return {"concurrency": good or None, "output_tok_s": at.get("output_tok_s", 0.0),
            "ttft_ms_p99": at.get("ttft_ms_p99"), "itl_ms_p99": at.get("itl_ms_p99"),
            "below_top": bad is not None, "curve": [curve[c] for c in sorted(curve)]}


def _p99(values: list[float]) -> float:
    """The 99th percentile, interpolated between the closest ranks."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def by_key(plan: Plan, surface: dict[str, Any]) -> dict[str, ConfigTruth]:
    """``study_surface``'s rows by the config key the plan's space gives each (the baseline's row under the
    baseline's key, whatever its params say)."""
    out = {}
    for row in surface["configs"]:
        key = plan.baseline.key if row["baseline"] else plan.space.candidate(row["params"]).key
        out[key] = ConfigTruth(dict(row["params"]), {int(c): v for c, v in row["level_tok_s"].items()},
                               row["accept_length"], row["max_running_requests"], row["fits"])
    return out


def format_study_table(result: dict[str, Any]) -> str:
    """A readable table of ``study_surface``: tok/s per level, the best of each level marked; for a capacity study
    each config's capacity (the highest load within the SLO, and its tok/s), the highest marked."""
    rows, levels = result["configs"], [str(c) for c in result["concurrency"]]
    fitting = [r for r in rows if r["fits"]]
    best = {c: max(fitting, key=lambda r: r["level_tok_s"][c], default=None) for c in levels}
    capacity = bool(rows) and "capacity" in rows[0]
    top = max(fitting, key=lambda r: r["capacity"]["output_tok_s"], default=None) if capacity else None
    names = list(rows[0]["params"]) if rows else []
    widths = [max(len(n), 6) for n in names]
    lines = [f"study {result['study']}: truth at --sim-speedup {result['speedup']:g}, max_tokens "
             f"{result['max_tokens']}, prompts of {result['prompt_tokens_mean']} tokens on average; "
             f"{len(rows)} configs, {len(fitting)} fit",
             " ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True)) + " "
             + " ".join(f"{'c' + c + ' tok/s':>11}" for c in levels) + "  accept  max_run"
             + ("  capacity (load, tok/s)" if capacity else "")]
    for r in rows:
        marks = "".join(f"  <- best c{c}" for c in levels if best[c] is r) + ("  (baseline)" if r["baseline"] else "")
        lines.append(" ".join(f"{v!s:>{w}}" for v, w in zip(r["params"].values(), widths, strict=True)) + " "
                     + " ".join(f"{r['level_tok_s'][c]:>11.1f}" for c in levels)
                     + f"  {r['accept_length']:>6.2f}  {r['max_running_requests']:>7}"
                     + (_capacity_cell(r) if capacity else "")
                     + ("" if r["fits"] else "  does not fit") + marks
                     + ("  <- most capacity" if top is r else ""))
    return "\n".join(lines)


def _capacity_cell(row: dict[str, Any]) -> str:
    cap = row.get("capacity")
    if not cap or cap["concurrency"] is None:
        return f"  {'none':>23}"
    load = f"{cap['concurrency']}{'' if cap['below_top'] else '+'}"
    return f"  {load:>9} {cap['output_tok_s']:>13.1f}"
