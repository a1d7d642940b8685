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
#: shell lines that set the positional parameters ("$@") to the python that runs the command $CMD (a python itself,
#: or a Python program whose first line names its interpreter, pip's console scripts among them, a long path through
#: pip's sh trampoline), or fail with one line saying why. A path stays one word whatever it holds (a space, a glob
#: character); only a #! line is split into words, as the kernel splits one (#!/usr/bin/env python3)
FIND_ENGINE_PYTHON = (
    'case "${CMD##*/}" in python|python[0-9]*) set -- "$CMD" ;; *) '
    'P=$(command -v "$CMD") || { echo "autotune: the server command $CMD is not found" >&2; exit 127; }; '
    'L=$(head -c 200 "$P" 2>/dev/null | head -n 1); '
    'case "$L" in "#!"*python*) set -f; set -- ${L#??}; set +f ;; '
    '"#!/bin/sh"*) EPY=$(sed -n "2s/^' "'''exec' " r'\"\\([^\"]*\\)\".*/\\1/p" "$P"); set -- ${EPY:+"$EPY"} ;; '
    '*) set -- ;; esac; '
    '[ "$#" -gt 0 ] || { echo "autotune: the server command $CMD is not a Python program (no python on its #! '
    'line)" >&2; '
    'exit 126; } ;; esac'
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
    run = f"exec(compile({source(name)!r}, {name + '.py'!r}, 'exec'), {{'__name__': '__main__'}})"
    if not modules:
        return run  # no stand-in autotune package: a program run by the engine's python may import the real one
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
        run,
    ])


def engine_program_lines(command: str, name: str) -> str:
    """Shell lines running program ``name`` by the python of server command ``command`` (its standard input is the
    program's)."""
    return "\n".join([f"CMD={shlex.quote(command)}", FIND_ENGINE_PYTHON,
                      f'exec "$@" -c {shlex.quote(script(name))}'])


def program_line(name: str, *args: object) -> str:
    """A shell line running program ``name`` with ``args`` (quoted) by ``$PY`` (FIND_PYTHON sets it)."""
    return text_line(script(name), *args)


def text_line(text: str, *args: object) -> str:
    """A shell line running the Python source ``text`` (a program of the standard library alone, shipped from
    wherever it lives) with ``args`` (quoted) by ``$PY`` (FIND_PYTHON sets it)."""
    return '"$PY" -c ' + " ".join(shlex.quote(str(a)) for a in (text, *args))
