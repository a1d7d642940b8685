"""Host keys are checked against known_hosts only: unknown and changed keys are refused with a message that says
what to do; nothing is added to known_hosts; secrets never show up in messages or logs."""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.targets.process import ProcessTarget
from autotune.targets.ssh import SSHConnection
from autotune.testing.sshd import host_key_line, keygen


def fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


def refusal(spec) -> str:
    conn = SSHConnection(spec)
    try:
        with pytest.raises(UserError) as e:
            conn.connect()
    finally:
        conn.close()
    message = str(e.value)
    assert "\n" not in message
    return message


def test_unknown_host_key_is_refused_with_fingerprint_and_keyscan_hint(make_spec, sshd, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    message = refusal(make_spec(known_hosts=str(known_hosts)))
    assert "not known" in message
    assert fingerprint(Path(f"{sshd.host_key}.pub")) in message
    hint = f"ssh-keyscan -p {sshd.port} -t ed25519 127.0.0.1 >> {known_hosts}"
    assert hint in message
    assert known_hosts.read_text() == ""  # never auto-added

    # the advice works: after running it, the same spec connects
    subprocess.run(["sh", "-c", hint], check=True, capture_output=True)
    conn = SSHConnection(make_spec(known_hosts=str(known_hosts)))
    try:
        conn.connect()
        assert conn.run("echo ok").stdout.strip() == "ok"
    finally:
        conn.close()


def test_missing_known_hosts_file_is_an_unknown_key(make_spec, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "known_hosts"
    message = refusal(make_spec(known_hosts=str(missing)))
    assert "not known" in message
    assert not missing.exists()


def test_changed_host_key_is_refused_as_possible_mitm(make_spec, sshd, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(host_key_line(sshd.host, sshd.port, Path(f"{impostor}.pub")))
    before = known_hosts.read_text()
    message = refusal(make_spec(known_hosts=str(known_hosts)))
    assert "CHANGED" in message and "man-in-the-middle" in message
    assert fingerprint(Path(f"{impostor}.pub")) in message  # what known_hosts says
    assert fingerprint(Path(f"{sshd.host_key}.pub")) in message  # what the server offers
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known_hosts}" in message
    assert known_hosts.read_text() == before


def test_changed_key_refusal_reaches_the_target_lock(make_spec, sshd, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(host_key_line(sshd.host, sshd.port, Path(f"{impostor}.pub")))
    target = ProcessTarget(make_spec(known_hosts=str(known_hosts)))
    try:
        with pytest.raises(UserError, match="CHANGED"), target.lock("study"):
            pass
    finally:
        target.close()


def test_wrong_key_is_an_authentication_error_and_secrets_stay_out(make_spec, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    stranger = keygen(tmp_path / "stranger")
    monkeypatch.setenv("AUTOTUNE_TEST_SSH_PASSWORD", "s3cret-value")
    caplog.set_level(logging.DEBUG)
    message = refusal(make_spec(key_file=str(stranger), password_env="AUTOTUNE_TEST_SSH_PASSWORD"))
    assert "authentication as root" in message
    assert str(stranger) in message and "$AUTOTUNE_TEST_SSH_PASSWORD" in message
    assert "s3cret-value" not in message
    assert "s3cret-value" not in caplog.text


def test_password_env_must_be_set(make_spec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_TEST_UNSET_PASSWORD", raising=False)
    message = refusal(make_spec(password_env="AUTOTUNE_TEST_UNSET_PASSWORD"))
    assert "AUTOTUNE_TEST_UNSET_PASSWORD" in message and "not set" in message
