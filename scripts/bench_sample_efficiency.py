#!/usr/bin/env python3
"""How many server launches until autotune's pick is within 2% of the best config?

For each emulator profile, objective mode, sampler setup and seed, a real study runs through `autotune run` (real
emulator processes at --sim-speedup, noise on, seeded by the study's seed) with a budget of ``--cap`` launches, and is
read back from its storage. After every launch the script takes the config the tuner would pick at that point (the
config with the best pooled estimate, as `autotune best` picks it) and looks up that config's *true*, noise-free value:
`autotune sim surface --study` for the bench's own study file (the emulator's scheduler driven by a perfect client
with the same prompts, max_tokens and concurrency; computed once per profile into OUT/truth/, a few minutes each).
The table is scored from the studies' storage each time it is printed. A launch is a server start: a trial that
reused a measurement or whose config the engine rejected is not one; the baseline is.

Reported per row: the median over seeds of the launch at which the pick first came within 2% of the optimum (">cap"
when fewer than half got there; in brackets how many did), the median pick after the last launch (share of the
optimum), and for comparison the full grid's size and random search's launches. "random" is an oracle lower bound:
Optuna's RandomSampler over the flags as written, a repeated or rejected draw costing nothing, stopping at the first
draw that is truly within 2% (200 runs per seed). Target per mode: single / concurrent on that figure; weighted on
the geometric mean of both relative to the baseline's true figures; pareto on the hypervolume of the measured front.

Measurement: 128 output tokens, a single stream of 32 requests (--requests), concurrency 32 with a window of 4
generations (128 requests finishing inside it; --generations), as autotune's default; tolerance 0.05; each profile at
the emulator speedup where concurrency 32 runs at about 7-8k tok/s, where scripts/bench_measurement.py shows this
client measuring within about 1% over longer windows and where it keeps up on a slow 2-core machine. A
last table checks how far that holds here, against the truth: every launch's single-stream and concurrent figures
against the truth for its config, how often each figure's 95% interval held the truth, and the attempts retried
because the client fell behind.

--surrogate runs the same study files in-process instead, through the product's own trial: the same queue, search,
admission, decisions, pruning, scoring and pooled pick (autotune.trial.Objective), with autotune.trial.surrogate's
launch standing in for a server: the truth plus Gaussian noise (each launch's single-stream figure off by sd 1%
(0.5% with --requests 128), its concurrent figure by sd 1.7% (2.5% with --generations 1), as the real runs'
launches against the truth show; each config by a fixed bias of sd 0.5%). It screens setups over many seeds in
seconds; it is not the evidence.

Usage: python scripts/bench_sample_efficiency.py [--profiles qwen122b,llama8b,...] [--modes weighted,concurrent]
           [--setups default,...] [--seeds 10 | --seeds 3-9] [--cap 15] [--parallel 1] [--out DIR] [--surrogate]
           [--report] [--requests 32] [--generations 4]
Results go to DIR/emulator/results.jsonl (DIR/surrogate/ with --surrogate; a name such as emulator-r128-g1 for other
--requests or --generations), one line per study; a run skips the studies already there, so it can be resumed
or extended, and the table is printed from everything in the file that matches the selection (--report prints it
without running the missing studies).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import optuna  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402

from autotune import queue, results  # noqa: E402
from autotune.budget import admit  # noqa: E402
from autotune.plan import make_plan  # noqa: E402
from autotune.record import TrialRecord  # noqa: E402
from autotune.pruning import make_pruner  # noqa: E402
from autotune.search import SearchSettings, make_sampler  # noqa: E402
from autotune.sim.surface import DRAFT, STEPS, TOPK  # noqa: E402
from autotune.storage import load_existing_study  # noqa: E402
from autotune.study import load_study  # noqa: E402
from autotune.trial import Objective  # noqa: E402
from autotune.trial.surrogate import Noise, SurrogateLaunch  # noqa: E402
from autotune.truth import by_key, study_surface  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.studies import SPEC_SPACE  # noqa: E402

MODES = ("weighted", "single", "concurrent", "pareto")
TARGET = 0.98
MAX_TOKENS = 128
#: the single stream's requests (--requests), and a concurrency level's window in generations of requests
#: (--generations): autotune's defaults
REQUESTS, GENERATIONS = 32, 4
#: the workload's tolerance: a level's client may take up to half of it (client_bound above that); at c32 and about
#: 8k tok/s of 128-token requests this client spends 1.5-2% of each request's time in `autotune bench` and 3-5% in
#: `autotune run` on a slow machine, over the default's 1.5%
TOLERANCE = 0.05
#: per profile: the emulator's model shape, and a speedup at which concurrency 32 runs at about 7-8k tok/s, where this
#: client mostly keeps up beside the emulator on a slow 2-core machine (at twice that, nearly every launch there failed
#: as client_bound; at this rate about one in four is retried, and on llama8b with windows of four generations
#: about one in three: 7.3 per study)
PROFILES: dict[str, dict[str, Any]] = {
    "qwen122b": {"model": "/shared/models/Qwen3.5-122B-A10B", "tp": 4, "speedup": 4, "concurrency": 32},
    "llama8b": {"model": "/shared/models/Llama-3.1-8B-Instruct", "tp": 1, "speedup": 1.5, "concurrency": 32},
    "llama70b": {"model": "/shared/models/Llama-3.3-70B-Instruct", "tp": 8, "speedup": 2.5, "concurrency": 32},
    "qwen235b": {"model": "/shared/models/Qwen3-235B-A22B-Instruct-2507-FP8", "tp": 4, "speedup": 4.5,
                 "concurrency": 32},
    "qwen14b": {"model": "/shared/models/Qwen3-14B-AWQ", "tp": 1, "speedup": 7, "concurrency": 32},
}
#: sampler setups: [study] keys (a missing key is autotune's default)
SETUPS: dict[str, dict[str, Any]] = {
    "default": {},
    "tpe-random-start": {"initial_design": "random"},
    "tpe-fixed": {"sampler": "tpe", "ranges": "fixed", "startup_trials": 8, "initial_design": "random"},
    "gp": {"sampler": "gp"},
    "random": {"sampler": "random"},
    "random-fixed": {"sampler": "random", "ranges": "fixed"},
    # the tuner's own proposals (autotune.search's SearchSettings) and the startup changed: the alternatives the
    # default was chosen over
    "no-local": {"_search": {"neighbour_every": 0}},
    "local-half": {"_search": {"neighbour_every": 2}},
    "no-confirm": {"_search": {"confirm_at_most": 0}},
    "no-rivals": {"_search": {"rivals_neighbours": False}},
    # which neighbour first (the local model): at random; by the model's mean alone, or with more optimism; one long
    # length scale instead of the likeliest
    "random-neighbour": {"_search": {"min_points": 10 ** 9}},
    "kappa0": {"_search": {"kappa": 0.0}},
    "kappa2": {"_search": {"kappa": 2.0}},
    "long-scale": {"_search": {"lengthscales": (0.6,)}},
    "s4": {"startup_trials": 4},
    "s8": {"startup_trials": 8},
}
#: the emulator under a name of its own: test sessions of other checkouts kill stray "autotune-sim" processes
EMULATOR = "import sys\nfrom autotune.sim.startup import main\nsys.argv[0] = 'sglang.launch_server'\nmain()\n"
POLL = 1.0
#: the surrogate's measurement error, as the real runs of this script show it: every launch's single-stream figure
#: against the truth per --requests (sd 1.0-1.3% over 240 launches with 32 requests; with 128 taken to halve, as its
#: requests are independent), its concurrent figure's per --generations (2.1-2.7% over 240 launches with windows of
#: one generation, 1.7% over 149 with four), and each config's own bias (sd)
SINGLE_NOISE, CONCURRENT_NOISE, SURROGATE_BIAS = {32: 0.01, 128: 0.005}, {1: 0.025, 4: 0.017}, 0.005
#: a study whose sampler proposed only measured configs this many trials in a row has converged: stopped
STUCK_TRIALS = 60


# -- the truth --------------------------------------------------------------------------------------------------


@dataclass
class Truth:
    single: dict[tuple[int, int, int], float]
    concurrent: dict[tuple[int, int, int], float]
    fits: dict[tuple[int, int, int], bool]
    surface: dict[str, Any]                 # `autotune sim surface --study --json` itself
    base: tuple[int, int, int] = (1, 1, 2)

    def value(self, mode: str, key: tuple[int, int, int]) -> float:
        if mode == "single":
            return self.single[key]
        if mode == "concurrent":
            return self.concurrent[key]
        b = self.base
        return math.sqrt(self.single[key] / self.single[b] * self.concurrent[key] / self.concurrent[b])

    def optimum(self, mode: str) -> float:
        return max(self.value(mode, k) for k, fit in self.fits.items() if fit)

    def hypervolume(self, keys: list[tuple[int, int, int]]) -> float:
        """Hypervolume of these configs' true (single, concurrent), each axis divided by its optimum, reference 0."""
        s_max, c_max = self.optimum("single"), self.optimum("concurrent")
        points = sorted(((self.single[k] / s_max, self.concurrent[k] / c_max) for k in keys), reverse=True)
        area, best_c = 0.0, 0.0
        for s, c in points:  # by single descending: each point adds the strip its concurrent value rises by
            if c > best_c:
                area += s * (c - best_c)
                best_c = c
        return area

    def true_front_hv(self) -> float:
        return self.hypervolume([k for k, fit in self.fits.items() if fit])


