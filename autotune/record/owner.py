"""The process that runs a trial, named so that it can be told apart from every other process, ever: its host, the
host's boot, its pid and its start time. A trial left RUNNING is an orphan only when that process is gone: a pid alone
may have been reused, a target name is shared by workers on other machines."""
from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Owner:
    host: str
    boot: str | None
    pid: int
    #: the process's start time in clock ticks since boot (field 22 of /proc/PID/stat)
    start: str | None

    @classmethod
    def this(cls) -> Owner:
        """This process."""
        pid = os.getpid()
        return cls(socket.gethostname(), boot_id(), pid, start_time(pid))

    @classmethod
    def of(cls, attr: Any) -> Owner | None:
        """An owner as ``as_attr`` stored it (None for anything else)."""
        if not isinstance(attr, dict):
            return None
        try:
            return cls(str(attr["host"]), attr.get("boot"), int(attr["pid"]), attr.get("start"))
        except (KeyError, TypeError, ValueError):
            return None

    def as_attr(self) -> dict[str, Any]:
        return asdict(self)

    def gone(self) -> bool | None:
        """Whether the process has exited: True or False on this host, None on another (it cannot be told from
        here). This very process counts as gone: it runs one tuner, which has not started a trial yet when it
        asks."""
        here = Owner.this()
        if self.host != here.host:
            return None
        if self.boot is not None and here.boot is not None and self.boot != here.boot:
            return True  # the host rebooted since
        if (self.pid, self.start) == (here.pid, here.start):
            return True
        if self.start is None or here.start is None:  # no /proc: the pid alone
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            return False
        return start_time(self.pid) != self.start


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
