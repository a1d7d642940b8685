#!/usr/bin/env python3
"""Several workers on one study: wall time of a 30-trial study with 1, 2 and 3 workers sharing a real
PostgreSQL server, each worker on its own emulated GPU host (a local target on its own port).

The emulator's startup and generation are waits, not computation, so on a 2-core machine the workers overlap the
way GPU hosts would (server start ~5 s, measurement ~2 s per trial here). Goal: close to linear, >= 1.8x with 2.
Usage: python scripts/bench_workers.py [--trials 30] [--workers 1 2 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.testing import postgres  # noqa: E402
from autotune.testing.studies import write_multi  # noqa: E402


def run(work: Path, server: str, workers: int, trials: int) -> tuple[float, dict[str, int], int]:
    names = ["gpu1", "gpu2", "gpu3", "gpu4"][:workers]
    study, _ = write_multi(work, postgres.new_database(server), names, trials)
    # slower starts than the tests' (5 s, like a small model), so that trials are dominated by the server as on GPUs
    study.write_text(study.read_text().replace("sim-time-scale = 0.01", "sim-time-scale = 0.05")
                     .replace("sim-speedup = 10", "sim-speedup = 5"))
    env = {**os.environ, "XDG_STATE_HOME": str(work / f"state-{workers}")}
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(study), "--all-targets"], cwd=work,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    rows = json.loads(subprocess.run([sys.executable, "-m", "autotune", "status", "--study", str(study), "--json"],
                                     cwd=work, env=env, check=True, capture_output=True, text=True).stdout)["trials"]
    per_worker: dict[str, int] = {}
    for r in rows:
        per_worker[r["target"]] = per_worker.get(r["target"], 0) + 1
    launches = sum(1 for r in rows if r["reused_from"] is None and r["reason"] != "invalid_config")
    study.unlink()
    return wall, per_worker, launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    server = os.environ.get(postgres.ENV)
    root = None
    if not server:
        root = postgres.new_root()
        server = postgres.start(root)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            walls: dict[int, float] = {}
            print(f"{args.trials}-trial study on the emulator, workers sharing PostgreSQL")
            for n in args.workers:
                wall, per_worker, launches = run(Path(tmp), server, n, args.trials)
                walls[n] = wall
                speedup = f"{walls[1] / wall:.2f}x" if 1 in walls else "-"
                print(f"{n} worker(s): {wall:6.1f} s wall, speed-up {speedup:>6}, {launches} launches, "
                      f"trials per worker {dict(sorted(per_worker.items()))}")
    finally:
        if root is not None:
            postgres.stop(root)


if __name__ == "__main__":
    main()
