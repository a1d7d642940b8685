"""Event lines: one per event (trial start, deploy, ready, measured, failed, restored), to stdout for journald
and to the study's log file beside the study; secrets masked in the whole line, a traceback included
(autotune.redact)."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from autotune.errors import UserError
from autotune.redact import LogFilter, MaskingFormatter

FORMAT = "%(asctime)s %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"


def setup(log_file: Path | None, stream: object = None) -> logging.Logger:
    logger = logging.getLogger("autotune")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler(stream or sys.stdout)
    console.setFormatter(MaskingFormatter(FORMAT, DATEFMT))
    console.addFilter(LogFilter())
    logger.addHandler(console)
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            file_handler = _FileHandler(log_file)
        except OSError as e:  # a read-only study directory, a full disk
            logger.removeHandler(console)
            raise UserError(f"cannot write the event log {log_file}: {e.strerror}") from None
        file_handler.setFormatter(MaskingFormatter(FORMAT, DATEFMT))
        file_handler.addFilter(LogFilter())
        logger.addHandler(file_handler)
    return logger


class _FileHandler(logging.FileHandler):
    """The study's log file, opened without following a link (studyfile/paths.py refuses one; a link planted after that
    check fails the open); a line the file will not take (a full disk) is dropped, not a traceback on stderr: the
    same line went to stdout, and the command that cannot write its database ends with one line of its own."""

    def _open(self) -> TextIO:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        pass
