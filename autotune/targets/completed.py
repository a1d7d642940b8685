"""A finished command on a target (a remote shell command, or a program run beside the server): its exit status and
output."""
from __future__ import annotations

from dataclasses import dataclass

#: the status of a program stopped because it wrote more than it may (an answer no longer than a cap is read)
TOO_LONG = 125
#: the most bytes of each output a program run beside the server may write (an engine's answer is a line of JSON;
#: its import warnings some kB)
MAX_OUTPUT = 1 << 20


@dataclass(frozen=True)
class Completed:
    """A finished command."""

    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    def detail(self) -> str:
        """One line saying what went wrong (stderr, else stdout)."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1][:300] if text else f"exit status {self.status}"
