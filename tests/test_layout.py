"""The package's shape, as ARCHITECTURE.md draws it: no import cycles, one module that owns the trial record,
engine and target knowledge in their own folders, the emulator standing alone, and the test instruments apart from
the product; and the tests' own: test modules share code only through tests/support, scripts import no tests."""
from __future__ import annotations

import ast
from pathlib import Path


from autotune.engines.llamacpp import SPEC_TYPES
from autotune.engines.sglang import TREE_ARGS
from autotune.targets import KINDS, TargetSpec

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "autotune"
TESTS = REPO / "tests"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, tuple[Path, str]]:
    return {_module(p): (p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, text: str, modules: set[str]) -> set[str]:
    """Every autotune module ``name`` imports, wherever the import statement stands (in a function, or under ``if
    TYPE_CHECKING:``, too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(text)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            named = [f"{base}.{a.name}" for a in node.names]
            # a module of a package names its siblings through the package (``from autotune.run import queue``):
            # that is the sibling, not the package's face, which runs before any of its modules anyway
            inside = name.startswith(base + ".")
            targets = [t for t in named if t in modules] if inside else [base, *named]
            if inside and any(t not in modules for t in named):
                targets.append(base)  # a name the package's face re-exports
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt):], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_no_import_cycles() -> None:
    sources = _sources()
    # a package imports its own modules to re-export them; importing the package is then importing those
    cycles = _cycles({name: _imports(name, path, text, set(sources)) for name, (path, text) in sources.items()})
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_cycles_between_the_packages_modules_and_folders() -> None:
    """The layers ARCHITECTURE.md draws: a folder (bench/, targets/, ...) counts as one node, so two folders never
    import each other, whichever of their modules the imports go through (type-only imports too: a layer names
    what it needs of a layer above it as a Protocol of its own, as search/propose.py does with the plan)."""
    sources = _sources()

    def node(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for name, (path, text) in sources.items():
        graph.setdefault(node(name), set()).update(
            node(m) for m in _imports(name, path, text, set(sources)) if node(m) != node(name))
    cycles = _cycles(graph)
    assert not cycles, "cycles between modules and folders: " + "; ".join(" -> ".join(c) for c in cycles)


def test_only_record_reads_or_writes_user_attrs() -> None:
    """A trial's user attrs are read and written by autotune.record alone; the queue hands Optuna the attrs a queued
    trial starts with, as record.write builds them."""
    readers, queuers = set(), set()
    for name, (_, text) in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr in ("user_attrs", "set_user_attr"):
                readers.add(name)
            if isinstance(node, ast.keyword) and node.arg == "user_attrs":
                queuers.add(name)
    assert all(name.startswith("autotune.record") for name in readers), sorted(readers)
    assert queuers <= {"autotune.run.queue"}, sorted(queuers)


def test_study_file_parsing_names_no_target_kinds_option() -> None:
    tree = ast.parse(_sources()["autotune.studyfile.spec"][1])
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for kind in KINDS.values():
        for key in set(kind.spec.keys) - set(TargetSpec.keys):
            assert key not in names, f"study.py names {kind.spec.kind}'s option {key!r}"


def test_engine_flags_stay_in_engines() -> None:
    flags = {*TREE_ARGS, "speculative-algorithm", "api-key", "spec-type", "spec-draft-n-max", *SPEC_TYPES}
    for name, (_, text) in _sources().items():
        if name.startswith(("autotune.engines", "autotune.sim", "autotune.testing")):
            continue  # the engines themselves, the SGLang emulator, and the study files for it
        named = sorted(f for f in flags if f in text)
        assert not named, f"{name} names engine flags {named}"


def _module_of(path: Path) -> str:
    """The dotted name of any module of the repository (autotune, tests, scripts)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """Every module name an import statement of ``path`` names (relative imports resolved; ``from X import Y``
    names X and X.Y), wherever the statement stands."""
    name = _module_of(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_tests_share_code_only_through_support() -> None:
    """No test module, conftest or helper imports a test module or a conftest: what tests share is in tests/support
    (and the instruments benchmarks use too in autotune/testing)."""
    def shared_wrongly(name: str) -> bool:
        last = name.rpartition(".")[2]
        outside = _within(name, "tests") and name != "tests" and not _within(name, "tests.support")
        return outside or last == "conftest" or last.startswith("test_")

    wrong = sorted(f"{p.relative_to(REPO)} imports {n}" for p in TESTS.rglob("*.py") for n in _imported(p)
                   if shared_wrongly(n))
    assert not wrong, wrong


def test_scripts_import_no_tests() -> None:
    wrong = sorted(f"{p.relative_to(REPO)} imports {n}" for p in (REPO / "scripts").glob("*.py")
                   for n in _imported(p) if _within(n, "tests"))
    assert not wrong, wrong


def test_test_instruments_are_not_imported_by_the_product() -> None:
    """autotune/testing serves tests and scripts; nothing else in autotune depends on it."""
    wrong = sorted(f"{p.relative_to(REPO)} imports {n}" for p in PACKAGE.rglob("*.py")
                   if not _within(_module_of(p), "autotune.testing")
                   for n in _imported(p) if _within(n, "autotune.testing"))
    assert not wrong, wrong


def test_the_reference_client_shares_no_code_with_autotune() -> None:
    imported = _imported(PACKAGE / "testing" / "reference_client.py")
    assert not [n for n in imported if _within(n, "autotune") or _within(n, "tests")], imported


def test_one_free_port() -> None:
    defined = sorted(str(p.relative_to(REPO)) for folder in (PACKAGE, TESTS, REPO / "scripts")
                     for p in folder.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name == "free_port")
    assert defined == ["autotune/testing/ports.py"], defined


def test_the_emulator_imports_nothing_of_the_rest() -> None:
    """autotune/sim stands alone: a test instrument that knows SGLang, not the tuner."""
    wrong = sorted(f"{p.relative_to(REPO)} imports {n}" for p in (PACKAGE / "sim").rglob("*.py")
                   for n in _imported(p) if _within(n, "autotune") and not _within(n, "autotune.sim")
                   and n != "autotune")
    assert not wrong, wrong


def test_no_test_is_skipped_for_what_the_machine_lacks() -> None:
    """A missing system part fails its tests with one line naming scripts/setup.sh (tests/support/requires.py): a
    skipped test reads like a passing one in the summary."""
    skipping = ("skip", "skipif", "importorskip", "xfail")
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in skipping \
                    and getattr(node.value, "id", getattr(node.value, "attr", None)) in ("pytest", "mark"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert found == []


#: the modules the package's root holds: the command line and what every layer shares
ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "logs", "redact", "tables", "visible"}


def test_the_root_holds_the_command_line_and_what_every_layer_shares() -> None:
    """Everything else is in a package that names its part of the flow (ARCHITECTURE.md): at most 8 modules here."""
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root <= ROOT_MODULES and len(ROOT_MODULES) <= 8, sorted(root - ROOT_MODULES)


def test_every_package_says_what_it_is() -> None:
    """Every package opens with a docstring; every package of the product (not the emulator, the test instruments
    or the programs shipped to hosts) has a public face: the names its ``__init__`` re-exports in ``__all__``."""
    apart = ("autotune.sim", "autotune.testing", "autotune.targets.programs")
    bare, faceless = [], []
    for name, (path, text) in _sources().items():
        if path.name != "__init__.py" or name == "autotune":
            continue
        tree = ast.parse(text)
        if ast.get_docstring(tree) is None:
            bare.append(name)
        public = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
                     for n in tree.body)
        if not public and not any(_within(name, a) for a in apart):
            faceless.append(name)
    assert not bare, f"packages without a docstring: {bare}"
    assert not faceless, f"packages without a public face (__all__): {faceless}"
