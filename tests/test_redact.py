"""Which names are secrets, and how a command line, a URL, free text, tracebacks and files written as they stream are
masked (autotune/redact.py)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from autotune import redact
from autotune.sim.flags_table import FLAGS


def test_secret_names_are_whole_words_or_unmistakable_parts() -> None:
    secret = ["api-key", "admin-api-key", "HF_TOKEN", "OPENAI_API_KEY", "password", "x-authorization", "db_passwd",
              "PGPASSWORD", "sslpassword", "MYSQL_PASSWORD", "accessToken", "apiKey", "AWS_SECRET_ACCESS_KEY",
              "GITHUB_TOKEN", "hfToken", "ssl-keyfile-password", "client_secret", "cookie"]
    plain = ["max-total-tokens", "speculative-num-draft-tokens", "tp-size", "keyfile", "monkey", "tokenizer-path",
             "api-key-file", "AWS_ACCESS_KEY_ID", "speculative-token-map", "bucket-time-to-first-token",
             "kt-max-deferred-experts-per-token", "tokenizer", "max_tokens", "sslmode", "user"]
    assert [n for n in secret if not redact.is_secret(n)] == []
    assert [n for n in plain if redact.is_secret(n)] == []


def test_of_every_sglang_flag_only_the_keys_are_secret() -> None:
    """Every flag SGLang 0.5.23 takes (the emulator's table of them): only its key flags hold secrets, so no other
    flag's value is masked (and no ordinary value remembered as a secret)."""
    names = [flag for entry in FLAGS for flag in entry["flags"]]
    assert len(names) > 500
    assert sorted(n for n in names if redact.is_secret(n)) == ["--admin-api-key", "--api-key",
                                                               "--ssl-keyfile-password"]


def test_a_command_line_keeps_its_shape() -> None:
    argv = ["sglang", "--api-key", "k-123", "--enable-auth", "--port", "30000", "--hf-token=t-456"]
    masked = redact.redact_argv(argv)
    assert masked == ["sglang", "--api-key", "***", "--enable-auth", "--port", "30000", "--hf-token=***"]


def test_urls_lose_their_passwords() -> None:
    assert redact.redact_url("postgresql://tuner:pw@db:5432/autotune") == "postgresql://tuner:***@db:5432/autotune"
    assert redact.redact_url("postgresql://db/autotune?user=t&password=pw") == \
        "postgresql://db/autotune?user=t&password=***"
    assert redact.redact_url("postgresql://db/autotune?sslmode=require&sslpassword=pw") == \
        "postgresql://db/autotune?sslmode=require&sslpassword=***"
    assert redact.redact_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_a_url_password_is_remembered_wherever_it_appears_later() -> None:
    redact.remember_url_password("postgresql://db/a?sslpassword=ssl-pw-3315&sslmode=require")
    assert redact.mask("connection failed: sslpassword ssl-pw-3315 rejected") == \
        "connection failed: sslpassword *** rejected"


def test_remembered_values_are_masked_in_any_text() -> None:
    redact.remember("s3cr3t-value-91")
    line = 'ServerArgs(api_key="s3cr3t-value-91", port=1)'
    assert redact.mask(line) == 'ServerArgs(api_key="***", port=1)'
    assert redact.mask_mapping({"model": "m", "X": "a s3cr3t-value-91 b"}) == {"model": "m", "X": "a *** b"}


def test_a_secret_is_masked_however_a_program_quotes_it() -> None:
    """As it is, inside a JSON string or a Python repr (quotes and backslashes escaped), URL-encoded."""
    secret = 'p"w\\d/+ &x-7781'
    redact.remember(secret)
    shown = [secret, json.dumps({"k": secret}), repr({"k": secret}), quote(secret, safe=""), f"?k={quote(secret)}"]
    assert [s for s in shown if secret in redact.mask(s) or "7781" in redact.mask(s)] == []


def test_a_short_value_is_masked_only_when_it_is_the_whole_text() -> None:
    redact.remember("abc")
    assert redact.mask("abc") == "***"
    assert redact.mask("abcdef tabc") == "abcdef tabc"


def test_a_file_written_in_pieces_never_holds_the_secret(tmp_path: Path) -> None:
    """A secret cut anywhere between two writes (or split over many) is masked; lines without the secret are
    written whole and unchanged."""
    secret = "hf_streamed-secret-4417"
    redact.remember(secret)
    text = f"line one\n'api_key': '{secret}', port=1\nno newline at the end {secret}"
    for cut in range(len(text) + 1):
        path = tmp_path / f"cut-{cut}.log"
        f = redact.MaskedFile(path)
        f.write(text[:cut].encode())
        assert secret.encode() not in (path.read_bytes() if path.exists() else b""), cut
        f.write(text[cut:].encode())
        f.close()
        assert path.read_text() == text.replace(secret, "***"), cut
    path = tmp_path / "bytewise.log"
    f = redact.MaskedFile(path)
    for byte in text.encode():
        f.write(bytes([byte]))
        assert secret.encode() not in (path.read_bytes() if path.exists() else b"")
    f.close()
    assert path.read_text() == text.replace(secret, "***")


def test_a_long_line_is_written_before_it_ends_and_still_masked(tmp_path: Path) -> None:
    secret = "tok-very-long-line-8812"
    redact.remember(secret)
    path = tmp_path / "long.log"
    f = redact.MaskedFile(path)
    chunk = b"x" * (redact.MaskedFile.LINE_LIMIT - 10) + secret.encode()[:12]
    f.write(chunk)
    f.write(b"y" * 100)  # past the limit: written without waiting for the end of the line
    assert path.exists() and path.stat().st_size >= redact.MaskedFile.LINE_LIMIT - 10
    f.write(secret.encode()[12:] + b"x" * 5 + secret.encode() + b"\n")
    f.close()
    data = path.read_bytes()
    assert secret.encode() not in data and data.count(b"***") == 1 and data.endswith(b"***\n")


def test_a_secret_of_several_lines_is_masked_across_them(tmp_path: Path) -> None:
    secret = "-----BEGIN KEY-----\nAAAAB3Nza\n-----END KEY-----"
    redact.remember(secret)
    path = tmp_path / "pem.log"
    f = redact.MaskedFile(path)
    for line in f"before\nkey: {secret}\nafter\n".splitlines(keepends=True):
        f.write(line)
        assert b"AAAAB3Nza" not in (path.read_bytes() if path.exists() else b"")
    f.close()
    assert path.read_text() == "before\nkey: ***\nafter\n"


def test_tracebacks_in_event_lines_are_masked() -> None:
    secret = "tb-secret-value-3390"
    redact.remember(secret)
    formatter = redact.MaskingFormatter("%(message)s")
    try:
        raise RuntimeError(f"could not connect with {secret}")
    except RuntimeError:
        record = logging.LogRecord("autotune", logging.ERROR, __file__, 1, "failed: %s", (secret,), sys.exc_info())
    text = formatter.format(record)
    assert "Traceback" in text and "RuntimeError: could not connect with ***" in text
    assert secret not in text


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_bug_s_traceback_is_printed_masked(where: str) -> None:
    """An exception nobody catches (in the main thread or another) is printed with the secrets masked."""
    raising = "raise RuntimeError('bug near ' + s)"
    body = raising if where == "main" else (f"import threading\nt = threading.Thread(target=lambda: exec({raising!r}, "
                                            "{'s': s}))\nt.start(); t.join()")
    script = ("from autotune import redact\n"
              "s = 'uncaught-secret-7312'\n"
              "redact.remember(s)\n"
              "redact.install_excepthooks()\n" + body + "\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert "RuntimeError: bug near ***" in r.stderr and "Traceback" in r.stderr, r.stderr
    assert "uncaught-secret-7312" not in r.stderr
