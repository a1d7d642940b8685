"""A throw-away PostgreSQL server on 127.0.0.1 for tests and benchmarks, or the one CI started (AUTOTUNE_TEST_POSTGRES).

``.ci/run`` starts a cluster with ``python -m autotune.testing.postgres start DIR`` and exports its URL; a developer's
test run without that variable starts its own cluster in a temp dir (Debian's postgresql package provides initdb
and pg_ctl; as root, the server runs as the ``postgres`` user, which refuses to run as root).
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import sqlalchemy

from autotune.testing.ports import free_port

ENV = "AUTOTUNE_TEST_POSTGRES"
APT_HINT = "apt-get install -y --no-install-recommends postgresql"


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for version in sorted(Path("/usr/lib/postgresql").glob("*"), reverse=True):
        candidate = version / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def start(root: Path) -> str:
    """Initialise and start a cluster in ``root``; return its URL (trust authentication, loopback only).

    As root, ``root``'s parent must be traversable by the postgres user (``new_root()`` makes such a directory)."""
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError(f"PostgreSQL is not installed ({APT_HINT})")
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    port = free_port()
    subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
    subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-o", opts, "-w",
                                 "start"]), check=True, capture_output=True)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def new_root() -> Path:
    """A fresh directory for a cluster that the postgres user can reach (pytest's temp dirs are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    base.chmod(0o755)
    return base / "cluster"


def stop(root: Path) -> None:
    pg_ctl = find_bin("pg_ctl")
    if pg_ctl and (root / "data").exists():
        subprocess.run(_as_postgres([pg_ctl, "-D", str(root / "data"), "-m", "immediate", "stop"]),
                       capture_output=True, check=False)


def new_database(server_url: str) -> str:
    """A fresh, empty database on the server: its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


if __name__ == "__main__":
    # python -m autotune.testing.postgres start DIR  -> prints the URL;  ... stop DIR
    action, directory = sys.argv[1], Path(sys.argv[2])
    if action == "start":
        print(start(directory))
    else:
        stop(directory)
