"""One real study of the tuner's whole search, shared by the tests that read a default study end to end
(tests/run/test_run.py), its dependent ranges (tests/studyfile/test_dependent_ranges.py) and the search's own moves
(tests/search/test_search.py): `autotune run` of LAUNCHES launches on the emulator over SGLang's whole speculative space
(the engine's starting points, the search model's picks, confirmations at the end). Run once per test
session, on first use; `autotune best` and `status` only read it, and a test that runs it again works on a copy."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from autotune.testing.studies import write_study
from tests.support.cli import run_autotune, status

LAUNCHES = 12
#: enough requests per level that a confirmation can tell the leader from its rivals
WORKLOAD = "max_tokens = 48\nconcurrency = [1, 4]\nrequests = 8\nwindow_generations = 2\nwarmup = 1\ntolerance = 0.5"


@dataclass(frozen=True)
class SearchStudy:
    path: Path
    run: subprocess.CompletedProcess[str]
    #: `autotune status --json` rows, as read right after the run
    trials: list[dict[str, Any]]

    def copy(self, directory: Path) -> Path:
        """The study's file, database, log and server logs copied into ``directory``: its copy's study file."""
        for item in self.path.parent.iterdir():
            if item.name.startswith(self.path.stem) and item.name != "state":
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, directory / item.name)
        return directory / self.path.name


_made: list[SearchStudy] = []


def search_study(factory: pytest.TempPathFactory) -> SearchStudy:
    """The finished study (made on the first call)."""
    if not _made:
        directory = factory.mktemp("search-study")
        path = write_study(directory, launches=LAUNCHES, seed=3, workload=WORKLOAD)
        r = run_autotune("run", "--study", str(path), cwd=directory, env={"XDG_STATE_HOME": str(directory / "state")})
        assert r.returncode == 0, r.stderr + r.stdout
        _made.append(SearchStudy(path, r, status(path)["trials"]))
    return _made[0]
