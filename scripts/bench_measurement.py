#!/usr/bin/env python3
"""Can the measurement be trusted, at any token rate and through the SSH tunnel?

For a few configs and emulator speedups 1..32, the tuner's own measurement (autotune.bench.Bench, what every trial
and `autotune bench` run) of the single stream and of concurrency 32 in steady state, taken twice on the same
server: directly, and through an ssh-process target's default transport (the port forward over a real sshd on
127.0.0.1). Each figure is compared with the truth for the workload (`autotune sim surface --study`); a level the
client could not keep up with fails as client_bound, which the table shows with the share of a request's time spent
outside the server. The client's event rate and CPU share show what one measuring process sustains here.

2. Staged pruning (--pruning): the same study with pruning on and off; how much measuring time pruning saves.

Usage: python scripts/bench_measurement.py [--speedups 1,2,4,8,16,32] [--max-tokens 256] [--requests 32]
       [--window-generations 2] [--pruning] [--trials 30]
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

from autotune.bench.measure import Bench  # noqa: E402
from autotune.bench.workload import load_prompts  # noqa: E402
from autotune.engines import get_engine  # noqa: E402
from autotune.errors import TrialFailure  # noqa: E402
from autotune.health import wait_ready  # noqa: E402
from autotune.plan import make_plan  # noqa: E402
from autotune.truth import study_surface  # noqa: E402
from autotune.study import WorkloadSpec, load_study  # noqa: E402
from autotune.targets.process import ProcessSpec, ProcessTarget  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.studies import write_study  # noqa: E402
from tests.support.sshd import SSHServer  # noqa: E402

CONFIGS = [(3, 1, 4), (8, 4, 11), (1, 1, 2)]
ENGINE = get_engine("sglang")


def measure(url: str, prompts: list[str], level: int, size: int, max_tokens: int) -> dict:
    """One level's figure; ``size``: the single stream's requests, or the window's generations."""
    workload = WorkloadSpec(max_tokens=max_tokens, concurrency=(level,), requests=size, window_generations=size,
                            warmup=1, max_repeats=1)
    bench = Bench(url, ENGINE, workload, prompts, seed=0, levels=(level,))
    try:
        m = bench.run()
    except TrialFailure as e:
        if e.reason != "client_bound":
            raise
        run = bench.measurement.repeats[-1][-1]
        return {"bound": True, "share": run.client_share, "cpu": run.load.cpu, "events": _events(run)}
    run = m.level(level)[0]
    s = m.summary(level)
    return {"bound": False, "tok_s": s["output_tok_s"], "share": run.client_share, "cpu": run.load.cpu,
            "events": _events(run)}


def _events(run) -> float:
    """Token-carrying events the client received per second during the level."""
    events = sum(len(r.trace) for r in run.records)
    spans = [r.start + (r.e2e or 0.0) for r in run.records]
    return events / max(spans) if spans and max(spans) > 0 else 0.0


