#!/usr/bin/env python3
"""Soak test of the overnight daemon: a long study on the emulator with random server faults and random
kills of `autotune run` itself, restarted each time as systemd would (Restart=on-failure).

The server command is a wrapper that starts the emulator with a random --sim-fault for a share of the launches
(startup crash, startup hang, OOM under load, crash under load, stalls, errors). The daemon is SIGKILLed (or, one
time in five, sent SIGTERM) at random moments. At the end it prints: trials finished, faults survived, trials lost
(goal: 0) and whether the server was left healthy with the expected config.

By default the target is ssh-process through a throw-away OpenSSH server on 127.0.0.1 (so that the server is left
running at the end, as on a real host); --local uses the local target (whose server is stopped at the end).
Usage: python scripts/soak.py [--trials 200] [--kill-every 20] [--fault-rate 0.25] [--local] [--seed N]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.testing.ports import free_port  # noqa: E402
from autotune.testing.sshd import SSHServer, find_sshd  # noqa: E402
from autotune.testing.studies import SPEC_SPACE  # noqa: E402

FAULTS = ["startup-crash", "startup-hang", "oom-under-load:3", "crash-after:300", "stall-after:200", "errors:0.5"]
FAULT_REASONS = {"crashed", "startup_timeout", "oom_under_load", "crashed_under_load", "stalled", "errors"}

WRAPPER = """#!{python}
import os, random, sys
rate = {rate!r}
faults = {faults!r}
args = sys.argv[1:]
if random.random() < rate:
    args += ["--sim-fault", random.choice(faults)]
os.execvp("autotune-sim", ["autotune-sim", *args])
"""

STUDY = """[study]
trials = {trials}
sampler = "tpe"
objective = "weighted"

[target]
{target}

[engine]
kind = "sglang"
command = ["{wrapper}"]

[engine.args]
model-path = "/shared/models/Qwen3.5-122B-A10B"
tp-size = 4
speculative-algorithm = "EAGLE"
speculative-num-steps = 3
speculative-eagle-topk = 1
speculative-num-draft-tokens = 4
sim-time-scale = 0.005
sim-speedup = 20

{space}
[workload]
max_tokens = 48
concurrency = [1, 4]
requests = 4
window_generations = 1
warmup = 1
stall_timeout = 2
tolerance = 0.5

[health]
interval = 0.25
timeout = 5
"""


def run_until_done(study: Path, env: dict[str, str], kill_every: float, rng: random.Random) -> dict[str, int]:
    kills = {"SIGKILL": 0, "SIGTERM": 0, "runs": 0}
    while True:
        kills["runs"] += 1
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=study.parent,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        deadline = time.monotonic() + rng.expovariate(1 / kill_every)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            sig = signal.SIGTERM if rng.random() < 0.2 else signal.SIGKILL
            kills[sig.name] += 1
            proc.send_signal(sig)
        err = proc.communicate()[1]
        if proc.returncode == 0 and "stopped (budget)" in (study.with_suffix(".log").read_text()
                                                           .rstrip().rsplit("\n", 1)[-1]):
            return kills
        if proc.returncode not in (0, -9, 2) and "Traceback" in err:
            print(f"the daemon crashed:\n{err}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between kills of the daemon")
    ap.add_argument("--fault-rate", type=float, default=0.25, help="share of launches with a random fault")
    ap.add_argument("--local", action="store_true", help="use the local target instead of ssh-process")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
        wrapper = work / "soak-server"
        wrapper.write_text(WRAPPER.format(python=sys.executable, rate=args.fault_rate, faults=FAULTS))
        wrapper.chmod(0o755)
        port = free_port()
        sshd = None
        if args.local or find_sshd() is None:
            target = f'kind = "local"\nserver_port = {port}'
        else:
            sshd = SSHServer(work / "sshd", set_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                                                     "HOME": str(work)}).start()
            target = (f'kind = "ssh-process"\nhost = "127.0.0.1"\nport = {sshd.port}\nuser = "root"\n'
                      f'key_file = "{sshd.user_key}"\nknown_hosts = "{sshd.known_hosts}"\nworkdir = "{work}/remote"\n'
                      f'server_port = {port}\ntunnel = true')
        study = work / "soak.toml"
        study.write_text(STUDY.format(trials=args.trials, target=target, wrapper=wrapper, space=SPEC_SPACE))
        start = time.monotonic()
        try:
            kills = run_until_done(study, env, args.kill_every, rng)
            wall = time.monotonic() - start
            rows = json.loads(subprocess.run([sys.executable, "-m", "autotune", "status", "--study", str(study),
                                              "--json"], capture_output=True, text=True, env=env,
                                             check=True).stdout)["trials"]
            best = json.loads(subprocess.run([sys.executable, "-m", "autotune", "best", "--study", str(study),
                                              "--json"], capture_output=True, text=True, env=env,
                                             check=False).stdout or "null")
            healthy = check_server(port, best, sshd is not None)
        finally:
            if sshd is not None:
                subprocess.run(["pkill", "-f", "--", f"--port {port}"], check=False)
                sshd.stop()
    retried = {r["retry_of"] for r in rows if r["retry_of"] is not None}
    counted = [r for r in rows if r["number"] not in retried and r["state"] not in ("RUNNING", "WAITING")]
    stuck = [r for r in rows if r["state"] in ("RUNNING", "WAITING")]
    faults = [r for r in rows if r["reason"] in FAULT_REASONS]
    interrupted = [r for r in rows if r["reason"] in ("stale", "interrupted")]
    lost = stuck + [r for r in interrupted if r["number"] not in retried and r["retry_of"] is None]
    twice = [r for r in interrupted if r["number"] not in retried and r["retry_of"] is not None]
    print(f"soak: {args.trials}-trial study, {'local' if sshd is None else 'ssh-process'} target, "
          f"{wall / 60:.1f} min, {kills['runs']} daemon starts")
    print(f"trials finished: {len(counted)} of {args.trials} ({len(rows)} trials recorded)")
    print(f"faults survived: {len(faults)} server faults "
          f"({', '.join(sorted({r['reason'] for r in faults}))}), {kills['SIGKILL']} SIGKILLs and "
          f"{kills['SIGTERM']} SIGTERMs of the daemon, {len(interrupted)} trials cut short and queued again")
    print(f"trials lost: {len(lost)} (goal: 0); configs cut short twice (counted, not retried again): {len(twice)}")
    print(f"server ended healthy: {healthy}")


def check_server(port: int, best: dict | None, keeps_running: bool) -> str:
    """A kept server must answer and run the best config; a local one must have been stopped."""
    url = f"http://127.0.0.1:{port}"
    if not keeps_running:
        try:
            httpx.get(url + "/ready", timeout=2)
            return "no: the local server was left running"
        except httpx.HTTPError:
            return "yes (the local target's server was stopped at the end, as designed)"
    # the remote server listens on the target's loopback, which here is this machine's
    try:
        if httpx.get(url + "/ready", timeout=5).status_code != 200:
            return "no: the server does not answer /ready"
        info = httpx.get(url + "/server_info", timeout=5).json()
    except httpx.HTTPError as e:
        return f"no: {e}"
    running = {k: info.get(k.replace("-", "_"))
               for k in ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")}
    want = {k: (best or {}).get("params", {}).get(k) for k in running}
    if best and running == want:
        return f"yes, running the best config (trial {best['number']}: {running})"
    return f"yes, answering, running {running} (best trial: {want})"


if __name__ == "__main__":
    main()
