"""One trial loop: the tuner, the sample-efficiency bench and the tests' surrogate studies all take the same step
(autotune/run/trial/step.py: the confirmations and the adaptive server queued, the admission, the queue's next config,
the trial, the client check), so a bench cannot leave out a step the tuner takes."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotune.results import client_limit
from autotune.run import queue
from autotune.run.trial import step as step_module

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "scripts" / "bench_sample_efficiency.py"
#: what the tuner does around each trial, in its order
STEPS = ("queue_confirmation", "queue_adaptive", "admit", "queue_next", "verdict")
#: the loop's parts, called by the step alone
PARTS = {"admit", "queue_next", "queue_adaptive", "queue_confirmation"}


def _observed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the loop's parts, in the order they are called from now on."""
    seen: list[str] = []

    def spy(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)

    for owner, name in ((queue, "queue_confirmation"), (queue, "queue_adaptive"), (step_module, "admit"),
                        (queue, "queue_next"), (client_limit, "verdict")):
        spy(owner, name)
    return seen


def _bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sample_efficiency", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _calls(tree: ast.AST) -> set[str]:
    return {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree) if isinstance(node, ast.Call)}


def test_the_bench_takes_every_step_the_tuner_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench(monkeypatch)
    truth = bench.truth_of("llama8b", tmp_path, closed=True)
    seen = _observed(monkeypatch)
    row = bench.surrogate_study(tmp_path, "llama8b", "weighted", "default", 0, 4, truth)
    assert row["launches"] == 4 and row["stopped_by"] == "budget"
    ran = [seen[i:i + len(STEPS)] for i, name in enumerate(seen) if name == "queue_confirmation"]
    assert ran and all(tuple(r) == STEPS for r in ran[:-1]), ran
    assert ran[-1][:3] == list(STEPS[:3]), "the last step admits nothing more"


def test_the_tuner_loop_is_the_step() -> None:
    """The tuner's loop goes through trial_step and takes none of its parts itself."""
    tree = ast.parse((REPO / "autotune" / "run" / "tuner.py").read_text())
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_trials")
    assert "trial_step" in _calls(loop)
    assert not _calls(tree) & (PARTS | {"optimize", "verdict"})


def test_nothing_else_runs_the_loop() -> None:
    """Across autotune, scripts and tests, the loop's parts are called by autotune/run/trial/step.py alone (a test of
    the parts themselves excepted: none so far), so no bench or test can run a loop of its own."""
    step = REPO / "autotune" / "run" / "trial" / "step.py"
    wrong = sorted(f"{p.relative_to(REPO)}: {sorted(_calls(ast.parse(p.read_text())) & PARTS)}"
                   for folder in ("autotune", "scripts", "tests") for p in (REPO / folder).rglob("*.py")
                   if p != step and _calls(ast.parse(p.read_text())) & PARTS)
    assert not wrong, wrong
