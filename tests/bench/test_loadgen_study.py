"""Whole studies and the load generator: a client that cannot keep up stops the study in one line instead of
retrying and giving up on the fastest configs, and two workers on this 2-core machine spend their whole budget on
measured trials."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from autotune.testing.ports import free_port
from autotune.testing.studies import port_of, write_study
from tests.support.cli import kept, launches, run_autotune, status

pytestmark = pytest.mark.slow


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.timeout(300)
def test_a_client_that_cannot_keep_up_stops_the_study_in_one_line(tmp_path: Path) -> None:
    """The baseline at the model's speed measures fine; every config of the space runs the emulator 200-300x
    faster, where a 64-token request is over in milliseconds and the HTTP round trip alone keeps the server short
    of its 32 requests: three launches in a row fail client_bound and the study stops, at once (no backoff), with
    one line saying what the client reached, the limit and what to change. Nothing is lost and no config is given
    up on; the local server is stopped, as at the end of any study."""
    space = '[space.sim-speedup]\ntype = "categorical"\nchoices = [200, 250, 300]\n'
    study = write_study(tmp_path, launches=8, space=space, sampler="grid", args={"sim-speedup": 1},
                        workload="max_tokens = 64\nconcurrency = [1, 32]\nrequests = 4\nwarmup = 1\n"
                                 "window_generations = 2")
    start = time.monotonic()
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=280)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "measuring client could not keep up" in line]
    assert len(lines) == 1, r.stdout
    line = lines[0]
    assert "3 launches in a row" in line and "held fewer than 32 requests" in line and "tok/s" in line
    assert "[workload] client" in line or "processes" in line  # what to change
    rows = status(study)["trials"]
    baseline = next(t for t in rows if t["number"] == 0)
    assert baseline["state"] == "COMPLETE"
    failed = [t for t in rows if t["number"] > 0 and t["state"] != "WAITING"]
    assert [t["reason"] for t in failed] == ["client_bound"] * 3, [(t["number"], t["state"], t["reason"])
                                                                  for t in rows]
    assert all("held fewer than 32 requests" in t["detail"] for t in failed)
    assert not any(t["reason"] == "given_up" for t in rows)
    # the last config's retry stays queued: the next run, on a machine that keeps up, measures it first
    assert [t["state"] for t in rows if t["number"] > 3] == ["WAITING"]
    assert _port_free(port_of(study))
    assert took < 150, took  # no backoff between the attempts


@pytest.mark.timeout(900)
def test_two_workers_on_this_machine_measure_every_launch(tmp_path: Path) -> None:
    """`--all-targets` over two emulator targets here (96-token requests at concurrency 4, about 400 tok/s each,
    the default 3% tolerance): every launch of the budget ends measured (complete or pruned on its figures), none
    client_bound, and the study has a best. At twice that rate, two servers and their clients on 2 cores beside one
    or two busy cores (or another test) fell behind 1.6-1.9% of a window (1.5% allowed) in one run of three or four,
    without the traffic work as with it: client_bound was then the right verdict, not this test's subject; at this
    rate four runs of four passed beside three busy cores."""
    ports = [free_port(), free_port()]
    tables = "".join(f'[targets.w{i}]\nkind = "local"\nserver_port = {p}\n\n' for i, p in enumerate(ports))
    study = write_study(tmp_path, "multi", launches=6, args={"sim-speedup": 1},
                        workload="max_tokens = 96\nconcurrency = [1, 4]\nrequests = 8\nwarmup = 1")
    text = study.read_text()
    head, rest = text.split("[target]\n", 1)
    study.write_text(head + tables + rest.split("\n\n", 1)[1])
    r = run_autotune("run", "--study", str(study), "--all-targets", cwd=tmp_path, timeout=880)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = status(study)["trials"]
    assert launches(rows) == 6, rows
    measured = [t for t in kept(rows) if t["launched"]]
    assert all(t["state"] in ("COMPLETE", "PRUNED") for t in measured), [(t["state"], t["reason"]) for t in rows]
    assert not any(t["reason"] == "client_bound" for t in rows), [t["detail"] for t in rows if t["reason"]]
    assert "best" in r.stdout and all(_port_free(p) for p in ports)
