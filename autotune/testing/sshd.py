"""A throw-away OpenSSH server on 127.0.0.1 for tests and benchmarks: real sshd, real keys, nothing mocked.

``SSHServer(tmp_dir).start()`` generates a host key and a user key, writes an sshd_config that listens on a free
loopback port and accepts only that user key (root login by key only: the tests run as root and the remote side runs
this checkout's Python), starts ``sshd -D`` and writes a known_hosts file that trusts exactly its host key.

Needs Debian's openssh-server (``apt-get install -y --no-install-recommends openssh-server``) and the privilege
separation directory /run/sshd, which ``start()`` creates when missing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from autotune.testing.ports import free_port

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
APT_HINT = "apt-get update && apt-get install -y --no-install-recommends openssh-server"


def find_sshd() -> str | None:
    found = shutil.which("sshd")
    if found:
        return found
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A new passphrase-less key pair at ``path`` / ``path``.pub."""
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "autotune-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


def host_key_line(host: str, port: int, pub_path: Path) -> str:
    """A known_hosts line for ``pub_path`` (``[host]:port`` form for ports other than 22, as ssh writes it)."""
    kind, blob = Path(pub_path).read_text().split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kind} {blob}\n"


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(_children(child))
    return out


class SSHServer:
    """One sshd on 127.0.0.1:port with its own keys, config and log under ``root``."""

    def __init__(self, root: Path, set_env: dict[str, str] | None = None, user: str = "root",
                 sftp: bool = True) -> None:
        self.root = Path(root)
        self.sftp = sftp  # False: a host whose sshd offers no SFTP subsystem
        self.host = "127.0.0.1"
        self.port = free_port()
        self.user = user
        self.set_env = dict(set_env or {})
        self.host_key = self.root / "ssh_host_ed25519_key"
        self.user_key = self.root / "id_ed25519"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.config = self.root / "sshd_config"
        self.log = self.root / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- life --------------------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> SSHServer:
        sshd = find_sshd()
        if sshd is None:
            raise RuntimeError(f"sshd is not installed ({APT_HINT})")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege separation directory
        if not self.host_key.exists():
            keygen(self.host_key)
        if not self.user_key.exists():
            keygen(self.user_key)
        self.authorized_keys.write_text(Path(f"{self.user_key}.pub").read_text())
        os.chmod(self.authorized_keys, 0o600)
        self.known_hosts.write_text(host_key_line(self.host, self.port, Path(f"{self.host_key}.pub")))
        self.config.write_text(self._config_text())
        subprocess.run([sshd, "-t", "-f", str(self.config)], check=True, capture_output=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((self.host, self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on {self.host}:{self.port} within {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()
        self.kill_connections()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    # -- faults ------------------------------------------------------------------------------------------
    def connection_pids(self) -> list[int]:
        """The sshd processes serving connections now (under the listener; not the commands they run)."""
        assert self.proc is not None
        out = []
        for pid in _descendants(self.proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    out.append(pid)
            except OSError:
                continue
        return out

    def kill_connections(self) -> int:
        """SIGKILL every sshd process serving a connection (the listener stays): the client sees its connection
        cut, and the commands of its sessions see their pipes close, as when the network drops."""
        if self.proc is None:
            return 0
        pids = self.connection_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def pause(self) -> None:
        """Stop the listener (SIGSTOP): new connections hang before the banner, as behind a dead route."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    # -- helpers -----------------------------------------------------------------------------------------
    def _config_text(self) -> str:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "AllowTcpForwarding yes",
            "MaxSessions 50",
            "MaxStartups 100:30:200",
            "PrintMotd no",
            *(["Subsystem sftp internal-sftp"] if self.sftp else []),
            "LogLevel VERBOSE",
        ]
        if self.set_env:
            lines.append("SetEnv " + " ".join(f'"{k}={v}"' for k, v in self.set_env.items()))
        return "\n".join(lines) + "\n"
