"""What a target starts: the server's command line with its secrets taken off it.

A command line is visible to every user of a machine (``ps``). The engine says how its server can be told a secret
flag some other way (``Engine.hide_secrets``: an environment variable, or a file named by another flag); each target
decides where such a file lives and how the environment reaches the server. ``prepare`` also gathers every secret
value of a start, so that a target masks them in the logs it writes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune import redact
from autotune.engines import Engine
from autotune.engines.secret_args import OffCommandLine, SecretFile, flags_with_values


def is_secret(name: str, value: str) -> bool:
    """Whether a flag or variable holds a secret: its name says so, or its value is one the study gave by
    reference (masked wherever autotune writes)."""
    return redact.is_secret(name) or (bool(value) and redact.mask(value) != value)


@dataclass(frozen=True)
class StartCommand:
    """A server start as a target runs it."""

    #: the command line, without its secret flags unless the engine reads them there only (``kept``)
    argv: list[str]
    #: the server's environment: the study's and the secret flags the engine reads from it
    env: dict[str, str]
    #: a file holding the other secret flags, to be written where the target chooses (``command``)
    file: SecretFile | None
    #: every secret value of the start (flags and environment), to be masked in its logs
    secrets: tuple[str, ...]
    #: secret flags left on the command line
    kept: tuple[str, ...]

    def command(self, file_path: str | None = None) -> list[str]:
        """The argv to run, naming the secret file at ``file_path`` (where the target wrote ``file``)."""
        if self.file is None:
            return list(self.argv)
        if file_path is None:
            raise ValueError("this start needs its secret file's path")
        return [*self.argv, self.file.flag, file_path]

    def secret_env(self) -> dict[str, str]:
        """The environment variables that hold secrets."""
        return {k: v for k, v in self.env.items() if is_secret(k, v) or v in self.secrets}


def prepare(engine: Engine | None, argv: list[str], env: Mapping[str, str]) -> StartCommand:
    """``argv`` and ``env`` as ``engine`` can take them with no secret on the command line (None: an engine this
    target was not told, so nothing moves)."""
    values = [f.value for f in flags_with_values(argv, is_secret)]
    values += [v for k, v in env.items() if is_secret(k, v)]
    if engine is None:
        off = OffCommandLine(list(argv), kept=tuple(f.name for f in flags_with_values(argv, is_secret)))
    else:
        off = engine.hide_secrets(argv, is_secret)
    secrets = tuple(dict.fromkeys(v for v in [*values, *off.env.values()] if v))
    return StartCommand(off.argv, {**env, **off.env}, off.file, secrets, off.kept)


def kept_warning(launch: StartCommand, where: str) -> str:
    """The warning for secret flags left on the command line of a server on ``where``."""
    flags = ", ".join(f"--{k}" for k in launch.kept)
    return (f"the server's command line holds {flags} (the engine reads {'it' if len(launch.kept) == 1 else 'them'} "
            f"there only): every user of {where} can see it in ps; hide other users' processes with hidepid=2 "
            "(docs/shared-hosts.md)")
