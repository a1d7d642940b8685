"""Programs that run on the target host, with whatever python3 (>= 3.6) it has and its standard library only.

Each is a real module here (linted and unit-tested like the rest, importable where this machine needs the same
logic) and is shipped to the target as source text, run as ``python3 -c SCRIPT ARGS...`` (no file is written
there). A program may import its siblings as ``from autotune.targets.programs import NAME``: ``script(name)`` ships
those modules with it and registers them under that name before the program runs, so the same import works on a
host where autotune is not installed.
"""
from __future__ import annotations

import re
import shlex
from importlib import resources

#: shell lines that set $PY to a python3 on the target (the system's first: no pyenv/conda shim, which on GPU hosts
#: is often slow to start), or fail
FIND_PYTHON = (
    'PY=; for c in /usr/bin/python3 /usr/local/bin/python3 python3; do '
    'if command -v "$c" >/dev/null 2>&1; then PY=$(command -v "$c"); break; fi; done; '
    '[ -n "$PY" ] || { echo "autotune: python3 is not installed on the target (needed for its helpers)" >&2; '
    'exit 127; }'
)
_SIBLING = re.compile(r"^from autotune\.targets\.programs import (\w+)", re.MULTILINE)


def source(name: str) -> str:
    """The text of module ``name`` (``supervisor``, ``ports``, ...)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def _siblings(name: str, seen: list[str]) -> list[str]:
    """The modules program ``name`` imports, each after the ones it imports itself."""
    for dep in _SIBLING.findall(source(name)):
        if dep not in seen:
            _siblings(dep, seen)
            seen.append(dep)
    return seen


def script(name: str) -> str:
    """Program ``name`` as one ``python3 -c`` text: the sibling modules it imports registered first (as modules of
    an otherwise empty ``autotune.targets.programs`` package), then the program run as ``__main__``."""
    modules = [(dep, source(dep)) for dep in _siblings(name, [])]
    return "\n".join([
        "import sys, types",
        "def _module(name, path=None):",
        "    m = types.ModuleType(name)",
        "    if path is not None:",
        "        m.__path__ = path",
        "    sys.modules[name] = m",
        "    return m",
        "_package = None",
        "for _name in ('autotune', 'autotune.targets', 'autotune.targets.programs'):",
        "    _package = _module(_name, [])",
        f"for _name, _text in {modules!r}:",
        "    _m = _module('autotune.targets.programs.' + _name)",
        "    exec(compile(_text, _name + '.py', 'exec'), _m.__dict__)",
        "    setattr(_package, _name, _m)",
        f"exec(compile({source(name)!r}, {name + '.py'!r}, 'exec'), {{'__name__': '__main__'}})",
    ])


def program_line(name: str, *args: object) -> str:
    """A shell line running program ``name`` with ``args`` (quoted) by ``$PY`` (FIND_PYTHON sets it)."""
    return '"$PY" -c ' + " ".join(shlex.quote(str(a)) for a in (script(name), *args))
