"""The dataset fuzzer: at least 1,000 dataset files generated from real requests (the built-in traffic set and
prompts, in every format autotune reads) and mutated (tests/support/dataset_fuzz.py), each through autotune's own
``main()`` (`validate`, `workload`): no traceback, no hang, no character printed raw that autotune writes out, and
no nonsense accepted: a file a mutation made unreadable or meaningless (a lone surrogate, an empty user turn, broken
JSON, a wrong type, a repeated request...) ends in exit 2 and one line, a file that is odd but valid (a line
separator inside a string, a byte-order mark, CRLF, unknown keys) in exit 0.

The seed comes from the clock and is printed; AUTOTUNE_FUZZ_SEED=N replays a run."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.support.dataset_fuzz import ACCEPT, REFUSE, cases
from tests.support.study_fuzz import clock_seed, run_batch

CASES = 1000


@pytest.mark.slow
def test_generated_datasets_are_read_or_refused_in_one_line(tmp_path: Path) -> None:
    seed = clock_seed("dataset fuzz")
    todo = cases(seed, CASES)
    results = run_batch(todo, tmp_path, seed)
    wrong = [x for x in results if x["verdict"] not in ("exit 0", "exit 2")]
    nonsense = [x for x in results if todo[x["number"]]["expect"] == REFUSE and x["verdict"] == "exit 0"]
    refused = [x for x in results if todo[x["number"]]["expect"] == ACCEPT and x["verdict"] == "exit 2"]
    expected = collections.Counter(c["expect"] for c in todo)
    print(f"dataset fuzz totals: {len(results)} cases ({expected[ACCEPT]} to accept, {expected[REFUSE]} to refuse), "
          f"{sum(x['verdict'] == 'exit 0' for x in results)} exit 0, {sum(x['verdict'] == 'exit 2' for x in results)} "
          f"exit 2, {len(wrong)} other (tracebacks, hangs, raw characters), {len(nonsense)} nonsense accepted, "
          f"{len(refused)} valid files refused (seed {seed})")

    def shown(bad: list[dict]) -> str:
        return "\n".join(f"case {x['number']} ({', '.join(todo[x['number']]['done'])}): {x['verdict'][-700:]} "
                         f"{x['stderr'][-700:]}" for x in bad[:3])

    assert not wrong, f"seed {seed}: {len(wrong)} cases failed; the first:\n{shown(wrong)}"
    assert not nonsense, f"seed {seed}: {len(nonsense)} files of nonsense accepted; the first:\n{shown(nonsense)}"
    assert not refused, f"seed {seed}: {len(refused)} valid files refused; the first:\n{shown(refused)}"
    assert expected[ACCEPT] >= CASES // 5 and expected[REFUSE] >= CASES // 5, expected  # both kinds are drawn
