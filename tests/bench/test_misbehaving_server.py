"""A server that misbehaves never holds the tuner: each mode of tests/support/misbehaving_server.py ends its trial
with a named reason within a stated bound (each measured time printed), without a traceback, and a study goes on to
its next config; figures no server can produce fail the trial and never become the best."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.bench.measure import Bench
from autotune.bench.workload import load_prompts
from autotune.run.bringup import VERIFY_SECONDS, verify
from autotune.engines import get_engine
from autotune.errors import TrialFailure
from autotune.studyfile.spec import WorkloadSpec
from autotune.bench.measuring import Generator, LocalProcess
from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from tests.support.cli import run_autotune, status
from tests.support.misbehaving_server import PROGRAM, MisbehavingServer

ENGINE = get_engine("sglang")
#: the server's speculative config: one verify step yields at most 2 tokens
FLAGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "2")
#: a workload whose request deadline is 2 s + 1 s for each of its 8 tokens
WORKLOAD = WorkloadSpec(max_tokens=8, concurrency=(4,), requests=4, window_generations=1, warmup=0, max_repeats=1,
                        request_timeout=2, stall_timeout=2, tolerance=0.5)
#: a /generate mode -> the reason its measurement fails for (all within STREAM_BOUND seconds: they end in well
#: under one, the trickle in ten; the bound says "ends, not hangs" on a busy machine)
STREAM_MODES = {
    "endless-stream": "bad_response",       # tokens past max_tokens, without end: cut at the first one past
    "endless-events": "bad_response",       # events without end: cut at twice the tokens asked and some
    "trickle-stream": "stalled",            # a token every 1.5 s: past the request's deadline (10 s)
    "giant-event": "bad_response",          # an event past its cap
    "giant-header": "bad_response",         # a head past its cap
    "too-many-tokens": "bad_response",      # 1e30 completion tokens for 8 asked
    "negative-latency": "bad_response",     # e2e_latency -1e308
    "zero-latency": "bad_response",
    "nan-latency": "bad_response",
    "high-accept": "bad_response",          # above the 2 draft tokens
    "low-accept": "bad_response",           # below 1
    "bad-chunking": "bad_response",
    "bad-content-length": "bad_response",
    "wrong-content-length": "bad_response",  # bytes past the length it declared
    "other-answer": "bad_response",          # a ramp request of 2 tokens answered with 8
}
STREAM_BOUND = 30.0


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m == "trickle-stream" else m
                                  for m in sorted(STREAM_MODES)])
def test_a_stream_that_misbehaves_fails_the_measurement_with_its_reason(mode: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    processes: list[LocalProcess] = []

    def load_generator() -> LocalProcess:
        processes.append(LocalProcess())
        return processes[-1]

    with MisbehavingServer(mode, port, *FLAGS) as server:
        bench = Bench(server.url, ENGINE, WORKLOAD, load_prompts("builtin", Path(".")), levels=(1, 4),
                      most_accepted=2, load=Generator(load_generator, "127.0.0.1", port))
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(TrialFailure) as failure:
            bench.run()
        took = time.monotonic() - started
    print(f"{mode}: {failure.value.reason} after {took:.1f} s ({failure.value.detail})")
    assert failure.value.reason == STREAM_MODES[mode], failure.value
    assert took < STREAM_BOUND
    # no "Fatal error: protocol.data_received() call failed", here or in a load generator process
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    assert all("Traceback" not in p.errors() for p in processes), [p.errors() for p in processes]


def test_figures_no_server_gives_fail_the_request_whatever_the_error_rate() -> None:
    """A study that tolerates failed requests still never believes an impossible figure."""
    port = free_port()
    with MisbehavingServer("too-many-tokens", port, *FLAGS) as server:
        bench = Bench(server.url, ENGINE, WORKLOAD, load_prompts("builtin", Path(".")), levels=(1,),
                      max_error_rate=0.9)
        with pytest.raises(TrialFailure) as failure:
            bench.run()
    assert failure.value.reason == "bad_response"
    assert "1e+30 completion tokens, 8 asked" in failure.value.detail


@pytest.mark.parametrize("mode, reason, bound", [
    ("endless-body", "bad_response", 15.0),                     # read up to its cap, 8 MiB
    pytest.param("trickle", "unresponsive", VERIFY_SECONDS + 15, marks=pytest.mark.slow),  # a byte a second
])
def test_a_configuration_that_never_ends_fails_verification_within_its_deadline(mode: str, reason: str,
                                                                               bound: float) -> None:
    with MisbehavingServer(mode, free_port(), *FLAGS) as server:
        started = time.monotonic()
        with pytest.raises(TrialFailure) as failure:
            verify(server.url, ENGINE, {"speculative-num-draft-tokens": 2}, {})
        took = time.monotonic() - started
    print(f"{mode}: {failure.value.reason} after {took:.1f} s ({failure.value.detail})")
    assert failure.value.reason == reason and took < bound


@pytest.mark.slow
def test_a_load_generator_that_hangs_fails_its_level_by_the_level_deadline() -> None:
    """A load generator frozen on its host (SIGSTOP): the level ends by its deadline, (1 + 2) x the longest
    request's (1 s and 1 s for each of 4 tokens), and the grace the generator gets to send what it has."""
    port = free_port()
    workload = replace(WORKLOAD, max_tokens=4, request_timeout=1, stall_timeout=1)

    def frozen() -> LocalProcess:
        proc = LocalProcess()
        os.kill(proc.proc.pid, signal.SIGSTOP)
        return proc

    with MisbehavingServer("none", port, *FLAGS) as server:
        bench = Bench(server.url, ENGINE, workload, load_prompts("builtin", Path(".")), levels=(4,),
                      load=Generator(frozen, "127.0.0.1", port))
        started = time.monotonic()
        with pytest.raises(TrialFailure) as failure:
            bench.run()
        took = time.monotonic() - started
    print(f"frozen load generator: {failure.value.reason} after {took:.1f} s ({failure.value.detail})")
    assert failure.value.reason == "stalled" and "concurrency 4 not done within 15 s" in failure.value.detail
    assert took < 60


