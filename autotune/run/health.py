"""Readiness: wait until a freshly started server can really serve, or fail fast with a named reason.

Three things are watched at once, every ``interval`` seconds: the engine's readiness endpoint, the server log (for
the engine's fatal lines) and the process (for an early exit). There is no fixed sleep: a server that is ready in
3 s is measured after 3 s, and one that prints "Not enough memory" fails the trial within a poll or two. Each poll
ends by its own deadline, however slowly the server drips its answer (bounded.py), so the wait ends by its timeout.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from autotune.bench import bounded
from autotune.engines import Engine
from autotune.errors import TrialFailure
from autotune.targets import Deployment

#: a fatal log line's kind -> the trial's failure reason while starting
STARTUP_REASONS = {"oom": "oom_startup", "invalid_args": "invalid_args", "crashed": "crashed",
                   "port_busy": "port_busy"}
#: after the first fatal line, how long to keep reading for a more specific one (a traceback ends with the cause)
FATAL_SETTLE = 1.5


@dataclass(frozen=True)
class Ready:
    seconds: float          # from the start of the wait until the readiness endpoint answered 200


def wait_ready(
    deployment: Deployment,
    engine: Engine,
    interval: float,
    timeout: float,
    headers: dict[str, str] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_poll: Callable[[float], None] | None = None,
) -> Ready:
    """Return once the server answers its readiness endpoint with 200; raise ``TrialFailure`` otherwise.

    ``should_stop`` is checked at every poll (a signal asked the tuner to stop: reason ``interrupted``);
    ``on_poll`` receives the seconds waited so far (for progress display).
    """
    start = time.monotonic()
    paths = list(engine.readiness_paths)
    lines: list[str] = []                  # the log so far: a fatal line's meaning can come after it (a traceback)
    fatal: list[tuple[str, str]] = []      # (reason, line) in the order seen
    first_fatal_at: float | None = None
    poll = max(2.0, interval * 4)  # the most one look at the readiness endpoint may take
    with bounded.client(deployment.base_url, headers or {}, timeout=poll) as client:
        while True:
            now = time.monotonic()
            lines += deployment.read_log().splitlines()
            fatal = engine.fatal_lines(lines)
            if fatal:
                first_fatal_at = first_fatal_at or now
            status = deployment.exit_status()
            if status is not None:
                lines += deployment.read_log().splitlines()
                fatal = engine.fatal_lines(lines)
                if fatal:
                    raise _most_specific(fatal, engine)
                raise TrialFailure(engine.exit_reason(status),
                                   f"server exited with status {status} before it was ready")
            if first_fatal_at is not None and now - first_fatal_at >= FATAL_SETTLE:
                raise _most_specific(fatal, engine)
            if should_stop():
                raise TrialFailure("interrupted", "stop requested while waiting for the server")
            if first_fatal_at is None:
                code = _status(client, paths[0], poll, should_stop)
                if code == 404 and len(paths) > 1:
                    paths.pop(0)
                elif code == 200:
                    return Ready(seconds=time.monotonic() - start)
            waited = time.monotonic() - start
            if waited > timeout:
                raise TrialFailure("startup_timeout",
                                   f"not ready after {waited:.0f} s ([health] timeout = {timeout:g})")
            if on_poll is not None:
                on_poll(waited)
            time.sleep(max(0.0, interval - (time.monotonic() - now)))


def _status(client: httpx.Client, path: str, seconds: float, should_stop: Callable[[], bool]) -> int | None:
    """The readiness endpoint's status, or None when it gave none within ``seconds``."""
    try:
        return bounded.within(seconds, lambda: client.get(path).status_code, should_stop)
    except (httpx.HTTPError, bounded.Overran):
        return None
    except bounded.Stopped:
        raise TrialFailure("interrupted", "stop requested while waiting for the server") from None


def _most_specific(fatal: list[tuple[str, str]], engine: Engine) -> TrialFailure:
    kinds = engine.fatal_kinds
    kind, line = sorted(fatal, key=lambda f: kinds.index(f[0]) if f[0] in kinds else len(kinds))[0]
    return TrialFailure(STARTUP_REASONS.get(kind, "crashed"), line[:300])


def check_alive(deployment: Deployment, engine: Engine) -> None:
    """Raise ``TrialFailure`` if a server that was ready has died (called while it is measured).

    Its log decides between ``oom_under_load`` (the engine reported running out of memory) and
    ``crashed_under_load``.
    """
    status = deployment.exit_status()
    if status is None:
        return
    fatal = engine.fatal_lines(deployment.read_log().splitlines())
    oom = [line for kind, line in fatal if kind == "oom"]
    if oom:
        raise TrialFailure("oom_under_load", oom[0][:300])
    detail = fatal[0][1][:300] if fatal else f"server exited with status {status} while measured"
    raise TrialFailure("crashed_under_load", detail)
