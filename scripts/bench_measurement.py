#!/usr/bin/env python3
"""Can the measurement keep up with a fast server, whatever the way to it?

1. What a request costs the client (default; --no-cost skips it): one closed loop at concurrency 32 against the
   emulator at x16, for each way of streaming a request in one process: the client autotune had before (httpx, a
   timer per line, every event parsed as JSON), httpx without those, aiohttp (when installed), plain asyncio streams,
   and autotune's load generator (asyncio protocols, bench/loadgen.py). Printed: the events (streamed chunks) one
   process handles per second of its CPU, the client's CPU share and the events it received per wall second.

2. The way to the server (default; --no-transports skips it): for a few configs at emulator speedups (--speedups,
   default 16: about 30k tok/s at concurrency 32), concurrency 32 in steady state measured by autotune's own Bench on
   the same server, directly and through an ssh-process target over a real sshd on 127.0.0.1: autotune's paramiko
   forward, OpenSSH's own forward (ssh -L, one ControlMaster connection) and the load generator on the target host,
   each with 1 and 2 processes. Each figure against the truth (`autotune sim surface --study`); `held` is the mean
   count of requests in the server over the window as a share of 32, by the server's own timing of each request
   (client_bound below 98.5% or above 101.5%); `count` is the server's own running-plus-queued count (/v1/loads,
   sampled every 50 ms during the level), its median over 32;
   `cpu` and `lag ms` the load generator's busiest process; `tuner cpu` what this process (autotune's side: the
   paramiko forward's threads run here) used per second.

3. Staged pruning (--pruning): the same study with pruning on and off; how much measuring time pruning saves.

Usage: python scripts/bench_measurement.py [--speedups 16] [--processes 1,2] [--seconds 6] [--no-cost]
       [--no-transports] [--pruning] [--trials 30]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.bench import Bench, PromptStream, Shape, load_prompts, loadgen, measuring  # noqa: E402
from autotune.engines import get_engine  # noqa: E402
from autotune.errors import TrialFailure  # noqa: E402
from autotune.run import make_plan, study_surface, wait_ready  # noqa: E402
from autotune.studyfile import WorkloadSpec, read_study_file  # noqa: E402
from autotune.targets import ProcessSpec, ProcessTarget  # noqa: E402
from autotune.testing.ports import free_port  # noqa: E402
from autotune.testing.server_count import ServerCount  # noqa: E402
from autotune.testing.sshd import SSHServer  # noqa: E402
from autotune.testing.studies import write_study  # noqa: E402

CONFIGS = [tuple(int(x) for x in c.split(",")) for c in os.environ.get("BENCH_CONFIGS", "3,1,4;8,4,11").split(";")]
ENGINE = get_engine("sglang")
MAX_TOKENS = 256
CONCURRENCY = 32
TRANSPORTS = tuple(os.environ.get("BENCH_TRANSPORTS", "direct,local,openssh,target").split(","))
NAMES = {"direct": "direct", "local": "paramiko forward", "openssh": "OpenSSH forward", "target": "on the target"}


# -- 1. what a request costs the client -------------------------------------------------------------------------

OneRequest = Callable[[bytes], Awaitable[int]]
KEY = b'"completion_tokens":'


async def httpx_before(url: str) -> tuple[OneRequest, Callable[[], Awaitable[None]]]:
    """The client autotune measured with before: httpx's line iterator, a wait_for timer around every line, every
    event parsed as JSON and read by the engine."""
    client = httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=64), timeout=60)

    async def one(body: bytes) -> int:
        events = 0
        async with client.stream("POST", "/generate", content=body,
                                 headers={"Content-Type": "application/json"}) as resp:
            lines = resp.aiter_lines()
            while True:
                try:
                    line = await asyncio.wait_for(lines.__anext__(), 30)
                except StopAsyncIteration:
                    return events
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    update = ENGINE.parse_event(json.loads(line[5:].strip()))
                    events += update.tokens is not None
    return one, client.aclose


async def httpx_lean(url: str) -> tuple[OneRequest, Callable[[], Awaitable[None]]]:
    """httpx without the timer per line and the JSON parse: the token count read by its key's position."""
    client = httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=64), timeout=60)

    async def one(body: bytes) -> int:
        events = 0
        async with client.stream("POST", "/generate", content=body,
                                 headers={"Content-Type": "application/json"}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    events += loadgen.tokens_in(line.encode(), KEY) is not None
        return events
    return one, client.aclose


async def aiohttp_lean(url: str) -> tuple[OneRequest, Callable[[], Awaitable[None]]] | None:
    try:
        import aiohttp
    except ImportError:
        return None
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    async def one(body: bytes) -> int:
        events = 0
        async with session.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as resp:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    events += loadgen.tokens_in(line, KEY) is not None
        return events
    return one, session.close


async def asyncio_streams(url: str) -> tuple[OneRequest, Callable[[], Awaitable[None]]]:
    """Plain asyncio streams on keep-alive connections, chunked encoding and events framed by readline."""
    host, port = url.split("//")[1].split(":")
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one(body: bytes) -> int:
        reader, writer = idle.pop() if idle else await asyncio.open_connection(host, int(port))
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        while (await reader.readline()).strip():
            pass  # status line and headers (the emulator answers chunked)
        events = 0
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                idle.append((reader, writer))
                return events
            data = await reader.readexactly(size + 2)
            for line in data.split(b"\n"):
                if line.startswith(b"data:"):
                    events += loadgen.tokens_in(line, KEY) is not None

    async def close() -> None:
        for _, writer in idle:
            writer.close()
    return one, close


async def autotune_protocol(url: str) -> tuple[OneRequest, Callable[[], Awaitable[None]]]:
    """autotune's load generator: asyncio protocols, HTTP and events framed by hand (bench/loadgen.py)."""
    where = measuring.local(url)
    client = loadgen.Client(asyncio.get_running_loop(), {
        "host": where.host, "port": where.port, "path": "/generate", "tokens_key": "completion_tokens",
        "request_timeout": 60, "stall_timeout": 30}, time.monotonic(), lambda req: None)

    async def one(body: bytes) -> int:
        req = loadgen.Request(0, MAX_TOKENS, False, body)
        client.start(req)
        await req.release  # type: ignore[misc]
        while not req.finished:
            await asyncio.sleep(0.001)
        return len(req.trace)

    async def close() -> None:
        client.close()
    return one, close


CLIENTS = [("httpx: timer per line, JSON per event (before)", httpx_before),
           ("httpx: token count by key", httpx_lean),
           ("aiohttp: token count by key", aiohttp_lean),
           ("asyncio streams: by key", asyncio_streams),
           ("asyncio protocols: autotune's (after)", autotune_protocol)]


async def closed_loop(make: Callable[[str], Awaitable[tuple[OneRequest, Callable[[], Awaitable[None]]] | None]],
                      url: str, prompts: PromptStream, seconds: float) -> dict[str, float] | None:
    made = await make(url)
    if made is None:
        return None
    one, close = made
    shape = Shape(MAX_TOKENS)

    def body() -> bytes:
        """The next prompt's request body, as the load generator puts it together from the shape's parts."""
        before, middle, after, size, _ = shape.parts(ENGINE, prompts.next_request()[0])
        return (before + middle + str(size) + after).encode()

    events = 0
    stop = time.monotonic() + seconds

    async def slot() -> None:
        nonlocal events
        while time.monotonic() < stop:
            got = await one(body())
            events += got

    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(slot() for _ in range(CONCURRENCY)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    await close()
    return {"events_per_cpu_s": events / cpu, "cpu": cpu / wall, "events_per_s": events / wall}


def client_cost(work: Path, seconds: float) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "autotune.sim", "--model-path", "/m", "--tp-size", "4",
                               "--port", str(port), "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                               "--sim-time-scale", "0.005", "--sim-speedup", "16"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url)
        prompts = PromptStream(load_prompts("builtin", work), 0)
        print(f"what one request costs the client: concurrency {CONCURRENCY}, {MAX_TOKENS} tokens per request, "
              f"emulator x16 (3, 1, 4) on this machine, {seconds:g} s per client, one process")
        print(f"{'client':<46} {'events per CPU second':>22} {'CPU share':>10} {'events/s':>9}")
        for name, make in CLIENTS:
            r = asyncio.run(closed_loop(make, url, prompts, seconds))
            if r is None:
                print(f"{name:<46} {'(not installed)':>22}")
                continue
            print(f"{name:<46} {r['events_per_cpu_s']:>22.0f} {r['cpu']:>10.2f} {r['events_per_s']:>9.0f}")
    finally:
        server.kill()
        server.wait()


def _wait_http(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no server at {url}")


# -- 2. the way to the server -----------------------------------------------------------------------------------




def measure(target: ProcessTarget, base_url: str, server_port: int, prompts: list[str], transport: str,
            processes: int, generations: int) -> dict:
    workload = WorkloadSpec(max_tokens=MAX_TOKENS, concurrency=(CONCURRENCY,), window_generations=generations,
                            warmup=0, max_repeats=1, processes=processes)
    where = (measuring.local(f"http://127.0.0.1:{server_port}") if transport == "direct"
             else measuring.load_generator(target, base_url, transport))
    bench = Bench(base_url, ENGINE, workload, prompts, seed=0, levels=(CONCURRENCY,), load=where)
    with ServerCount(server_port) as sampler:
        cpu, wall = time.process_time(), time.monotonic()
        try:
            m = bench.run()
            failed = None
        except TrialFailure as e:
            if e.reason != "client_bound":
                raise
            failed = e
    here = (time.process_time() - cpu) / (time.monotonic() - wall)
    run = bench.measurement.repeats[-1][-1]
    busy = [s for s in sampler.samples if s > 0]
    held = statistics.median(busy) / CONCURRENCY if busy else None
    out = {"bound": failed is not None, "share": run.client_share, "cpu": run.load.cpu, "lag": run.load.loop_lag,
           "held": held, "processes": run.load.processes, "here": here, "in_server": run.server_held}
    if failed is None:
        out["tok_s"] = m.summary(CONCURRENCY)["output_tok_s"]
    return out


def transports(work: Path, server: SSHServer, speedups: list[int], processes: list[int], generations: int) -> None:
    prompts = load_prompts("builtin", work)
    print(f"concurrency {CONCURRENCY} in steady state vs truth: qwen122b profile, {MAX_TOKENS} tokens per request, "
          f"a window of {generations * CONCURRENCY} requests; the same server measured directly and through an "
          "ssh-process target (sshd on 127.0.0.1)")
    print(f"{'config':>10} {'x':>3} {'truth':>7} | {'way to the server':<17} {'procs':>5} | {'tok/s':>7} "
          f"{'error':>7} {'held':>6} {'count':>5} {'cpu':>5} {'lag ms':>6} {'tuner cpu':>9}")
    worst: dict[str, float] = {}
    bound = 0
    for config in CONFIGS:
        for k in speedups:
            study = write_study(work, f"b{k}", args={
                "speculative-num-steps": config[0], "speculative-eagle-topk": config[1],
                "speculative-num-draft-tokens": config[2], "sim-speedup": k, "sim-time-scale": 0.002},
                workload=f"max_tokens = {MAX_TOKENS}\nconcurrency = [{CONCURRENCY}]",
                space="".join(f'[space.{n}]\ntype = "categorical"\nchoices = [{v}]\n' for n, v in zip(
                    ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"), config,
                    strict=True)))
            plan = make_plan(read_study_file(str(study)))
            truth = study_surface(plan)["configs"][0]["level_tok_s"][str(CONCURRENCY)]
            spec = ProcessSpec(name="bench", host=server.host, port=server.port, user="root",
                               key_file=str(server.user_key), known_hosts=str(server.known_hosts),
                               workdir=str(work / "remote"), server_port=free_port(), tunnel=True)
            target = ProcessTarget(spec)
            try:
                argv = plan.engine.render([sys.executable, "-m", "autotune.sim"],
                                          {**plan.baseline.args, "port": spec.server_port})
                deployment = target.deploy([*argv, "--sim-seed", "1"], {}, work / f"b{k}.log")
                wait_ready(deployment, ENGINE, 0.25, 120)
                for transport in TRANSPORTS:
                    for n in processes:
                        r = measure(target, deployment.base_url, spec.server_port, prompts, transport, n, generations)
                        bound += r["bound"]
                        print(_row(config, k, truth, transport, r, worst), flush=True)
            finally:
                measuring.close(target)
                target.stop()
                target.close()
    print("worst error against the truth: " + ", ".join(f"{NAMES[t]} {e:.1%}" for t, e in worst.items())
          + f" (goal: within 3%); {bound} level(s) failed as client_bound")


def _row(config: tuple, k: int, truth: float, transport: str, r: dict, worst: dict) -> str:
    if r["bound"]:
        figure = f"{'bound':>7} {'-':>7}"
    else:
        err = r["tok_s"] / truth - 1
        worst[transport] = max(worst.get(transport, 0.0), abs(err))
        figure = f"{r['tok_s']:>7.0f} {err:>+7.1%}"
    held = "-" if r["held"] is None else f"{r['held']:.2f}"
    return (f"{config!s:>10} {k:>3} {truth:>7.0f} | {NAMES[transport]:<17} {r['processes']:>5} | {figure} "
            f"{_pct(r['in_server']):>6} {held:>5} {r['cpu']:>5.2f} {r['lag'] * 1000:>6.2f} {r['here']:>9.2f}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


# -- 3. staged pruning ------------------------------------------------------------------------------------------


def pruning(work: Path, trials: int) -> None:
    results = {}
    for pruned in (True, False):
        name = "pruned" if pruned else "unpruned"
        study = write_study(work, name, launches=trials, seed=11,
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
        measuring_s = sum(r["timings"].get("measuring", 0.0) for r in rows)
        n_pruned = sum(1 for r in rows if r["reason"] == "pruned")
        best = max((r["value"] for r in rows if r["state"] == "COMPLETE" and r["value"] is not None), default=None)
        results[name] = (wall, measuring_s, n_pruned, best)
        print(f"{name:>9}: {trials} trials in {wall:.0f} s, {measuring_s:.0f} s measuring, {n_pruned} pruned, "
              f"best {best:.3f}")
    (w1, m1, _, _), (w0, m0, _, _) = results["pruned"], results["unpruned"]
    print(f"staged pruning saved {1 - m1 / m0:.0%} of the measuring time ({m0 - m1:.0f} s) and "
          f"{1 - w1 / w0:.0%} of the wall time over {trials} trials")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speedups", default="16")
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--generations", type=int, default=4, help="the concurrency-32 window, in generations")
    ap.add_argument("--seconds", type=float, default=6.0, help="how long each client runs in the cost comparison")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--no-transports", action="store_true")
    ap.add_argument("--pruning", action="store_true", help="also compare a study with and without pruning")
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(work / "state")
        if not args.no_cost:
            client_cost(work, args.seconds)
        if not args.no_transports:
            home = work / "home"
            home.mkdir()
            server = SSHServer(work / "sshd", set_env={
                "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}).start()
            try:
                transports(work, server, [int(k) for k in args.speedups.split(",")],
                           [int(n) for n in args.processes.split(",")], args.generations)
            finally:
                server.stop()
        if args.pruning:
            pruning(work, args.trials)


if __name__ == "__main__":
    main()
