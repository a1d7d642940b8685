#!/usr/bin/env python3
"""Judge studies against a measured grid: how close each study's pick came to the best config of a space measured
whole, within that grid's own noise.

A landscape the search was not designed on is only a judge once it is measured, not modelled: on a real engine,
measure the study's space whole once (a study with `sampler = "grid"` and as many launches as the space has configs,
run with `autotune run`), and write it as a grid file:

    python scripts/judge_against_grid.py grid --study GRID.toml --out grid.json

Each config of the grid keeps its pooled estimate and 95% interval (autotune.results.tally.estimates, over every launch
of it) or that it failed (for memory or otherwise). Then judge studies of the same space, engine and workload (their
fixed args equal to the grid's, so that config keys match):

    python scripts/judge_against_grid.py judge --grid grid.json --study S1.toml --study S2.toml

For each study, after each launch, the config it picks (as `autotune best` picks it: autotune.results.tally.pick) is
looked up in the grid; the table gives the launch at which that pick first came within 2% of the grid's best, the pick
after the last launch as a share of the grid's best, and whether the grid cannot tell the two apart (their intervals in
the grid overlap: within the grid's noise, which the table states as the best config's interval). A pick the grid never
measured is said so.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.results import tally  # noqa: E402
from autotune.record import TrialRecord  # noqa: E402
from autotune.record import storage  # noqa: E402
from autotune.studyfile import read_study_file  # noqa: E402

#: the pick's share of the grid's best that counts as found
TARGET = 0.98


def write_grid(study_file: str, out: Path) -> None:
    """The grid file of a finished study that measured the space whole."""
    spec = read_study_file(study_file)
    study = storage.load_existing_study(spec.name, spec.storage)
    trials = study.get_trials(deepcopy=False)
    found = tally.estimates(study, trials)
    configs: dict[str, dict[str, Any]] = {}
    for e in found.values():
        rec = TrialRecord.of(trials[e.trials[0]])
        configs[e.key] = {"config_key": e.key, "params": rec.params, "value": e.value, "low": e.low, "high": e.high,
                          "launches": e.launches, "trials": list(e.trials), "fits": True}
    for t in tally.launches(trials):
        rec = TrialRecord.of(t)
        if rec.config_key and rec.config_key not in configs:
            configs[rec.config_key] = {"config_key": rec.config_key, "params": rec.params, "fits": False,
                                       "reason": rec.reason, "trials": [t.number]}
    out.write_text(json.dumps({"study": spec.name, "objective": spec.objective, "configs": list(configs.values())},
                              indent=1))
    measured = sum(c["fits"] for c in configs.values())
    print(f"{out}: {len(configs)} configs of study {spec.name!r} ({measured} measured, {len(configs) - measured} "
          f"failed)")


def judge(grid_file: Path, study_files: list[str]) -> None:
    grid = json.loads(grid_file.read_text())
    measured = {c["config_key"]: c for c in grid["configs"] if c["fits"]}
    best = max(measured.values(), key=lambda c: c["value"])
    noise = (best["high"] - best["low"]) / 2 / best["value"]
    print(f"grid {grid_file} (study {grid['study']!r}, objective {grid['objective']}): {len(measured)} configs "
          f"measured; best {best['params']} at {best['value']:.4g} [{best['low']:.4g}, {best['high']:.4g}] "
          f"(the grid's noise there: +-{noise:.1%})")
    head = (f"{'study':<28} {'launches':>8} {'to 2%':>6} {'pick after last':>15} {'within noise':>12}  pick")
    print(head)
    print("-" * len(head))
    for path in study_files:
        row = judged(path, measured, best)
        print(f"{row['study']:<28} {row['launches']:>8} {row['reached'] or '-':>6} "
              f"{row['share'] if row['share'] is not None else 'not in grid':>15} {row['within']:>12}  "
              f"{row['params']}")


def judged(study_file: str, grid: dict[str, dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
    """One study against the grid: launches, the launch at which its pick first came within TARGET of the grid's
    best, the pick after its last launch (share of the best) and whether the grid's intervals of the two overlap."""
    spec = read_study_file(study_file)
    study = storage.load_existing_study(spec.name, spec.storage)
    trials = study.get_trials(deepcopy=False)
    finished = sorted((t for t in trials if t.state in tally.FINISHED), key=lambda t: t.number)
    again = tally.retried(trials)
    launches, reached, key = 0, None, None
    for n, t in enumerate(finished):
        if not TrialRecord.of(t).launched or t.number in again:
            continue
        launches += 1
        leader = tally.leader(study, finished[:n + 1])
        key = None if leader is None else leader.key
        value = grid.get(key or "", {}).get("value")
        if reached is None and value is not None and value >= TARGET * best["value"]:
            reached = launches
    pick = grid.get(key or "")
    share = None if pick is None else f"{pick['value'] / best['value']:.3f}"
    within = "-" if pick is None else "yes" if pick["high"] >= best["low"] else "no"
    params = pick["params"] if pick else (None if key is None else "(not in the grid)")
    return {"study": spec.name, "launches": launches, "reached": reached, "share": share, "within": within,
            "params": params}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="write the grid file of a study that measured the space whole")
    g.add_argument("--study", required=True, help="the grid study's file")
    g.add_argument("--out", type=Path, required=True)
    j = sub.add_parser("judge", help="judge studies against a grid file")
    j.add_argument("--grid", type=Path, required=True)
    j.add_argument("--study", action="append", required=True, help="a study file to judge (repeat for more)")
    args = ap.parse_args()
    if args.command == "grid":
        write_grid(args.study, args.out)
    else:
        judge(args.grid, args.study)


if __name__ == "__main__":
    main()
