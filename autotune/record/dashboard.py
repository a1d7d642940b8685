"""`autotune dashboard`: optuna-dashboard on a study's storage, with the study's artifact store (each trial's server
log, rendered command line or unit, and raw measurement records).

optuna-dashboard has no authentication and its HTTP API can change and delete studies, so it binds to the loopback
interface unless told otherwise; reach it from a laptop through an SSH tunnel:

    ssh -L 8080:127.0.0.1:8080 gpu-host      # then open http://127.0.0.1:8080/ on the laptop
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore

from autotune.record.artifacts import artifact_dir
from autotune.errors import UserError
from autotune.record.storage import load_existing_study, open_storage, redact

TUNNEL_HINT = "ssh -L {port}:127.0.0.1:{port} HOST"


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Dashboard:
    storage: optuna.storages.RDBStorage
    store: FileSystemArtifactStore
    artifacts: Path
    host: str
    port: int
    study_id: int
    storage_url: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/dashboard/studies/{self.study_id}"

    def banner(self) -> str:
        lines = [f"optuna-dashboard for {redact(self.storage_url)} (artifacts: {self.artifacts})",
                 f"  study: {self.url}"]
        if is_loopback(self.host):
            lines.append(f"  from another machine: {TUNNEL_HINT.format(port=self.port)}, then open the URL there")
        else:
            lines.append("  WARNING: listening beyond this host; anyone who reaches the port can delete studies")
        lines.append("  stop with Ctrl-C")
        return "\n".join(lines)

    def serve(self) -> None:
        """Blocks until interrupted."""
        from optuna_dashboard import run_server

        try:
            run_server(self.storage, host=self.host, port=self.port, artifact_store=self.store)
        except OSError as e:
            raise UserError(f"dashboard: cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None


def prepare(study_name: str, study_dir: Path, storage_url: str, host: str, port: int,
            allow_remote: bool = False) -> Dashboard:
    """Check the address and the study, open its storage and artifact store; listen nowhere yet."""
    if not is_loopback(host) and not allow_remote:
        raise UserError(f"--host {host} is not a loopback address and the dashboard has no authentication (anyone "
                        f"who reaches it can delete studies): use an SSH tunnel ({TUNNEL_HINT.format(port=port)}) "
                        "or pass --allow-remote")
    load_existing_study(study_name, storage_url)  # one clear line if there is no such study
    storage = open_storage(storage_url, create=False)
    _check_port(host, port)  # before anything is written: a wrong address is one line and leaves nothing behind
    path = artifact_dir(study_dir, study_name)
    try:
        path.mkdir(parents=True, exist_ok=True)  # the store does not create its directory
    except OSError as e:  # a read-only study directory
        raise UserError(f"dashboard: cannot create the artifact directory {path}: {e.strerror}") from None
    return Dashboard(storage=storage, store=FileSystemArtifactStore(path), artifacts=path, host=host, port=port,
                     study_id=storage.get_study_id_from_name(study_name), storage_url=storage_url)


def _check_port(host: str, port: int) -> None:
    """Fail with one line before optuna-dashboard prints its banner and a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: {e.strerror}") from None
    except (UnicodeError, ValueError) as e:  # a name IDNA cannot encode ("a..b", a label of 64 letters)
        raise UserError(f"--host {host}: not a host name or address ({e})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise UserError(f"dashboard: cannot listen on {host}:{port}: {e.strerror}") from None
