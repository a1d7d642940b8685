"""`autotune run --study sglang-cpu` end to end over ssh-process through the real sshd: SGLang 0.5.23 on this CPU
tuned by the product's own path, unchanged. The host's SGLang is asked about each config before it runs (a config
its CPU platform refuses costs no launch), readiness
comes from its real log and /ready, its real /server_info is checked, each request's acceptance comes from the chat
endpoint's speculative figures (the study sends chat traffic), and the tuner leaves the best config running and
healthy on the host."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.studyfile.spec import read_study_file
from autotune.targets.process import ProcessTarget
from autotune.testing.ports import free_port
from autotune.testing.sshd import SSHServer
from tests.support import requires
from tests.support.cli import finished_ok, kept, run_autotune, status
from autotune.testing.sglang_cpu import study_file
from tests.support.ssh import start_sshd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ENGINE = SGLang()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    requires.sglang_cpu()
    server = start_sshd(tmp_path / "ssh", tmp_path / "systemd")
    yield server
    server.stop()


def test_the_sglang_cpu_study_over_ssh_process(sshd: SSHServer, tmp_path: Path) -> None:
    target = {"kind": "ssh-process", "host": sshd.host, "port": sshd.port, "user": "root",
              "key_file": str(sshd.user_key), "known_hosts": str(sshd.known_hosts),
              "workdir": str(tmp_path / "remote-work"), "tunnel": True, "connect_timeout": 5,
              "reconnect_timeout": 20, "server_port": free_port()}
    # the chain's steps, and DFLASH, which SGLang's CPU platform refuses: the host's SGLang says so before a launch
    space = {"speculative-algorithm": {"type": "categorical", "choices": ["STANDALONE", "DFLASH"]},
             "speculative-num-steps": {"type": "categorical", "choices": [1, 2]}}
    study = study_file(tmp_path, study={"launches": 2, "sampler": "grid"}, target=target, space=space,
                       engine_args={"speculative-num-draft-tokens": None},
                       workload={"requests": 3, "concurrency": [1, 2], "window_generations": 1, "tolerance": 0.5})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=1700)
    host = ProcessTarget(read_study_file(str(study)).target())
    try:  # the tuner leaves the best config running on the host: stopped here whatever the checks find
        finished_ok(r)
        report = status(study)
        trials = kept(report["trials"])
        refused = [t for t in trials if t["params"]["speculative-algorithm"] == "DFLASH"]
        assert refused and all(t["reason"] == "host_rejected" and not t["launched"] for t in refused), trials
        assert "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'" in refused[0]["detail"]
        launched = [t for t in trials if t["launched"]]
        assert report["launches"] == 2 and len(launched) == 2, trials
        complete = [t for t in launched if t["state"] == "COMPLETE"]
        assert len(complete) == 2, trials
        for t in complete:
            metrics = t["metrics"]
            assert metrics["single_tok_s"] > 0 and metrics["concurrent_tok_s"] > 0, metrics
            # chat traffic: acceptance read from the speculative figures SGLang sends after each finishing event
            assert 1.0 <= metrics["accept_length"] <= t["config"]["speculative-num-steps"] + 1, metrics
            assert t["ready_s"] > 5, t   # the tokenizer's slow start, waited for
            assert not t["host_rewrote"], t  # the host's SGLang, asked in the server's environment, keeps intel_amx
            log = (tmp_path / "t-logs" / f"trial-{t['number']:04d}.log").read_text()
            assert "The server is fired up and ready to roll!" in log  # fetched from the host over SFTP
            assert ENGINE.fatal_lines(log.splitlines()) == [], t["number"]
        events = (tmp_path / "t.log").read_text()
        assert not re.search(r"cannot be asked about a config", events)  # the host's own SGLang answered

        # the tuner has exited; the host keeps the best config running, healthy and verified
        info = httpx.get(host.base_url() + "/server_info", timeout=30).json()
        best = json.loads(run_autotune("best", "--study", str(study), "--json", cwd=tmp_path).stdout)
        assert (info["speculative_algorithm"], info["speculative_num_steps"]) == (
            "STANDALONE", best["params"]["speculative-num-steps"]), best
        assert httpx.get(host.base_url() + "/health", timeout=30).status_code == 200
    finally:
        host.stop()
        host.close()
