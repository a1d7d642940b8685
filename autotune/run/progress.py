"""A live status line under the log lines while `autotune run` works on a terminal:

    launch 5/24 (trial #7) | waiting 12 s | best 1.444 (trial 9) | ETA 3 min 10 s

(launch n of the budget and the trial it is, what the current trial is doing, the best so far, the time left from
the median launch). Every log line written to the terminal first clears the status line, then the line is drawn
again below it, so the two never mix; the line is cleared when the run ends. When stdout is not a terminal
(journald, a pipe, a file) nothing is drawn: the log lines are the whole output.
"""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

import optuna

from autotune.results import tally

CLEAR = "\r\x1b[2K"
#: seconds between redraws while nothing happens (the clock and the ETA move on)
TICK = 1.0


@dataclass
class Phase:
    """What the current trial is doing: "suggest", "deploying", "waiting" (for readiness), "verifying",
    "measuring" (detail: the level just measured), "done"; or "idle" between trials."""

    trial: int | None = None
    name: str = "idle"
    detail: str = ""


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class _Wrapped:
    """Stands in for the terminal in the logger's console handler: clears the status line before a log line is
    written and draws it again when the handler flushes (right after the line)."""

    def __init__(self, progress: Progress, stream: TextIO) -> None:
        self._progress = progress
        self._stream = stream

    def write(self, text: str) -> int:
        with self._progress.lock:
            self._progress._clear()
            return self._stream.write(text)

    def flush(self) -> None:
        with self._progress.lock:
            self._stream.flush()
            self._progress._draw()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Progress:
    """The status line of one run. Disabled (a no-op) unless its stream is a terminal."""

    def __init__(self, budget: int = 0, deadline: float | None = None, concurrency: Iterable[int] = (),
                 stream: TextIO | None = None, enabled: bool | None = None, logger: str = "autotune",
                 clock: Any = time.time) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self.budget = budget
        self.deadline = deadline
        self.levels = sorted(concurrency)
        self.lock = threading.RLock()
        self.clock = clock
        self.done = 0                       # launches (servers started) counted against the budget
        self.best: tuple[float, int] | None = None
        self.median: float | None = None    # seconds per launch
        self.phase = Phase()
        self.phase_since = clock()
        self.trial_since = clock()
        self._shown = False
        self._closed = False
        self._handlers: list[tuple[logging.StreamHandler, Any]] = []
        self._logger = logging.getLogger(logger)
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        if self.enabled:
            self._attach()

    # -- inputs ------------------------------------------------------------------------------------------------

    def update(self, study: optuna.Study) -> None:
        """Budget used, best so far and the median trial time, from the study as stored."""
        if not self.enabled:
            return
        trials = study.get_trials(deepcopy=False)
        counted = tally.launches(trials)
        times = [t.duration.total_seconds() for t in counted if t.duration is not None]
        best = tally.best(study)
        with self.lock:
            self.done = len(counted)
            self.median = statistics.median(times) if times else None
            self.best = (tally.score(best, study), best.number) if best is not None else None
            self._redraw()

    def on_phase(self, phase: Phase) -> None:
        if not self.enabled:
            return
        with self.lock:
            now = self.clock()
            if phase.trial != self.phase.trial:
                self.trial_since = now
            if phase.name != self.phase.name or phase.trial != self.phase.trial:
                self.phase_since = now
            self.phase = phase
            self._redraw()

    # -- the line ----------------------------------------------------------------------------------------------

    def line(self) -> str:
        now = self.clock()
        parts = []
        n = min(self.done + 1, self.budget) if self.budget else self.done + 1
        number = f" (trial #{self.phase.trial})" if self.phase.trial is not None else ""
        parts.append(f"launch {n}/{self.budget}{number}" if self.budget else f"launch {n}{number}")
        parts.append(self._phase_text(now))
        parts.append(f"best {self.best[0]:.4g} (trial {self.best[1]})" if self.best else "best: none yet")
        parts.append(self._eta_text(now))
        return " | ".join(p for p in parts if p)

    def _phase_text(self, now: float) -> str:
        name, detail = self.phase.name, self.phase.detail
        elapsed = duration(now - self.phase_since)
        if name == "waiting":
            return f"waiting {detail or elapsed} for readiness"
        if name == "measuring":
            if detail.startswith("concurrency "):
                try:
                    measured = int(detail.split()[1])
                except ValueError:
                    return f"measuring {detail}"
                after = [c for c in self.levels if c > measured]
                return f"measuring concurrency {after[0]}" if after else "measuring (repeats for precision)"
            return f"measuring concurrency {self.levels[0]}" if self.levels else "measuring"
        if name in ("idle", "done"):
            return "starting the next trial" if self.done < self.budget else "finishing"
        if name == "suggest":
            return "choosing a config"
        return f"{name} {elapsed}"

    def _eta_text(self, now: float) -> str:
        left = max(0, self.budget - self.done)
        if left == 0:
            return ""
        eta = None
        if self.median is not None:
            in_trial = now - self.trial_since if self.phase.name not in ("idle", "done") else 0.0
            eta = max(0.0, left * self.median - in_trial)
        if self.deadline is not None and (eta is None or now + eta > self.deadline):
            return f"ETA {duration(self.deadline - now)} (deadline)"
        return f"ETA {duration(eta)}" if eta is not None else "ETA: after the first trial"

    # -- drawing (callers hold self.lock) ----------------------------------------------------------------------

    def _clear(self) -> None:
        if self._shown:
            self.stream.write(CLEAR)
            self._shown = False

    def _draw(self) -> None:
        if self._closed:
            return
        width = shutil.get_terminal_size((100, 24)).columns
        text = self.line()
        if len(text) >= width:
            text = text[: max(0, width - 4)] + "..."
        self.stream.write(CLEAR + text)
        self.stream.flush()
        self._shown = True

    def _redraw(self) -> None:
        if self.enabled and not self._closed:
            self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            with self.lock:
                self._redraw()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def _attach(self) -> None:
        for h in self._logger.handlers:
            if type(h) is logging.StreamHandler and getattr(h, "stream", None) is self.stream:
                self._handlers.append((h, h.stream))
                h.setStream(_Wrapped(self, self.stream))  # type: ignore[arg-type]
        self._ticker = threading.Thread(target=self._tick, name="autotune-progress", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        """Clear the line and give the log handlers their stream back."""
        if not self.enabled or self._closed:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2 * TICK)
        with self.lock:
            self._clear()
            self.stream.flush()
            self._closed = True
        # outside our lock: setStream takes the handler's lock, which a logging thread may hold while it waits
        # for ours
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()
