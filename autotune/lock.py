"""One tuner per target: an advisory lock that names its holder and dies with it."""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from autotune.errors import UserError


def state_dir() -> Path:
    """Machine-wide state of this user's tuners ($XDG_STATE_HOME/autotune)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    path = Path(base) / "autotune"
    path.mkdir(parents=True, exist_ok=True)
    return path


def holder_description(study: str) -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "study": study,
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def describe(holder: dict[str, object] | None) -> str:
    if not holder:
        return "another autotune process"
    return (f"autotune pid {holder.get('pid')} on {holder.get('host')} "
            f"(study {holder.get('study')}, since {holder.get('since')})")


class FileLock:
    """An flock(2) on a local file: released by the kernel when the holder exits, however it exits, so a lock
    left by a killed tuner is simply free again."""

    def __init__(self, identity: str, holder: dict[str, object]) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", identity)
        self.path = state_dir() / f"{safe}.lock"
        self.identity = identity
        self.holder = holder
        self._fd: int | None = None

    def __enter__(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                current = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                current = None
            os.close(fd)
            raise UserError(f"target {self.identity} is busy: held by {describe(current)}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.holder).encode(), 0)
        self._fd = fd

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
