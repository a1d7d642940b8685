"""Per-trial artifacts in Optuna's artifact store, so optuna-dashboard shows them beside each trial: the server
log of this start, the rendered command line (or unit), and the raw measurement records."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from autotune.redact import mask

log = logging.getLogger("autotune")


def artifact_dir(study_dir: Path, name: str) -> Path:
    return study_dir / f"{name}-artifacts"


def open_store(study_dir: Path, name: str) -> FileSystemArtifactStore:
    path = artifact_dir(study_dir, name)
    path.mkdir(parents=True, exist_ok=True)  # the store does not create its directory
    return FileSystemArtifactStore(path)


def upload_trial(
    store: FileSystemArtifactStore,
    trial: optuna.Trial,
    files_dir: Path,
    server_log: Path | None,
    launch: tuple[str, str] | None,
    records: list[dict[str, Any]] | None,
    files: Sequence[tuple[str, str]] = (),
) -> None:
    """Upload what a trial produced (``files``: the files its server read, as name and text); failures to upload
    are logged, never raised (the trial's result matters more)."""
    prefix = f"trial-{trial.number:04d}"
    try:
        files_dir.mkdir(parents=True, exist_ok=True)
        uploads: list[tuple[Path, str]] = []
        if server_log is not None and server_log.exists():
            # the targets write server logs masked as they stream (servers print their arguments at startup, SGLang
            # its api_key); a log kept elsewhere is copied here masked
            path = files_dir / server_log.name
            if path.resolve() != server_log.resolve():
                path.write_text(mask(server_log.read_text(errors="replace")))
            uploads.append((path, "text/plain"))
        if launch is not None:
            name, text = launch
            path = files_dir / f"{prefix}.{name}"
            path.write_text(mask(text))
            uploads.append((path, "text/plain"))
        if records:
            path = files_dir / f"{prefix}.records.json"
            path.write_text(mask(json.dumps(records, indent=1)))
            uploads.append((path, "application/json"))
        for name, text in files:
            path = files_dir / f"{prefix}.{name}"
            path.write_text(mask(text))
            uploads.append((path, "application/json" if name.endswith(".json") else "text/plain"))
        for path, mimetype in uploads:
            upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial, mimetype=mimetype)
    except Exception as e:  # an artifact is never worth a trial
        log.warning("trial %d: could not store its artifacts: %s", trial.number, e)