def truth_of(profile: str, out: Path) -> Truth:
    """The truth for the bench's workload on ``profile``: `autotune sim surface --study` for its study file (the
    emulator's own scheduler driven by a perfect client with the same prompts, max_tokens and levels, noise off),
    for every config of the space; computed once per profile and speedup and kept in OUT/truth/ (it takes minutes)."""
    cache = out / "truth" / f"{profile}-x{PROFILES[profile]['speedup']:g}.json"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        path = write_study(cache.parent, profile, "weighted", "default", 0, 15)
        # the same server under its own name (the studies run it under another: see EMULATOR)
        path.write_text(re.sub(r"(?m)^command = .*$", 'command = ["autotune-sim"]', path.read_text()))
        plan = make_plan(load_study(str(path)))
        cache.write_text(json.dumps(study_surface(plan)))
    surface = json.loads(cache.read_text())
    rows = surface["configs"]
    key = lambda r: (r["params"][STEPS], r["params"][TOPK], r["params"][DRAFT])  # noqa: E731
    return Truth(single={key(r): r["single_tok_s"] for r in rows},
                 concurrent={key(r): r["concurrent_tok_s"] for r in rows}, fits={key(r): r["fits"] for r in rows},
                 surface=surface)


def config_of(t: FrozenTrial) -> tuple[int, int, int] | None:
    return key_of(TrialRecord.of(t).config or {})


