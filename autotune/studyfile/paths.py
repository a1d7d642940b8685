"""The files autotune keeps beside a study file: NAME.log (the event log), NAME-logs/ (server logs) and
NAME-artifacts/ (the trials' artifacts). autotune makes them itself; one found as a symbolic link (or as the wrong
kind of file) was put there by someone else, and following it would append the event log, or write server logs and
artifacts, wherever it points: refused in one line, before anything is written."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from autotune.errors import UserError
from autotune.studyfile.spec import StudySpec


def check(spec: StudySpec) -> None:
    """Refuse a study whose event log, server logs or artifacts path is a link, or not the kind of file it must be
    (a missing one is made when it is first written)."""
    base = spec.directory / spec.name
    for path, what, directory in ((Path(f"{base}.log"), "event log", False),
                                  (Path(f"{base}-logs"), "server logs", True),
                                  (Path(f"{base}-artifacts"), "trials' artifacts", True)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UserError(f"cannot use {path} for the study's {what}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}): autotune writes the study's {what} "
                            "there itself and follows no link; remove the link")
        if directory != stat.S_ISDIR(st.st_mode) or not (directory or stat.S_ISREG(st.st_mode)):
            raise UserError(f"{path} is not a {'directory' if directory else 'regular file'}: autotune keeps the "
                            f"study's {what} there; move it away")
