"""Keeping secrets out of what autotune prints, logs and stores.

A secret is a value whose name says so (an API key flag, ``HF_TOKEN``, ``PGPASSWORD``, ...), a value the study file
gives by reference (``HF_TOKEN = { env = "HF_TOKEN" }``, read from autotune's environment) or marks secret
(``X = { secret = "..." }``), or the password of a storage URL. The study file's reader ``remember``s each one; every
byte autotune writes goes through ``mask`` at the moment it is written: the database, artifacts, the event log (its
tracebacks too), `status`, the dashboard, and the servers' logs as they stream in (``MaskedFile``),
so that even a `kill -9` of the tuner leaves no secret on disk. The server itself still gets the real value.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlencode

from autotune.visible import visible

MASK = "***"
#: words of a flag or variable name (split at anything but letters and digits) that make its value a secret, unless a
#: word of ``MEASURES`` says the name is about an amount of them or where one is kept (``--speculative-token-map``,
#: ``--bucket-time-to-first-token``, ``KEY_FILE``); whole words only, so that ``max-total-tokens`` is not
SECRET_WORDS = frozenset({"key", "apikey", "token", "auth", "authorization", "bearer", "cookie"})
#: parts that make a name a secret's wherever they stand: ``PGPASSWORD``, ``sslpassword``, ``apiKey``, ``AWSSECRET``
SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "apikey", "credential", "privatekey", "accesskey")
MEASURES = frozenset({"per", "first", "inter", "bucket", "map", "usage", "distribution", "threshold", "max", "min",
                      "num", "count", "size", "limit", "latency", "watermark", "budget", "file", "path", "dir",
                      "time", "rate", "len", "length", "id"})
_WORD = re.compile(r"[a-z0-9]+")


def is_secret(name: str) -> bool:
    """Whether a flag, environment variable or URL parameter of this name holds a secret (an API key flag,
    ``HF_TOKEN``, ``PGPASSWORD``, ``sslpassword``, ``accessToken``, ...; not ``max-total-tokens``, ``tokenizer-path``,
    ``keyfile`` or ``--speculative-token-map``)."""
    words = _WORD.findall(name.lower())
    if any(part in word for word in words for part in SECRET_PARTS):
        return True
    weak = any(word in SECRET_WORDS or word.endswith("token") for word in words)
    return weak and not MEASURES.intersection(words)


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
    (``?password=...``, ``?sslpassword=...``); also every remembered secret."""
    if "://" not in url:
        return mask(url)
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    if "@" in rest:
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            rest = f"{creds.split(':', 1)[0]}:{MASK}@{host}"
    if query:
        pairs = [(k, MASK if is_secret(k) else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        rest += "?" + urlencode(pairs, safe="*")
    return mask(f"{scheme}://{rest}")


#: the secret values of the study files read by this process
_known: set[str] = set()
#: a value shorter than this is not masked inside other text (it would mask ordinary words and numbers); a value the
#: user names a secret (by reference or marked) must be at least this long
SHORTEST = 4


def remember(value: str) -> None:
    """Mask ``value`` from now on wherever autotune writes text (also as it appears quoted in JSON, a Python repr or
    a URL)."""
    if value and value != MASK and value not in _known:
        _known.add(value)
        _patterns.clear()


def remember_url_password(url: str) -> None:
    """Mask a storage URL's password (``user:pw@host``, ``?password=``, ``?sslpassword=``) from now on."""
    if "://" not in url:
        return
    rest, _, query = url.split("://", 1)[1].partition("?")
    creds = rest.rsplit("@", 1)[0] if "@" in rest else ""
    if ":" in creds:
        remember(creds.split(":", 1)[1])
    for key, value in parse_qsl(query):
        if is_secret(key):
            remember(value)


def _forms(value: str) -> set[str]:
    """How a secret may appear in text a program prints: as it is, inside a JSON string or a Python repr, and
    URL-encoded."""
    forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1], quote(value), quote(value, safe=""),
             quote_plus(value)}
    return {f for f in forms if len(f) >= SHORTEST}


