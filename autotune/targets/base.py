"""Where a server runs: a target deploys an argv, and a deployment is one start of the server.

A target owns the whole life of the server it starts: it never starts one while another still holds the port, it
stops the whole process tree, it keeps every start's log, and at the end of a study it can put back what ran before.
"""
from __future__ import annotations

import logging
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from autotune.engines import Engine, get_engine
from autotune.tables import Reader
from autotune.targets.start_command import StartCommand, kept_warning, prepare
from autotune.targets.completed import Completed

log = logging.getLogger("autotune")


@dataclass(frozen=True)
class TargetSpec:
    """A target as its study file table sets it. Each kind subclasses this with its own options, declares their keys
    in ``keys`` and reads them in ``read`` (the options every kind has are read here)."""

    name: str = "default"
    server_port: int = 30000                          # the engine's HTTP port on the target
    env: dict[str, str] = field(default_factory=dict)  # environment variables for the server
    #: the engine the study runs (set by the plan, not the study's table): how a secret flag reaches the server
    #: other than on its command line is the engine's knowledge
    engine: str = ""

    #: the ``kind = "..."`` this spec is for
    kind: ClassVar[str] = ""
    #: the keys of its table besides ``kind``
    keys: ClassVar[tuple[str, ...]] = ("server_port", "env")

    @classmethod
    def parse(cls, name: str, table: dict[str, Any], where: str, reader: Reader) -> TargetSpec:
        """The spec for one ``[target]``/``[targets.NAME]`` table (its keys already checked against ``keys``)."""
        return cls(name=name, **cls.read(table, where, reader))

    @classmethod
    def read(cls, table: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
        return {"server_port": reader.integer(table, where, "server_port", 30000, low=1, high=65535),
                "env": reader.env(table, where, "env")}

    @property
    def identity(self) -> str:
        """What makes two targets the same machine and port (for the one-tuner-per-target lock)."""
        return f"{self.kind}:{self.server_port}"

    def unit_note(self, study: str) -> list[str]:
        """Comment lines for `autotune best --format unit` about how this target runs the server ([] if none)."""
        return []


class Deployment(ABC):
    """One start of the server, from launch until it is stopped."""

    #: the URL the tuner reaches the server at (through a tunnel where the target uses one)
    base_url: str
    #: a local file that receives this start's server log as it is read
    log_path: Path

    @abstractmethod
    def exit_status(self) -> int | None:
        """The server's exit status once it has exited (negative: killed by that signal); None while it runs."""

    @abstractmethod
    def read_log(self) -> str:
        """Log text written since the previous call (also appended to ``log_path``)."""

    def reconnected(self) -> bool:
        """Whether the connection to the target was reopened since this start: requests in flight at that moment
        failed for the connection's sake, not the server's. (A local server has no connection to lose.)"""
        return False


class Target(ABC):
    """A machine and port the tuner deploys servers to."""

    def __init__(self, spec: TargetSpec, cwd: Path | None = None) -> None:
        """``cwd``: where relative paths of the study resolve (a local server starts there)."""
        self.spec = spec
        self.engine: Engine | None = get_engine(spec.engine) if spec.engine else None
        self._warned_kept = False

    @property
    def name(self) -> str:
        return self.spec.name

    #: whether the server should keep running after the tuner exits (False for local targets)
    keeps_server: bool = True
    #: the machine the server runs on, as its users would name it
    machine: str = "this machine"

    def start_command(self, argv: list[str], env: dict[str, str]) -> StartCommand:
        """A start of ``argv`` with the target's and ``env``'s environment, its secret flags off the command line
        where the engine allows it (a warning, once, for those it does not)."""
        launch = prepare(self.engine, argv, {**self.spec.env, **env})
        if launch.kept and not self._warned_kept:
            self._warned_kept = True
            log.warning(kept_warning(launch, self.machine))
        return launch

    def preflight(self, command: list[str]) -> None:
        """Checks that need no deployment (reachable, the server command exists); raises ``UserError``.

        Run before a study is created, so a typo in the study never leaves a half-made study behind.
        """
        return None

    @abstractmethod
    def run_engine_program(self, command: str, program: str, stdin: bytes, timeout: float,
                           should_stop: Callable[[], bool] = lambda: False) -> Completed:
        """Run ``programs/<program>`` on the target with the python that runs the server command ``command`` (a
        python, or a Python program's #! interpreter: programs.FIND_ENGINE_PYTHON), where the server starts, with
        ``stdin`` on its standard input, for at most ``timeout`` seconds (status 124 then), each of its outputs read
        up to ``completed.MAX_OUTPUT`` bytes (status ``completed.TOO_LONG`` past it). Raises ``TrialFailure`` when
        the target cannot be reached, ``TrialFailure("interrupted")`` as soon as ``should_stop()`` says so; a
        target that cannot run programs answers status 127."""

    @abstractmethod
    def place_file(self, name: str, data: bytes, local: Path) -> str:
        """Put a file the server reads (an adaptive schedule) where this target's servers read files, and return
        the path to give the server (``local`` is a path beside the study on this machine, for a target whose
        servers run here)."""

    @abstractmethod
    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> Deployment:
        """Stop what this target runs, make sure the port is free, and start ``argv``.

        Raises ``TrialFailure`` (port_busy, deploy_failed, ssh_lost) when the server cannot be started.
        """

    def rendered(self, argv: list[str], env: dict[str, str]) -> tuple[str, str]:
        """What this target makes of a launch, as a file name and its text (for the trial's artifacts)."""
        lines = [f"{k}={shlex.quote(v)} \\" for k, v in env.items()] + [shlex.join(argv)]
        return "command.sh", "\n".join(lines) + "\n"

    @abstractmethod
    def stop(self) -> None:
        """Stop the server this target started (its whole process tree) and wait until the port is free."""

    def restore(self, argv: list[str], env: dict[str, str], log_path: Path) -> Deployment | None:
        """Put back the server as it was before tuning; ``argv`` is the study's baseline for targets that keep no
        copy of their own. Returns the deployment to wait for, or None when nothing is to run."""
        return self.deploy(argv, env, log_path)

    @abstractmethod
    def base_url(self) -> str:
        """The URL of the server running on the target now, whoever started it."""

    @abstractmethod
    def lock(self, holder: str) -> AbstractContextManager[None]:
        """Hold the target for one tuner; raises ``UserError`` naming the current holder if another has it."""

    def close(self) -> None:
        """Release connections; the server keeps running unless ``stop`` was called."""
        return None
