"""Fixtures of every test: its own machine-wide state dir (locks, pid files), and no emulator left running; and,
under pytest-xdist, the turns that keep a test marked ``alone`` from sharing the machine."""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import requires
from tests.support.turns import turn


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    # the workers' temp dirs share one parent, the run's own (removed as pytest rotates its temp dirs)
    alone = item.get_closest_marker("alone") is not None
    with turn(Path(item.config.option.basetemp).parent / "turn", alone):
        yield


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


def _emulators() -> set[int]:
    """Emulator processes that are orphans or this test process's own children (not other sessions')."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if (b"autotune-sim" in cmd or b"autotune.sim" in cmd) and ppid in (1, os.getpid()):
                pids.add(int(entry.name))
    return pids


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_servers() -> object:
    """Every emulator a test starts must be stopped by the code under test or the test; whatever survives the
    session is killed here and reported, so CI machines stay clean and leaks are seen."""
    before = _emulators()
    yield
    import signal
    import time

    time.sleep(0.5)
    leaked = _emulators() - before
    for pid in leaked:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if leaked:
        print(f"\nwarning: {len(leaked)} emulator process(es) outlived the tests and were killed: {sorted(leaked)}",
              file=sys.__stderr__)


@pytest.fixture
def llama_parts() -> None:
    """llama-server and SmolLM2 in the cache, or the test fails naming the set-up command."""
    requires.llama_server()
    requires.smollm2()
