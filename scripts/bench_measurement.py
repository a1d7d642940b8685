#!/usr/bin/env python3
"""Can the measurement be trusted? (issue 4)

1. Accuracy: for several configs, start the emulator, measure it with the tuner's own Bench (the code `autotune run`
   and `autotune bench` use) and compare with the emulator's noise-free truth (`autotune sim surface`).
   Goal: single-stream tok/s within 3%, concurrency-32 output throughput within 5% (median of 5 runs).
2. Staged pruning: the same 30-trial study with pruning on and off; how much measuring time pruning saves.

Rates are divided by the emulator's --sim-speedup before comparing (the emulator multiplies every rate by it). The
concurrent level runs at a lower speedup than the single stream: at 32 streams x thousands of tokens per second the
Python client on a 2-core machine, not the config, would set the pace.
Usage: python scripts/bench_measurement.py [--runs 5] [--speedup 10] [--concurrent-speedup 2] [--trials 30]
       [--skip-accuracy] [--skip-pruning]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.bench.measure import Bench  # noqa: E402
from autotune.bench.workload import load_prompts  # noqa: E402
from autotune.engines import get_engine  # noqa: E402
from autotune.health import wait_ready  # noqa: E402
from autotune.score import metrics_of  # noqa: E402
from autotune.sim.surface import surface  # noqa: E402
from autotune.sim.tokens import encode  # noqa: E402
from autotune.study import WorkloadSpec  # noqa: E402
from autotune.targets.local import LocalSpec, LocalTarget  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.studies import write_study  # noqa: E402

CONFIGS = [(1, 1, 2), (3, 1, 4), (5, 1, 6), (3, 4, 8), (6, 4, 16), (2, 8, 16)]
MAX_TOKENS = 256
ENGINE = get_engine("sglang")


def measure(work: Path, config: tuple[int, int, int], workload: WorkloadSpec, speedup: float, runs: int,
            prompts: list[str]) -> list[dict]:
    """Start the emulator ``runs`` times with ``config`` and measure it; the metrics of each run, at speedup 1."""
    steps, topk, draft = config
    port = free_port()
    target = LocalTarget(LocalSpec(name="bench", server_port=port), cwd=work)
    argv = ["autotune-sim", "--model-path", "/m", "--tp-size", "4", "--port", str(port), "--speculative-algorithm",
            "EAGLE", "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(draft), "--sim-time-scale", "0.01", "--sim-speedup", str(speedup)]
    out = []
    try:
        for run in range(runs):
            deployment = target.deploy([*argv, "--sim-seed", str(run)], {}, work / f"{port}-{run}.log")
            wait_ready(deployment, ENGINE, interval=0.25, timeout=60)
            metrics = metrics_of(Bench(deployment.base_url, ENGINE, workload, prompts, seed=run).run(), None)
            out.append({k: v / speedup for k, v in metrics.items() if k in ("single_tok_s", "concurrent_tok_s")})
    finally:
        target.stop()
    return out


def accuracy(work: Path, runs: int, speedup: float, concurrent_speedup: float) -> None:
    prompts = load_prompts("builtin", work)
    prompt_tokens = round(statistics.mean(len(encode(p, 248320)) for p in prompts))
    truth = {tuple(c["params"].values()): c for c in surface("qwen122b", 32, prompt_tokens=prompt_tokens,
                                                             output_tokens=MAX_TOKENS)["configs"]}
    single_load = WorkloadSpec(max_tokens=MAX_TOKENS, concurrency=(1,), requests=16, warmup=2, max_repeats=1)
    busy_load = WorkloadSpec(max_tokens=MAX_TOKENS, concurrency=(32,), requests=64, warmup=2, max_repeats=1)
    print(f"accuracy: qwen122b profile, {MAX_TOKENS} tokens per request, prompts of {prompt_tokens} tokens on "
          f"average; single stream: 16 requests at --sim-speedup {speedup:g}; concurrency 32: 64 requests at "
          f"--sim-speedup {concurrent_speedup:g}; median of {runs} runs")
    print(f"{'steps':>5} {'topk':>4} {'draft':>5} | {'single truth':>12} {'measured':>9} {'error':>7} | "
          f"{'c32 truth':>9} {'measured':>9} {'error':>7} | mrr")
    worst = [0.0, 0.0]
    for steps, topk, draft in CONFIGS:
        single = [r["single_tok_s"] for r in measure(work, (steps, topk, draft), single_load, speedup, runs, prompts)]
        busy = [r["concurrent_tok_s"] for r in measure(work, (steps, topk, draft), busy_load, concurrent_speedup,
                                                       runs, prompts)]
        t = truth[(steps, topk, draft)]
        s_med, c_med = statistics.median(single), statistics.median(busy)
        s_err = s_med / t["single_tok_s"] - 1
        c_err = c_med / t["concurrent_tok_s"] - 1
        worst = [max(worst[0], abs(s_err)), max(worst[1], abs(c_err))]
        print(f"{steps:>5} {topk:>4} {draft:>5} | {t['single_tok_s']:>12.1f} {s_med:>9.1f} {s_err:>+7.1%} | "
              f"{t['concurrent_tok_s']:>9.1f} {c_med:>9.1f} {c_err:>+7.1%} | {t['max_running_requests']}")
    print(f"worst error: single-stream {worst[0]:.1%} (goal <= 3%), concurrency 32 {worst[1]:.1%} (goal <= 5%)")


def pruning(work: Path, trials: int) -> None:
    results = {}
    for pruned in (True, False):
        name = "pruned" if pruned else "unpruned"
        study = write_study(work, name, trials=trials, seed=11,
                            workload="max_tokens = 128\nconcurrency = [1, 8, 32]\nrequests = 16\nwarmup = 1",
                            args={"sim-time-scale": 0.01, "sim-speedup": 25})
        if not pruned:
            study.write_text(study.read_text().replace("seed = 11\n", "seed = 11\npruning = false\n"))
        env = {**os.environ, "XDG_STATE_HOME": str(work / f"state-{name}")}
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=work, check=True,
                       stdout=subprocess.DEVNULL, env=env)
        wall = time.monotonic() - start
        rows = json.loads(subprocess.run([sys.executable, "-m", "autotune", "status", "--study", str(study),
                                          "--json"], cwd=work, check=True, capture_output=True, text=True,
                                         env=env).stdout)["trials"]
        measuring = sum(r["timings"].get("measuring", 0.0) for r in rows)
        n_pruned = sum(1 for r in rows if r["reason"] == "pruned")
        best = max((r["value"] for r in rows if r["state"] == "COMPLETE" and r["value"] is not None), default=None)
        results[name] = (wall, measuring, n_pruned, best)
        print(f"{name:>9}: {trials} trials in {wall:.0f} s, {measuring:.0f} s measuring, {n_pruned} pruned, "
              f"best {best:.3f}")
    (w1, m1, _, _), (w0, m0, _, _) = results["pruned"], results["unpruned"]
    print(f"staged pruning saved {1 - m1 / m0:.0%} of the measuring time ({m0 - m1:.0f} s) and "
          f"{1 - w1 / w0:.0%} of the wall time over {trials} trials")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--speedup", type=float, default=10.0, help="emulator speedup for the single stream")
    ap.add_argument("--concurrent-speedup", type=float, default=2.0, help="emulator speedup at concurrency 32")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-pruning", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        if not args.skip_accuracy:
            accuracy(work, args.runs, args.speedup, args.concurrent_speedup)
        if not args.skip_pruning:
            pruning(work, args.trials)


if __name__ == "__main__":
    main()