def accuracy(work: Path, server: SSHServer, speedups: list[int], max_tokens: int, requests: int,
             generations: int) -> None:
    prompts = load_prompts("builtin", work)
    print(f"steady-state measurement vs truth: qwen122b profile, {max_tokens} tokens per request; single stream: "
          f"{requests} requests; concurrency 32: a window of {32 * generations} requests; the same server measured "
          f"directly and through an ssh-process target's default transport (port forward over sshd on 127.0.0.1)")
    print(f"{'config':>10} {'x':>3} {'level':>5} | {'truth':>8} | {'direct':>8} {'error':>7} {'share':>6} | "
          f"{'tunnel':>8} {'error':>7} {'share':>6} {'vs direct':>9} | events/s cpu (tunnel)")
    worst = {"direct": 0.0, "tunnel": 0.0}
    bound = 0
    for config in CONFIGS:
        for k in speedups:
            study = write_study(work, f"b{k}", args={
                "speculative-num-steps": config[0], "speculative-eagle-topk": config[1],
                "speculative-num-draft-tokens": config[2], "sim-speedup": k, "sim-time-scale": 0.002},
                workload=f"max_tokens = {max_tokens}\nconcurrency = [1, 32]\nrequests = {requests}",
                space="".join(f'[space.{n}]\ntype = "categorical"\nchoices = [{v}]\n' for n, v in zip(
                    ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"), config,
                    strict=True)))
            plan = make_plan(load_study(str(study)))
            truth = {int(c): v for c, v in study_surface(plan)["configs"][0]["level_tok_s"].items()}
            spec = ProcessSpec(name="bench", host=server.host, port=server.port, user="root",
                               key_file=str(server.user_key), known_hosts=str(server.known_hosts),
                               workdir=str(work / "remote"), server_port=free_port(), tunnel=True)
            target = ProcessTarget(spec)
            try:
                argv = plan.engine.render([sys.executable, "-m", "autotune.sim"],
                                          {**plan.baseline.args, "port": spec.server_port})
                deployment = target.deploy([*argv, "--sim-seed", "1"], {}, work / f"b{k}.log")
                wait_ready(deployment, ENGINE, 0.25, 120)
                for level, n in ((1, requests), (32, generations)):
                    direct = measure(f"http://127.0.0.1:{spec.server_port}", prompts, level, n, max_tokens)
                    tunnel = measure(deployment.base_url, prompts, level, n, max_tokens)
                    print(_row(config, k, level, truth[level], direct, tunnel, worst))
                    bound += direct["bound"] + tunnel["bound"]
            finally:
                target.stop()
                target.close()
    print(f"worst silent error against the truth: direct {worst['direct']:.1%}, through the tunnel "
          f"{worst['tunnel']:.1%} (goal: within 3%, or client_bound); {bound} level(s) failed as client_bound")


def _row(config: tuple, k: int, level: int, truth: float, direct: dict, tunnel: dict, worst: dict) -> str:
    def cell(r: dict, name: str) -> str:
        if r["bound"]:
            return f"{'bound':>8} {'-':>7} {_pct(r['share']):>6}"
        err = r["tok_s"] / truth - 1
        worst[name] = max(worst[name], abs(err))
        return f"{r['tok_s']:>8.0f} {err:>+7.1%} {_pct(r['share']):>6}"
    vs = (f"{tunnel['tok_s'] / direct['tok_s'] - 1:>+9.1%}" if not (direct["bound"] or tunnel["bound"])
          else f"{'-':>9}")
    return (f"{config!s:>10} {k:>3} {'c' + str(level):>5} | {truth:>8.0f} | {cell(direct, 'direct')} | "
            f"{cell(tunnel, 'tunnel')} {vs} | {tunnel['events']:>8.0f} {tunnel['cpu']:.2f}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def pruning(work: Path, trials: int) -> None:
    results = {}
    for pruned in (True, False):
        name = "pruned" if pruned else "unpruned"
        study = write_study(work, name, trials=trials, seed=11,
                            workload="max_tokens = 128\nconcurrency = [1, 8, 32]\nrequests = 32\nwarmup = 1\n"
                                     "window_generations = 1\ntolerance = 0.1",
                            args={"sim-time-scale": 0.01, "sim-speedup": 8})
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
    ap.add_argument("--speedups", default="1,2,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=32, help="single-stream requests")
    ap.add_argument("--window-generations", type=int, default=2,
                    help="the concurrency-32 window, in generations of 32 requests")
    ap.add_argument("--pruning", action="store_true", help="also compare a study with and without pruning")
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        home = work / "home"
        home.mkdir()
        server = SSHServer(work / "sshd", set_env={
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}).start()
        try:
            accuracy(work, server, [int(k) for k in args.speedups.split(",")], args.max_tokens, args.requests,
                     args.window_generations)
        finally:
            server.stop()
        if args.pruning:
            pruning(work, args.trials)


if __name__ == "__main__":
    main()
