#!/usr/bin/env python3
# ruff: noqa: E402 - the autotune imports must follow the sys.path insert that makes this checkout importable
"""How fast the tuner notices things, measured against the real emulator on this machine.

1. server ready -> tuner notices: an independent 10 ms poller finds the moment /ready first answers 200;
   the tuner's wait (default 0.5 s interval) returns some time later.           goal: median <= 1 s
2. fatal startup log line -> trial failure: a 10 ms log tail finds the first fatal line; the tuner's wait raises
   some time later.                                                              goal: median <= 3 s
3. the tuner's own overhead per trial, excluding server start and measurement, from a real `autotune run`.
                                                                                 goal: median <= 1 s
Usage: python scripts/bench_readiness.py [--runs 7] [--trials 12]
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.engines import get_engine
from autotune.errors import TrialFailure
from autotune.run import wait_ready
from autotune.targets import LocalSpec, LocalTarget
from autotune.testing.ports import free_port
from autotune.testing.studies import write_study

ENGINE = get_engine("sglang")


def emulator(port: int, *extra: str) -> list[str]:
    return ["autotune-sim", "--model-path", "/m", "--tp-size", "4", "--port", str(port), "--speculative-algorithm",
            "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
            "4", "--sim-time-scale", "0.02", *extra]


def ready_latency(workdir: Path, interval: float) -> float:
    port = free_port()
    target = LocalTarget(LocalSpec(name="bench", server_port=port), cwd=workdir)
    truth: list[float] = []

    def poll() -> None:
        with httpx.Client(timeout=1.0) as c:
            while not truth:
                try:
                    if c.get(f"http://127.0.0.1:{port}/ready").status_code == 200:
                        truth.append(time.monotonic())
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)

    deployment = target.deploy(emulator(port), {}, workdir / f"ready-{port}.log")
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        wait_ready(deployment, ENGINE, interval=interval, timeout=60)
        seen = time.monotonic()
        poller.join(5)
        return seen - truth[0]
    finally:
        target.stop()


def fatal_latency(workdir: Path, interval: float, fault: list[str]) -> tuple[float, str]:
    port = free_port()
    target = LocalTarget(LocalSpec(name="bench", server_port=port), cwd=workdir)
    log = workdir / f"fatal-{port}.log"
    first: list[float] = []

    def tail() -> None:
        offset = 0
        while not first:
            if log.exists():
                data = log.read_bytes()
                for line in data[offset:].decode(errors="replace").splitlines():
                    if ENGINE.fatal_reason(line):
                        first.append(time.monotonic())
                        return
            time.sleep(0.01)

    deployment = target.deploy(emulator(port, *fault), {}, log)
    tailer = threading.Thread(target=tail, daemon=True)
    tailer.start()
    try:
        wait_ready(deployment, ENGINE, interval=interval, timeout=60)
        raise RuntimeError("the faulty server became ready")
    except TrialFailure as e:
        failed = time.monotonic()
        tailer.join(5)
        return failed - first[0], e.reason
    finally:
        target.stop()


def tuner_overhead(workdir: Path, trials: int) -> tuple[list[float], list[float]]:
    study = write_study(workdir, "overhead", launches=trials, workload="max_tokens = 32\nconcurrency = [1, 4]\n"
                        "requests = 4\nwindow_generations = 1\nwarmup = 1\ntolerance = 0.5",
                        health="interval = 0.5\ntimeout = 60")
    env = {**os.environ, "XDG_STATE_HOME": str(workdir / "state")}
    subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL, env=env)
    out = subprocess.run([sys.executable, "-m", "autotune", "status", "--study", str(study), "--json"], cwd=workdir,
                         check=True, capture_output=True, text=True, env=env).stdout
    rows = json.loads(out)["trials"]
    overhead, deploy = [], []
    for a, b in itertools.pairwise(rows):
        t = a["timings"]
        if "waiting" not in t:
            continue  # reused or invalid: no server was started
        span = (dt.datetime.fromisoformat(b["started"]) - dt.datetime.fromisoformat(a["started"])).total_seconds()
        overhead.append(span - t.get("waiting", 0) - t.get("measuring", 0))
        deploy.append(t.get("deploying", 0))
    return overhead, deploy


def describe(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3f} s, min {min(values):.3f}, max {max(values):.3f} "
            f"(n={len(values)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--interval", type=float, default=0.5, help="the tuner's readiness poll interval")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        ready = [ready_latency(work, args.interval) for _ in range(args.runs)]
        print(f"ready -> noticed       (interval {args.interval} s): {describe(ready)}   goal: median <= 1 s")
        for name, fault in (("startup crash", ["--sim-fault", "startup-crash"]),
                            ("KV cache OOM ", ["--mem-fraction-static", "0.3"])):
            runs = [fatal_latency(work, args.interval, fault) for _ in range(args.runs)]
            reasons = sorted({r for _, r in runs})
            print(f"fatal line -> failure  ({name}, reason {', '.join(reasons)}): "
                  f"{describe([x for x, _ in runs])}   goal: median <= 3 s")
        overhead, deploy = tuner_overhead(work, args.trials)
        print(f"tuner overhead / trial (excl. server start and measurement): {describe(overhead)}"
              "   goal: median <= 1 s")
        print(f"  of which stopping the previous server and spawning the next: {describe(deploy)}")


if __name__ == "__main__":
    main()
