"""The public face of autotune (like httpx's test of its own): exactly these names, each the object its package
defines, and nothing of the tuner loaded by importing autotune alone."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import autotune
from autotune import engines, run, studyfile, targets

PUBLIC = {
    "read_study_file": studyfile, "StudySpec": studyfile, "make_plan": run, "Plan": run, "Tuner": run,
    "RunOptions": run, "RunSummary": run, "Engine": engines, "ENGINES": engines, "get_engine": engines,
    "Target": targets, "KINDS": targets, "make_target": targets,
}


def test_the_public_names() -> None:
    assert sorted(autotune.__all__) == sorted(PUBLIC)
    assert sorted(dir(autotune)) == sorted(PUBLIC)
    for name, package in PUBLIC.items():
        assert getattr(autotune, name) is getattr(package, name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        autotune.load_study  # noqa: B018
    except AttributeError as e:
        assert "load_study" in str(e)
    else:
        raise AssertionError("autotune.load_study exists")


def test_importing_autotune_loads_none_of_the_tuner() -> None:
    loaded = subprocess.run([sys.executable, "-c", "import sys, autotune.sim; print(' '.join(sorted(sys.modules)))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if m.startswith(("optuna", "autotune.run", "autotune.studyfile"))]


def _faces_scripts_import() -> list[tuple[str, str, str]]:
    """(script, module, name) for each name scripts/ import from autotune outside its test instruments and emulator."""
    found = []
    for path in sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "autotune":
                if not node.module.startswith(("autotune.testing", "autotune.sim")):
                    found += [(path.name, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(path.name, a.name, "") for a in node.names if a.name.startswith("autotune.")
                          and not a.name.startswith(("autotune.testing", "autotune.sim"))]
    return found


def test_scripts_import_only_public_faces() -> None:
    """A bench runs the product through the names a package shows (its ``__all__``), or a module of the root that
    every layer shares (errors), never a module inside a package, so a module can move or change inside its package
    without a script noticing."""
    imports = _faces_scripts_import()
    assert imports, "scripts/ import nothing of autotune: the check would prove nothing"
    private = []
    for script, module, name in imports:
        face = importlib.import_module(module)
        if module.count(".") == 1 and not hasattr(face, "__path__"):
            continue
        if not hasattr(face, "__path__") or name not in getattr(face, "__all__", ()):
            private.append(f"{script}: {module}.{name}" if name else f"{script}: import {module}")
    assert not private, private
