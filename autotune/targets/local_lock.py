"""One tuner per server port on this machine, whoever runs it: the lock names of programs/hostlock.py, held by the
tuner's own process (so the kernel frees them the moment it ends, however it ends)."""
from __future__ import annotations

import contextlib
import getpass
import json
import select
import socket
import threading

from autotune.errors import UserError
from autotune.targets.programs import hostlock
from autotune.targets.remote_lock import busy_message


class HostLock:
    """Holds ``names`` on this machine; a thread tells a second tuner who holds them."""

    def __init__(self, identity: str, names: list[str], holder: dict[str, object]) -> None:
        self.identity = identity
        self.names = names
        self.holder = json.dumps(holder).encode()
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> None:
        held, taken = hostlock.bind(self.names)
        if taken is not None:
            raise UserError(busy_message(self.identity, hostlock.ask(taken), "this machine", getpass.getuser()))
        self._held = held
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name=f"lock-{self.identity}", daemon=True)
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()
        self._held = []

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select(self._held, [], [], 0.2)
            except (OSError, ValueError):
                return
            for s in ready:
                hostlock.answer(s, self.holder)
