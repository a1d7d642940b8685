"""A remote server's log mirrored into the trial's local log file, by a background reader."""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko

from autotune import redact
from autotune.errors import TrialFailure, UserError

log = logging.getLogger(__name__)

class LogFollower:
    """Keeps a remote deployment's local log file filling by itself, as a local server's log does.

    ``fetch()`` returns the log text that appeared on the target since its previous call. A background thread
    calls it every ``interval`` seconds and appends the text to ``log_path``; ``read()`` fetches once more and
    returns everything that arrived since the previous ``read()`` (so readiness and liveness checks see every
    line, and the trial's log file is complete even while nobody reads it, e.g. during the benchmark). Secrets
    (``masked``, and every value redact.py knows) are masked before the text is written or handed out.
    """

    PENDING_LIMIT = 1 << 20     # characters of unread text kept for read(); the file keeps everything

    def __init__(self, fetch: Callable[[], str], log_path: Path, interval: float, name: str,
                 masked: tuple[str, ...] = ()) -> None:
        self._fetch = fetch
        self._masked = sorted((v for v in masked if len(v) >= redact.SHORTEST), key=len, reverse=True)
        self.log_path = log_path
        self.interval = interval
        self._pending: list[str] = []
        self._pending_size = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"log-{name}", daemon=True)
        self._thread.start()

    def read(self) -> str:
        with self._lock:
            text = "".join(self._pending) + self._pull()
            self._pending.clear()
            self._pending_size = 0
            return text

    def stop(self) -> None:
        """Stop following (a last fetch first, so the file ends with what the server wrote)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(Exception), self._lock:
            self._keep(self._pull())

    def _pull(self) -> str:
        text = self._fetch()
        for value in self._masked:
            text = text.replace(value, redact.MASK)
        text = redact.mask(text)
        if text:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(text)
        return text

    def _keep(self, text: str) -> None:
        if not text:
            return
        self._pending.append(text)
        self._pending_size += len(text)
        while self._pending_size > self.PENDING_LIMIT and len(self._pending) > 1:
            self._pending_size -= len(self._pending.pop(0))

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._keep(self._pull())
            except TrialFailure as e:
                if "was closed" in e.detail:
                    return  # the target was closed: nothing more to follow
                log.debug("log follower %s: %s", self._thread.name, e)
            except (UserError, OSError, ValueError, EOFError, paramiko.SSHException) as e:
                log.debug("log follower %s: %s", self._thread.name, e)  # the next read() reports real problems
