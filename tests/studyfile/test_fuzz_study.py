"""The fuzzer: at least 1,000 study files generated from real ones (wrong types, huge numbers and strings, control
characters, unknown keys, duplicate choices, owned flags, paths to /dev/zero, FIFOs, directories and missing files),
each through autotune's own ``main()``: every case ends with exit 0, or exit 2 and exactly one line on stderr; no
traceback, nothing written beside the study file, no case over 10 s, the whole batch within a memory cap.

The seed comes from the clock and is printed; AUTOTUNE_FUZZ_SEED=N replays a run."""
from __future__ import annotations

import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.study_fuzz import ROOT, cases

CASES = 1000
#: the runner's address space: the interpreter with optuna, numpy and torch's imports is ~800 MB
MEMORY = 2 * 2**30
#: the whole batch (about 30 s on one busy core): beyond it, cases hang or crawl
BATCH_SECONDS = 240


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.slow
def test_generated_study_files_end_in_one_line_or_succeed(tmp_path: Path) -> None:
    seed = int(os.environ.get("AUTOTUNE_FUZZ_SEED") or time.time_ns() % 2**32)
    print(f"fuzz seed {seed} (replay: AUTOTUNE_FUZZ_SEED={seed})")
    todo = cases(seed, CASES)
    (tmp_path / "cases.json").write_text(json.dumps(todo))
    (tmp_path / "runs").mkdir()
    try:
        r = subprocess.run([sys.executable, "-m", "tests.support.study_fuzz", str(tmp_path / "cases.json"),
                            str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, preexec_fn=_capped,
                           timeout=BATCH_SECONDS, check=False)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode().count("\n")
        pytest.fail(f"seed {seed}: the batch took over {BATCH_SECONDS} s ({done} cases done; case {done}: "
                    f"{todo[min(done, CASES - 1)]['done']})", pytrace=False)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    counts = collections.Counter(x["verdict"] if x["verdict"] in ("exit 0", "exit 2") else "other" for x in results)
    print(f"fuzz totals: {len(results)} cases, {counts['exit 0']} exit 0, {counts['exit 2']} exit 2, "
          f"{counts['other']} other (seed {seed})")
    assert r.returncode == 0 and len(results) == CASES, (
        f"seed {seed}: the runner ended with {r.returncode} after {len(results)} cases "
        f"(case {len(results)}: {todo[len(results)]['done'] if len(results) < CASES else ''}): {r.stderr[-2000:]}")
    bad = [(x, todo[x["number"]]["done"]) for x in results if x["verdict"] not in ("exit 0", "exit 2")]
    assert not bad, f"seed {seed}: {len(bad)} cases failed; the first: " + "\n".join(
        f"case {x['number']} ({', '.join(done)}): {x['verdict'][-700:]} {x['stderr'][-700:]}" for x, done in bad[:3])
    assert counts["exit 0"] >= CASES // 20 and counts["exit 2"] >= CASES // 2, counts  # both kinds are exercised
