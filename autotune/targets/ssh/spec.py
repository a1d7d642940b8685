"""The study-file options of a target reached over SSH (the ssh-* kinds subclass ``SSHSpec``)."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from autotune.tables import PLAIN_TOKEN, Reader
from autotune.targets.base import TargetSpec

USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]*")
#: a host name (or an alias of ~/.ssh/config): dot-separated labels of letters, digits, '-' and '_', none opening or
#: closing with '-'
HOST_NAME = re.compile(r"(?!.{254})[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                       r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: private to the remote user (created 0700; checked before every use: programs/safedir.py)
DEFAULT_WORKDIR = "~/.cache/autotune"


@dataclass(frozen=True)
class SSHSpec(TargetSpec):
    """The options of a target reached over SSH (the ssh-* kinds subclass it)."""

    host: str = ""
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    #: name of a local environment variable holding the SSH password or key passphrase (never the secret itself)
    password_env: str | None = None
    #: reach server_port through SSH port forwarding (the server may listen on the target's loopback only)
    tunnel: bool = False
    #: logs, pid files and backups on the target
    workdir: str = DEFAULT_WORKDIR
    connect_timeout: float = 10.0
    #: how long to keep reconnecting (with backoff) after the connection drops before failing with ssh_lost
    reconnect_timeout: float = 60.0

    keys = (*TargetSpec.keys, "host", "port", "user", "key_file", "known_hosts", "password_env", "tunnel", "workdir",
            "connect_timeout", "reconnect_timeout")

    @classmethod
    def read(cls, table: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
        host = reader.get(table, where, "host", str, None)
        if host is None:
            reader.fail(where, "host", f"is required for kind = {cls.kind!r}")
        if not _host(host):
            reader.fail(where, "host", "must be a host name (labels of letters, digits, '-' and '_' between dots, "
                                       f"none opening or closing with '-') or an IP address, got {host!r}")
        user = reader.get(table, where, "user", str, None)
        if user is not None and not USER_NAME.fullmatch(user):
            reader.fail(where, "user", f"must be a login name, got {user!r}")
        workdir = reader.get(table, where, "workdir", str, DEFAULT_WORKDIR)
        if not workdir.startswith(("/", "~/")) or not PLAIN_TOKEN.fullmatch(workdir.removeprefix("~")):
            reader.fail(where, "workdir", f"must be an absolute path or one under ~/ (the SSH user's home), of plain "
                                          f"characters, got {workdir!r}")
        password_env = reader.get(table, where, "password_env", str, None)
        if password_env is not None and not ENV_NAME.fullmatch(password_env):
            reader.fail(where, "password_env",
                        "names an environment variable (the password itself never goes in a study)")
        return {
            **super().read(table, where, reader), "host": host, "user": user, "workdir": workdir,
            "port": reader.integer(table, where, "port", 22, low=1, high=65535),
            "key_file": reader.get(table, where, "key_file", str, None),
            "known_hosts": reader.get(table, where, "known_hosts", str, "~/.ssh/known_hosts"),
            "password_env": password_env, "tunnel": reader.get(table, where, "tunnel", bool, False),
            "connect_timeout": reader.number(table, where, "connect_timeout", 10.0, low=0.5, high=300),
            "reconnect_timeout": reader.number(table, where, "reconnect_timeout", 60.0, low=0, high=3600),
        }

    @property
    def identity(self) -> str:
        return f"{self.user or ''}@{self.host}:{self.port}:{self.server_port}"


def _host(text: str) -> bool:
    """Whether ``text`` is a host name or an IP address: nothing ssh could read as an option (``-oProxyCommand=``)."""
    if HOST_NAME.fullmatch(text):
        return True
    address, _, zone = text.partition("%")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return not zone or (":" in address and HOST_NAME.fullmatch(zone) is not None)  # an IPv6 scope: an interface