def key_of(c: dict[str, Any]) -> tuple[int, int, int] | None:
    if not all(n in c for n in (STEPS, TOPK, DRAFT)):
        return None
    return int(c[STEPS]), int(c[TOPK]), int(c[DRAFT])


def pick_value(mode: str, truth: Truth, study: optuna.Study, trials: list[FrozenTrial]) -> float | None:
    """The true value of the config the tuner would pick from ``trials`` (the best pooled estimate, as `autotune
    best` picks it), relative to the optimum; for pareto the measured front's hypervolume relative to the true one."""
    if mode == "pareto":
        measured = [t for t in trials if results.feasible(t) and not TrialRecord.of(t).reused_from is not None]
        front = [t for t in measured if not any(o.values[0] >= t.values[0] and o.values[1] >= t.values[1] and
                                                 tuple(o.values) != tuple(t.values) for o in measured)]
        keys = [k for k in (config_of(t) for t in front) if k is not None]
        return truth.hypervolume(keys) / truth.true_front_hv() if keys else None
    leader = results.leader(study, trials)
    key = None if leader is None else config_of(trials_by_number(trials)[leader.trials[0]])
    return None if key is None else truth.value(mode, key) / truth.optimum(mode)


def trials_by_number(trials: list[FrozenTrial]) -> dict[int, FrozenTrial]:
    return {t.number: t for t in trials}


