"""A process of someone else's holding a port, as autotune meets it on a target: started, listening, then killed."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from autotune.targets.local import port_open


@contextmanager
def holding(argv: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` (which must listen on ``port``) running, and listening, until the block ends."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_open(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()
