"""Free TCP ports on 127.0.0.1."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice; another process may take it before the caller does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
