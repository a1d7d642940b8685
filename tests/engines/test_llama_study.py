"""A real engine end to end: studies/smollm2-cpu.toml tuned on llama.cpp's llama-server with SmolLM2-135M.

Needs the binary and the model from scripts/build-llama-server.sh and scripts/fetch-smollm2.sh (CI runs both)."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from autotune.testing.ports import free_port
from tests.support.cli import run_autotune, status
from tests.support.llama_cache import cached_model, cached_server_binary

BINARY, MODEL = cached_server_binary(), cached_model()
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("llama_parts")
SPECULATIVE = ("ngram-simple", "ngram-map-k", "draft-simple")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smollm2_study_tunes_a_real_engine(tmp_path: Path) -> None:
    # the repository's study file, with its cache paths made absolute, a free port, and a lighter workload (a 135M
    # model on 2 shared cores: the figures only need to be real, not precise)
    text = (REPO / "studies" / "smollm2-cpu.toml").read_text()
    text = text.replace("../.cache/llama/bin/llama-server", str(BINARY)).replace(
        "../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", str(MODEL))
    text = re.sub(r"server_port = \d+", f"server_port = {free_port()}", text)
    text = re.sub(r"(?m)^max_tokens = \d+", "max_tokens = 48", text)
    text = re.sub(r"(?m)^requests = \d+", "requests = 3", text)
    text = re.sub(r"(?m)^window_generations = \d+", "window_generations = 1", text)
    text = re.sub(r"(?m)^max_repeats = \d+", "max_repeats = 1", text)
    study = tmp_path / "smollm2-cpu.toml"
    study.write_text(text)

    # resume in steps until at least six trials launched a real server (reused configs launch none)
    launched: list[dict] = []
    for budget in range(6, 13):
        r = run_autotune("run", "--study", str(study), "--trials", str(budget), cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
        trials = status(study)["trials"]
        launched = [t for t in trials if t["launched"]]
        if len(launched) >= 6:
            break
    assert len(launched) >= 6

    measured = [t for t in launched if t["state"] == "COMPLETE"]
    assert measured, [t["reason"] for t in launched]
    for t in measured:
        m = t["metrics"]
        assert m["single_tok_s"] > 1 and m["concurrent_tok_s"] > 1  # real tokens from a real model
        assert m["max_running_requests"] == 2  # the server's slots
    speculative = [t for t in measured if t["config"]["spec-type"] in SPECULATIVE]
    assert speculative, "no speculative config was measured"
    for t in speculative:
        assert t["metrics"]["accept_length"] is not None and t["metrics"]["accept_length"] > 1.0, t

    # the best config's command line starts a working server
    best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
    argv = best["command"]
    port = int(argv[argv.index("--port") + 1])
    server = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, "the best config's command line does not start"
            time.sleep(0.2)
        # llama-server samples at temperature 0.8 by default, so a plain request may stop early on end-of-text
        r = httpx.post(f"http://127.0.0.1:{port}/completion",
                       json={"prompt": "The capital of France is", "n_predict": 8, "ignore_eos": True,
                             "temperature": 0.0}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
    finally:
        server.kill()
        server.wait()