#: each mode of a study -> the reason its trial ends with, and the seconds it must end within (launch included)
STUDY_MODES = {**{mode: (reason, 60.0) for mode, reason in STREAM_MODES.items()},
               "trickle": ("unresponsive", VERIFY_SECONDS + 30), "endless-body": ("bad_response", 60.0)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_study_ends_each_misbehaving_config_with_its_reason_and_goes_on(tmp_path: Path) -> None:
    space = ('[space.misbehave]\ntype = "categorical"\n'
             f'choices = {sorted([*STUDY_MODES, "none"])!r}\n'.replace("'", '"'))
    study = write_study(tmp_path, sampler="grid", launches=len(STUDY_MODES) + 4, space=space,
                        command=[sys.executable, str(PROGRAM)],
                        workload="max_tokens = 16\nconcurrency = [1, 4]\nrequests = 4\nwindow_generations = 1\n"
                                 "warmup = 1\nrequest_timeout = 2\nstall_timeout = 2\nmax_repeats = 1\n"
                                 "tolerance = 0.5")
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=850)
    output = r.stdout + r.stderr + (tmp_path / "t.log").read_text()
    assert r.returncode == 0, output[-3000:]
    assert "Traceback" not in output and "Fatal error" not in output, output[-3000:]
    trials = status(study)["trials"]
    by_mode = {t["params"].get("misbehave"): t for t in trials if not t["baseline"]}
    assert set(by_mode) == {*STUDY_MODES, "none"}, "the study went on to every config after each failure"
    for mode, (reason, bound) in sorted(STUDY_MODES.items()):
        t = by_mode[mode]
        print(f"{mode}: {t['reason']} after {t['duration_s']:.1f} s ({(t['detail'] or '')[:100]})")
        assert (t["state"], t["reason"]) == ("PRUNED", reason), t
        assert t["duration_s"] < bound, t
    completed = [t for t in trials if t["state"] == "COMPLETE"]
    assert {t["params"].get("misbehave") for t in completed} <= {None, "none"}, completed
    best = run_autotune("best", "--study", str(study), "--format", "json")
    assert json.loads(best.stdout)["params"].get("misbehave") in (None, "none"), best.stdout
