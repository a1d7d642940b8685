"""Which names are secrets, and how a command line, a URL and free text are masked (autotune/redact.py)."""
from __future__ import annotations

from autotune import redact


def test_secret_names_are_whole_words() -> None:
    secret = ["api-key", "admin-api-key", "HF_TOKEN", "OPENAI_API_KEY", "password", "x-authorization", "db_passwd"]
    plain = ["max-total-tokens", "speculative-num-draft-tokens", "tp-size", "keyfile", "monkey", "tokenizer-path"]
    assert [n for n in secret if not redact.is_secret(n)] == []
    assert [n for n in plain if redact.is_secret(n)] == []


def test_a_command_line_keeps_its_shape() -> None:
    argv = ["sglang", "--api-key", "k-123", "--enable-auth", "--port", "30000", "--hf-token=t-456"]
    masked = redact.redact_argv(argv)
    assert masked == ["sglang", "--api-key", "***", "--enable-auth", "--port", "30000", "--hf-token=***"]
    assert redact.unmask_argv(masked, {"api-key": "k-123", "hf-token": "t-456"}) == argv


def test_urls_lose_their_passwords() -> None:
    assert redact.redact_url("postgresql://tuner:pw@db:5432/autotune") == "postgresql://tuner:***@db:5432/autotune"
    assert redact.redact_url("postgresql://db/autotune?user=t&password=pw") == \
        "postgresql://db/autotune?user=t&password=***"
    assert redact.redact_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_remembered_values_are_masked_in_any_text() -> None:
    redact.remember("s3cr3t-value-91")
    line = 'ServerArgs(api_key="s3cr3t-value-91", port=1)'
    assert redact.mask(line) == 'ServerArgs(api_key="***", port=1)'
    assert redact.mask_mapping({"model": "m", "X": "a s3cr3t-value-91 b"}) == {"model": "m", "X": "a *** b"}
