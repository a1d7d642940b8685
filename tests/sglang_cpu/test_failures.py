"""Failures as the real SGLang 0.5.23 on this CPU fails, each recognized by autotune from SGLang's own output and
recorded with its reason, through the product's own path (`autotune run`, or the trial's bring-up); and no healthy
start read as failed: every line the real server prints here goes through the fatal-line patterns.

- a config SGLang refuses at start, launched anyway (bring-up without the question to the host, which refuses it
  first: test_study.py): ``invalid_args`` in SGLang's own words;
- a KV cache that does not fit: ``--mem-fraction-static`` below the weights fails the start as ``oom_startup`` with
  SGLang's message; ``--max-total-tokens`` below a request fails its requests, each with SGLang's 400;
- the server killed during a measurement: ``crashed_under_load``, and the study goes on;
- a stale SGLang on the port: named, never killed, the trial ``port_busy``.
(The tokenizer's slow start, 20-60 s before /ready answers here, waited for and recorded: test_study.py.)
(A tree of fewer draft tokens than steps + 1, which SGLang starts and then crashes on at its first verify, is refused
by the rules at once: tests/studyfile/test_dependent_ranges.py; the real crash: test_emulator_against_sglang.py.)"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from autotune.run.bringup import bring_up
from autotune.engines.sglang import SGLang
from autotune.errors import TrialFailure
from autotune.run.plan import make_plan
from autotune.studyfile.spec import read_study_file
from autotune.targets import make_target
from autotune.testing import sglang_cpu
from autotune.testing.ports import free_port
from tests.support import requires
from tests.support.cli import kept, run_autotune, start_run, status
from autotune.testing.sglang_cpu import study_file

#: a real server takes 20-60 s to start here, a study of two launches some minutes
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.usefixtures("real_parts")]
ENGINE = SGLang()
#: a workload a real server on this CPU measures in under a minute
SMALL = {"requests": 3, "max_tokens": 32, "warmup": 1, "concurrency": [1, 2], "window_generations": 1,
         "tolerance": 0.5, "max_repeats": 1}
CHAIN = {"speculative-num-steps": 1, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 2}
#: a space of the one config CHAIN
ONE = {"speculative-num-steps": {"type": "categorical", "choices": [1]}}


@pytest.fixture
def real_parts() -> None:
    requires.sglang_cpu()


@pytest.mark.parametrize(("change", "reason", "said"), [
    ({"speculative-eagle-topk": 2, "speculative-num-draft-tokens": 3, "page-size": 16}, "invalid_args",
     "speculative_eagle_topk > 1 with page_size > 1 is only supported on"),
    ({"mem-fraction-static": 0.01}, "oom_startup",
     "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.01"),
], ids=["refused", "no-room-for-the-kv-cache"])
def test_a_start_sglang_refuses_is_read_in_its_own_words(tmp_path: Path, change: dict, reason: str,
                                                         said: str) -> None:
    """Launched without the question to the host (a config the rules and the host would refuse first): a tree on
    pages of 16 tokens, which SGLang's intel_amx backend refuses while it resolves its arguments, and a
    --mem-fraction-static below the weights, which leaves the KV cache no room."""
    plan = make_plan(read_study_file(str(study_file(tmp_path, workload=SMALL, engine_args=CHAIN))))
    target = make_target(plan.target, cwd=tmp_path)
    argv = plan.engine.render(plan.spec.engine.command, {**plan.space.fixed, **change})
    try:
        with pytest.raises(TrialFailure) as failure:
            bring_up(lambda: target.deploy(argv, plan.spec.engine.env, tmp_path / "refused.log"), plan.engine,
                     plan.spec.health, plan.headers, None)
    finally:
        target.stop()
    assert failure.value.reason == reason
    assert said in failure.value.detail


def test_a_kv_pool_smaller_than_a_request_fails_its_requests_with_sglangs_400(tmp_path: Path) -> None:
    study = study_file(tmp_path, study={"launches": 1}, space=ONE, workload=SMALL,
                       engine_args={**CHAIN, "max-total-tokens": 16})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    trial = kept(status(study)["trials"])[0]
    assert (trial["reason"], trial["launched"]) == ("errors", True), trial
    assert re.search(r"Input length \(\d+ tokens\) exceeds the maximum allowed length", trial["detail"]), trial
    log = (tmp_path / "t-logs" / "trial-0000.log").read_text()
    assert "KV pool holds 16 tokens, fewer than --context-length 2048" in log
    assert ENGINE.fatal_lines(log.splitlines()) == []  # a warning of a healthy start, not a failure


def test_a_server_killed_while_measured_and_a_stale_one_on_the_port(tmp_path: Path) -> None:
    """An SGLang squatting on the port a study wants is named and left alone; on a port of its own, the study's
    first server is killed (its scheduler, SIGKILL) in the middle of its measurement: crashed_under_load, and the
    study goes on to its next config."""
    squatter = sglang_cpu.RealSGLang([], tmp_path)
    try:
        squatter.wait_ready()
        taken = study_file(tmp_path, name="taken", study={"launches": 1}, space=ONE, workload=SMALL,
                           engine_args=CHAIN, target={"kind": "local", "server_port": squatter.port})
        r = run_autotune("run", "--study", str(taken), cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        trial = status(taken)["trials"][0]
        assert trial["reason"] == "port_busy", trial
        assert f"port {squatter.port} on 127.0.0.1 is held by pid {squatter.proc.pid}" in trial["detail"]
        assert "sglang.launch_server" in trial["detail"]
        assert squatter.proc.poll() is None, "autotune killed a server it did not start"
    finally:
        squatter.kill()

    space = {"speculative-num-steps": {"type": "categorical", "choices": [1, 2]}}
    study = study_file(tmp_path, study={"launches": 2, "sampler": "grid"}, space=space,
                       workload={**SMALL, "requests": 6, "max_tokens": 48},
                       target={"kind": "local", "server_port": free_port()})
    run = start_run(study)
    try:
        scheduler = _scheduler_once_measuring(tmp_path / "t.log", run)
        os.kill(scheduler, signal.SIGKILL)
        out, err = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-3000:] + out[-3000:]
    trials = kept(status(study)["trials"])
    assert trials[0]["reason"] == "crashed_under_load" and trials[0]["launched"], trials[0]
    assert [t["state"] for t in trials[1:]] == ["COMPLETE"], trials


def _scheduler_once_measuring(log: Path, run) -> int:  # type: ignore[no-untyped-def]
    """The pid of the first trial's SGLang scheduler, once that trial is ready and its requests are flowing."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        if log.exists() and re.search(r"trial 0 ready in", log.read_text()):
            time.sleep(8)  # the warm-up request, then the single stream
            found = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_scheduler(int(p), run.pid)]
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.5)
    pytest.fail("trial 0 never became ready")


def _is_scheduler(pid: int, tuner: int) -> bool:
    """An SGLang scheduler process started under ``tuner`` (not another test's)."""
    try:
        if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sglang::scheduler"):
            return False
        for _ in range(4):
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if pid == tuner:
                return True
    except (OSError, ValueError, IndexError):
        pass
    return False
