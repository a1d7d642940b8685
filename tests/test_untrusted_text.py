"""Text autotune did not write (a port holder's command line, any user's on the host) reaches the terminal, the
event log and the stored trial only through ``visible``: its escape sequences written out, never sent raw."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.record import TrialRecord
from autotune.report.summary import _categories
from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from autotune.visible import cell, visible
from tests.support.cli import run_autotune, status
from tests.support.port_holder import holding

#: a window-title escape and a bell, as a hostile process's argument would carry them
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e"
RAW = ("\x1b", "\x07", "\u202e")


def test_visible_writes_out_what_a_terminal_would_obey() -> None:
    assert visible(HOSTILE) == SHOWN
    assert visible("a\nb\r\tc\x9b31m\u2028\ufeff\udcff") == "a\\nb\\r\\tc\\x9b31m\\u2028\\ufeff\\udcff"
    assert visible("steps=3 topk=1 modèle 日本 ok") == "steps=3 topk=1 modèle 日本 ok"


@pytest.mark.slow
def test_a_port_holders_escape_sequences_reach_no_terminal_log_or_record(tmp_path: Path) -> None:
    port = free_port()
    # its command line starts with the hostile text (autotune shows the first 160 characters)
    listen = (f"#{HOSTILE}\nimport socket,sys,time;s=socket.socket();s.bind(('127.0.0.1',int(sys.argv[1])));"
              "s.listen();time.sleep(600)")
    with holding([sys.executable, "-c", listen, str(port)], port) as squatter:
        study = write_study(tmp_path, launches=1, port=port)
        r = run_autotune("run", "--study", str(study), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        log = study.with_suffix(".log").read_text()
        detail = status(study)["trials"][0]["detail"]
        assert f"held by pid {squatter.pid}" in detail and SHOWN in detail
        assert SHOWN in log and SHOWN in r.stdout
        for text in (detail, log, r.stdout, r.stderr):
            assert not any(c in text for c in RAW), repr(text[-300:])


#: a dataset's category as a hostile file would set it: an escape sequence, a line break, HTML, a table's separator
CATEGORY = "\x1b[31mred\nx<img src=x>|a|b"


def test_a_datasets_category_reaches_the_workload_view_and_the_summary_as_text(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "Once upon a time", "category": CATEGORY}) + "\n")
    study = write_study(tmp_path, workload='dataset = "d.jsonl"')
    r = run_autotune("workload", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shown = next(line for line in r.stdout.splitlines() if line.startswith("categories: "))
    assert shown == f"categories: {visible(CATEGORY)} 1" and "\x1b" not in r.stdout

    figures = {"measured": 4, "tokens_mean": 40.0, "accept_length": 3.1, "decode_tok_s": 80.0}
    best = TrialRecord(number=3, state=TrialState.COMPLETE, values=[1.2], params={}, constraints={},
                       levels=[{"concurrency": 1, "categories": {CATEGORY.strip(): figures}}])
    row = next(line for line in _categories(None, best, None) if line.startswith("| trial 3 "))
    assert row.count("|") - row.count("\\|") == 8, row  # seven cells, as the header has
    assert cell(CATEGORY) in row and "<img" not in row and "\n" not in row and "\x1b" not in row
    assert cell("a|b <i>&") == "a\\|b &lt;i&gt;&amp;"
