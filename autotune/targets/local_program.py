"""A program on this machine, run as the tuner runs programs beside a server: ended by one deadline, its output read
up to a cap, and stopped at once, with its whole process group, when the tuner is asked to stop.

A program that writes without end (an engine's question program gone wrong) once filled the tuner's memory in
seconds; one that never answers held a signal for its whole deadline."""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autotune.errors import TrialFailure
from autotune.targets.completed import TOO_LONG, Completed

#: how often the stop request is looked at while the program runs (seconds)
POLL = 0.1


def run_program(argv: Sequence[str], stdin: bytes, *, cwd: Path | None, env: Mapping[str, str], timeout: float,
                limit: int, should_stop: Callable[[], bool] = lambda: False) -> Completed:
    """Run ``argv`` with ``stdin`` on its standard input. Its exit status and output; status 124 past ``timeout``
    seconds, ``TOO_LONG`` once either output passes ``limit`` bytes (the program is killed then). Raises
    ``TrialFailure("interrupted")`` as soon as ``should_stop()`` says so."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=dict(env), start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    with contextlib.suppress(BrokenPipeError):  # a program that does not read its question
        proc.stdin.write(stdin)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    output = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    end = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as pipes:
            for fd in output:
                pipes.register(fd, selectors.EVENT_READ)
            while pipes.get_map() or proc.poll() is None:
                if should_stop():
                    raise TrialFailure("interrupted", "stop requested while a program ran beside the server")
                left = end - time.monotonic()
                if left <= 0:
                    return Completed(124, "", f"autotune: no answer within {timeout:.0f} s")
                if not pipes.get_map():
                    time.sleep(min(POLL, left))
                    continue
                for key, _ in pipes.select(min(POLL, left)):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        pipes.unregister(key.fd)
                    output[key.fd] += data
                    if len(output[key.fd]) > limit:
                        return Completed(TOO_LONG, "", f"autotune: the program wrote more than {limit} bytes")
        out, err = (bytes(b).decode("utf-8", "replace") for b in output.values())
        return Completed(proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
