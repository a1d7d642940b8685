"""Text autotune did not write (a port holder's command line, any user's on the host) reaches the terminal, the
event log and the stored trial only through ``visible``: its escape sequences written out, never sent raw."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from autotune.visible import visible
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
        study = write_study(tmp_path, trials=1, port=port)
        r = run_autotune("run", "--study", str(study), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        log = study.with_suffix(".log").read_text()
        detail = status(study)["trials"][0]["detail"]
        assert f"held by pid {squatter.pid}" in detail and SHOWN in detail
        assert SHOWN in log and SHOWN in r.stdout
        for text in (detail, log, r.stdout, r.stderr):
            assert not any(c in text for c in RAW), repr(text[-300:])