def progress(mode: str, truth: Truth, study: optuna.Study) -> dict[str, Any]:
    """Launches so far, the launch count at which the pick was first within 2% of the optimum (None: not yet), the
    pick's share of the optimum after each launch, and trials since the last launch."""
    trials = study.get_trials(deepcopy=False)
    finished = sorted((t for t in trials if t.state in results.FINISHED), key=lambda t: t.number)
    again = results.retried(trials)  # an attempt cut short for the infrastructure's sake is not a launch
    launches, at, since, picks = 0, None, 0, []
    for n, t in enumerate(finished):
        since += 1
        if not TrialRecord.of(t).launched or t.number in again:
            continue
        launches, since = launches + 1, 0
        value = pick_value(mode, truth, study, finished[:n + 1])
        picks.append(value)
        if at is None and value is not None and value >= TARGET:
            at = launches
    return {"launches": launches, "reached_at": at, "trials": len(finished), "since_launch": since, "picks": picks}


def oracle_launches(mode: str, truth: Truth, order: list[tuple[int, int, int]]) -> int:
    """Launches a sweep through ``order`` needs until the best config so far, by its true value, is within 2%."""
    fitting: list[tuple[int, int, int]] = []
    for n, key in enumerate(order, 1):
        if truth.fits[key]:
            fitting.append(key)
        if mode == "pareto":
            if fitting and truth.hypervolume(fitting) >= TARGET * truth.true_front_hv():
                return n
        elif fitting and max(truth.value(mode, k) for k in fitting) >= TARGET * truth.optimum(mode):
            return n
    return len(order)


def random_oracle(mode: str, truth: Truth, seeds: list[int]) -> float:
    """Random search as Optuna's RandomSampler runs it over the flags as written (steps 1-8, topk 1/2/4/8, draft
    2-32, each uniform): a draw the engine rejects or that repeats a measured config costs no launch, and the search
    stops at the first launch whose config is truly within 2% (a noise-free pick: a lower bound for real random
    search). Median over ``seeds`` times 200 runs (its own spread is wide). Pareto is not covered (single-objective
    modes only)."""
    goal = TARGET * truth.optimum(mode)
    good = {k for k, fit in truth.fits.items() if fit and truth.value(mode, k) >= goal}
    runs = []
    for seed in seeds:
        for rep in range(200):
            rng = random.Random(seed * 100_003 + rep)
            seen: set[tuple[int, int, int]] = set()
            while True:
                steps, topk, draft = rng.randint(1, 8), rng.choice((1, 2, 4, 8)), rng.randint(2, 32)
                key = (steps, 1, steps + 1) if topk == 1 else (steps, topk, draft)
                if key not in truth.fits or key in seen:
                    continue
                seen.add(key)
                if key in good:
                    runs.append(len(seen))
                    break
    return statistics.median(runs)


# -- one study --------------------------------------------------------------------------------------------------


