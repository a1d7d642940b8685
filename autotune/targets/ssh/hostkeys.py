"""The host-key policy: a host's key is checked against the target's known_hosts file and nothing else.

An unknown key and a changed key are refused with a one-line ``UserError`` that shows the offered fingerprint and
the command to fix it. Nothing is ever added to known_hosts by the tuner.
"""
from __future__ import annotations

import os
import shlex

import paramiko

from autotune.errors import UserError
from autotune.targets.ssh.spec import SSHSpec


def known_hosts_path(spec: SSHSpec) -> str:
    """The local known_hosts file the target trusts (``~`` expanded)."""
    return os.path.expanduser(spec.known_hosts or "~/.ssh/known_hosts")


def host_name(host: str, port: int) -> str:
    """The name a host key is filed under in known_hosts (``[host]:port`` for ports other than 22)."""
    return host if port == 22 else f"[{host}]:{port}"


def key_type_flag(key: paramiko.PKey) -> str:
    name = key.get_name()
    if "ed25519" in name:
        return "ed25519"
    if "ecdsa" in name:
        return "ecdsa"
    if "rsa" in name:
        return "rsa"
    return name


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class RefuseUnknown(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key so the refusal can show its fingerprint."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


def trust_only_known(client: paramiko.SSHClient, known_hosts: str) -> None:
    """Make ``client`` accept only the keys ``known_hosts`` holds (a missing file trusts nothing)."""
    if os.path.exists(known_hosts):
        try:
            client.load_host_keys(known_hosts)
        except (OSError, paramiko.SSHException, ValueError) as e:
            raise UserError(f"ssh: cannot read known_hosts file {known_hosts}: {e}") from None
    client.set_missing_host_key_policy(RefuseUnknown())


def unknown_key_message(spec: SSHSpec, known_hosts: str, hostname: str, key: paramiko.PKey) -> str:
    kh = known_hosts
    return (
        f"ssh: host key of {hostname} is not known (not in {kh}); the server offers {key.get_name()} "
        f"{key.fingerprint}. Compare that fingerprint with the host's own (on the host: ssh-keygen -lf "
        f"/etc/ssh/ssh_host_{key_type_flag(key)}_key.pub), then trust it with: "
        f"ssh-keyscan -p {spec.port} -t {key_type_flag(key)} {shlex.quote(spec.host)} >> {shlex.quote(kh)}"
    )


def changed_key_message(spec: SSHSpec, known_hosts: str, got: paramiko.PKey, expected: paramiko.PKey) -> str:
    name = host_name(spec.host, spec.port)
    kh = known_hosts
    return (
        f"ssh: REFUSED: the host key of {name} has CHANGED (possible man-in-the-middle attack): {kh} has "
        f"{expected.get_name()} {expected.fingerprint}, the server offers {got.get_name()} {got.fingerprint}. "
        f"If the host was reinstalled and the new fingerprint is its own, remove the old entry with: "
        f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(kh)} and add the new one with: "
        f"ssh-keyscan -p {spec.port} -t {key_type_flag(got)} {shlex.quote(spec.host)} >> {shlex.quote(kh)}"
    )