#: the remembered secrets compiled: (text pattern, bytes pattern, every form in bytes, longest first); empty when
#: they are to be compiled again
_patterns: list[tuple[re.Pattern[str] | None, re.Pattern[bytes] | None, list[bytes]]] = []


def _compiled() -> tuple[re.Pattern[str] | None, re.Pattern[bytes] | None, list[bytes]]:
    if not _patterns:
        forms = sorted({f for v in _known for f in _forms(v)}, key=len, reverse=True)
        encoded = [f.encode("utf-8", "surrogatepass") for f in forms]
        _patterns.append((re.compile("|".join(map(re.escape, forms))) if forms else None,
                          re.compile(b"|".join(map(re.escape, encoded))) if forms else None, encoded))
    return _patterns[0]


def mask(text: str) -> str:
    """``text`` with every remembered secret replaced by ``MASK``."""
    if text in _known:
        return MASK
    pattern = _compiled()[0]
    return text if pattern is None else pattern.sub(MASK, text)


def mask_bytes(data: bytes) -> bytes:
    """``mask`` for raw bytes (a server's log as it arrives)."""
    pattern = _compiled()[1]
    return data if pattern is None else pattern.sub(MASK.encode(), data)


def mask_argv(argv: list[str]) -> list[str]:
    """A command line with secret flags' values and every remembered secret masked."""
    return [mask(a) for a in redact_argv(argv)]


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flag or variable values with secrets masked (by name, and every remembered value)."""
    return {k: mask(v) if isinstance(v, str) else v for k, v in redact_mapping(values).items()}


# -- event lines ------------------------------------------------------------------------------------------------

class LogFilter(logging.Filter):
    """Masks remembered secrets in every event line's message (for handlers whose formatter is not ours)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


class MaskingFormatter(logging.Formatter):
    """Formats an event line, its traceback included, and masks the whole of it; the message's control characters
    are made visible (``visible``: a port holder's command line may hold an escape sequence)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = visible(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


def install_excepthooks() -> None:
    """Tracebacks that reach the interpreter (a bug in autotune, in any thread) are printed masked."""
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        sys.stderr.write(mask("".join(traceback.format_exception(kind, error, tb))))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            sys.stderr.write(f"Exception in thread {args.thread.name if args.thread else '?'}:\n")
            hook(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)

    sys.excepthook = hook
    threading.excepthook = thread_hook


# -- files written as they stream -------------------------------------------------------------------------------

class MaskedFile:
    """Appends to a file with every remembered secret masked at the moment the bytes are written.

    Text is written a line at a time, once the line is complete (or once ``LINE_LIMIT`` bytes of it have arrived),
    and never with the start of a secret at its end: a secret split between two writes is masked all the same."""

    LINE_LIMIT = 1 << 16

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending = b""

    def write(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        buf = self._pending + data
        cut = buf.rfind(b"\n") + 1
        if len(buf) - cut > self.LINE_LIMIT:
            cut = len(buf)
        cut = _clear_cut(buf, cut)
        self._pending = buf[cut:]
        if cut:
            self._append(mask_bytes(buf[:cut]))

    def close(self) -> None:
        """Write what is left (an unfinished last line)."""
        if self._pending:
            self._append(mask_bytes(self._pending))
            self._pending = b""

    def _append(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(data)


def _clear_cut(buf: bytes, cut: int) -> int:
    """``cut``, moved back before any secret that starts before it and goes on past it (or may: the end of ``buf`` is
    the start of a secret)."""
    moved = True
    while moved:
        moved = False
        for form in _compiled()[2]:
            start = max(0, cut - len(form) + 1)
            while (start := buf.find(form[:1], start, cut)) >= 0:
                if form.startswith(buf[start:start + len(form)]):
                    cut, moved = start, True
                    break
                start += 1
    return cut
