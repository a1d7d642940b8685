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
admission, decisions, pruning, scoring and pooled pick (autotune.run.trial.Objective), with
autotune.run.trial.surrogate's launch standing in for a server: the truth plus Gaussian noise (each launch's
single-stream figure off by sd 1% (0.5% with --requests 128), its concurrent figure by sd 1.7% (2.5% with --generations
1), as the real runs' launches against the truth show; each config by a fixed bias of sd 0.5%). It screens setups over
many seeds in seconds; it is not the evidence.

Random hosts: --random N draws N seeds from the clock (printed, and kept in OUT/hosts.txt) for `autotune sim profile
--random SEED --family F` (each family of --families: closed, tree, tight), writes each host's profile to OUT/hosts/,
and gives it a speedup at which its baseline runs concurrency 32 at about 7.5k tok/s by the closed form, like the
named profiles; --random-seeds repeats a printed draw. With random hosts the report leads with the distribution: every
study of the random hosts, of each family, of those where one of the engine's starting points fails for memory, and
of each named profile; the five worst random hosts with what they are. --closed takes the emulator's closed form
(autotune.sim.surface) as the truth instead of `sim surface --study` (minutes per host): a screen, said so in the
table's title. --truth-only computes the truths and stops.

Usage: python scripts/bench_sample_efficiency.py [--profiles qwen122b,llama8b,...] [--modes weighted,concurrent]
           [--setups default,...] [--seeds 10 | --seeds 3-9] [--cap 15] [--parallel 1] [--out DIR] [--surrogate]
           [--report] [--requests 32] [--generations 4] [--random N | --random-seeds S1,S2,...] [--closed]
           [--truth-only]
