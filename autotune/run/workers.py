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

from autotune.studyfile.spec import StudySpec


def run_all_targets(spec: StudySpec, flags: list[str]) -> int:
    """Run one worker per target, each `autotune run --study ... --target NAME` with ``flags`` (the run's other
    options, ``RunOptions.flags()``), until all end; the highest exit status of any worker."""
    def argv(target: str) -> list[str]:
        return [sys.executable, "-m", "autotune", "run", "--study", str(spec.path), "--target", target, *flags]

    procs = {name: subprocess.Popen(argv(name), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1)
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