def write_study(work: Path, profile: str, mode: str, setup: str, seed: int, cap: int,
                requests: int = REQUESTS, generations: int = GENERATIONS) -> Path:
    p = PROFILES[profile]
    name = f"{profile}-{mode}-{setup}-{seed}"
    lines = [f"{k} = {json.dumps(v)}" for k, v in SETUPS[setup].items() if not k.startswith("_")]
    levels = [p["concurrency"]] if mode == "concurrent" else [1, p["concurrency"]]
    emulator = work / "sglang_emulator.py"
    if not emulator.exists():
        emulator.write_text(EMULATOR)
    text = f"""[study]
name = "{name}"
launches = {cap}
objective = "{mode}"
seed = {seed}
{chr(10).join(lines)}

[target]
kind = "local"
server_port = {free_port()}

[engine]
kind = "sglang"
command = [{json.dumps(sys.executable)}, {json.dumps(str(emulator))}]

[engine.args]
model-path = "{p['model']}"
tp-size = {p['tp']}
speculative-algorithm = "EAGLE"
speculative-num-steps = 1
speculative-eagle-topk = 1
speculative-num-draft-tokens = 2
sim-profile = "{profile}"
sim-time-scale = 0.003
sim-speedup = {p['speedup']}
{SPEC_SPACE}
[workload]
max_tokens = {MAX_TOKENS}
concurrency = {levels}
requests = {requests}
window_generations = {generations}
warmup = 1
max_repeats = 2
tolerance = {TOLERANCE}

[health]
interval = 0.25
timeout = 60
"""
    path = work / f"{name}.toml"
    path.write_text(text)
    return path


def run_study(work: Path, profile: str, mode: str, setup: str, seed: int, cap: int, truth: Truth,
              requests: int = REQUESTS, generations: int = GENERATIONS) -> dict[str, Any]:
    """`autotune run` on a fresh study with a budget of ``cap`` launches (the tuner stops itself there, having
    spent its last launches on confirmations); stopped early only if it has converged."""
    path = write_study(work, profile, mode, setup, seed, cap, requests, generations)
    name = path.stem
    db = work / f"{name}.db"
    for old in (db, work / f"{name}.log"):
        old.unlink(missing_ok=True)
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    start = time.monotonic()
    with open(work / f"{name}.out", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(path)], cwd=work,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    proc.wait()
    study = load_existing_study(name, f"sqlite:///{db}")
    state = progress(mode, truth, study)
    return {"profile": profile, "mode": mode, "setup": setup, "seed": seed, "cap": cap,
            "reached_at": state["reached_at"], "launches": state["launches"], "trials": state["trials"],
            "picks": state["picks"], "stopped_by": "budget", "wall_s": round(time.monotonic() - start, 1),
            "exit": proc.returncode}


def surrogate_study(work: Path, profile: str, mode: str, setup: str, seed: int, cap: int, truth: Truth,
                    requests: int = REQUESTS, generations: int = GENERATIONS) -> dict[str, Any]:
    """The same study file run in-process through the product's own trial (its queue, admission, search,
    decisions, pruning and scoring), with the truth plus noise (autotune.trial.surrogate) standing in for each
    launch: every measurement off by a normal error (sd SINGLE_NOISE at ``requests``, CONCURRENT_NOISE at
    ``generations``) and each config by a fixed bias of its own (sd SURROGATE_BIAS)."""
    path = write_study(work, profile, mode, setup, seed, cap, requests, generations)
    spec = load_study(str(path))
    plan = replace(make_plan(spec), search=SearchSettings(**SETUPS[setup].get("_search", {})))
    noise = Noise(single=SINGLE_NOISE[requests], concurrent=CONCURRENT_NOISE[generations], bias=SURROGATE_BIAS)
    # the same noise for every setup (common random numbers): setups differ by what they do, not by their luck
    launch = SurrogateLaunch(plan, by_key(plan, truth.surface), noise,
                             seed * 1_000_003 + zlib.crc32(f"{profile} {mode}".encode()))
    study = optuna.create_study(directions=spec.directions, sampler=make_sampler(spec, plan.space, 0),
                                pruner=make_pruner(spec))
    queue.start(study, plan)
    objective = Objective(plan, launch)
    start = time.monotonic()
    while admit(study, cap, heartbeats=False) == "run":
        queue.queue_next(study, plan, cap)
        study.optimize(objective, n_trials=1)
    state = progress(mode, truth, study)
    return {"profile": profile, "mode": mode, "setup": setup, "seed": seed, "cap": cap,
            "reached_at": state["reached_at"], "launches": state["launches"], "trials": state["trials"],
            "picks": state["picks"], "stopped_by": "budget", "wall_s": round(time.monotonic() - start, 1),
            "surrogate": True}


