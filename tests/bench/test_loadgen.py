"""The load generator program and what the tuner makes of it: reading events on the hot path, the steady-state
window over several processes, the server's own count of requests, any python3 from 3.6 on the target, and a study
that stops (instead of giving up on configs) when its client cannot keep up."""
from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from autotune.results import client_limit, tally
from autotune.run import queue
from autotune.record import write
from autotune.bench.client import RequestRecord
from autotune.bench.measuring import LOADGEN, Generator, LocalProcess
from autotune.bench.measure import Bench, LevelResult
from autotune.bench.workload import load_prompts
from autotune.engines import get_engine
from autotune.studyfile.spec import WorkloadSpec
from autotune.bench import loadgen
from autotune.testing.ports import free_port
from tests.support import requires
from tests.support.emulator import start_emulator

KEY = b'"completion_tokens":'


def test_the_token_count_is_read_by_its_key_and_never_from_the_text() -> None:
    event = b'{"text":"say \\"completion_tokens\\": 999","meta_info":{"completion_tokens": 17,"e2e_latency":1.5e-1}}'
    assert loadgen.tokens_in(event, KEY) == 17
    assert loadgen.seconds_in(event, b'"e2e_latency":') == pytest.approx(0.15)
    # the key only inside the generated text (escaped quotes) is not the count
    assert loadgen.tokens_in(b'{"text":"\\"completion_tokens\\": 999"}', KEY) is None
    assert loadgen.tokens_in(b'{"meta_info":{}}', KEY) is None


def _wire(slot: int, start: float, e2e: float | None, ramp: bool = False, error: str | None = None,
          cancelled: bool = False) -> dict:
    return {"slot": slot, "start": start, "e2e": e2e, "ramp": ramp, "error": error, "cancelled": cancelled}


def test_one_window_for_every_process() -> None:
    # the ramp of two slots (in two processes) ends at 1.0 and 1.5; the window opens at the later one and closes at
    # the end of the 3rd request finished after it; a failed or cut-off request does not count
    records = [_wire(0, 0.0, 1.0, ramp=True), _wire(1, 0.0, 1.5, ramp=True),
               _wire(0, 1.0, 0.4), _wire(0, 1.4, 0.5), _wire(1, 1.5, 0.1, error="http 500: x"),
               _wire(1, 1.6, 0.6), _wire(0, 1.9, 0.5), _wire(1, 2.2, None, cancelled=True)]
    assert loadgen.window_of(records, 2, 3) == [1.5, 2.4]
    assert loadgen.window_of(records, 2, 4) is None
    assert loadgen.window_of(records[:1] + records[2:], 2, 1) is None  # a slot's ramp has not ended


def _rec(start: float, e2e: float, server: float | None, cancelled: bool = False) -> RequestRecord:
    r = RequestRecord(2, start, max_tokens=100, e2e=e2e, tokens=100, trace=[(e2e, 100)], server_e2e=server,
                      finish_reason=None if cancelled else "length", cancelled=cancelled)
    return r


def test_a_round_trip_the_slots_send_ahead_of_costs_the_server_nothing() -> None:
    # two slots through a 40 ms round trip: each next request is sent 40 ms before the current one's last event
    # arrives, so the server (1.0 s per request) holds two requests all the time: nothing is the client's
    sent_ahead = [_rec(i * 1.0, 1.04, 1.0) for _ in range(2) for i in range(5)]
    assert LevelResult(2, sent_ahead, window=(1.04, 4.04)).client_share == pytest.approx(0.0)
    # sent when the last event arrives, each request waits out the round trip first: 40 ms of each 1.04 s
    waited = [_rec(i * 1.04, 1.04, 1.0) for _ in range(2) for i in range(5)]
    assert LevelResult(2, waited, window=(1.04, 4.16)).client_share == pytest.approx(0.04 / 1.04)
    # sent ahead by more than the round trip, each request reaches the server before the previous one left it: the
    # server held more than its two (the figure would read high), which the tuner refuses as well
    early = [_rec(i * 1.0, 1.04, 1.04) for _ in range(2) for i in range(5)]
    level = LevelResult(2, early, window=(1.04, 4.04))
    assert level.server_held == pytest.approx(1.04) and level.client_share == 0.0
    # a request cut off when the window closed was held from its start plus the typical time outside the server
    cut = [*waited[:4], _rec(4.16, 0.3, None, cancelled=True), *waited[5:9], _rec(4.16, 0.3, None, cancelled=True)]
    assert LevelResult(2, cut, window=(1.04, 4.5)).client_share == pytest.approx(
        1 - (2 * (3 * 1.0 + (4.5 - 4.2))) / (2 * (4.5 - 1.04)))


