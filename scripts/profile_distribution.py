#!/usr/bin/env python3
"""What do random emulator hosts look like? A sanity check of `autotune sim profile --random`'s distribution.

Draws N random hosts whose seeds come from the clock (printed, so a run can be repeated with --seeds) and, for each
and for the five named profiles, reads the emulator's own closed form (`autotune.sim.surface.surface`, the figures of
`autotune sim surface`) over the default space (steps 1-8, topk 1/2/4/8, draft tokens 2-32; 571 valid configs) at
concurrency 32, and prints:

- fit: the share of valid configs that start (the rest fail for memory);
- for each objective (single stream, c32, and weighted: the geometric mean of both relative to the baseline, as the
  tuner's weighted objective), the optimum's (steps, topk, draft), whether it is a chain (topk 1) or a tree, its gain
  over the baseline (steps 1, topk 1, draft 2) and how many configs lie within 2 % of it;
- oom: how many of the engine's starting points (autotune.engines.sglang's own starting_points for that space) fail
  for memory.

Usage: python scripts/profile_distribution.py [--hosts 30] [--seeds 1,2,3] [--concurrency 32]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from typing import Any

from autotune.engines import SGLang
from autotune.sim.profile import load_profile
from autotune.sim.random_profile import draw
from autotune.sim.surface import DEFAULT_SPACE, DRAFT, STEPS, TOPK, surface

NAMED = ("qwen122b", "llama8b", "llama70b", "qwen235b", "qwen14b")
BASELINE = (1, 1, 2)
OBJECTIVES = ("single", "c32", "weighted")


def key(row: dict[str, Any]) -> tuple[int, int, int]:
    p = row["params"]
    return p[STEPS], p[TOPK], p[DRAFT]


def starting_points() -> list[tuple[int, int, int]]:
    """The engine's own opening for the default space (the product's code, not a copy)."""
    points = SGLang().starting_points(DEFAULT_SPACE, {"speculative-algorithm": "EAGLE"})
    return [(p[STEPS], p[TOPK], p[DRAFT]) for p in points]


def survey(profile: Any, concurrency: int) -> dict[str, Any]:
    """One profile's landscape: fit share, each objective's optimum, gain and near-optimal count, OOM starts."""
    rows = surface(profile, concurrency)["configs"]
    by_key = {key(r): r for r in rows}
    fitting = [r for r in rows if r["fits"]]
    base = by_key[BASELINE]
    values = {
        "single": lambda r: r["single_tok_s"],
        "c32": lambda r: r["concurrent_tok_s"],
        "weighted": lambda r: math.sqrt(r["single_tok_s"] / base["single_tok_s"]
                                        * r["concurrent_tok_s"] / base["concurrent_tok_s"]),
    }
    out: dict[str, Any] = {
        "configs": len(rows),
        "fit": len(fitting) / len(rows),
        "baseline_fits": base["fits"],
        "oom_starts": sum(not by_key[p]["fits"] for p in starting_points()),
        "starts": len(starting_points()),
    }
    for name, value in values.items():
        best = max(fitting, key=value)
        top = value(best)
        out[name] = {
            "config": key(best),
            "tree": key(best)[1] > 1,
            "gain": top / value(base),
            "near": sum(value(r) >= 0.98 * top for r in fitting),
        }
    return out


def row_text(label: str, s: dict[str, Any], width: int) -> str:
    cells = [f"{label:<{width}}", f"{s['fit']:>5.0%}", f"{s['oom_starts']}/{s['starts']}"]
    for name in OBJECTIVES:
        o = s[name]
        config = "{},{},{}".format(*o["config"])
        cells.append(f"{config:>8} {'tree' if o['tree'] else 'chain':<5} {o['gain']:>5.2f}x {o['near']:>4}")
    return "  ".join(cells)


def header(width: int) -> str:
    parts = [f"{'host':<{width}}", "  fit", "oom"]
    parts += [f"{name + ' optimum':>14} {'gain':>6} {'<2%':>4}" for name in OBJECTIVES]
    return "  ".join(parts)


def summary(label: str, surveys: list[dict[str, Any]]) -> list[str]:
    n = len(surveys)
    lines = [f"{label} ({n} hosts):"]
    fits = [s["fit"] for s in surveys]
    lines.append(f"  configs that fit: median {statistics.median(fits):.0%}, min {min(fits):.0%}, max {max(fits):.0%}")
    oom = [s for s in surveys if s["oom_starts"]]
    lines.append(f"  hosts where a starting point fails for memory: {len(oom)} of {n} "
                 f"(starting points failing: {sum(s['oom_starts'] for s in surveys)} of "
                 f"{sum(s['starts'] for s in surveys)})")
    for name in OBJECTIVES:
        trees = sum(s[name]["tree"] for s in surveys)
        gains = sorted(s[name]["gain"] for s in surveys)
        near = sorted(s[name]["near"] for s in surveys)
        steps = sorted(s[name]["config"][0] for s in surveys)
        topks = [s[name]["config"][1] for s in surveys]
        lines.append(
            f"  {name:>8} optimum: {trees} trees, {n - trees} chains; topk "
            + ", ".join(f"{k}: {topks.count(k)}" for k in (1, 2, 4, 8))
            + f"; steps median {statistics.median(steps):g} (min {steps[0]}, max {steps[-1]}); gain over the "
            f"baseline median {statistics.median(gains):.2f}x (min {gains[0]:.2f}, max {gains[-1]:.2f}); configs "
            f"within 2%: median {statistics.median(near):g} (min {near[0]}, max {near[-1]})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=30, help="random hosts to draw (default 30)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds to repeat a printed run")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
        print(f"seeds (given): {','.join(map(str, seeds))}")
    else:
        clock = time.time_ns()
        rng = random.Random(clock)
        seeds = [rng.randrange(10**9) for _ in range(args.hosts)]
        print(f"seeds (from the clock, {clock}): {','.join(map(str, seeds))}")
    print(f"starting points: {' '.join('{},{},{}'.format(*p) for p in starting_points())}; baseline "
          f"{'{},{},{}'.format(*BASELINE)}; optimum columns: steps,topk,draft, chain (topk 1) or tree, gain over "
          "the baseline, configs within 2%")
    print()
    hosts = [draw(seed) for seed in seeds]
    width = 16
    print(header(width))
    random_surveys = []
    for host in hosts:
        s = survey(host.profile(), args.concurrency)
        random_surveys.append(s)
        print(row_text(host.name, s, width) + f"  {host.describe()}")
    print()
    named_surveys = []
    for name in NAMED:
        s = survey(load_profile(name), args.concurrency)
        named_surveys.append(s)
        print(row_text(name, s, width))
    print()
    print("\n".join(summary("random hosts", random_surveys)))
    print("\n".join(summary("named profiles", named_surveys)))


if __name__ == "__main__":
    main()
