"""Where a target's concurrency levels are generated (``[workload] client``), and the load generator's process
there (``Generator``: started on demand, fed a job on its standard input, read on its standard output).

* ``local``: on this machine, through the target's own way to the server (``Target.base_url``: for an SSH target
  with ``tunnel``, autotune's paramiko forward);
* ``openssh``: on this machine, through an OpenSSH ``ssh -L`` forward of the target's own (SSH targets);
* ``target``: on the target host, as ``loadgen.py`` run by the host's python3 over the target's SSH
  connection; the job goes there on its standard input and only the records come back (SSH targets);
* ``auto``: ``target`` for SSH targets, ``local`` for the others.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import weakref
from importlib import resources
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import paramiko

from autotune.targets.base import Target
from autotune.targets.forward import OpenSSHForward
from autotune.targets.programs import text_line
from autotune.targets.remote import FIND_PYTHON, RemoteTarget

#: the load generator (loadgen.py, the standard library alone), shipped as source to the python that runs it
LOADGEN = resources.files(__package__).joinpath("loadgen.py").read_text(encoding="utf-8")


class Process(Protocol):
    """A running load generator: its stdin and stdout."""

    def send(self, data: bytes) -> None: ...
    def read(self) -> bytes: ...                # blocking; b"" once its output ended
    def close_input(self) -> None: ...
    def kill(self) -> None: ...
    def errors(self) -> str: ...                # what it wrote to stderr, once it ended


@dataclass(frozen=True)
class Generator:
    """Where the load generator runs (``start``), and the server's address as seen from there."""

    start: Callable[[], Process]
    host: str
    port: int
    prefix: str = ""
    where: str = "this machine"


class LocalProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOADGEN], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self) -> bytes:
        assert self.proc.stdout is not None
        return os.read(self.proc.stdout.fileno(), 1 << 20)

    def close_input(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            with contextlib.suppress(OSError, ValueError):
                self._errors = self.proc.stderr.read().decode("utf-8", "replace")
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def errors(self) -> str:
        return getattr(self, "_errors", "")


def local(base_url: str) -> Generator:
    """The load generator as a child process of this one, sending to ``base_url``."""
    url = urlsplit(base_url)
    return Generator(LocalProcess, url.hostname or "127.0.0.1", url.port or 80, url.path.rstrip("/"))


#: the client ``auto`` picks for an SSH target (scripts/bench_measurement.py compares them)
SSH_DEFAULT = "target"

_forwards: weakref.WeakKeyDictionary[Target, OpenSSHForward] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def load_generator(target: Target, base_url: str, client: str) -> Generator:
    """Where ``target``'s concurrency levels run for ``[workload] client``; ``base_url`` is the deployment's."""
    if not isinstance(target, RemoteTarget):
        return local(base_url)
    if client == "auto":
        client = SSH_DEFAULT
    if client == "target":
        return Generator(lambda: RemoteProcess(target), "127.0.0.1", target.spec.server_port,
                         where=f"target {target.spec.name} ({target.conn.label})")
    if client == "openssh":
        with _lock:
            forward = _forwards.get(target)
            if forward is None or forward.closed:
                forward = _forwards[target] = OpenSSHForward(target.spec, "127.0.0.1", target.spec.server_port)
                weakref.finalize(target, forward.close)
        return local(forward.url)
    return local(base_url)


def close(target: Target) -> None:
    """Close ``target``'s OpenSSH forward, if it has one."""
    with _lock:
        forward = _forwards.pop(target, None)
    if forward is not None:
        forward.close()


class RemoteProcess:
    """The load generator running on the target host, on one exec channel of its SSH connection."""

    def __init__(self, target: RemoteTarget) -> None:
        self.chan: paramiko.Channel = target.conn.open_exec("\n".join([FIND_PYTHON, text_line(LOADGEN)]))
        self._stderr = bytearray()

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise OSError(str(e)) from e

    def read(self) -> bytes:
        try:
            data = self.chan.recv(1 << 20)
        except (OSError, EOFError, paramiko.SSHException):
            return b""
        while self.chan.recv_stderr_ready():
            self._stderr += self.chan.recv_stderr(65536)
        return data

    def close_input(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def kill(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while self.chan.recv_stderr_ready():
                self._stderr += self.chan.recv_stderr(65536)
            self.chan.close()

    def errors(self) -> str:
        return self._stderr.decode("utf-8", "replace")
