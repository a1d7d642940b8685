"""Keeping secrets out of what autotune prints, logs and stores.

A secret is a value whose name says so (an API key flag, ``HF_TOKEN``, ``password``, ...), a value the study file names
by reference (``HF_TOKEN = { env = "HF_TOKEN" }``, read from autotune's environment) or the password of a storage
URL. The study file's reader ``remember``s each one; wherever such a value would be written (the database, artifacts,
logs, reports, `status`, the dashboard) it is replaced by ``MASK``. The server itself still gets the real value at
launch.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

MASK = "***"
#: words of a flag or variable name (split at anything but letters and digits) that make its value a secret; whole
#: words only, so that ``max-total-tokens`` or ``num-draft-tokens`` are not
SECRET_WORDS = frozenset({"key", "apikey", "token", "password", "passwd", "passphrase", "secret", "credential",
                          "credentials", "auth", "authorization"})
_WORD = re.compile(r"[a-z0-9]+")


def is_secret(name: str) -> bool:
    """Whether a flag or environment variable of this name holds a secret (an API key flag, ``HF_TOKEN``, ...)."""
    words = _WORD.findall(name.lower())
    return any(w in SECRET_WORDS for w in words)


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every secret's value masked."""
    return {k: MASK if is_secret(k) and v not in (None, "") else v for k, v in values.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the value after (or in ``--flag=value``) every secret flag masked."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide and not arg.startswith("-"):  # a secret flag's value (a bare secret-named switch has none)
            out.append(MASK)
            hide = False
        elif arg.startswith("-") and "=" in arg and is_secret(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(arg)
            hide = arg.startswith("-") and is_secret(arg)
    return out


def redact_url(url: str) -> str:
    """A storage URL without its password: in the user part (``user:pw@host``) and in the query
    (``?password=...``)."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    if "@" in rest:
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            rest = f"{creds.split(':', 1)[0]}:{MASK}@{host}"
    if query:
        pairs = [(k, MASK if is_secret(k) else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        rest += "?" + urlencode(pairs, safe="*")
    return f"{scheme}://{rest}"


#: the secret values of the study files read by this process
_known: set[str] = set()
#: a value shorter than this is not masked inside other text (it would mask ordinary words and numbers)
SHORTEST = 4


def remember(value: str) -> None:
    """Mask ``value`` from now on wherever autotune writes text."""
    if value and value != MASK:
        _known.add(value)


def remember_url_password(url: str) -> None:
    """Mask a storage URL's password (``user:pw@host``, ``?password=``) from now on."""
    if "://" not in url:
        return
    rest, _, query = url.split("://", 1)[1].partition("?")
    creds = rest.rsplit("@", 1)[0] if "@" in rest else ""
    if ":" in creds:
        remember(creds.split(":", 1)[1])
    for key, value in parse_qsl(query):
        if is_secret(key):
            remember(value)


def mask(text: str) -> str:
    """``text`` with every remembered secret replaced by ``MASK``."""
    for value in sorted(_known, key=len, reverse=True):
        if len(value) >= SHORTEST or text == value:
            text = text.replace(value, MASK)
    return text


def mask_argv(argv: list[str]) -> list[str]:
    """A command line with secret flags' values and every remembered secret masked."""
    return [mask(a) for a in redact_argv(argv)]


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flag or variable values with secrets masked (by name, and every remembered value)."""
    return {k: mask(v) if isinstance(v, str) else v for k, v in redact_mapping(values).items()}


def unmask_argv(argv: list[str], args: Mapping[str, Any]) -> list[str]:
    """A stored (masked) command line made runnable again: each masked flag value taken from ``args``, the study's
    own values of those flags."""
    out = list(argv)
    for i, word in enumerate(out):
        if word == MASK and i > 0 and out[i - 1].startswith("-"):
            value = args.get(out[i - 1].lstrip("-"))
            if value is not None:
                out[i] = str(value)
        elif word.startswith("-") and word.endswith("=" + MASK):
            name = word.split("=", 1)[0]
            if args.get(name.lstrip("-")) is not None:
                out[i] = f"{name}={args[name.lstrip('-')]}"
    return out


class LogFilter(logging.Filter):
    """Masks remembered secrets in every event line (stdout, journald, the study's log file)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True
