"""The live status line: drawn under the log lines on a terminal, never mixed into them, absent otherwise."""
from __future__ import annotations

import io
import logging
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.logs import setup as setup_logging
from autotune.run.progress import CLEAR, Phase, Progress
from autotune.testing.studies import write_study


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(raw: str) -> tuple[list[str], str]:
    """What a terminal shows: finished lines, and the line the cursor is on (CLEAR wipes that line)."""
    done: list[str] = []
    current = ""
    for i, part in enumerate(raw.split(CLEAR)):
        if i:
            current = ""
        pieces = (current + part).split("\n")
        done += pieces[:-1]
        current = pieces[-1]
    return done, current


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log_to(request: pytest.FixtureRequest) -> logging.Logger:
    logger = logging.getLogger("autotune")
    saved = list(logger.handlers)
    yield logger
    for h in list(logger.handlers):
        logger.removeHandler(h)
    for h in saved:
        logger.addHandler(h)


def test_status_line_stays_below_the_log_lines(log_to: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # a terminal wide enough for the whole line (pytest-xdist's workers get 80)
    term = Terminal()
    setup_logging(None, stream=term)
    clock = Clock()
    progress = Progress(budget=4, concurrency=[1, 8, 32], stream=term, clock=clock)
    assert progress.enabled
    try:
        progress.on_phase(Phase(0, "deploying"))
        clock.now += 2
        progress.on_phase(Phase(0, "waiting", "7 s"))
        lines, status = screen(term.getvalue())
        assert lines == [] and status.startswith("launch 1/4 (trial #0) | waiting 7 s for readiness | best: none yet")

        log_to.info("trial 0 ready in 7.0 s")
        progress.on_phase(Phase(0, "measuring"))
        lines, status = screen(term.getvalue())
        assert [line.split(" ", 2)[2] for line in lines] == ["trial 0 ready in 7.0 s"]
        assert "measuring concurrency 1" in status
        progress.on_phase(Phase(0, "measuring", "concurrency 1"))
        assert "measuring concurrency 8" in screen(term.getvalue())[1]
        progress.on_phase(Phase(0, "measuring", "concurrency 32"))
        assert "measuring (repeats for precision)" in screen(term.getvalue())[1]

        # after a trial: the budget used, the best so far and the ETA from the median trial time
        progress.done, progress.best, progress.median = 1, (1.25, 0), 60.0
        progress.on_phase(Phase(0, "done"))
        log_to.info("trial 0 COMPLETE")
        lines, status = screen(term.getvalue())
        assert [line.split(" ", 2)[2] for line in lines] == ["trial 0 ready in 7.0 s", "trial 0 COMPLETE"]
        assert status == "launch 2/4 (trial #0) | starting the next trial | best 1.25 (trial 0) | ETA 3 min 00 s"
        progress.on_phase(Phase(1, "deploying"))
        clock.now += 30
        progress.on_phase(Phase(1, "waiting", "30 s"))
        assert screen(term.getvalue())[1].endswith("ETA 2 min 30 s")
    finally:
        progress.close()
    lines, status = screen(term.getvalue())
    assert status == "", "the status line is cleared at exit"
    log_to.info("after")
    assert screen(term.getvalue())[0][-1].endswith(" after")
    assert term.getvalue().endswith(" after\n"), "the handler has its own stream back"


def test_nothing_extra_when_not_a_terminal(log_to: logging.Logger) -> None:
    out = io.StringIO()
    setup_logging(None, stream=out)
    progress = Progress(budget=4, concurrency=[1, 8], stream=out)
    assert not progress.enabled
    progress.on_phase(Phase(0, "waiting", "3 s"))
    log_to.info("a line")
    progress.close()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert out.getvalue().count("\n") == 1 and out.getvalue().endswith("a line\n")


def test_run_on_a_terminal_shows_progress_between_clean_log_lines(tmp_path: Path) -> None:
    study = write_study(tmp_path, launches=2, args={"sim-time-scale": 0.001},
                        workload="max_tokens = 48\nconcurrency = [1, 2]\nrequests = 2\n"
                                 "window_generations = 1\nwarmup = 0\nmax_repeats = 1"
                                "\ntolerance = 0.5")
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200", "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    raw = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                raw += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = raw.decode(errors="replace").replace("\r\n", "\n")
    assert re.search(r"launch 1/2 \(trial #0\) \| (deploying|waiting|measuring|choosing)", text), text[-2000:]
    assert "launch 2/2 (trial #1)" in text and "best 1 (trial 0)" in text
    lines, status = screen(text)
    assert status == ""
    lines = lines[:-3] if lines[-3:] and lines[-3].startswith("next: autotune best") else lines  # the run's last word
    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
    assert lines and all(stamped.match(line) for line in lines), [ln for ln in lines if not stamped.match(ln)]
    # trial 1, or its retry when a busy machine cut it short as client_bound
    assert any(re.search(r"trial \d+ (\[starting point\] )?(COMPLETE|PRUNED)", line) for line in lines), lines
