"""A space whose ranges hold billions of values is counted, never listed: `validate` ends with little memory, and the
search walks only a space small enough to walk."""
from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

from autotune.search.neighbours import valid_configs, spread
from tests.support.study_texts import TOPK, VALID, space_of, write

#: the topk of the audit: every whole number from 1 to a billion
BILLION_WIDE = VALID.replace('type = "categorical"\nchoices = [1, 2]', 'type = "int"\nlow = 1\nhigh = 1000000000')
#: and a fixed argument of 100,000 characters, in every config's key
LONG_ARGUMENT = BILLION_WIDE.replace('model-path = "/m"', f'model-path = "/{"m" * 100_000}"')
#: the address space the `validate` of a billion-value range gets (the interpreter, optuna and numpy need ~700 MB)
MEMORY = 1536 * 2**20


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def test_validate_counts_a_topk_range_of_a_billion_values_with_a_long_argument(tmp_path: Path) -> None:
    assert BILLION_WIDE != VALID and LONG_ARGUMENT != BILLION_WIDE
    study = write(tmp_path, LONG_ARGUMENT)
    r = subprocess.run([sys.executable, "-m", "autotune", "validate", "--study", str(study)], capture_output=True,
                       text=True, timeout=120, preexec_fn=_capped, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"at least \d+ distinct valid configs", r.stdout), r.stdout
    assert "starting point: steps=2 topk=1" in r.stdout, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


def test_a_space_too_large_to_walk_is_not_walked(tmp_path: Path) -> None:
    space = space_of(tmp_path, BILLION_WIDE)
    assert space.size() == 4 * 10**9 * 7
    assert not space.walkable
    assert valid_configs(space) == ()  # the local search takes over (propose.py)
    place = spread(space, {p.name: 2 for p in space.params})
    assert 0 < place[[p.name for p in space.params].index(TOPK)] < 0.1


def test_sglang_starts_from_a_few_wide_trees_of_a_billion(tmp_path: Path) -> None:
    space = space_of(tmp_path, BILLION_WIDE)
    points = space.engine.starting_points({p.name: p.values() for p in space.params}, space.fixed)
    widths = [p[TOPK] for p in points]
    chains = widths.count(1)
    assert chains >= 1 and widths[:chains] == [1] * chains  # the chain at the quartiles of the steps first
    assert 1 < len(widths) - chains <= 6, widths  # then a few wider trees, spread up to the widest
    assert widths == sorted(widths) and widths[-1] == 10**9
