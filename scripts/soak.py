#!/usr/bin/env python3
"""Soak test of the overnight daemon: a long study on the emulator with random server faults and random
kills of `autotune run` itself, restarted each time as systemd would (Restart=on-failure).

The server command is a wrapper that starts the emulator with a random --sim-fault for a share of the launches
(startup crash, startup hang, OOM under load, crash under load, stalls, errors). The daemon is SIGKILLed (or, one
time in five, sent SIGTERM) at random moments. At the end it prints: trials finished, faults survived, trials lost
(goal: 0) and whether the server was left healthy with the expected config.

By default the target is ssh-process through a throw-away OpenSSH server on 127.0.0.1 (so that the server is left
running at the end, as on a real host); --local uses the local target (whose server is stopped at the end).

--final-failures N makes the first N launches outside a trial (the deploy of the best config at the end of the study)
fail for the infrastructure: the server started runs the baseline's speculative flags instead of the requested ones,
a stale server as the verification sees it (``wrong_args``). Once, the tuner starts the best again and ends on it;
twice, it ends on the next-best config that beats the baseline. In this mode the daemon is only ever SIGKILLed (a
SIGTERM ends a run with a final deploy of its own) and launches outside a trial get no random fault.
Usage: python scripts/soak.py [--trials 200] [--kill-every 20] [--fault-rate 0.25] [--local] [--seed N]
                              [--speedup 20] [--final-failures N]
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
import os, random, sqlite3, sys
rate = {rate!r}
faults = {faults!r}
baseline = {baseline!r}
database, armed, record = {database!r}, {armed!r}, {record!r}
args = sys.argv[1:]


def in_a_trial():
    # a trial's server starts while its trial is RUNNING; the final deploy starts one when none is
    with sqlite3.connect("file:" + database + "?mode=ro", uri=True, timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0] > 0


if in_a_trial():
    if random.random() < rate:
        args += ["--sim-fault", random.choice(faults)]
else:
    left = int(open(armed).read()) if os.path.exists(armed) else 0
    if left > 0:
        open(armed, "w").write(str(left - 1))
        for flag, value in baseline.items():
            args[args.index(flag) + 1] = str(value)
    with open(record, "a") as f:
        f.write(("failed (ran the baseline's flags)" if left > 0 else "started as asked") + ": " + " ".join(args)
                + chr(10))
os.execvp("autotune-sim", ["autotune-sim", *args])
"""
#: the study's fixed (baseline) speculative flags, which a failed final launch runs instead of the requested ones
BASELINE = {"--speculative-num-steps": 3, "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}

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
sim-speedup = {speedup}

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


def run_until_done(study: Path, env: dict[str, str], kill_every: float, rng: random.Random,
                   sigterm: bool = True) -> dict[str, int]:
    kills = {"SIGKILL": 0, "SIGTERM": 0, "runs": 0}
    while True:
        kills["runs"] += 1
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=study.parent,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        deadline = time.monotonic() + rng.expovariate(1 / kill_every)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            sig = signal.SIGTERM if rng.random() < 0.2 and sigterm else signal.SIGKILL
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
    ap.add_argument("--speedup", type=float, default=20.0,
                    help="the emulator's --sim-speedup (lower it on a busy machine, where the client falls behind)")
    ap.add_argument("--final-failures", type=int, default=0,
                    help="make the deploy of the best config at the end fail this many times (for the infrastructure)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
        wrapper = work / "soak-server"
        armed, record = work / "final-failures", work / "final-launches"
        armed.write_text(str(args.final_failures))
        wrapper.write_text(WRAPPER.format(python=sys.executable, rate=args.fault_rate, faults=FAULTS,
                                          baseline=BASELINE, database=str(work / "soak.db"), armed=str(armed),
                                          record=str(record)))
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
        study.write_text(STUDY.format(trials=args.trials, target=target, wrapper=wrapper, space=SPEC_SPACE,
                                      speedup=args.speedup))
        start = time.monotonic()
        try:
            kills = run_until_done(study, env, args.kill_every, rng, sigterm=args.final_failures == 0)
            wall = time.monotonic() - start
            ending = final_deploy(study, record, port, sshd is not None)
            rows = json.loads(subprocess.run([sys.executable, "-m", "autotune", "status", "--study", str(study),
                                              "--json"], capture_output=True, text=True, env=env,
                                             check=True).stdout)["trials"]
            best = json.loads(subprocess.run([sys.executable, "-m", "autotune", "best", "--study", str(study),
                                              "--json"], capture_output=True, text=True, env=env,
                                             check=False).stdout or "null")
            healthy = check_server(port, best, sshd is not None)
        finally:
            if sshd is not None:
                stop_server(study, env)
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
    print("\n".join(ending))


def stop_server(study: Path, env: dict[str, str]) -> None:
    """Stop the server the study left running on its target, the way the target stops one (its process group)."""
    script = ("import sys\nfrom autotune.studyfile import read_study_file\nfrom autotune.targets import make_target\n"
              "t = make_target(read_study_file(sys.argv[1]).target())\nt.stop()\nt.close()\n")
    subprocess.run([sys.executable, "-c", script, str(study)], env=env, check=False, timeout=120)


def final_deploy(study: Path, record: Path, port: int, keeps_running: bool) -> list[str]:
    """What the end of the study did: the launches outside a trial (as the wrapper saw them), the tuner's own lines
    about them, and which config the server runs now among the configs that beat the baseline, ranked."""
    from autotune.results import tally
    from autotune.record import storage

    lines = ["the end of the study:"]
    lines += [f"  launch: {line}" for line in (record.read_text().splitlines() if record.exists() else [])]
    log = study.with_suffix(".log").read_text().splitlines()
    last = max(i for i, line in enumerate(log) if "stopped (budget)" in line)
    said = [line.split(" ", 2)[2] for line in log[:last + 1][-12:]
            if any(w in line for w in ("did not come up", "left running", "restor", "no other config"))]
    lines += [f"  tuner: {line}" for line in said]
    if not keeps_running:
        return lines
    ahead = tally.above_baseline(storage.load_existing_study("soak", f"sqlite:///{study.parent / 'soak.db'}"))
    try:
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
    except httpx.HTTPError as e:
        return [*lines, f"  server: not answering ({e})"]
    running = {k: info.get(k.replace("-", "_")) for k in FLAGS}
    names = ["the best", "the next-best"] + [f"number {n + 1}" for n in range(2, len(ahead))]
    which = next((f"{names[i]} config that beats the baseline (trial {t.number})" for i, t in enumerate(ahead)
                  if {k: t.user_attrs.get("params", {}).get(k) for k in FLAGS} == running),
                 "a config that does not beat the baseline (the original?)")
    return [*lines, f"  server ended on: {which}: {running}"]


FLAGS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


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
