"""What the one-tuner-per-target locks share (targets/local_lock.py, targets/remote_lock.py): the holder's
description and this user's machine-wide state directory."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path


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
