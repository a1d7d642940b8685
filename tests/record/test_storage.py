"""Opening a study database: processes that create a new one at the same moment all get it."""
from __future__ import annotations

import threading
from pathlib import Path

from autotune.record.storage import open_storage


def test_a_new_sqlite_database_opened_by_several_at_once(tmp_path: Path) -> None:
    """`autotune status` (or a dashboard, or a second worker) opening the database while the first `autotune run`
    creates its tables must not fail with "table studies already exists"."""
    errors: list[str] = []

    def open_it(url: str, start: threading.Barrier) -> None:
        start.wait()
        try:
            open_storage(url).get_all_studies()
        except Exception as e:
            errors.append(str(e))

    for i in range(4):
        start = threading.Barrier(6)
        threads = [threading.Thread(target=open_it, args=(f"sqlite:///{tmp_path / f'{i}.db'}", start))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