# -- the table --------------------------------------------------------------------------------------------------


def median_of(rows: list[dict[str, Any]]) -> float:
    values = sorted(r["reached_at"] if r["reached_at"] is not None else math.inf for r in rows)
    return statistics.median(values) if values else math.nan


def fmt(x: float, cap: int) -> str:
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return f">{cap}"
    return f"{x:g}"


def pick_at(rows: list[dict[str, Any]], n: int) -> float:
    """Median over studies of the pick's true share of the optimum after ``n`` launches (the last pick if fewer)."""
    values = [r["picks"][min(n, len(r["picks"])) - 1] or 0.0 for r in rows if r.get("picks")]
    return statistics.median(values) if values else math.nan


def table(rows: list[dict[str, Any]], profiles: list[str], modes: list[str], setups: list[str], cap: int,
          truths: dict[str, Truth], seeds: list[int]) -> str:
    """Per setup: median launches until the pick is within 2% ((reached/runs)) and the median pick after ``cap``
    launches; the grid's full size, random search (random_oracle: a lower bound), and the ratios to the default."""
    grid = {p: sum(1 for _ in truths[p].fits) for p in profiles}
    head = (f"{'profile':<9} {'mode':<10} " + " ".join(f"{s:>22}" for s in setups) +
            f" {'grid':>5} {'random':>7} {'grid/default':>12} {'random/default':>14}")
    lines = [head, "-" * len(head)]
    for p in profiles:
        for m in modes:
            cells, medians = [], {}
            for s in setups:
                sel = [r for r in rows if (r["profile"], r["mode"], r["setup"]) == (p, m, s)]
                med = medians[s] = median_of(sel)
                missed = sum(r["reached_at"] is None for r in sel)
                cells.append(f"{fmt(med, cap)} ({len(sel) - missed}/{len(sel)}) {pick_at(sel, cap):.3f}" if sel
                             else "-")
            d = medians.get("default", math.nan)
            r = random_oracle(m, truths[p], seeds)
            ratio_grid = f"{grid[p] / d:.0f}x" if d and math.isfinite(d) else "-"
            ratio_random = f"{r / d:.1f}x" if d and math.isfinite(d) else "-"
            lines.append(f"{p:<9} {m:<10} " + " ".join(f"{c:>22}" for c in cells) +
                         f" {grid[p]:>5} {r:>7g} {ratio_grid:>12} {ratio_random:>14}")
    return "\n".join(lines)


