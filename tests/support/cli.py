"""The `autotune` command line as a user runs it: a subprocess (``run_autotune``, ``start_run``), or in this process
for cheap checks that start nothing (``run_cli``); and `status --json` read back."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main


def run_autotune(*args: str, cwd: Path | None = None, timeout: float = 300,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `autotune` command line in a subprocess."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process, for cheap checks that start nothing: exit status, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["autotune", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def start_run(study: Path, *extra: str) -> subprocess.Popen[str]:
    """`autotune run --study STUDY` in the background (for tests that signal or kill it)."""
    return subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study), *extra],
                            cwd=study.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Wait until the study's log has a line matching ``pattern``; fail if the tuner ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and re.search(pattern, log.read_text()):
            return
        assert proc.poll() is None, f"the tuner ended before {pattern!r}: {proc.communicate()}"
        time.sleep(0.02)
    pytest.fail(f"never saw {pattern!r}")


def status(path: Path) -> dict[str, Any]:
    """`autotune status --study PATH --json`."""
    r = run_autotune("status", "--study", str(path), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def kept(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`status --json` rows without the attempts that were queued again (cut short for the infrastructure's sake,
    like a client_bound level on a busy machine): the trials a user counts."""
    retried = {t["retry_of"] for t in trials}
    return [t for t in trials if t["number"] not in retried]


def launches(trials: list[dict[str, Any]]) -> int:
    """The launches a study's budget counts, from `status --json` rows."""
    return sum(t["launched"] for t in kept(trials))


def finished_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Traceback" not in r.stderr
