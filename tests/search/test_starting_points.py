"""The engine's starting points: a new study measures informed configs right after the baseline."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from autotune.engines import get_engine
from autotune.errors import REASONS
from autotune.engines.sglang import tree_capacity
from autotune.search import initial_design
from autotune.studyfile.space import Space
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import SPEC_SPACE, write_study
from tests.support.cli import kept, run_autotune, start_run, status, wait_for_line
from tests.support.study_texts import DRAFT, STEPS, TOPK, WIDE, space_of, write

EAGLE = {"speculative-algorithm": "EAGLE"}
#: what the full space's starting points are: the chain at the quartiles of steps 1-8, then wider trees at the median
FULL_SPACE_POINTS = [(3, 1, 4), (5, 1, 6), (6, 1, 7), (5, 2, 13), (5, 4, 19), (5, 8, 19)]
#: the ones a new study measures (SearchSettings.starting_points): the 3-step chain and the first tree
OPENING = [(3, 1, 4), (5, 2, 13)]


def triples(points: list[dict]) -> list[tuple[int, int, int]]:
    return [(p[STEPS], p[TOPK], p[DRAFT]) for p in points]


def test_sglang_starts_deeper_on_the_chain_then_wider() -> None:
    engine = get_engine("sglang")
    values = {STEPS: list(range(1, 9)), TOPK: [1, 2, 4, 8], DRAFT: list(range(2, 33))}
    points = engine.starting_points(values, EAGLE)
    assert triples(points) == FULL_SPACE_POINTS
    for p in points:
        engine.resolve({**EAGLE, **p})  # each one a config SGLang runs as it is: never rejected, never rewritten
        low, high = (p[STEPS] + 1, p[STEPS] + 1) if p[TOPK] == 1 else (p[STEPS] + 1, tree_capacity(p[STEPS], p[TOPK]))
        assert low <= p[DRAFT] <= high


def test_without_a_chain_the_narrowest_tree_goes_deeper_first() -> None:
    engine = get_engine("sglang")
    values = {STEPS: [2, 3, 4], TOPK: [2, 4], DRAFT: list(range(2, 9))}
    # topk 2 at steps 2, 3, 4 (drafts halfway into steps + 1..min(8, tree)), then topk 4 at the median steps
    assert triples(engine.starting_points(values, EAGLE)) == [(2, 2, 5), (3, 2, 6), (4, 2, 7), (3, 4, 6)]
    # only steps tuned: the study's own tree goes deeper
    fixed = {**EAGLE, TOPK: 4, DRAFT: 8}
    assert triples(engine.starting_points({STEPS: list(range(1, 9))}, fixed)) == [(3, 4, 8), (5, 4, 8), (6, 4, 8)]


def test_no_starting_points_where_sglang_drafts_no_tree() -> None:
    engine = get_engine("sglang")
    values = {STEPS: list(range(1, 9)), TOPK: [1, 2], DRAFT: list(range(2, 9))}
    assert engine.starting_points(values, {"speculative-algorithm": "NGRAM"}) == []
    assert engine.starting_points({"mem-fraction-static": [0.8, 0.9]}, {**EAGLE, STEPS: 3, TOPK: 1, DRAFT: 4}) == []
    assert get_engine("llamacpp").starting_points(values, {}) == []


def test_the_space_keeps_only_new_configs_it_holds(tmp_path: Path) -> None:
    # the baseline is the 3-step chain: that point is already measured; draft tokens stop at 8 here
    text = WIDE.replace('speculative-algorithm = "EAGLE"', 'speculative-algorithm = "EAGLE"\n'
                        f'{STEPS} = 3\n{TOPK} = 1\n{DRAFT} = 4').replace("low = 2\nhigh = 32", "low = 2\nhigh = 8")
    space = space_of(tmp_path, text)
    points = space.starting_points()
    assert triples(points) == [(5, 1, 6), (6, 1, 7), (5, 2, 7), (5, 4, 7), (5, 8, 7)]
    assert len({space.candidate(p).key for p in points}) == len(points)
    assert space.baseline().key not in {space.candidate(p).key for p in points}


def test_only_model_based_samplers_get_them(tmp_path: Path) -> None:
    engine = get_engine("sglang")
    for extra, expected in (("", FULL_SPACE_POINTS), ('sampler = "gp"', FULL_SPACE_POINTS),
                            ('initial_design = "random"', []), ('sampler = "random"', []), ('sampler = "grid"', [])):
        spec = read_study_file(str(write(tmp_path, WIDE.replace("trials = 10", f"trials = 10\n{extra}"))))
        assert triples(initial_design(spec, Space(spec, engine, 31555))) == expected, extra


@pytest.mark.slow
def test_a_new_study_measures_them_right_after_the_baseline(tmp_path: Path) -> None:
    workload = ("max_tokens = 48\nconcurrency = [1, 4]\nrequests = 4\n"
                "window_generations = 1\nwarmup = 0\nmax_repeats = 1\ntolerance = 0.5")
    study = write_study(tmp_path, launches=4, space=SPEC_SPACE, workload=workload)
    listed = run_autotune("validate", "--study", str(study), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    # the 3-step chain and the first tree (SearchSettings.starting_points): then the search's model takes over
    assert "starting point: steps=3 topk=1 draft-tokens=4" in listed.stdout
    assert listed.stdout.count("starting point:") == 2

    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "trial 1 [starting point] COMPLETE: steps=3 topk=1 draft-tokens=4" in r.stdout
    trials = kept(status(study)["trials"])
    assert [t["baseline"] for t in trials] == [True, False, False, False]
    assert [t["starting_point"] for t in trials] == [False, True, True, False]
    assert [(t["config"][STEPS], t["config"][TOPK], t["config"][DRAFT]) for t in trials[1:3]] == OPENING

    # more trials later for the same study are the sampler's own: the starting points were chosen when it was made
    study.write_text(study.read_text().replace("launches = 4", "launches = 6"))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = kept(status(study)["trials"])
    assert [t["starting_point"] for t in trials] == [False, True, True, False, False, False]
    # each of them ran (a fast config may outrun this machine's client twice: that is the infrastructure's)
    assert all(t["state"] in ("COMPLETE", "PRUNED") or not REASONS[t["reason"]] for t in trials)


@pytest.mark.slow
def test_a_baseline_cut_short_runs_again_before_them(tmp_path: Path) -> None:
    """A config queued again after a failure that was not its fault (here the user's stop during the baseline) is
    the next one measured: the starting points are queued one at a time, so they never stand in front of it (the
    weighted objective of each of them needs the baseline first)."""
    # the server starts in 2 s: the stop lands while the baseline's server starts
    study = write_study(tmp_path, launches=5, space=SPEC_SPACE, args={"sim-time-scale": 0.02})
    proc = start_run(study)
    wait_for_line(tmp_path / "t.log", r"trial 0 deploy", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # stopped by a signal, as a shell reports one
    assert re.search(r"trial 0 failed: interrupted .*; its config is queued again", out)
    queued = [t for t in status(study)["trials"] if t["state"] == "WAITING"]
    assert [(t["retry_of"], t["baseline"]) for t in queued] == [(0, True)]

    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = status(study)["trials"]
    assert trials[1]["retry_of"] == 0 and trials[1]["baseline"] and trials[1]["state"] == "COMPLETE"
    assert [t["starting_point"] for t in trials[2:]] == [True, True, False, False]
    assert [(t["config"][STEPS], t["config"][TOPK], t["config"][DRAFT]) for t in trials[2:4]] == OPENING
    assert all(t["state"] in ("COMPLETE", "PRUNED") for t in trials[1:])