class _Python:
    """The load generator under another python3, as a target host with an old one would run it."""

    def __init__(self, python: str) -> None:
        self.python = python

    def __call__(self) -> LocalProcess:
        proc = LocalProcess.__new__(LocalProcess)
        proc.proc = subprocess.Popen([self.python, "-c", LOADGEN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return proc


def test_the_program_runs_on_an_old_python_with_several_processes() -> None:
    python = requires.old_python("3.6", "3.7", "3.8")
    port = free_port()
    server = start_emulator(port, steps=3, topk=1, draft=4, speedup=4)
    try:
        workload = WorkloadSpec(max_tokens=64, concurrency=(8,), requests=2, window_generations=2, warmup=1,
                                max_repeats=1, processes=3, tolerance=0.5)
        bench = Bench(f"http://127.0.0.1:{port}", get_engine("sglang"), workload, load_prompts("builtin", Path(".")),
                      seed=0, load=Generator(_Python(python), "127.0.0.1", port, where=Path(python).name))
        m = bench.run()
    finally:
        server.kill()
        server.wait()
    level = m.level(8)[0]
    assert level.load.processes == 3 and level.load.where == Path(python).name
    assert len(level.measured) == 16 and m.summary(8)["output_tok_s"] > 0
    assert {r.max_tokens for r in level.records if r.ramp} == {8, 16, 24, 32, 40, 48, 56, 64}  # one ramp per slot
    assert all(r.verify_steps and r.server_e2e for r in level.measured)  # the engine read every last event


# -- a client that cannot keep up ------------------------------------------------------------------------------


def _study_with(outcomes: list[tuple[str | None, bool]]) -> list[optuna.trial.FrozenTrial]:
    """A study whose trials launched and ended as ``outcomes`` say: (failure reason or None, baseline)."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    for i, (reason, baseline) in enumerate(outcomes):
        if baseline:
            queue.enqueue(study, {}, "baseline")
        trial = study.ask()
        write.candidate(trial, {"steps": i}, {"steps": i}, f"key{i}")
        write.launched(trial, ["server"], "log")
        if reason is None:
            study.tell(trial, 1.0)
        else:
            write.failed(trial, reason, f"{reason}: concurrency 32: the client fell behind the server")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return study.get_trials(deepcopy=False)


def test_a_client_that_keeps_failing_stops_the_study_and_no_config_is_given_up_on() -> None:
    two = _study_with([(None, True), ("client_bound", False), ("client_bound", False)])
    assert client_limit.verdict(two) is None
    three = _study_with([(None, True), ("client_bound", False), ("client_bound", False), ("client_bound", False)])
    line = client_limit.verdict(three)
    assert line is not None and "\n" not in line
    assert "3 launches in a row (trials 1, 2, 3)" in line and "concurrency 32: the client fell behind" in line
    interrupted = _study_with([(None, True), ("client_bound", False), (None, False), ("client_bound", False)])
    assert client_limit.verdict(interrupted) is None
    baseline = _study_with([("client_bound", True), ("client_bound", True)])
    assert "the baseline (trials 0, 1)" in (client_limit.verdict(baseline) or "")
    # a config the client could not measure is never given up on; one the infrastructure failed twice is
    assert tally.given_up(three) == {}
    lost = _study_with([(None, True), ("ssh_lost", False)])
    assert list(tally.given_up(lost)) == ["key1"]
