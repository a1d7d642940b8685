"""Secrets in a real study on the emulator: named by reference or by a secret-looking name, they reach the server
and nowhere else (the database, logs, artifacts, `status`, `best`, the report), and the study's files are private."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from autotune.testing.studies import port_of, write_study
from tests.support.cli import run_autotune

API_KEY = "sk-api-7Hq2kP9x"
HF_TOKEN = "hf_tokenvalue_81234"
LITERAL = "literal-token-5542"


@pytest.mark.slow
def test_secrets_reach_the_server_and_nothing_autotune_writes(tmp_path: Path) -> None:
    study = write_study(tmp_path, trials=3, space='[space.speculative-num-steps]\ntype = "int"\nlow = 2\nhigh = 3\n')
    text = study.read_text().replace("[engine.args]\n", '[engine.args]\napi-key = { env = "AUTOTUNE_TEST_API_KEY" }\n')
    study.write_text(text + '\n[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_HF_TOKEN" }\n'
                            f'MY_SERVICE_TOKEN = "{LITERAL}"\n')
    env = {"AUTOTUNE_TEST_API_KEY": API_KEY, "AUTOTUNE_TEST_HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path / "s")}
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    # the server needed the key: every measured trial's requests carried it
    status = run_autotune("status", "--study", str(study), "--json", env=env)
    trials = json.loads(status.stdout)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * len(trials)
    assert "***" in " ".join(trials[0]["command"])

    outputs = [r.stdout, r.stderr, status.stdout]
    for fmt in ("args", "unit"):
        best = run_autotune("best", "--study", str(study), "--format", fmt, env=env)
        assert best.returncode == 0, best.stderr
        outputs.append(best.stdout)
    assert "HF_TOKEN='***'" in outputs[-2]
    report = run_autotune("report", "--study", str(study), "--out", str(tmp_path / "report"), env=env)
    assert report.returncode == 0, report.stderr

    secrets = (API_KEY, HF_TOKEN, LITERAL)
    for text in outputs:
        assert not [s for s in secrets if s in text], text[-2000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != study]
    assert any(p.suffix == ".db" for p in written) and any("artifacts" in str(p) for p in written)
    leaks = [(str(p), s) for p in written for s in secrets if s.encode() in p.read_bytes()]
    assert leaks == [], leaks

    # the study's own files are the user's alone
    for p in [tmp_path / "t.db", tmp_path / "t.log", *(tmp_path / "t-logs").iterdir()]:
        assert p.stat().st_mode & 0o077 == 0, (p, oct(p.stat().st_mode))
    assert (tmp_path / "t-artifacts").stat().st_mode & 0o077 == 0

    # apply puts the real key back into the command it deploys
    port = port_of(study)
    try:
        r = run_autotune("apply", "--study", str(study), cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 401
        ok = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                       timeout=5)
        assert ok.status_code == 200
    finally:
        subprocess.run(["pkill", "-f", "--", f"--port {port}"], check=False)
