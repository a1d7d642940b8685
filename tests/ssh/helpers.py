"""Helpers shared by the SSH target tests (fixtures are in conftest.py)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def server_argv(port: int, *extra: str) -> list[str]:
    """The command line of the SGLang emulator on ``port``, started fast (startup x0.01, tokens x20)."""
    return [sys.executable, "-m", "autotune.sim", "--port", str(port), "--host", "127.0.0.1",
            "--model-path", "/m", "--tp-size", "4", "--speculative-algorithm", "EAGLE",
            "--sim-time-scale", "0.01", "--sim-speedup", "20", *extra]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def cmdline(pid: int) -> list[str]:
    """The argv of process ``pid`` (the 'remote' side is this machine)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stand_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the stand-in systemctl/journalctl (tests/ssh/fake_systemd.py) on state under ``root`` directly."""
    return subprocess.run([sys.executable, str(HERE / "fake_systemd.py"), *args], capture_output=True, text=True,
                          env={**os.environ, "AUTOTUNE_FAKE_SYSTEMD": str(root)}, timeout=60, check=False)


def main_pid(root: Path, unit: str) -> int:
    """The MainPID the stand-in systemd reports for ``unit``."""
    out = stand_in(root, "systemctl", "show", unit, "-p", "MainPID", "--value").stdout
    return int(out.strip() or 0)
