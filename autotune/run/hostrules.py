"""What of a host's answer the tuner takes (hostresolve.py): the engine's own values, and only values the study's
rules would allow.

The engine on the target is asked how it runs a config; its answer rewrites flags the rules did not predict (a page
size a backend forces). It must never move what autotune or the target owns (the port autotune waits on, the address
it reaches the server at, the model the study measures, a secret, the adaptive schedule's file: ``Engine.owner_of``),
and a value it gives must be one the study file could hold for that flag: of the kind the flag was asked with (the
[space]'s type for a tuned flag), a finite number, or a one-line string without shell syntax. Anything else is a
broken or hostile answer: not taken, and said.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from autotune.engines import ArgValue, Engine
from autotune.redact import is_secret
from autotune.studyfile.spec import SHELL_CHARACTERS, ParamSpec
from autotune.tables import CONTROL, PLAIN_TOKEN


def _refusal(engine: Engine, params: Sequence[ParamSpec], name: str, asked: ArgValue | None,
             value: object) -> str | None:
    """Why the host's ``value`` for flag ``name`` (asked as ``asked``) is not taken; None when it is."""
    owner = engine.owner_of(name) or ("a secret, given to the server by autotune" if is_secret(name) else None)
    if owner is not None:
        return f"{name} is {owner}"
    param = next((p for p in params if p.name == name), None)
    kind = param.type if param is not None else _kind(asked)
    if isinstance(value, bool):
        return None if kind not in ("int", "float") else f"{name} is a number ({kind}), not true/false"
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return "not a finite number"
        if kind == "int" and not isinstance(value, int):
            return f"{name} is a whole number (int)"
        return None
    if not isinstance(value, str):
        return f"not a flag's value ({type(value).__name__})"
    if kind in ("int", "float", "bool"):
        return f"{name} is {'true/false' if kind == 'bool' else f'a number ({kind})'}, not text"
    if kind == "categorical" and not PLAIN_TOKEN.fullmatch(value):
        return "not a plain token (letters, digits, ./:+=,@%_-), as the [space]'s choices are"
    if not value or CONTROL.search(value) or value.startswith("-"):
        return "not a one-line value (it is empty, holds a control character or opens with '-')"
    shell = sorted({c for c in value if c in SHELL_CHARACTERS})
    if shell:
        return f"holds {' '.join(shell)} (shell syntax no server flag takes)"
    return None


def admissible(engine: Engine, params: Sequence[ParamSpec], asked: Mapping[str, ArgValue],
               changes: Mapping[str, object]) -> tuple[dict[str, ArgValue], dict[str, str]]:
    """The changes the host's answer may make to ``asked`` (flag -> value), and the refused ones (flag -> why)."""
    kept: dict[str, ArgValue] = {}
    refused: dict[str, str] = {}
    for name, value in changes.items():
        why = _refusal(engine, params, name, asked.get(name), value)
        if why is None:
            kept[name] = value  # type: ignore[assignment]  # _refusal lets only flag values through
        else:
            refused[name] = why
    return kept, refused


def _kind(asked: ArgValue | None) -> str | None:
    """The study file's kind of a fixed flag's value (None: not asked, any kind)."""
    if asked is None:
        return None
    if isinstance(asked, bool):
        return "bool"
    if isinstance(asked, int):
        return "int"
    return "float" if isinstance(asked, float) else "str"
