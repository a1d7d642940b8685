"""Programs that run on the target host, with whatever python3 (>= 3.6) it has and its standard library only.

Each is a real module here (linted and unit-tested like the rest, importable where this machine needs the same
logic) and is shipped to the target as source text, run as ``python3 -c SOURCE ARGS...`` (no file is written
there). ``source(name)`` reads one through importlib.resources.
"""
from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The text of program ``name`` (``supervisor``, ``ports``)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
