"""The fuzzer: at least 1,000 study files generated from real ones (wrong types, huge numbers and strings, control
characters, unknown keys, duplicate choices, owned flags, paths to /dev/zero, FIFOs, directories and missing files),
each through autotune's own ``main()``: every case ends with exit 0, or exit 2 and exactly one line on stderr; no
traceback, nothing written beside the study file, no case over 10 s, the whole batch within a memory cap.

The seed comes from the clock and is printed; AUTOTUNE_FUZZ_SEED=N replays a run."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.support.study_fuzz import cases, clock_seed, run_batch

CASES = 1000


@pytest.mark.slow
def test_generated_study_files_end_in_one_line_or_succeed(tmp_path: Path) -> None:
    seed = clock_seed("fuzz")
    todo = cases(seed, CASES)
    results = run_batch(todo, tmp_path, seed)
    counts = collections.Counter(x["verdict"] if x["verdict"] in ("exit 0", "exit 2") else "other" for x in results)
    print(f"fuzz totals: {len(results)} cases, {counts['exit 0']} exit 0, {counts['exit 2']} exit 2, "
          f"{counts['other']} other (seed {seed})")
    bad = [(x, todo[x["number"]]["done"]) for x in results if x["verdict"] not in ("exit 0", "exit 2")]
    assert not bad, f"seed {seed}: {len(bad)} cases failed; the first: " + "\n".join(
        f"case {x['number']} ({', '.join(done)}): {x['verdict'][-700:]} {x['stderr'][-700:]}" for x, done in bad[:3])
    assert counts["exit 0"] >= CASES // 20 and counts["exit 2"] >= CASES // 2, counts  # both kinds are exercised
