"""Secret flags off a server's command line: what an engine answers in ``Engine.hide_secrets``.

A command line is visible to every user of the machine (``ps``, /proc/PID/cmdline), so a flag whose value is a
secret (an API key) should reach the server some other way. Each engine knows which other ways it has: an
environment variable it reads the flag from, or a file named by another flag. Where the secret file lives and how it
is written is the target's business (targets/launch.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SecretFile:
    """A file the server reads secret flags from, named on its command line as ``flag PATH``."""

    flag: str           # the option as written on the command line ("--config")
    suffix: str         # how the file's name must end for the engine to take it ("" for any name)
    text: str


@dataclass(frozen=True)
class OffCommandLine:
    """A server's command line with its secret flags taken off it."""

    argv: list[str]
    #: environment variables the server reads some of the secret flags from
    env: dict[str, str] = field(default_factory=dict)
    #: a file it reads the others from (its flag and path are not in ``argv`` yet: the target chooses the path)
    file: SecretFile | None = None
    #: secret flags the engine reads from its command line only (still in ``argv``)
    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flag:
    """One flag with a value in a command line: ``argv[start:end]`` is ``--name value`` or ``--name=value``."""

    start: int
    end: int
    name: str
    value: str


def flags_with_values(argv: list[str], pick: Callable[[str, str], bool]) -> list[Flag]:
    """The flags of ``argv`` with a value (``-n v``, ``--name v``, ``--name=v``) that ``pick(name, value)`` selects."""
    out: list[Flag] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word.startswith("-") and len(word) > 1:
            if "=" in word:
                name, value = word.split("=", 1)
                if pick(name.lstrip("-"), value):
                    out.append(Flag(i, i + 1, name.lstrip("-"), value))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                if pick(word.lstrip("-"), argv[i + 1]):
                    out.append(Flag(i, i + 2, word.lstrip("-"), argv[i + 1]))
                i += 1
        i += 1
    return out


def without(argv: list[str], flags: list[Flag]) -> list[str]:
    """``argv`` less the words of ``flags``."""
    drop = {i for f in flags for i in range(f.start, f.end)}
    return [w for i, w in enumerate(argv) if i not in drop]
