"""Where studies live: Optuna's RDB storage on SQLite (one tuner) or PostgreSQL (several workers)."""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial

from autotune.errors import UserError
from autotune.record import study as record_study
from autotune.redact import redact_url as redact

#: seconds a SQLite writer waits for the lock, so optuna-dashboard can read while the daemon writes
SQLITE_TIMEOUT = 30
#: tries to open a database whose schema another process is creating (about 11 s of waiting in all)
SCHEMA_ATTEMPTS = 10
#: the tables that make a database Optuna's (any version autotune runs with has them)
OPTUNA_TABLES = frozenset({"studies", "version_info", "trials"})
#: tables of Optuna's schema (a database holding any of them is Optuna's, perhaps being created right now)
OPTUNA_SCHEMA = frozenset({"studies", "version_info", "trials", "study_directions", "study_user_attributes",
                           "study_system_attributes", "trial_params", "trial_values", "trial_user_attributes",
                           "trial_system_attributes", "trial_intermediate_values", "trial_heartbeats"})


def open_storage(url: str, create: bool = True, heartbeat: float | None = None,
                 on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> optuna.storages.RDBStorage:
    """Open (and with ``create`` make) the storage at ``url``; errors become one line.

    Without ``create`` (the commands that only read) a database without Optuna's tables is refused and nothing is
    written to it; with it, a database that holds other tables but not Optuna's is refused too (it is some other
    program's: autotune keeps its studies in a database of their own).

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
        try:
            exists = path.exists()
        except OSError as e:  # a name longer than the file system takes
            raise UserError(f"cannot open storage {redact(url)}: {e.strerror}") from None
        if not create and not exists:
            raise UserError(f"no study database at {path}: run `autotune run` first")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot open storage {redact(url)}: cannot create {path.parent}: {e.strerror}") \
                from None
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_TIMEOUT}}
    _check_schema(url, create, kwargs.get("engine_kwargs", {}))
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


def _check_schema(url: str, create: bool, engine_kwargs: dict) -> None:
    """Refuse, in one line and having written nothing, a database that is not Optuna's: without ``create``, one that
    lacks Optuna's tables; with it, one that holds tables and none of Optuna's."""
    try:
        engine = sqlalchemy.create_engine(_with_driver(url), **engine_kwargs)
    except (ImportError, ValueError, sqlalchemy.exc.SQLAlchemyError) as e:
        raise UserError(f"cannot open storage {redact(url)}: {str(e).splitlines()[0]}") from None
    try:
        tables = set(sqlalchemy.inspect(engine).get_table_names())
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise UserError(f"cannot open storage {redact(url)}: {_first_line(e)}") from None
    finally:
        engine.dispose()
    if tables >= OPTUNA_TABLES:
        return
    if not create:
        raise UserError(f"no study database at {redact(url)}: it holds no Optuna tables (run `autotune run` first, "
                        "or give the right --storage)")
    if tables and not tables & OPTUNA_SCHEMA:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise UserError(f"storage {redact(url)} is another program's database (tables {shown}, none of "
                        "Optuna's): give autotune a database of its own")


#: room kept beside a SQLite database for a run's last writes on a full disk (a trial's failure, its retry)
RESERVE_BYTES = 1 << 20


class Reserve:
    """Space held beside a SQLite study database while a tuner runs (NAME.db.reserve), given back when the disk is
    full, so that the trial whose figures the database would not take can still be recorded as failed (and queued
    again) rather than left running. Nothing for another database (its disk is its server's)."""

    def __init__(self, url: str) -> None:
        self.path = Path(url[len("sqlite:///"):] + ".reserve") if url.startswith("sqlite:///") else None

    def __enter__(self) -> Reserve:
        if self.path is not None and not self.path.exists():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError:  # no room even for this, or a link in its place: run without
                self.path = None
                return self
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except OSError:
                os.unlink(self.path)
                self.path = None
            finally:
                os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> bool:
        """Give the space back; whether there was any."""
        path, self.path = self.path, None
        if path is None:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True


#: what a write to the study database raises when it cannot be written (read-only, a full disk, a lost server)
WRITE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)


def failed_write(e: BaseException) -> BaseException | None:
    """The failed database write behind ``e``, if any: Optuna, when it cannot record a trial's end either, raises an
    AssertionError ("Should not reach.") in the middle of handling the write's own error."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen and not isinstance(e, UserError):  # a UserError says it all
        if isinstance(e, WRITE_ERRORS):
            return e
        seen.add(id(e))
        e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__  # type: ignore
    return None


def write_failure(e: BaseException, url: str) -> UserError:
    """The one line for a failed write to the study database at ``url``: its path and the database's own reason."""
    return UserError(f"cannot write the study database {redact(url)}: {write_reason(e)}")


def write_reason(e: BaseException) -> str:
    """The database's own reason a write failed (``database or disk is full``)."""
    cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ else e
    return _first_line(cause)


def _first_line(e: BaseException) -> str:
    return (str(getattr(e, "orig", None) or e).splitlines() or [type(e).__name__])[0]


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
    """An existing study autotune created, for commands that only read (status, best, report, ...)."""
    storage = open_storage(url, create=False)
    if not refuse_foreign(storage, name, url):
        raise UserError(f"no study {name!r} in {redact(url)}: run `autotune run --study {name}` first")
    return optuna.load_study(study_name=name, storage=storage)


def refuse_foreign(storage: optuna.storages.BaseStorage, name: str, url: str) -> bool:
    """Whether the storage holds a study ``name``; refuses one autotune did not create (another program's of the same
    name: autotune would fail its live trials as orphans and queue its own configs into it). A study with no trial, no
    attribute and only maximized objectives is one an autotune was creating when it stopped (or is creating now: the
    study and autotune's record of it are two writes): it is taken as autotune's."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return False
    blank = record_study.is_blank(study)  # before is_autotunes: see is_blank
    if record_study.is_autotunes(study):
        return True
    if blank and all(d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions):
        return True
    raise UserError(f"study {name!r} in {redact(url)} was not created by autotune (it has no autotune record): give "
                    "the study another name, or autotune another --storage")