def trials_table(rows: list[dict[str, Any]], profiles: list[str], modes: list[str], setups: list[str]) -> str:
    """Median trials and launches per study as run (a trial that reuses or is rejected costs no launch)."""
    lines = [f"{'profile':<9} {'mode':<10} " + " ".join(f"{s:>16}" for s in setups)]
    for p in profiles:
        for m in modes:
            cells = []
            for s in setups:
                sel = [r for r in rows if (r["profile"], r["mode"], r["setup"]) == (p, m, s)]
                cells.append(f"{statistics.median(r['trials'] for r in sel):g} / "
                             f"{statistics.median(r['launches'] for r in sel):g}" if sel else "-")
            lines.append(f"{p:<9} {m:<10} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return list(range(int(text)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--modes", default="weighted,concurrent")
    ap.add_argument("--setups", default="default")
    ap.add_argument("--seeds", default="10", help="N (seeds 0..N-1) or A-B")
    ap.add_argument("--cap", type=int, default=15, help="the studies' budget of launches")
    ap.add_argument("--parallel", type=int, default=1, help="studies at once (more distorts the measurements)")
    ap.add_argument("--out", type=Path, default=REPO / ".bench" / "sample_efficiency")
    ap.add_argument("--surrogate", action="store_true", help="in-process screen: the truth plus noise, no launches")
    ap.add_argument("--report", action="store_true", help="run nothing: print the tables from the results so far")
    ap.add_argument("--requests", type=int, default=REQUESTS, help="the single stream's requests")
    ap.add_argument("--generations", type=int, default=GENERATIONS,
                    help="each concurrency level's window, in generations of requests (c each)")
    args = ap.parse_args()
    profiles, modes, setups = args.profiles.split(","), args.modes.split(","), args.setups.split(",")
    for name, known in ((profiles, PROFILES), (modes, MODES), (setups, SETUPS)):
        unknown = [x for x in name if x not in known]
        if unknown:
            ap.error(f"unknown {', '.join(unknown)}; known: {', '.join(known)}")
    internal = [s for s in setups if "_search" in SETUPS[s]]
    if internal and not args.surrogate:
        ap.error(f"{', '.join(internal)} change the search's settings, which a study file does not hold: they run "
                 "only with --surrogate")
    if "gp" in ",".join(setups):
        try:
            import torch  # noqa: F401
        except ImportError:
            ap.error("the gp setups need torch: pip install -e '.[gp]'")
    if args.surrogate and (args.requests not in SINGLE_NOISE or args.generations not in CONCURRENT_NOISE):
        ap.error(f"the surrogate knows the noise of --requests {', '.join(map(str, SINGLE_NOISE))} and "
                 f"--generations {', '.join(map(str, CONCURRENT_NOISE))} only")
    name = "surrogate" if args.surrogate else "emulator"
    name += f"-r{args.requests}" if args.requests != REQUESTS else ""
    name += f"-g{args.generations}" if args.generations != GENERATIONS else ""
    out = args.out / name
    work = out / "studies"
    work.mkdir(parents=True, exist_ok=True)
    results_file = out / "results.jsonl"
    done = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.exists() else []
    have = {(r["profile"], r["mode"], r["setup"], r["seed"], r["cap"]) for r in done}
    truths = {p: truth_of(p, args.out) for p in profiles}
    todo = [(p, m, s, seed) for seed in seeds_of(args.seeds) for p in profiles for m in modes for s in setups
            if (p, m, s, seed, args.cap) not in have and not args.report]
    lock = threading.Lock()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    started = time.monotonic()
    print(f"{len(todo)} studies to run ({len(done)} already in {results_file})", flush=True)

    def one(item: tuple[str, str, str, int]) -> None:
        p, m, s, seed = item
        runner = surrogate_study if args.surrogate else run_study
        row = runner(work, p, m, s, seed, args.cap, truths[p], args.requests, args.generations)
        with lock:
            done.append(row)
            with open(results_file, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[{time.monotonic() - started:7.0f} s] {p} {m} {s} seed {seed}: "
                  f"{'reached after ' + str(row['reached_at']) if row['reached_at'] else 'not reached'} "
                  f"({row['launches']} launches, {row['trials']} trials, {row['stopped_by']}, {row['wall_s']} s)",
                  flush=True)

    with ThreadPoolExecutor(max_workers=1 if args.surrogate else max(1, min(args.parallel, 2))) as pool:
        list(pool.map(one, todo))
    seeds = set(seeds_of(args.seeds))
    rows = [r for r in done if r["seed"] in seeds and r["cap"] == args.cap and r["profile"] in profiles
            and r["mode"] in modes and r["setup"] in setups]
    if not args.surrogate:  # scored again from each study's storage: the table always reads the studies as they are
        rows = [rescored(work, r, truths[r["profile"]]) for r in rows]
    wall = sum(r["wall_s"] for r in rows)
    print(f"\nlaunches until the pick is within 2% of the optimum: median over seeds, (reached/runs); "
          f"{'SURROGATE (the truth + noise)' if args.surrogate else 'autotune run on the emulator'}; "
          f"cap {args.cap} launches; single stream {args.requests} requests, windows of {args.generations} "
          f"generations; {len(rows)} studies, "
          f"{wall / 3600:.1f} h of study time, "
          f"this run {(time.monotonic() - started) / 3600:.2f} h")
    print(table(rows, profiles, modes, setups, args.cap, truths, sorted(seeds)))
    print("\nper study, median trials / launches as run (reused and rejected configs are trials, not launches)")
    print(trials_table(rows, profiles, modes, setups))
    if not args.surrogate:
        print("\nevery launch's figures against the truth for its config (`autotune sim surface --study`), and the "
              "attempts retried because the client fell behind (client_bound: server starts the budget does not count)")
        print(accuracy_table(work, rows, profiles, truths))


