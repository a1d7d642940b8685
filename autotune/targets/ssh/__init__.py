"""One SSH connection per remote target (paramiko): commands, SFTP and port forwarding (forward.py) share it.

One module per job:

    spec.py         the study file's options of an ssh-* target (``SSHSpec``)
    hostkeys.py     the host-key policy (known_hosts only, one-line refusals)
    connection.py   the link: connect, keepalive, reconnect with backoff, the retry wrapper every call goes through
    commands.py     remote shell commands with deadlines (``sh -c``, every value quoted)
    files.py        SFTP: reads, atomic writes, ``~`` paths

``SSHConnection`` is the link with both commands and files on it.
"""
from __future__ import annotations

from autotune.targets.ssh.commands import DEFAULT_TIMEOUT, Commands, Completed, sh_command
from autotune.targets.ssh.connection import LINK_ERRORS, Connection, describe_error
from autotune.targets.ssh.files import READ_LIMIT, Files
from autotune.targets.ssh.spec import DEFAULT_WORKDIR, SSHSpec

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_WORKDIR", "LINK_ERRORS", "READ_LIMIT", "Completed", "Connection",
           "SSHConnection", "SSHSpec", "describe_error", "sh_command"]


class SSHConnection(Commands, Files):
    """The one SSH connection of a target, reopened on demand: commands and SFTP over it. Thread-safe."""
