"""Where studies live: Optuna's RDB storage on SQLite (one tuner) or PostgreSQL (several workers)."""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial

from autotune.errors import UserError
from autotune.redact import redact_url as redact

#: seconds a SQLite writer waits for the lock, so optuna-dashboard can read while the daemon writes
SQLITE_TIMEOUT = 30
#: tries to open a database whose schema another process is creating (about 11 s of waiting in all)
SCHEMA_ATTEMPTS = 10


def open_storage(url: str, create: bool = True, heartbeat: float | None = None,
                 on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> optuna.storages.RDBStorage:
    """Open (and with ``create`` make) the storage at ``url``; errors become one line.

    ``heartbeat`` (seconds) makes running trials beat, so that a trial whose worker died is failed (after three
    missed beats) and handed to ``on_stale`` (the tuner queues its config again). SQLite has one worker and no
    heartbeat: the next start sweeps what a dead tuner left.
    """
    kwargs: dict = {}
    if heartbeat is not None and not url.startswith("sqlite:"):
        kwargs.update(heartbeat_interval=max(1, round(heartbeat)), grace_period=max(3, round(3 * heartbeat)),
                      heartbeat_stale_trial_callback=on_stale)
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if not create and not path.exists():
            raise UserError(f"no study database at {path}: run `autotune run` first")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot open storage {redact(url)}: cannot create {path.parent}: {e.strerror}") \
                from None
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_TIMEOUT}}
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: stable in use
                return optuna.storages.RDBStorage(_with_driver(url), **kwargs)
        except sqlalchemy.exc.SQLAlchemyError as e:
            if not _schema_race(e):
                raise UserError(f"cannot open storage {redact(url)}: {str(e).splitlines()[0]}") from None
            time.sleep(0.2 * (attempt + 1))
        except (ImportError, ValueError) as e:
            raise UserError(f"cannot open storage {redact(url)}: {str(e).splitlines()[0]}") from None
    raise UserError(f"cannot open storage {redact(url)}: its schema could not be created")


def _schema_race(e: sqlalchemy.exc.SQLAlchemyError) -> bool:
    """Whether ``e`` comes from several processes creating the schema of a new database at once (workers starting
    together; `autotune status` while a first `autotune run` starts): one wins, the others load it on a retry.
    SQLite says "table ... already exists", PostgreSQL "relation ... already exists" or a duplicate key."""
    return isinstance(e, sqlalchemy.exc.IntegrityError) or "already exists" in str(e)


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg 3 (the [postgres] extra), as in SQLAlchemy 2.1; SQLAlchemy 2.0 would look for
    psycopg2."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def load_existing_study(name: str, url: str) -> optuna.Study:
    """An existing study, for commands that only read (status, best, report)."""
    storage = open_storage(url, create=False)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserError(f"no study {name!r} in {redact(url)}: run `autotune run --study {name}` first") from None