Results go to DIR/emulator/tally.jsonl (DIR/surrogate/ with --surrogate; a name such as emulator-r128-g1 for other
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

from autotune.results import tally  # noqa: E402
from autotune.record import TrialRecord, storage  # noqa: E402
from autotune.run import by_key, make_plan, make_pruner, queue, study_surface  # noqa: E402
from autotune.run.trial import Noise, Objective, SurrogateLaunch, run_trials  # noqa: E402
from autotune.search import SearchSettings, make_sampler  # noqa: E402
from autotune.sim import model as sim_model  # noqa: E402
from autotune.sim.profile import load_profile  # noqa: E402
from autotune.sim.random_profile import FAMILIES, draw  # noqa: E402
from autotune.engines import SGLang  # noqa: E402
from autotune.errors import InvalidConfig  # noqa: E402
from autotune.sim.surface import DEFAULT_SPACE, DRAFT, STEPS, TOPK, surface  # noqa: E402
from autotune.studyfile import read_study_file  # noqa: E402
from autotune.sim.virtual_run import FULL, QUICK  # noqa: E402
from autotune.testing.ports import free_port  # noqa: E402
from autotune.testing.studies import SPEC_SPACE  # noqa: E402

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
#: a random host's speedup is chosen, like the named profiles', so that concurrency 32 runs at about this many tok/s
#: at the baseline (the emulator's closed form for the bench's request shape)
RANDOM_C32_TOK_S = 7500.0
#: the builtin prompts' mean length in tokens, for the closed form (the truth uses the prompts themselves)
PROMPT_TOKENS = 40


def random_host(seed: int, out: Path, family: str = "closed") -> str:
    """Register the random host of ``seed`` (`autotune sim profile --random SEED --family FAMILY`): its profile file
    in OUT/hosts/, its tp, and a speedup like the named profiles'. Returns its name."""
    host = draw(seed, family=family)
    name = host.name
    if name in PROFILES:
        return name
    path = out / "hosts" / f"{name}.toml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(host.toml())
    profile = load_profile(str(path))
    base = sim_model.figures(profile, sim_model.Config(tp=host.tp, spec=sim_model.Spec(1, 1, 2),
                                                       max_running_requests=sim_model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS),
                             32, PROMPT_TOKENS, MAX_TOKENS)
    speedup = float(f"{RANDOM_C32_TOK_S / max(base.concurrent_tok_s, 1e-9):.3g}")
    PROFILES[name] = {"model": "/models/random", "tp": host.tp, "speedup": speedup, "concurrency": 32,
                      "sim_profile": str(path.resolve()), "describe": host.describe(), "seed": seed,
                      "family": family}
    return name


def clock_seeds(n: int) -> tuple[int, list[int]]:
    """``n`` host seeds drawn from the clock (never chosen by hand): (the clock reading, the seeds)."""
    clock = time.time_ns()
    rng = random.Random(clock)
    return clock, [rng.randrange(10 ** 9) for _ in range(n)]


#: the search's settings until the whole-space model
LOCAL = {"scope": "local", "starting_points": None, "physics": False}
#: sampler setups: [study] keys (a missing key is autotune's default); "_search": SearchSettings fields
SETUPS: dict[str, dict[str, Any]] = {
    "default": {},
    "tpe-random-start": {"initial_design": "random"},
    "tpe-fixed": {"sampler": "tpe", "ranges": "fixed", "startup_trials": 8, "initial_design": "random"},
    "gp": {"sampler": "gp"},
    "random": {"sampler": "random"},
    "random-fixed": {"sampler": "random", "ranges": "fixed"},
    # the search until the whole-space model (scope local: neighbours of the leader and of its close rivals, after
    # the baseline and all six starting points), and the alternatives that one was chosen over
    "previous": {"startup_trials": 6, "_search": {**LOCAL, "oom_in_model": True}},
    "local": {"startup_trials": 6, "_search": LOCAL},
    "no-local": {"startup_trials": 6, "_search": {**LOCAL, "neighbour_every": 0}},
    "local-half": {"startup_trials": 6, "_search": {**LOCAL, "neighbour_every": 2}},
    "no-confirm": {"startup_trials": 6, "_search": {**LOCAL, "confirm_at_most": 0}},
    "no-rivals": {"startup_trials": 6, "_search": {**LOCAL, "rivals_neighbours": False}},
    "random-neighbour": {"startup_trials": 6, "_search": {**LOCAL, "min_points": 10 ** 9}},
    "kappa0": {"startup_trials": 6, "_search": {**LOCAL, "kappa": 0.0}},
    "kappa2": {"startup_trials": 6, "_search": {**LOCAL, "kappa": 2.0}},
    "long-scale": {"startup_trials": 6, "_search": {**LOCAL, "lengthscales": (0.6,)}},
    "s4": {"startup_trials": 4, "_search": LOCAL},
    "s8": {"startup_trials": 8, "_search": LOCAL},
    "local-oom-in-model": {"startup_trials": 6, "_search": {**LOCAL, "oom_in_model": True, "shrink_after_oom": False}},
    "local-shrink": {"startup_trials": 6, "_search": {**LOCAL, "shrink_after_oom": True}},
    # the whole-space model (the default: the 3-step chain and a topk-2 tree, then expected improvement times the
    # chance of fitting, over the physics prior fitted to the opening) against: a memory failure counted in
    # the objective's model at the worst value seen; the same tree measured right below a memory failure; other
    # openings; no physics, or physics from 3 or 8 trees; other acquisitions, kernels and coordinates
    "oom-in-model": {"_search": {"oom_in_model": True}},
    "shrink": {"_search": {"shrink_after_oom": True}},
    "global-s6": {"startup_trials": 6, "_search": {"starting_points": None, "physics": False}},
    "global-s3": {"_search": {"starting_points": 3, "model_from": 4, "physics": False}},
    "global-chains": {"_search": {"starting_points": 2, "physics": False}},
    "global-s1": {"_search": {"starting_points": 1, "model_from": 2, "physics": False}},
    "open-tree2": {"_search": {"physics": False}},
    "open-tree4": {"_search": {"starting_points": (0, 4), "physics": False}},
    "physics-s6": {"startup_trials": 6, "_search": {"physics_from": 3, "starting_points": None}},
    "physics-s3": {"_search": {"physics_from": 3, "starting_points": 3, "model_from": 4}},
    "physics-s2-m3": {"_search": {"physics_from": 3, "starting_points": 2}},
    "physics-m6": {"_search": {"starting_points": 2, "physics_from": 6}},
    "physics-m8": {"_search": {"starting_points": 2, "physics_from": 8}},
    "ucb": {"_search": {"acquisition": "ucb", "kappa": 2.0, "starting_points": 2, "physics": False}},
    "signal": {"_search": {"min_signal": 0.003, "starting_points": 2, "physics": False}},
    "hybrid2": {"_search": {"local_every": 2, "starting_points": 2, "physics": False}},
    "hybrid3": {"_search": {"local_every": 3, "starting_points": 2, "physics": False}},
    "geo-linear": {"_search": {"geometry": "linear", "starting_points": 2, "physics": False}},
    "geo-log": {"_search": {"geometry": "log", "starting_points": 2, "physics": False}},
    "draft-linear": {"_search": {"geometry": "draft-linear", "starting_points": 2, "physics": False}},
    "draft-log": {"_search": {"geometry": "draft-log", "starting_points": 2, "physics": False}},
    "ls-long": {"_search": {"lengthscales": (0.25, 0.4, 0.7, 1.2), "starting_points": 2, "physics": False}},
    "ls-035": {"_search": {"lengthscales": (0.35,), "starting_points": 2, "physics": False}},
    # when each topk no launch has tried gets one (at the model's best config there): as soon as the tuner's own
    # proposals begin, 6 launches before the confirmations (the default), 3 before, right before, or never
    "cover-early": {"_search": {"cover": "early"}},
    "cover-late": {"_search": {"cover": "late", "cover_room": 3}},
    "cover-last": {"_search": {"cover": "late", "cover_room": 0}},
    "cover-room6": {"_search": {"cover": "late", "cover_room": 6}},
    "cover-off": {"_search": {"cover": "off"}},
    # physics set aside after its first miss beyond its own interval (the default), after its second, never
    "physics-miss2": {"_search": {"physics_misses": 2}},
    "physics-keep": {"_search": {"physics_misses": 0}},
    # physics from the opening's three trees (the default) against from six, four and five (six the default before)
    "physics-from6": {"_search": {"physics_from": 6}},
    "physics-from4": {"_search": {"physics_from": 4}},
    "physics-from5": {"_search": {"physics_from": 5}},
    # a region covered only by a measurement, a coverage or starting point that ran out of memory followed below
    # it, the boundary a line per width (the default) against: covered by any launch there, memory failures and
    # crashes included, and no follow-up (the rule before); no follow-up; the coverage launch by the model's mean
    # times the chance of fitting; every config a failure reaches in doubt alike, per width or anywhere (before)
    "cover-by-launch": {"_search": {"cover_by": "launch", "follow_oom": False}},
    "no-follow": {"_search": {"follow_oom": False}},
    "cover-product": {"_search": {"cover_fit": 0.0}},
    "cover-fit03": {"_search": {"cover_fit": 0.3}},
    "boundary-topk": {"_search": {"boundary": "topk"}},
    "boundary-one": {"_search": {"boundary": "one"}},
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


def truth_of(profile: str, out: Path, closed: bool = False) -> Truth:
    """The truth for the bench's workload on ``profile``: `autotune sim surface --study` for its study file (the
    emulator's own scheduler driven by a perfect client with the same prompts, max_tokens and levels, noise off),
    for every config of the space; computed once per profile and speedup and kept in OUT/truth/ (it takes minutes; a
    random host's with the shorter virtual runs of autotune.sim.virtual_run.QUICK, which settle to about 0.5%, three
    times sooner). ``closed``: the emulator's closed form instead (autotune.sim.surface, for the builtin prompts' mean
    length and the bench's max_tokens; a fraction of a second), to screen designs on many hosts; never the final
    tables'."""
    quick = profile.startswith("random-")
    kind = "closed-" if closed else "quick-" if quick else ""
    cache = out / "truth" / f"{kind}{profile}-x{PROFILES[profile]['speedup']:g}.json"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        path = write_study(cache.parent, profile, "weighted", "default", 0, 15)
        # the same server under its own name (the studies run it under another: see EMULATOR)
        path.write_text(re.sub(r"(?m)^command = .*$", 'command = ["autotune-sim"]', path.read_text()))
        plan = make_plan(read_study_file(str(path)))
        document = closed_surface(profile, plan) if closed else study_surface(plan, QUICK if quick else FULL)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        tmp.rename(cache)
    surface_ = json.loads(cache.read_text())
    rows = surface_["configs"]
    key = lambda r: (r["params"][STEPS], r["params"][TOPK], r["params"][DRAFT])  # noqa: E731
    return Truth(single={key(r): r["single_tok_s"] for r in rows},
                 concurrent={key(r): r["concurrent_tok_s"] for r in rows}, fits={key(r): r["fits"] for r in rows},
                 surface=surface_)


def closed_surface(profile: str, plan: Any) -> dict[str, Any]:
    """The closed form's figures for the bench's workload in `autotune sim surface --study --json`'s shape, for the
    configs the study's space accepts (as `sim surface --study`: a config the engine rejects has no figures)."""
    p = PROFILES[profile]
    prof = load_profile(p.get("sim_profile", profile))
    rows = []
    for r in surface(prof, 32, prompt_tokens=PROMPT_TOKENS, output_tokens=MAX_TOKENS)["configs"]:
        if tuple(r["params"].values()) != (1, 1, 2):
            try:
                plan.space.candidate(r["params"])
            except InvalidConfig:
                continue
        single, concurrent = r["single_tok_s"] * p["speedup"], r["concurrent_tok_s"] * p["speedup"]
        rows.append({"params": r["params"], "baseline": tuple(r["params"].values()) == (1, 1, 2),
                     "single_tok_s": single, "concurrent_tok_s": concurrent,
                     "level_tok_s": {"1": single, "32": concurrent}, "accept_length": r["accept_length"],
                     "max_running_requests": r["max_running_requests"], "fits": r["fits"]})
    return {"study": profile, "speedup": p["speedup"], "configs": rows}


def config_of(t: FrozenTrial) -> tuple[int, int, int] | None:
    return key_of(TrialRecord.of(t).config or {})


def key_of(c: dict[str, Any]) -> tuple[int, int, int] | None:
    if not all(n in c for n in (STEPS, TOPK, DRAFT)):
        return None
    return int(c[STEPS]), int(c[TOPK]), int(c[DRAFT])


#: how the pick is made: as `autotune best` makes it (settled by intervals, a tie to the higher pooled estimate), the
#: same with a tie to the config cheaper to run, or the best pooled estimate (the pick before it was settled)
PICKS = ("settled", "cheaper", "mean")


def pick_value(mode: str, truth: Truth, study: optuna.Study, trials: list[FrozenTrial],
               rule: str = "settled") -> float | None:
    """The true value of the config the tuner would pick from ``trials`` by ``rule`` (PICKS), relative to the
    optimum; for pareto the measured front's hypervolume relative to the true one."""
    if mode == "pareto":
        measured = [t for t in trials if tally.feasible(t) and not TrialRecord.of(t).reused_from is not None]
        front = [t for t in measured if not any(o.values[0] >= t.values[0] and o.values[1] >= t.values[1] and
                                                 tuple(o.values) != tuple(t.values) for o in measured)]
        keys = [k for k in (config_of(t) for t in front) if k is not None]
        return truth.hypervolume(keys) / truth.true_front_hv() if keys else None
    if rule == "mean":
        leader = tally.top(tally.estimates(study, trials))
    else:
        chosen = tally.pick(study, trials, "cheaper" if rule == "cheaper" else "estimate")
        leader = None if chosen is None else chosen.estimate
    key = None if leader is None else config_of(trials_by_number(trials)[leader.trials[0]])
    return None if key is None else truth.value(mode, key) / truth.optimum(mode)


def trials_by_number(trials: list[FrozenTrial]) -> dict[int, FrozenTrial]:
    return {t.number: t for t in trials}


def progress(mode: str, truth: Truth, study: optuna.Study) -> dict[str, Any]:
    """Launches so far, the launch count at which the pick was first within 2% of the optimum (None: not yet), the
    pick's share of the optimum after each launch, and trials since the last launch; the same for the other rules
    of PICKS (``_cheaper``, ``_mean``), and whether the last pick was a tie."""
    trials = study.get_trials(deepcopy=False)
    finished = sorted((t for t in trials if t.state in tally.FINISHED), key=lambda t: t.number)
    again = tally.retried(trials)  # an attempt cut short for the infrastructure's sake is not a launch
    launches, since = 0, 0
    at: dict[str, int | None] = dict.fromkeys(PICKS)
    picks: dict[str, list[float | None]] = {rule: [] for rule in PICKS}
    for n, t in enumerate(finished):
        since += 1
        if not TrialRecord.of(t).launched or t.number in again:
            continue
        launches, since = launches + 1, 0
        for rule in PICKS:
            value = pick_value(mode, truth, study, finished[:n + 1], rule)
            picks[rule].append(value)
            if at[rule] is None and value is not None and value >= TARGET:
                at[rule] = launches
    chosen = tally.pick(study, finished) if mode != "pareto" else None
    out = {"launches": launches, "reached_at": at["settled"], "trials": len(finished), "since_launch": since,
           "picks": picks["settled"], "tie": bool(chosen and chosen.tied)}
    for rule in PICKS[1:]:
        out[f"reached_at_{rule}"], out[f"picks_{rule}"] = at[rule], picks[rule]
    return out


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
sim-profile = "{p.get('sim_profile', profile)}"
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
    study = storage.load_existing_study(name, f"sqlite:///{db}")
    state = progress(mode, truth, study)
    return {"profile": profile, "mode": mode, "setup": setup, "seed": seed, "cap": cap,
            "reached_at": state["reached_at"], "launches": state["launches"], "trials": state["trials"],
            "picks": state["picks"], "stopped_by": "budget", "wall_s": round(time.monotonic() - start, 1),
            "exit": proc.returncode}


def surrogate_study(work: Path, profile: str, mode: str, setup: str, seed: int, cap: int, truth: Truth,
                    requests: int = REQUESTS, generations: int = GENERATIONS) -> dict[str, Any]:
    """The same study file run in-process through the product's own trial (its queue, admission, search,
    decisions, pruning and scoring), with the truth plus noise (autotune.run.trial.surrogate) standing in for each
    launch: every measurement off by a normal error (sd SINGLE_NOISE at ``requests``, CONCURRENT_NOISE at
    ``generations``) and each config by a fixed bias of its own (sd SURROGATE_BIAS)."""
    path = write_study(work, profile, mode, setup, seed, cap, requests, generations)
    spec = read_study_file(str(path))
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
    stopped_by = run_trials(study, plan, cap, objective)
    state = progress(mode, truth, study)
    return {"profile": profile, "mode": mode, "setup": setup, "seed": seed, "cap": cap,
            "reached_at": state["reached_at"], "launches": state["launches"], "trials": state["trials"],
            "picks": state["picks"], **{k: v for k, v in state.items() if k.startswith(("reached_at_", "picks_"))},
            "tie": state["tie"], "stopped_by": stopped_by, "wall_s": round(time.monotonic() - start, 1),
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


def oom_start_hosts(profiles: list[str], truths: dict[str, Truth]) -> set[str]:
    """Hosts where one of the engine's starting points (the product's own, for the default space) fails for
    memory."""
    points = [key_of(p) for p in SGLang().starting_points(DEFAULT_SPACE, {"speculative-algorithm": "EAGLE"})]
    return {h for h in profiles if any(not truths[h].fits.get(k, True) for k in points)}


def lowest_prior_topk_hosts(profiles: list[str], truths: dict[str, Truth], mode: str) -> set[str]:
    """Hosts whose optimum (for ``mode``) lies at the topk the opening and the physics prior rank lowest: physics.py
    fitted to the truth at the baseline and every one of the engine's starting points, each topk's best config by
    its prediction, the topk whose best is lowest."""
    from autotune.search import Observation, Physics

    opening = [(1, 1, 2)] + [key_of(p) for p in SGLang().starting_points(DEFAULT_SPACE,
                                                                          {"speculative-algorithm": "EAGLE"})]
    out = set()
    for h in profiles:
        truth = truths[h]
        lengths = {key_of(r["params"]): r["accept_length"] for r in truth.surface["configs"]}
        seen = [Observation(k, lengths[k], {1: truth.single[k], 32: truth.concurrent[k]})
                for k in opening if truth.fits.get(k) and lengths.get(k)]
        model = Physics.fit(seen, 3)
        if model is None:
            continue
        fitting = [k for k, fit in truth.fits.items() if fit]
        best_by_topk = {t: max(_predicted(model, mode, k, truth.base) for k in fitting if k[1] == t)
                        for t in {k[1] for k in fitting}}
        lowest = min(best_by_topk, key=best_by_topk.get)
        optimum = max(fitting, key=lambda k: truth.value(mode, k))
        if optimum[1] == lowest:
            out.add(h)
    return out


def _predicted(model: Any, mode: str, key: tuple[int, int, int], base: tuple[int, int, int]) -> float:
    """physics.py's prediction of a config's value for ``mode`` (weighted: relative to the baseline's)."""
    v, b = model.tok_s(key), model.tok_s(base)
    if mode == "single":
        return v[1]
    if mode == "concurrent":
        return v[32]
    return math.sqrt(v[1] / b[1] * v[32] / b[32])


def quantile(values: list[float], q: float) -> float:
    """The value that a share ``q`` of ``values`` is at or below (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def distribution_table(rows: list[dict[str, Any]], profiles: list[str], modes: list[str], setups: list[str],
                       cap: int, truths: dict[str, Truth]) -> str:
    """Per group of hosts (the random ones, each family of them, those where a starting point fails for memory,
    those whose optimum lies at the topk the opening and the physics prior rank lowest (per mode: prior-lowest),
    each named profile), mode and setup, over every study (hosts x seeds): the median launch at which the pick came
    within 2%, the share of studies within 2% by ``cap``, the worst decile's and the median pick after ``cap``
    launches, and the worst study."""
    randoms = [p for p in profiles if p.startswith("random-")]
    oom = oom_start_hosts(randoms, truths)
    every = tuple(modes)
    groups = ([(f"random hosts ({len(randoms)})", set(randoms), every)] if randoms else [])
    for family in FAMILIES:
        members = {p for p in randoms if PROFILES[p].get("family", "closed") == family}
        if members and len(members) < len(randoms):
            groups.append((f"{family} family ({len(members)})", members, every))
    groups += [(f"OOM-start hosts ({len(oom)})", oom, every)] if oom else []
    for m in modes:
        low = lowest_prior_topk_hosts(randoms, truths, m)
        if low:
            groups.append((f"prior-lowest ({len(low)})", low, (m,)))
    groups += [(p, {p}, every) for p in profiles if not p.startswith("random-")]
    head = (f"{'hosts':<22} {'mode':<10} {'setup':<18} {'studies':>7} {'median':>6} {'within 2% by ' + str(cap):>16}"
            f" {'p10 pick':>8} {'median pick':>11}  worst study (host seed: pick, launches to 2%)")
    lines = [head, "-" * len(head)]
    for label, hosts, its_modes in groups:
        for m in its_modes:
            for s in setups:
                sel = [r for r in rows if r["profile"] in hosts and (r["mode"], r["setup"]) == (m, s)]
                if not sel:
                    continue
                reached = sum(r["reached_at"] is not None for r in sel)
                final = [(r["picks"][min(cap, len(r["picks"])) - 1] or 0.0) if r.get("picks") else 0.0 for r in sel]
                worst = min(zip(final, sel, strict=True), key=lambda x: (x[0], -(x[1]["reached_at"] or 99)))
                w = worst[1]
                lines.append(f"{label:<22} {m:<10} {s:<18} {len(sel):>7} {fmt(median_of(sel), cap):>6} "
                             f"{f'{reached}/{len(sel)} ({reached / len(sel):.0%})':>16} {quantile(final, 0.1):>8.3f}"
                             f" {statistics.median(final):>11.3f}  {w['profile']} {w['seed']}: {worst[0]:.3f}, "
                             f"{w['reached_at'] or '>' + str(cap)}")
    return "\n".join(lines)


def setups_table(rows: list[dict[str, Any]], profiles: list[str], modes: list[str], setups: list[str], cap: int,
                 truths: dict[str, Truth]) -> str:
    """One line per setup over the random hosts and those of them where a starting point fails for memory, each mode:
    median launches to 2%, the share of studies within 2% by ``cap``, the worst decile's pick after ``cap``."""
    randoms = [p for p in profiles if p.startswith("random-")]
    groups = [("random", set(randoms)), ("OOM start", oom_start_hosts(randoms, truths))]
    cols = [(g, hosts, m) for g, hosts in groups for m in modes]
    head = f"{'setup':<18} " + " ".join(f"{g + ' ' + m:>22}" for g, _, m in cols)
    under = f"{'median  by ' + str(cap) + '    p10':>22}"
    lines = [head, f"{'':<18} " + " ".join(under for _ in cols), "-" * len(head)]
    for s in setups:
        cells = []
        for _, hosts, m in cols:
            sel = [r for r in rows if r["profile"] in hosts and (r["mode"], r["setup"]) == (m, s)]
            if not sel:
                cells.append(f"{'-':>22}")
                continue
            reached = sum(r["reached_at"] is not None for r in sel) / len(sel)
            final = [(r["picks"][min(cap, len(r["picks"])) - 1] or 0.0) if r.get("picks") else 0.0 for r in sel]
            cells.append(f"{fmt(median_of(sel), cap):>6} {reached:>8.0%} {quantile(final, 0.1):>6.3f}")
        lines.append(f"{s:<18} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def worst_hosts(rows: list[dict[str, Any]], profiles: list[str], modes: list[str], setup: str, cap: int,
                truths: dict[str, Truth], count: int = 5) -> str:
    """The ``count`` random hosts (and modes) whose studies did worst under ``setup`` (lowest median pick after
    ``cap``, then latest median launch), with what the host is."""
    oom = oom_start_hosts(profiles, truths)
    cells = []
    for h in (p for p in profiles if p.startswith("random-")):
        for m in modes:
            sel = [r for r in rows if (r["profile"], r["mode"], r["setup"]) == (h, m, setup)]
            if not sel:
                continue
            final = [(r["picks"][min(cap, len(r["picks"])) - 1] or 0.0) if r.get("picks") else 0.0 for r in sel]
            cells.append((statistics.median(final), -median_of(sel), h, m, sel, final))
    cells.sort(key=lambda c: (c[0], c[1]))
    lines = [f"{'host':<17} {'mode':<10} {'median':>6} {'reached':>7} {'median pick':>11} {'worst':>6}  "
             f"{'optimum':>9} {'gain':>5} {'fit':>4} {'oom start':>9}  host"]
    for _, _, h, m, sel, final in cells[:count]:
        truth = truths[h]
        best = max((k for k, fit in truth.fits.items() if fit), key=lambda k: truth.value(m, k))
        fit = sum(truth.fits.values()) / len(truth.fits)
        reached = sum(r["reached_at"] is not None for r in sel)
        lines.append(f"{h:<17} {m:<10} {fmt(median_of(sel), cap):>6} {f'{reached}/{len(sel)}':>7} "
                     f"{statistics.median(final):>11.3f} {min(final):>6.3f}  {'{},{},{}'.format(*best):>9} "
                     f"{truth.value(m, best) / truth.value(m, truth.base):>5.2f} {fit:>4.0%} "
                     f"{'yes' if h in oom else 'no':>9}  {PROFILES[h].get('describe', '')}")
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
    ap.add_argument("--profiles", default=",".join(PROFILES), help="named profiles ('' for none)")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="N random hosts (`autotune sim profile --random SEED`), seeds drawn from the clock")
    ap.add_argument("--random-seeds", default="", metavar="S1,S2,...",
                    help="random hosts of these seeds (a printed run, repeated); OUT/hosts.txt: every host so far")
    ap.add_argument("--families", default="closed", metavar="closed,tree,tight",
                    help="each random seed's host in these families (`autotune sim profile --family`): the closed "
                         "form's acceptance, the Monte Carlo of SGLang's tree, that tree with the widest tree of "
                         "every width out of memory")
    ap.add_argument("--closed", action="store_true",
                    help="with --surrogate: the closed form as the truth (screening only; the tables' truth is "
                         "`sim surface --study`'s)")
    ap.add_argument("--truth-only", action="store_true", help="compute the hosts' truths (niced) and stop")
    ap.add_argument("--modes", default="weighted,concurrent")
    ap.add_argument("--setups", default="default")
    ap.add_argument("--seeds", default="10", help="N (seeds 0..N-1) or A-B")
    ap.add_argument("--cap", type=int, default=15, help="the studies' budget of launches")
    ap.add_argument("--parallel", type=int, default=1, help="studies at once (more distorts the measurements)")
    ap.add_argument("--out", type=Path, default=REPO / ".bench" / "sample_efficiency")
    ap.add_argument("--surrogate", action="store_true", help="in-process screen: the truth plus noise, no launches")
    ap.add_argument("--report", action="store_true", help="run nothing: print the tables from the results so far")
    ap.add_argument("--pick", choices=PICKS, default="settled",
                    help="score the pick as `autotune best` makes it (settled by intervals, a tie to the higher "
                         "pooled estimate), with a tie to the config cheaper to run, or the best pooled estimate (the "
                         "pick before)")
    ap.add_argument("--requests", type=int, default=REQUESTS, help="the single stream's requests")
    ap.add_argument("--generations", type=int, default=GENERATIONS,
                    help="each concurrency level's window, in generations of requests (c each)")
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    modes, setups = args.modes.split(","), args.setups.split(",")
    seeds_random = [int(x) for x in args.random_seeds.split(",") if x]
    if args.random:
        clock, drawn = clock_seeds(args.random)
        print(f"random hosts: seeds drawn from the clock ({clock}): {','.join(map(str, drawn))}", flush=True)
        seeds_random += drawn
    if args.random:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "hosts.txt", "a") as f:
            f.write(",".join(map(str, drawn)) + "\n")
    profiles += [random_host(seed, args.out, family) for family in args.families.split(",") for seed in seeds_random]
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
    if args.closed and not args.surrogate:
        ap.error("--closed screens with the surrogate only")
    if args.truth_only:
        for p in profiles:
            truth_of(p, args.out, args.closed)
            print(f"truth of {p}: {args.out / 'truth'}", flush=True)
        return
    name = "surrogate-closed" if args.closed else "surrogate" if args.surrogate else "emulator"
    name += f"-r{args.requests}" if args.requests != REQUESTS else ""
    name += f"-g{args.generations}" if args.generations != GENERATIONS else ""
    out = args.out / name
    work = out / "studies"
    work.mkdir(parents=True, exist_ok=True)
    results_file = out / "tally.jsonl"
    done = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.exists() else []
    have = {(r["profile"], r["mode"], r["setup"], r["seed"], r["cap"]) for r in done}
    truths = {p: truth_of(p, args.out, args.closed) for p in profiles}
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
    if args.pick != "settled":
        rows = [{**r, "reached_at": r[f"reached_at_{args.pick}"], "picks": r[f"picks_{args.pick}"]} for r in rows]
    ties = sum(bool(r.get("tie")) for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    print(f"\nlaunches until the pick is within 2% of the optimum: median over seeds, (reached/runs); "
          f"{'SURROGATE (the truth + noise)' if args.surrogate else 'autotune run on the emulator'}; "
          f"cap {args.cap} launches; single stream {args.requests} requests, windows of {args.generations} "
          f"generations; {len(rows)} studies, "
          f"{wall / 3600:.1f} h of study time, "
          f"this run {(time.monotonic() - started) / 3600:.2f} h; the pick "
          + {"settled": "settled by intervals, as `autotune best` makes it", "cheaper": "settled by intervals, a tie "
             "to the cheaper config (--pick cheaper)", "mean": "the best pooled estimate (--pick mean)"}[args.pick]
          + f"; {ties} studies ended on a tie")
    truth_kind = ("the emulator's closed form (screening)" if args.closed else
                  "`autotune sim surface --study` (the emulator's scheduler)")
    randoms = any(p.startswith("random-") for p in profiles)
    print(f"\n{'the distribution: ' if randoms else ''}every study of each group of hosts (hosts x seeds); truth: "
          f"{truth_kind}")
    print(distribution_table(rows, profiles, modes, setups, args.cap, truths))
    print()
    if randoms:
        if len(setups) > 1:
            print(f"\nper setup: median launches to 2%, studies within 2% by launch {args.cap}, the worst decile's "
                  f"pick after {args.cap}")
            print(setups_table(rows, profiles, modes, setups, args.cap, truths))
        for s in setups:
            print(f"\nthe five worst random hosts under {s}")
            print(worst_hosts(rows, profiles, modes, s, args.cap, truths))
            print()
    named = [p for p in profiles if not p.startswith("random-")]
    if named:
        print(table(rows, named, modes, setups, args.cap, truths, sorted(seeds)))
    if named:
        print("\nper study, median trials / launches as run (reused and rejected configs are trials, not launches)")
        print(trials_table(rows, named, modes, setups))
    if not args.surrogate:
        print("\nevery launch's figures against the truth for its config (`autotune sim surface --study`), and the "
              "attempts retried because the client fell behind (client_bound: server starts the budget does not count)")
        print(accuracy_table(work, rows, profiles, truths))


def stored_study(work: Path, row: dict[str, Any]) -> optuna.Study:
    """The study behind a results row, from its storage in ``work`` (as run_study left it)."""
    name = f"{row['profile']}-{row['mode']}-{row['setup']}-{row['seed']}"
    return storage.load_existing_study(name, f"sqlite:///{work / name}.db")


def rescored(work: Path, row: dict[str, Any], truth: Truth) -> dict[str, Any]:
    """``row`` with the launch at which its study's pick came within 2%, and its picks, read again from the study."""
    state = progress(row["mode"], truth, stored_study(work, row))
    return {**row, **{k: v for k, v in state.items() if k.startswith(("reached_at", "picks")) or k in ("launches",
                                                                                                    "tie")}}


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
