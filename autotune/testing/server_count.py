"""The server's own count of the requests it holds, sampled while a level runs (for tests and benchmarks)."""
from __future__ import annotations

import contextlib
import threading

import httpx


class ServerCount:
    """The server's own count of requests (running and queued: SGLang's /v1/loads) every 50 ms, straight from its
    port: ``with ServerCount(port) as count: ...`` then ``count.samples``."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/loads"
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ServerCount:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.wait(0.05):
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                    load = client.get(self.url).json()["loads"][0]
                    self.samples.append(load["num_running_reqs"] + load["num_waiting_reqs"])
