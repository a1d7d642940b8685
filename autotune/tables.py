"""Typed reads from the TOML tables of a study file, failing with one line: 'FILE: [table] key: what is allowed'.

Shared by the study file's own tables (studyfile/spec.py) and the option tables each target kind declares (targets/).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, NoReturn

from autotune.errors import UserError
from autotune.redact import MASK, SHORTEST, is_secret, remember
from autotune.visible import visible

#: a value that may reach a remote shell or a unit file without surprises. Names and values are matched whole
#: (``\A...\Z``: ``$`` would also match before a final newline, which a shell then runs as a second command)
PLAIN_TOKEN = re.compile(r"\A[A-Za-z0-9_./:+=,@%-]+\Z")
ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
#: characters no single-line setting holds (a newline ends a line of a unit file, an env file or a log)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Reader:
    """Reads keys of one study file's tables; every failure names the file, the table and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: values named by reference whose environment variable is not set: "[table] key: ..." (a command that
        #: launches a server refuses to start; the others do not need them)
        self.missing: list[str] = []

    def fail(self, where: str, key: str, message: str) -> NoReturn:
        place = f"[{where}] {key}" if where else key
        raise UserError(f"{self.path}: {visible(place)}: {message}")

    def table(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.fail("", key, "must be a table")
        return value

    def only(self, table: dict[str, Any], where: str, allowed: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                self.fail(where, key, f"unknown key; allowed: {', '.join(allowed)}")

    def get(self, table: dict[str, Any], where: str, key: str, kind: type, default: Any) -> Any:
        if key not in table:
            return default
        value = table[key]
        if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
            names = {str: "a string", bool: "true or false", list: "a list", dict: "a table"}
            self.fail(where, key, f"must be {names.get(kind, kind.__name__)}, got {value!r}")
        if kind is str and CONTROL.search(value):
            self.fail(where, key, f"must be one line without control characters, got {value!r}")
        return value

    def choice(self, table: dict[str, Any], where: str, key: str, allowed: tuple[str, ...], default: Any) -> Any:
        value = self.get(table, where, key, str, default)
        if value is not None and value not in allowed:
            self.fail(where, key, f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def number(self, table: dict[str, Any], where: str, key: str, default: Any,
               low: float | None = None, high: float | None = None) -> Any:
        return self._bounded(table, where, key, default, low, high, (int, float), "a number")

    def integer(self, table: dict[str, Any], where: str, key: str, default: Any,
                low: int | None = None, high: int | None = None) -> Any:
        return self._bounded(table, where, key, default, low, high, (int,), "a whole number")

    def env(self, table: dict[str, Any], where: str, key: str) -> dict[str, str]:
        """A table of environment variables for the server; a value may be given by reference, ``{ env = "NAME" }``
        (read from autotune's own environment, so that the secret is in no file), or marked secret,
        ``{ secret = "VALUE" }``."""
        env = dict(self.get(table, where, key, dict, {}))
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                self.fail(f"{where}.{key}", name, "environment variable names must be letters, digits and '_' "
                                                  "(not starting with a digit)")
            if isinstance(value, dict):
                env[name] = self.reference(f"{where}.{key}", name, value)
                continue
            if not isinstance(value, str) or not PLAIN_TOKEN.fullmatch(value):
                shown = MASK if is_secret(name) and isinstance(value, str) else repr(value)
                self.fail(f"{where}.{key}", name, "must be a plain string value (letters, digits, ./:+=,@%_-), "
                                                  f'{{ env = "NAME" }} or {{ secret = "VALUE" }}, got {shown}')
            if is_secret(name):
                remember(value)
        return env

    def reference(self, where: str, key: str, ref: dict[str, Any]) -> str:
        """A secret: ``{ env = "NAME" }``, read from autotune's environment ("" and a note in ``missing`` when the
        variable is not set), or ``{ secret = "VALUE" }``, a value written in the file that is masked wherever autotune
        writes. Either is remembered (``redact.remember``) and must be long enough to be told apart in text."""
        if set(ref) == {"secret"}:
            value = ref["secret"]
            if not isinstance(value, str) or not value or CONTROL.search(value):
                self.fail(where, key, "{ secret = ... } must be a non-empty one-line string")
            self._remember(where, key, value, "the secret")
            return value
        name = ref.get("env")
        if set(ref) != {"env"} or not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            self.fail(where, key, f'a value by reference is {{ env = "NAME" }} (an environment variable of '
                                  f'autotune\'s) and a secret written here {{ secret = "VALUE" }}, got a table of '
                                  f"{', '.join(map(repr, ref)) or 'nothing'}")
        value = os.environ.get(name)
        if value is None:
            self.missing.append(f"[{where}] {key}: environment variable {name} is not set (the value is read from "
                                "autotune's environment)")
            return ""
        if CONTROL.search(value):
            self.fail(where, key, f"environment variable {name} holds a control character (a newline?); a secret is "
                                  "one line")
        if value:
            self._remember(where, key, value, f"environment variable {name}")
        return value

    def _remember(self, where: str, key: str, value: str, what: str) -> None:
        if len(value) < SHORTEST:
            self.fail(where, key, f"{what} has {len(value)} characters; a secret needs at least {SHORTEST}, or it "
                                  "could not be told apart from other text to be masked")
        remember(value)

    def _bounded(self, table: dict[str, Any], where: str, key: str, default: Any, low: float | None,
                 high: float | None, kinds: tuple[type, ...], what: str) -> Any:
        if key not in table:
            return default
        value = table[key]
        if (isinstance(value, bool) or not isinstance(value, kinds)
                or (isinstance(value, float) and not math.isfinite(value))):
            self.fail(where, key, f"must be {what}, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            rng = f"from {low} to {high}" if low is not None and high is not None else (
                f"at least {low}" if low is not None else f"at most {high}")
            self.fail(where, key, f"must be {rng}, got {value!r}")
        return value
