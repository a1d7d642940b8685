"""Turns between the pytest-xdist workers of one test run: a test marked ``alone`` (it measures throughput against
a truth) runs with no other test beside it; the others share the machine two at a time."""
from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def turn(prefix: Path, alone: bool) -> Iterator[None]:
    """Hold a shared turn, or the machine alone, for the duration of the block.

    A readers-writer lock on two files: everyone passes a turnstile first, and an ``alone`` turn keeps the turnstile
    while it waits for the shared turns in progress to end, so no new one starts in the meantime (it is never starved)
    and the next test of the other worker waits for it."""
    with open(f"{prefix}.turnstile", "a") as gate, open(f"{prefix}.turn", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
