"""objective = "capacity": real `autotune run` on the emulator, each launch climbing and narrowing the load within
one server start, checked against the emulator's own account (`autotune sim surface --study`): each config's
capacity within one step of the study's ladder of the truth's, and the study's pick the config with the most
truthful capacity. (Bad inputs: test_bad_inputs.py's table, "capacity ..." cases.)"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.bench.capacity import SLO, Ladder
from autotune.run.plan import make_plan
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import write_study
from tests.support import truths
from tests.support.cli import finished_ok, run_autotune, status

#: configs whose capacity differs by its running-request limit and by its speed there: (1, 2) and (3, 4) are the
#: valid chains, at 8 or 16 requests running; the rest of the grid is rejected before launching
SPACE = """
[space.speculative-num-steps]
type = "categorical"
choices = [1, 3]
[space.speculative-num-draft-tokens]
type = "categorical"
choices = [2, 4]
[space.max-running-requests]
type = "categorical"
choices = [8, 16]
"""
LADDER = [4, 8, 16, 24, 32]
#: TTFT p99 within 40 ms: a request that must queue for a running slot waits most of another's time (60 ms and more
#: at this speed), one that is admitted at once 10-15 ms by the server's clock, and up to about 25 ms as a busy
#: 2-core machine's client sees it (the way there and back, the HTTP handling): the bound sits between the two
SLO_MS = 40

_made: dict[str, Any] = {}


@pytest.fixture(scope="module")
def capacity_study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The finished study (run once): its file, `status --json`, its trials' capacity records, and the truth."""
    if not _made:
        directory = tmp_path_factory.mktemp("capacity")
        path = write_study(directory, "cap", objective="capacity", sampler="grid", launches=8, space=SPACE,
                           args={"max-running-requests": 8},
                           workload=f"max_tokens = 48\nconcurrency = {LADDER}\nrequests = 4\nwindow_generations = 2\n"
                                    "warmup = 1\ntolerance = 0.5\nmax_repeats = 1",
                           extra=f"[constraints]\nmax_ttft_p99_ms = {SLO_MS}\n")
        r = run_autotune("run", "--study", str(path), cwd=directory, env={"XDG_STATE_HOME": str(directory / "s")})
        finished_ok(r)
        plan = make_plan(read_study_file(str(path)))
        _made.update(path=path, trials=status(path)["trials"], truth=truths.surface(plan))
    return _made


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _capacities(path: Path) -> dict[str, dict[str, Any]]:
    """Each launched config's capacity record (`best --per-concurrency --json`), by its params."""
    r = run_autotune("best", "--study", str(path), "--per-concurrency", "--json")
    finished_ok(r)
    return {_key(c["params"]): c for c in json.loads(r.stdout)["capacity"]}


def _step_around(load: int) -> tuple[int, int]:
    """The ladder's levels either side of ``load`` (0 below the lowest; the top above it)."""
    below = max((c for c in LADDER if c < load), default=0)
    above = min((c for c in LADDER if c > load), default=LADDER[-1])
    return below, above


@pytest.mark.slow
def test_each_configs_capacity_is_within_one_ladder_step_of_the_truth(capacity_study: dict[str, Any]) -> None:
    measured = _capacities(capacity_study["path"])
    truth = {_key(row["params"]): row["capacity"] for row in capacity_study["truth"]["configs"] if row["fits"]}
    compared = []
    for key, cap in measured.items():
        true = truth[key]
        assert true["concurrency"] is not None, true
        below, above = _step_around(true["concurrency"])
        assert cap["concurrency"] is not None and below <= cap["concurrency"] <= above, (key, cap, true)
        # the curve holds every probed load, the capacity among those that met the SLO, the next one up broke it
        loads = [p["concurrency"] for p in cap["curve"]]
        assert loads == sorted(loads) and cap["concurrency"] in loads
        assert all(p["meets_slo"] == (p["ttft_ms_p99"] <= SLO_MS) for p in cap["curve"])
        assert not next(p for p in cap["curve"] if p["concurrency"] > cap["concurrency"])["meets_slo"]
        compared.append((key, cap["concurrency"], true["concurrency"]))
    assert len(compared) == 4, compared  # every valid config of the grid was launched and compared


@pytest.mark.slow
def test_the_pick_is_the_config_with_the_most_truthful_capacity(capacity_study: dict[str, Any]) -> None:
    rows = sorted((row for row in capacity_study["truth"]["configs"] if row["fits"]),
                  key=lambda row: -row["capacity"]["output_tok_s"])
    top, runner_up = rows[0], rows[1]
    assert top["capacity"]["output_tok_s"] > 1.2 * runner_up["capacity"]["output_tok_s"], rows  # a clear winner
    r = run_autotune("best", "--study", str(capacity_study["path"]), "--json")
    finished_ok(r)
    best = json.loads(r.stdout)
    assert best["params"] == top["params"], (best["params"], top["params"])
    assert best["metrics"]["capacity_concurrency"] is not None
    assert best["value"] == pytest.approx(best["metrics"]["capacity_tok_s"])
    shown = run_autotune("best", "--study", str(capacity_study["path"]))
    finished_ok(shown)
    assert f"capacity c{best['metrics']['capacity_concurrency']} within the SLO" in shown.stdout


@pytest.mark.parametrize(("limit", "probes", "capacity"), [
    (17, [4, 8, 16, 24, 20, 18, 17], 17),     # climb to the first break, then three bisections
    (5, [4, 8, 6, 5], 5),                     # the bisection stops once one load separates good from bad
    (40, [4, 8, 16, 24, 32], 32),             # nothing broke: the top, "at least"
    (2, [4, 2, 3], 2),                        # the lowest level broke: bisect below it
    (0, [4, 2, 1], None),                     # not even one request at a time: no capacity
])
def test_the_probe_sequence_climbs_the_ladder_then_bisects(limit: int, probes: list[int], capacity: int | None
                                                           ) -> None:
    """The loads a launch probes, in order, for a server whose TTFT p99 breaks a 25 ms SLO above ``limit``."""
    ladder = Ladder(LADDER, SLO(ttft_p99_ms=SLO_MS))
    seen, load = [], ladder.first()
    while load is not None:
        seen.append(load)
        load = ladder.next(load, {"ttft_ms_p99": 10.0 if load <= limit else 80.0, "itl_ms_p99": 5.0})
    assert seen == probes
    assert ladder.capacity == capacity
    assert (ladder.bracket()[1] is None) == (limit >= LADDER[-1])  # "below the top" only when a load broke it


def test_an_itl_bound_judges_every_gap_and_a_missing_figure_breaks_it() -> None:
    slo = SLO(itl_p99_ms=30)
    assert slo.meets({"ttft_ms_p99": 900.0, "itl_ms_p99": 29.9})
    assert not slo.meets({"ttft_ms_p99": 1.0, "itl_ms_p99": 30.1})
    assert not slo.meets({"ttft_ms_p99": 1.0, "itl_ms_p99": None})
