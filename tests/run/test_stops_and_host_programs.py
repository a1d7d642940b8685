"""A stop acts within seconds in every phase (a server that drips its configuration, a host that never answers the
start-up question, even with SIGINT ignored by whoever started the tuner), the server then handled as at any stop;
and a program run on the host is read up to a cap: past it, the host's answer is "unavailable"."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.engines.sglang import SGLang
from autotune.run.hostresolve import HostResolver
from autotune.targets.completed import MAX_OUTPUT
from autotune.targets.local import LocalSpec, LocalTarget
from autotune.testing.studies import write_study
from tests.support.cli import status, wait_for_line
from tests.support.emulator import port_open
from tests.support.misbehaving_server import PROGRAM

#: seconds a stop may take, from the signal to the tuner's exit (it takes well under one)
STOP_BOUND = 10.0


def _fake_python(directory: Path, question: str) -> Path:
    """A python3 that runs the shell ``question`` when asked a question (``-c PROGRAM``) and is this python
    otherwise (the emulator's server starts as usual)."""
    path = directory / "python3"
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then {question}; fi\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def _start(study: Path, shell: str = "") -> subprocess.Popen[str]:
    """`autotune run` in the background, exec'd by a shell after ``shell`` (``trap '' INT``: SIGINT ignored, as a
    script started in the background starts it; ``ulimit -v KB``: a bounded address space, where a run that reads
    without end fails instead of filling the machine)."""
    run = shlex.join([sys.executable, "-m", "autotune", "run", "--study", str(study)])
    return subprocess.Popen(["sh", "-c", f"{shell}\nexec {run}"], cwd=study.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stopped(proc: subprocess.Popen[str], sig: signal.Signals) -> float:
    """Send ``sig``; the seconds until the tuner exited with 128 + its number (no traceback on the way)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{sig.name} did not stop the tuner within 60 s: {out[-2000:]} {err[-2000:]}")
    took = time.monotonic() - sent
    assert proc.returncode == 128 + sig.value, out + err
    assert "Traceback" not in out + err, out + err
    return took


def _kill_server(port: int) -> None:
    """The server a failed test's tuner left (its pid file in this test's state directory)."""
    pid_file = Path(os.environ["XDG_STATE_HOME"]) / "autotune" / f"local-{port}.pid"
    with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError):
        os.killpg(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_server_drips_its_configuration_stops_the_run(tmp_path: Path, sig: signal.Signals) -> None:
    """The baseline's /server_info sends a byte a second without end: the stop acts within seconds, the trial is
    queued again as interrupted, and the server is stopped as at any stop of a local target."""
    study = write_study(tmp_path, launches=3, args={"misbehave": "trickle"}, command=[sys.executable, str(PROGRAM)])
    port = int(study.read_text().split("server_port = ")[1].split()[0])
    proc = _start(study)
    try:
        wait_for_line(tmp_path / "t.log", r"trial 0 deploy", proc, timeout=60)
        deadline = time.monotonic() + 30
        while not port_open(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # ready at once: verifying by now
        took = _stopped(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_server(port)
    print(f"{sig.name} while verifying: the tuner ended {took:.1f} s later")
    assert took < STOP_BOUND
    assert not port_open(port), "the local server is stopped at any stop"
    trials = status(study)["trials"]
    assert (trials[0]["state"], trials[0]["reason"]) == ("FAIL", "interrupted"), trials[0]
    assert trials[1]["state"] == "WAITING" and trials[1]["baseline"], "queued again for the next run"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_start_up_host_question_stops_the_run(tmp_path: Path, sig: signal.Signals) -> None:
    """A host whose engine never answers (the question sleeps): the stop acts within seconds, not after the
    question's 180 s, and the question's program is not left behind. Started with SIGINT ignored, as a script in
    the background starts it."""
    asked = tmp_path / "asked"
    python = _fake_python(tmp_path, f"echo $$ > {asked}; exec sleep 600")
    study = write_study(tmp_path, launches=2, command=[str(python), "-m", "autotune.sim"])
    proc = _start(study, "trap '' INT")
    try:
        deadline = time.monotonic() + 60
        while not asked.exists() or not asked.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate() if proc.poll() else ""
            time.sleep(0.05)
        took = _stopped(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    question = int(asked.read_text())
    print(f"{sig.name} during the host question: the tuner ended {took:.1f} s later")
    try:
        os.kill(question, 0)
        os.kill(question, signal.SIGKILL)
        pytest.fail("the question's program outlived the tuner")
    except ProcessLookupError:
        pass
    assert took < STOP_BOUND
    assert "stopped before any trial" in (tmp_path / "t.log").read_text()


@pytest.mark.slow
def test_a_host_program_that_writes_without_end_is_unavailable_and_the_study_runs(tmp_path: Path) -> None:
    """The question's program writes without end: read up to its cap, the host is said unable to answer once and
    the rules decide; the tuner's memory stays bounded (it runs within 2 GiB of address space here; the whole
    output once reached a MemoryError in seconds)."""
    python = _fake_python(tmp_path, "exec yes autotune")
    study = write_study(tmp_path, launches=2, command=[str(python), "-m", "autotune.sim"])
    started = time.monotonic()
    proc = _start(study, f"ulimit -v {2 << 20}")  # KiB: 2 GiB
    out, err = proc.communicate(timeout=240)
    took = time.monotonic() - started
    print(f"a host program without end: the study of 2 launches ran in {took:.1f} s")
    assert proc.returncode == 0 and "Traceback" not in out + err, out[-2000:] + err[-2000:]
    log = (tmp_path / "t.log").read_text()
    assert f"cannot be asked about a config before its launch (the program wrote more than {MAX_OUTPUT} bytes)" \
        in log, log
    assert [t["state"] for t in status(study)["trials"]] == ["COMPLETE", "COMPLETE"]


def test_an_answer_past_the_output_cap_is_no_answer(tmp_path: Path) -> None:
    """A program that writes more than the cap before its answer: its answer is not taken (the host cannot
    answer), whatever the last line says."""
    rejected = json.dumps({"answer": "rejected", "message": "no"})
    python = _fake_python(tmp_path, f"head -c {MAX_OUTPUT + 1} /dev/zero | tr '\\\\0' x; echo; echo '{rejected}'; "
                                    "exit 0")
    host = HostResolver(SGLang(), LocalTarget(LocalSpec(engine="sglang"), cwd=tmp_path),
                        [str(python), "-m", "autotune.sim"], {})
    args = {"model-path": "/m", "tp-size": 4}
    assert host.effective(args, "key", None) == args
    assert host.available is False
