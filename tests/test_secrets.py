"""Secrets in a real study on the emulator: given by reference, marked secret in the file, or named like secrets (a
literal ``PGPASSWORD``), they reach the server and nowhere else: not the database, the event log, the trial logs
(masked as they stream, so a `kill -9` mid-trial leaves none), `apply.log`, the artifacts, `status`, `best` or the
report; and the study's files are private."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest

from autotune.record import write
from autotune.redact import remember
from autotune.targets.logfollow import LogFollower
from autotune.testing.studies import port_of, write_study
from tests.support.cli import run_autotune, status

API_KEY = "sk-api-7Hq2kP9x"
HF_TOKEN = "hf_tokenvalue_81234"
LITERAL = "literal-token-5542"
PGPASSWORD = "pg-literal-pw-3321"
MARKED = "marked-secret-9077"
SECRETS = (API_KEY, HF_TOKEN, LITERAL, PGPASSWORD, MARKED)


def secret_study(tmp_path: Path, launches: int = 3) -> tuple[Path, dict[str, str]]:
    """A study whose server needs an API key (by reference) and whose environment holds a token by reference, a
    literal whose name says it is a token, a literal PGPASSWORD and a value marked secret; its environment."""
    study = write_study(tmp_path, launches=launches,
                        space='[space.speculative-num-steps]\ntype = "int"\nlow = 2\nhigh = 3\n')
    text = study.read_text().replace("[engine.args]\n", '[engine.args]\napi-key = { env = "AUTOTUNE_TEST_API_KEY" }\n')
    study.write_text(text + '\n[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_HF_TOKEN" }\n'
                            f'MY_SERVICE_TOKEN = "{LITERAL}"\nPGPASSWORD = "{PGPASSWORD}"\n'
                            f'DOWNLOAD_SIGNATURE = {{ secret = "{MARKED}" }}\n')
    # the machine-wide state (locks, the local target's pid files) beside the study's directory: the files scanned
    # here are the study's
    return study, {"AUTOTUNE_TEST_API_KEY": API_KEY, "AUTOTUNE_TEST_HF_TOKEN": HF_TOKEN,
                   "XDG_STATE_HOME": str(tmp_path.parent / f"{tmp_path.name}-state")}


def leaks(directory: Path, exclude: Path) -> list[tuple[str, str]]:
    """(file, secret) for every secret whose bytes are in a file under ``directory`` (the database too)."""
    return [(str(p), s) for p in directory.rglob("*") if p.is_file() and p != exclude
            for s in SECRETS if s.encode() in p.read_bytes()]


@pytest.mark.slow
def test_secrets_reach_the_server_and_nothing_autotune_writes(tmp_path: Path) -> None:
    study, env = secret_study(tmp_path)
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    # the server needed the key: every measured trial's requests carried it (a busy machine may cut a level short)
    result = run_autotune("status", "--study", str(study), "--json", env=env)
    trials = json.loads(result.stdout)["trials"]
    assert all(t["state"] == "COMPLETE" or t["reason"] == "client_bound" for t in trials), trials
    assert "***" in " ".join(trials[0]["command"])

    outputs = [r.stdout, r.stderr, result.stdout]
    for fmt in ("args", "unit"):
        best = run_autotune("best", "--study", str(study), "--format", fmt, env=env)
        assert best.returncode == 0, best.stderr
        outputs.append(best.stdout)
    assert "HF_TOKEN='***'" in outputs[-2] and "PGPASSWORD='***'" in outputs[-2]
    assert "DOWNLOAD_SIGNATURE='***'" in outputs[-2]
    report = run_autotune("report", "--study", str(study), "--out", str(tmp_path / "report"), env=env)
    assert report.returncode == 0, report.stderr
    assert not [(text[-300:], s) for text in outputs for s in SECRETS if s in text]

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in written) and any("artifacts" in str(p) for p in written)
    assert any(p.name == "command.sh" or p.name.endswith(".command.sh") for p in written)
    assert leaks(tmp_path, study) == []
    # the server did print its key (SGLang logs its arguments at startup): the log shows where it was masked
    assert "'api_key': '***'" in (tmp_path / "t-logs" / "trial-0000.log").read_text()

    # the study's own files are the user's alone
    for p in [tmp_path / "t.db", tmp_path / "t.log", *(tmp_path / "t-logs").iterdir()]:
        assert p.stat().st_mode & 0o077 == 0, (p, oct(p.stat().st_mode))
    assert (tmp_path / "t-artifacts").stat().st_mode & 0o077 == 0

    # apply puts the real key back into the command it deploys; its log, like every other, holds it masked
    port = port_of(study)
    try:
        r = run_autotune("apply", "--study", str(study), cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 401
        ok = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                       timeout=5)
        assert ok.status_code == 200
        # the server outlives `autotune apply` and goes on logging, masked, into apply.log
        for _ in range(3):
            httpx.post(f"http://127.0.0.1:{port}/generate", json={"text": f"say {API_KEY}",
                                                                   "sampling_params": {"max_new_tokens": 4}},
                       headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
        assert "'api_key': '***'" in (tmp_path / "t-logs" / "apply.log").read_text()
        assert leaks(tmp_path, study) == []
    finally:
        stop_local_server(port, env)


def stop_local_server(port: int, env: dict[str, str]) -> None:
    """Stop the server `autotune apply` left on ``port`` (its process group, named in the local target's pid file)."""
    pid_file = Path(env["XDG_STATE_HOME"]) / "autotune" / f"local-{port}.pid"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(int(json.loads(pid_file.read_text())["pid"]), signal.SIGKILL)


def test_a_tuner_killed_mid_trial_leaves_no_secret_on_disk(tmp_path: Path) -> None:
    """The server's startup line (its arguments, the key among them) is in the trial's log, masked, the moment it is
    there; the tuner is SIGKILLed then, before any artifact is uploaded. The next run stops the orphan and finishes."""
    study, env = secret_study(tmp_path, launches=1)
    log = tmp_path / "t-logs" / "trial-0000.log"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "server_args=" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, "the tuner ended before the server started"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "'api_key': '***'" in log.read_text()
    assert leaks(tmp_path, study) == []
    time.sleep(1)  # the orphaned server goes on writing its log
    assert leaks(tmp_path, study) == []
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "trial 0 was left running by a stopped tuner" in r.stdout
    assert leaks(tmp_path, study) == []
    assert [t["state"] for t in status(study)["trials"]][-1] in ("COMPLETE", "FAIL")


def test_a_failure_detail_is_stored_masked() -> None:
    """A failure's detail (often a line of the server's log) is masked before it reaches the record."""
    remember("detail-secret-4410")
    study = optuna.create_study()
    trial = study.ask()
    write.failed(trial, "crashed", "ValueError: bad key 'detail-secret-4410' given", stage="waiting")
    assert study.trials[0].user_attrs["detail"] == "ValueError: bad key '***' given"


def test_a_remote_log_is_masked_as_it_is_mirrored(tmp_path: Path) -> None:
    """The ssh targets mirror a server's remote log into the trial's local log file (LogFollower): a secret cut
    between two fetches is masked all the same, and never on disk in part."""
    secret = "remote-log-secret-7301"
    remember(secret)
    text = f"[startup] server_args={{'api_key': '{secret}', 'port': 1}}\nready\n"
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    log = tmp_path / "trial-0001.log"

    def fetch() -> str:
        return pieces.pop(0) if pieces else ""

    follower = LogFollower(fetch, log, interval=0.01, name="test")
    try:
        deadline = time.monotonic() + 10
        while pieces and time.monotonic() < deadline:
            assert secret[:6] not in (log.read_text() if log.exists() else "")
            time.sleep(0.005)
    finally:
        follower.stop()
    assert log.read_text() == text.replace(secret, "***")


@pytest.mark.parametrize("storage", ["postgresql://tuner@127.0.0.1:1/db?sslpassword=url-ssl-pw-8841",
                                     "postgresql://tuner:url-user-pw-8841@127.0.0.1:1/db"])
def test_a_storage_password_is_masked_in_what_a_failing_run_prints(tmp_path: Path, storage: str) -> None:
    study = write_study(tmp_path)
    r = run_autotune("run", "--study", str(study), "--storage", storage, cwd=tmp_path)
    assert r.returncode == 2 and "cannot open storage" in r.stderr, r.stderr
    assert "8841" not in r.stderr + r.stdout