def stored_study(work: Path, row: dict[str, Any]) -> optuna.Study:
    """The study behind a results row, from its storage in ``work`` (as run_study left it)."""
    name = f"{row['profile']}-{row['mode']}-{row['setup']}-{row['seed']}"
    return load_existing_study(name, f"sqlite:///{work / name}.db")


def rescored(work: Path, row: dict[str, Any], truth: Truth) -> dict[str, Any]:
    """``row`` with the launch at which its study's pick came within 2%, and its picks, read again from the study."""
    state = progress(row["mode"], truth, stored_study(work, row))
    return {**row, "reached_at": state["reached_at"], "picks": state["picks"], "launches": state["launches"]}


def accuracy_table(work: Path, rows: list[dict[str, Any]], profiles: list[str], truths: dict[str, Truth]) -> str:
    """Per profile and figure: launches measured, median and 90th percentile of |measured / truth - 1|, the worst
    error (signed), the share of launches off by more than 5%, the share whose 95% interval held the truth; and the
    client_bound retries per study."""
    errors: dict[tuple[str, str], list[float]] = {}
    held: dict[tuple[str, str], list[bool]] = {}
    retries: dict[str, list[int]] = {}
    for r in rows:
        trials = stored_study(work, r).get_trials(deepcopy=False)
        retries.setdefault(r["profile"], []).append(sum(TrialRecord.of(t).reason == "client_bound" for t in trials))
        truth = truths[r["profile"]]
        for t in trials:
            rec, key = TrialRecord.of(t), config_of(t)
            if not rec.feasible or rec.reused_from is not None or key not in truth.single:
                continue
            metrics = rec.metrics
            for figure, table_ in (("single", truth.single), ("concurrent", truth.concurrent)):
                measured = metrics.get(f"{figure}_tok_s")
                if measured:
                    error = measured / table_[key] - 1
                    errors.setdefault((r["profile"], figure), []).append(error)
                    level = 1 if figure == "single" else metrics.get("concurrency")
                    half = rec.level(level).get("output_tok_s_rel_ci")
                    if half is not None:
                        held.setdefault((r["profile"], figure), []).append(abs(error) <= half * (1 + error))
    lines = [f"{'profile':9} {'figure':11} {'launches':>8} {'median':>7} {'p90':>7} {'worst':>7} {'>5%':>5}"
             f" {'95% held':>8} {'client_bound per study':>23}"]
    for p in profiles:
        for figure in ("single", "concurrent"):
            e = errors.get((p, figure), [])
            if not e:
                continue
            a = sorted(abs(x) for x in e)
            worst = max(e, key=abs)
            lines.append(f"{p:9} {figure:11} {len(e):8d} {statistics.median(a):7.1%} {a[int(0.9 * (len(a) - 1))]:7.1%}"
                         f" {worst:+7.1%} {sum(x > 0.05 for x in a) / len(a):5.0%}"
                         f" {_share(held.get((p, figure), [])):>8} {statistics.mean(retries[p]):23.1f}")
    return "\n".join(lines)


def _share(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.0%}" if flags else "-"


if __name__ == "__main__":
    main()
