"""Files on the target over SFTP: one SFTP session per connection, reopened with it; reads, atomic writes, and the
remote user's home for ``~`` paths."""
from __future__ import annotations

import contextlib
import os
import posixpath
import stat as stat_mod
import threading
from collections.abc import Callable
from typing import TypeVar

import paramiko

from autotune.targets.ssh.connection import Connection
from autotune.targets.ssh.spec import SSHSpec

T = TypeVar("T")

READ_LIMIT = 4 << 20        # at most this much log is fetched by one read


class Files(Connection):
    """SFTP on the target (calls are serialised on the one session)."""

    def __init__(self, spec: SSHSpec, **kwargs: float) -> None:
        super().__init__(spec, **kwargs)
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_generation = -1
        self._home: str | None = None

    def _reset_sessions(self) -> None:
        with self._lock:
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
            self._sftp = None
        super()._reset_sessions()

    def _sftp_client(self, transport: paramiko.Transport) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None or self._sftp_generation != self.generation:
                if self._sftp is not None:
                    with contextlib.suppress(Exception):
                        self._sftp.close()
                client = paramiko.SFTPClient.from_transport(transport)
                if client is None:
                    raise paramiko.SSHException("the server refused the SFTP subsystem")
                self._sftp = client
                self._sftp_generation = self.generation
            channel = self._sftp.get_channel()
            if channel is not None:
                channel.settimeout(self.sftp_timeout)
            return self._sftp

    def sftp(self, fn: Callable[[paramiko.SFTPClient], T], what: str, *, retry: bool = True) -> T:
        """Run ``fn(sftp)`` with the reconnecting wrapper (SFTP calls are serialised)."""
        def go(t: paramiko.Transport) -> T:
            with self._lock:
                return fn(self._sftp_client(t))
        return self.call(go, what, retry=retry)

    def home(self) -> str:
        if self._home is None:
            self._home = self.sftp(lambda s: s.normalize("."), "finding the home directory")
        return self._home

    def resolve(self, path: str) -> str:
        """A remote path with a leading ``~`` replaced by the remote user's home."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return posixpath.join(self.home(), path[2:])
        return path

    def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        """The file's bytes from ``offset`` (at most ``limit``); None when it does not exist."""
        def go(s: paramiko.SFTPClient) -> bytes | None:
            try:
                f = s.open(path, "rb")
            except FileNotFoundError:
                return None
            with f:
                if offset:
                    f.seek(offset)
                return f.read(limit) if limit is not None else f.read()
        return self.sftp(go, f"reading {path}")

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", "replace")

    def stat(self, path: str) -> paramiko.SFTPAttributes | None:
        def go(s: paramiko.SFTPClient) -> paramiko.SFTPAttributes | None:
            try:
                return s.stat(path)
            except FileNotFoundError:
                return None
        return self.sftp(go, f"stat {path}")

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        def go(s: paramiko.SFTPClient) -> None:
            parts = [p for p in path.split("/") if p]
            current = "/" if path.startswith("/") else ""
            for part in parts:
                current = posixpath.join(current, part) if current else part
                try:
                    attrs = s.stat(current)
                except FileNotFoundError:
                    try:
                        s.mkdir(current, mode)
                    except OSError:
                        if not _is_dir(s, current):  # made by someone else meanwhile is fine
                            raise
                    continue
                if not stat_mod.S_ISDIR(attrs.st_mode or 0):
                    raise NotADirectoryError(f"{current} is not a directory")
        self.sftp(go, f"creating {path}")

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644, *, exclusive: bool = False) -> bool:
        """Write a file atomically (a temporary beside it, then rename). With ``exclusive``, never replace an
        existing file: returns False if ``path`` already exists."""
        def go(s: paramiko.SFTPClient) -> bool:
            if exclusive:
                try:
                    f = s.open(path, "wxb")
                except OSError:
                    if _exists(s, path):
                        return False
                    raise
                with f:
                    f.chmod(mode)  # before the data: never readable by others with it
                    f.write(data)
                return True
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            with s.open(tmp, "wb") as f:
                f.chmod(mode)
                f.write(data)
            s.posix_rename(tmp, path)
            return True
        return self.sftp(go, f"writing {path}")

    def remove(self, path: str) -> bool:
        def go(s: paramiko.SFTPClient) -> bool:
            try:
                s.remove(path)
            except FileNotFoundError:
                return False
            return True
        return self.sftp(go, f"removing {path}")

    def rename(self, src: str, dst: str) -> None:
        self.sftp(lambda s: s.posix_rename(src, dst), f"renaming {src}")


def _exists(s: paramiko.SFTPClient, path: str) -> bool:
    try:
        s.stat(path)
    except FileNotFoundError:
        return False
    return True


def _is_dir(s: paramiko.SFTPClient, path: str) -> bool:
    try:
        return stat_mod.S_ISDIR(s.stat(path).st_mode or 0)
    except FileNotFoundError:
        return False
