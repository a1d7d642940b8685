"""Several targets, one study: one `autotune run --target NAME` worker process per target.

Each worker holds its own target and shares the study's storage with the others (PostgreSQL for hosts on several
machines); the study's admission lock keeps the total budget exact. This process only starts the workers, prefixes
their lines with the target's name, passes SIGTERM/SIGINT on, and reports the worst exit status.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from types import FrameType

from autotune.study import StudySpec
from autotune.tuner import RunOptions


def worker_argv(spec: StudySpec, options: RunOptions, target: str) -> list[str]:
    argv = [sys.executable, "-m", "autotune", "run", "--study", str(spec.path), "--target", target]
    for flag, value in (("--trials", options.trials), ("--timeout", options.timeout), ("--until", options.until),
                        ("--storage", options.storage), ("--processes", options.processes)):
        if value is not None:
            argv += [flag, str(value)]
    if not options.restore:
        argv.append("--no-restore")
    return argv


def run_all_targets(spec: StudySpec, options: RunOptions) -> int:
    """Run one worker per target until all end; the highest exit status of any worker."""
    procs = {name: subprocess.Popen(worker_argv(spec, options, name), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
             for name in spec.targets}
    width = max(len(n) for n in procs)
    lock = threading.Lock()

    def relay(name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                sys.stdout.write(f"[{name:<{width}}] {line}")
                sys.stdout.flush()

    def forward(signum: int, frame: FrameType | None) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    relays = [threading.Thread(target=relay, args=item, daemon=True) for item in procs.items()]
    try:
        for t in relays:
            t.start()
        codes = [proc.wait() for proc in procs.values()]
        for t in relays:
            t.join(5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return max((abs(c) for c in codes), default=0)
