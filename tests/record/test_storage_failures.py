"""A study directory or database autotune cannot write (read-only, a full disk): one line naming the path, no
traceback, and a measurement the database would not take kept on stdout. Read-only file systems are real mounts (a
tmpfs, a read-only bind mount of the database): root ignores file modes, and the suite runs as root."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from tests.support.cli import run_autotune, start_run, status, wait_for_line


def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.fail(f"mount {' '.join(args)} failed: {r.stderr.strip()} (these tests need root, as the CI container "
                    "runs them; run scripts/setup.sh)", pytrace=False)


@contextmanager
def read_only_copy(directory: Path, where: Path) -> Iterator[Path]:
    """``directory``'s files on a tmpfs at ``where``, mounted read-only."""
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where))
    try:
        for p in directory.iterdir():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, where / p.name)
        _mount("-o", "remount,ro", str(where))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextmanager
def read_only_file(path: Path) -> Iterator[None]:
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def one_line(r: subprocess.CompletedProcess[str] | tuple[int, str, str], pattern: str) -> None:
    code, out, err = (r.returncode, r.stdout, r.stderr) if not isinstance(r, tuple) else r
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in out + err, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and re.fullmatch(pattern, lines[0]), err[-2000:]


@pytest.mark.slow
def test_a_read_only_study_directory_and_database_are_one_line(tmp_path: Path) -> None:
    study = write_study(tmp_path / "s", launches=1) if (tmp_path / "s").mkdir() is None else None
    assert study is not None
    r = run_autotune("run", "--study", str(study), cwd=study.parent)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(study.parent / "t-artifacts")
    with read_only_copy(study.parent, tmp_path / "ro") as ro:
        for argv, pattern in [
            (("run", "--launches", "2"), rf"autotune: error: cannot write the event log {ro}/t\.log: Read-only file "
                                         "system"),
            (("apply",), rf"autotune: error: cannot write the event log {ro}/t\.log: Read-only file system"),
            (("dashboard", "--port", str(free_port())), rf"autotune: error: dashboard: cannot create the artifact "
                                                        rf"directory {ro}/t-artifacts: Read-only file system"),
        ]:
            one_line(run_autotune(argv[0], "--study", str(ro / "t.toml"), *argv[1:], cwd=ro), pattern)
        r = run_autotune("status", "--study", str(ro / "t.toml"), cwd=ro)  # reading needs no writing
        assert r.returncode == 0 and "1 of 1 launches" in r.stdout, r.stderr
    # the database alone read-only: the directory takes the log, the database takes nothing
    with read_only_file(study.parent / "t.db"):
        r = run_autotune("run", "--study", str(study), "--launches", "2", cwd=study.parent)
    one_line(r, rf"autotune: error: cannot write the study database sqlite:///{study.parent}/t\.db: attempt to "
                "write a readonly database")


@pytest.mark.slow
def test_a_measurement_the_database_would_not_take_is_kept(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount("-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk))
    try:
        study = write_study(disk, launches=2, objective="pareto",
                            workload="max_tokens = 48\nconcurrency = [1, 4]\nrequests = 24\nwindow_generations = 4\n"
                                     "warmup = 1\ntolerance = 0.5")
        db = disk / "t.db"
        proc = start_run(study)
        try:
            wait_for_line(study.with_suffix(".log"), r"trial 1 ready", proc)
            with open(disk / "filler", "wb") as f, pytest.raises(OSError):  # the disk fills while trial 1 is measured
                while True:
                    f.write(b"\0" * 2**16)
                    f.flush()
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        (disk / "filler").unlink()
        trials = status(study)["trials"]
        left = sorted(p.name for p in disk.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    one_line((proc.returncode, out, err), rf"autotune: error: cannot write the study database sqlite:///{db}: "
                                          "database or disk is full")
    kept = re.search(r"^autotune: trial 1 measured but not stored: (\{.*\})$", out, re.MULTILINE)
    assert kept, out[-2000:]
    figures = json.loads(kept.group(1))
    assert figures["params"] and figures["metrics"]["single_tok_s"] > 0, figures
    # ended, not left running for the next start to measure again unannounced: failed, with where its figures are,
    # and its config queued once more (the room kept beside the database took these last writes, and is given back)
    one = trials[1]
    assert one["state"] == "FAIL" and one["reason"] == "not_stored", one
    assert "database or disk is full" in one["detail"] and "measured but not stored" in one["detail"], one
    assert [t["state"] for t in trials if t["retry_of"] == 1] == ["WAITING"], trials
    assert "t.db.reserve" not in left, left
