"""An adaptive emulator as a process: SGLang's errors and exit statuses for bad schedules, the fallback warning,
the controller's moves and routing switches in its log, the live step in /server_info and /metrics, and a
schedule that does not fit dying like a fixed config that does not."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.emulator import FAST, LLAMA, QWEN

DATA = Path(__file__).parent / "data"
CROSSOVER = ["--model-path", "/models/Llama-3.1-8B-Instruct", "--sim-profile", str(DATA / "crossover.toml")]
LOWACCEPT = ["--model-path", "/models/Llama-3.1-8B-Instruct", "--sim-profile", str(DATA / "lowaccept.toml")]
ADAPTIVE = ["--speculative-algorithm", "EAGLE", "--speculative-adaptive"]
SCHEDULER_CRASH = "Scheduler hit an exception: Traceback (most recent call last):"
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def write(tmp_path: Path, content) -> str:
    path = tmp_path / "adaptive.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune.sim", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def generate(url: str, text: str, max_new_tokens: int) -> dict:
    r = httpx.post(f"{url}/generate", timeout=60, json={
        "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def live(url: str) -> tuple[dict, dict]:
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    return info, info["internal_states"][0]


@pytest.mark.parametrize("content,last_line,code", [
    ({"candidate_steps": [1, 3, 7]},
     "ValueError: speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
     "{\"1\": {\"candidate_steps\": [1,3,7]}}. Got keys: ['candidate_steps']", "raise ValueError("),
    ({"1": {"candidate_steps": [1, 3]}, "16": {"candidate_steps": [0, -1]}},
     "ValueError: BS 16: candidate_steps must be a list of non-negative ints, got [0, -1]", "raise ValueError("),
    (None, "FileNotFoundError: [Errno 2] No such file or directory: '{path}'", "with open(cfg_path) as f:"),
])
def test_an_invalid_schedule_is_refused_at_startup_with_exit_1(tmp_path, content, last_line, code):
    path = write(tmp_path, content) if content is not None else str(tmp_path / "missing.json")
    proc = run(*LLAMA, *ADAPTIVE, "--speculative-adaptive-config", path)
    assert proc.returncode == 1
    err = proc.stderr.rstrip()
    assert err.endswith("\n" + last_line.replace("{path}", path))
    assert "Traceback (most recent call last):" in err
    assert 'sglang/srt/speculative/adaptive_spec_params.py", line 104, in _load_adaptive_config\n    ' + code in err
    assert "Load weight begin" not in err and "server_args=" not in err


def test_steps_outside_the_schedule_are_refused_with_exit_1(tmp_path):
    path = write(tmp_path, {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}})
    proc = run(*LLAMA, *ADAPTIVE, "--speculative-adaptive-config", path, "--speculative-num-steps", "2")
    assert proc.returncode == 1
    assert proc.stderr.rstrip().endswith(
        "\n    raise ValueError(\nValueError: --speculative-num-steps=2 is not in the adaptive config candidate_steps "
        "[0, 1, 3]. Pass one of those values.")


def test_topk_above_one_falls_back_to_the_static_tree(emulator):
    emu = emulator(*LLAMA, *FAST, *ADAPTIVE, "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                   "--speculative-num-draft-tokens", "6").wait_ready()
    assert ("speculative_adaptive disabled: speculative_eagle_topk=2 (only topk=1 is supported). Falling back to "
            "static speculative params.") in emu.log
    assert "AdaptiveSpeculativeParams" not in emu.log and "Built adaptive runtime state" not in emu.log
    info, state = live(emu.url)
    assert info["speculative_adaptive"] is False
    assert (state["speculative_num_steps"], state["speculative_eagle_topk"], state["speculative_num_draft_tokens"]) \
        == (3, 2, 6)


@pytest.mark.parametrize("profile,moved", [(CROSSOVER, (3, 7)), (LOWACCEPT, (3, 1))])
def test_the_controller_walks_by_acceptance_and_server_info_shows_the_live_step(emulator, tmp_path, profile, moved):
    path = write(tmp_path, {"1": {"candidate_steps": [1, 3, 7], "down_hysteresis": 0.0},
                            "ema_alpha": 0.5, "warmup_batches": 2, "update_interval": 2})
    emu = emulator(*profile, *FAST, *ADAPTIVE, "--speculative-adaptive-config", path, "--enable-metrics",
                   "--decode-log-interval", "1").wait_ready()
    log = emu.log
    assert "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 7]" in log
    for steps in (1, 7):
        assert f"Built adaptive runtime state steps={steps}: elapsed=" in log
    assert log.index("Built adaptive runtime state steps=1") < log.index("Built adaptive runtime state steps=7") \
        < log.index("fired up")
    before, _ = live(emu.url)
    meta = generate(emu.url, "tell me a long story", 300)
    old, new = moved
    log = emu.wait_log(f"Switch adaptive runtime state: steps {old} -> {new}, draft_tokens {old + 1} -> {new + 1}")
    update = f"Adaptive spec params updated: steps {old} -> {new} (ema_accept_len="
    assert update in log and log.index(update) < log.index("Switch adaptive runtime state")
    info, state = live(emu.url)
    assert (state["speculative_num_steps"], state["speculative_num_draft_tokens"]) == (new, new + 1)
    # the top level comes from the tokenizer process: the startup values
    assert (info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (3, 4) == \
        (before["speculative_num_steps"], before["speculative_num_draft_tokens"])
    accept = state["avg_spec_accept_length"]
    assert (accept > 4.5) if new == 7 else (1.0 < accept < 1.6)
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    metrics = httpx.get(f"{emu.url}/metrics", timeout=10).text
    gauges = {line.partition("{")[0]: float(line.rpartition(" ")[2]) for line in metrics.splitlines()
              if line.startswith(("sglang:spec_num_steps{", "sglang:spec_num_draft_tokens{"))}
    assert gauges == {"sglang:spec_num_steps": new, "sglang:spec_num_draft_tokens": new + 1}


def test_each_batch_size_switches_to_its_slots_step(emulator, tmp_path):
    path = write(tmp_path, {"1": {"candidate_steps": [7]}, "2": {"candidate_steps": [3]}})
    # at speedup 2 the two requests (about 0.3 s and 1 s) surely overlap, however busy the machine
    emu = emulator(*CROSSOVER, "--sim-time-scale", "0.01", "--sim-speedup", "2", *ADAPTIVE,
                   "--speculative-adaptive-config", path).wait_ready()
    assert "AdaptiveSpeculativeParams initialized: steps=7, candidate_steps=[7]" in emu.log
    short = threading.Thread(target=generate, args=(emu.url, "a short one", 300))
    short.start()
    generate(emu.url, "and a long one", 1000)
    short.join()
    log = emu.log
    down = "Switch adaptive runtime state: steps 7 -> 3, draft_tokens 8 -> 4"
    up = "Switch adaptive runtime state: steps 3 -> 7, draft_tokens 4 -> 8"
    assert down in log and up in log and log.index(down) < log.rindex(up)
    assert "Adaptive spec params updated" not in log  # one candidate per slot: routing alone moves the step
    _, state = live(emu.url)
    assert state["speculative_num_steps"] == 7


def test_steps_zero_is_a_plain_decode(emulator, tmp_path):
    path = write(tmp_path, {"1": {"candidate_steps": [0]}})
    emu = emulator(*CROSSOVER, *FAST, *ADAPTIVE, "--speculative-adaptive-config", path,
                   "--decode-log-interval", "1").wait_ready()
    meta = generate(emu.url, "plain", 50)
    assert meta["spec_verify_ct"] == 49  # the first token comes from the prefill, then one per one-node verify
    assert meta["spec_num_correct_drafts"] == 0
    _, state = live(emu.url)
    assert (state["speculative_num_steps"], state["speculative_num_draft_tokens"]) == (0, 1)
    assert state["avg_spec_accept_length"] == 1.0


def test_a_schedule_too_large_for_the_host_dies_like_a_fixed_config_that_is(emulator, tmp_path):
    path = write(tmp_path, {"1": {"candidate_steps": [1, 80, 100, 120]}})
    emu = emulator(*LLAMA, *FAST, *ADAPTIVE, "--speculative-adaptive-config", path, "--speculative-num-steps", "1")
    assert emu.wait_exit() == -9
    log = emu.log
    assert "Built adaptive runtime state steps=80: elapsed=" in log
    assert "Built adaptive runtime state steps=100" not in log
    assert SCHEDULER_CRASH in log and LAUNCH_SIGQUIT in log
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in log
    assert "Possible solutions:\n1. set --mem-fraction-static to a smaller value" in log
    assert "in build_adaptive_runtime_state\n    target_graph_runner = TargetGraphRunnerCls(" in log
    assert "Uvicorn running" not in log and "fired up" not in log
    # the widest of its steps alone starts
    fixed = emulator(*LLAMA, *FAST, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "120",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "121").wait_ready()
    assert "fired up" in fixed.log


def test_the_default_schedule_costs_a_hybrid_model_running_requests(emulator):
    adaptive = emulator(*QWEN, *FAST, *ADAPTIVE).wait_ready()
    fixed = emulator(*QWEN, *FAST, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4").wait_ready()
    _, a = live(adaptive.url)
    _, f = live(fixed.url)
    # both start on steps 3, but the adaptive server's state pool holds 8 draft tokens per request (steps 7)
    assert a["speculative_num_steps"] == f["speculative_num_steps"] == 3
    assert a["effective_max_running_requests_per_dp"] == 11 < f["effective_max_running_requests_per_dp"] == 17
