"""The question to the engine on an ssh-process target, through the real test sshd, when the host's program goes
wrong: an output without end is read up to its cap (the host cannot answer), and a stop request ends the wait at
once instead of after the question's deadline."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.errors import TrialFailure
from autotune.targets import make_target
from autotune.targets.completed import MAX_OUTPUT, TOO_LONG
from tests.support.ssh import SpecFactory


def _python(directory: Path, question: str) -> str:
    """A python3 on the host that runs the shell ``question`` when asked (``-c PROGRAM``)."""
    path = directory / "python3"
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then {question}; fi\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_an_output_without_end_is_read_up_to_its_cap(make_spec: SpecFactory, cleanup: Callable[[object], object],
                                                     tmp_path: Path) -> None:
    target = cleanup(make_target(make_spec(), cwd=tmp_path))
    started = time.monotonic()
    done = target.run_engine_program(_python(tmp_path, "exec yes autotune"), "engine_resolve", b"{}", 60)
    took = time.monotonic() - started
    print(f"an endless answer over SSH: cut after {took:.1f} s")
    assert done.status == TOO_LONG and f"more than {MAX_OUTPUT} bytes" in done.stderr
    assert took < 30


def test_a_stop_ends_a_question_that_never_answers(make_spec: SpecFactory, cleanup: Callable[[object], object],
                                                   tmp_path: Path) -> None:
    target = cleanup(make_target(make_spec(), cwd=tmp_path))
    stop = threading.Timer(1.0, lambda: None)
    stop.start()
    started = time.monotonic()
    with pytest.raises(TrialFailure) as failure:
        # (a program that hangs on the host stays there until it ends by itself: this one ends soon after)
        target.run_engine_program(_python(tmp_path, "exec sleep 5"), "engine_resolve", b"{}", 180,
                                  should_stop=lambda: not stop.is_alive())
    took = time.monotonic() - started
    print(f"a stop during a question over SSH: ended {took - 1.0:.1f} s after it")
    assert failure.value.reason == "interrupted" and took < 10
