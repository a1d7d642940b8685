"""Startup failures from the config and every --sim-fault, with SGLang's log lines and exit statuses."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.support.emulator import FAST, LLAMA, QWEN, port_open, sse_events

SCHEDULER_CRASH = "Scheduler hit an exception: Traceback (most recent call last):"
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
RUNNING_SIGQUIT = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."


def eagle(steps: int, topk: int, draft: int) -> list[str]:
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft)]


def stream_tokens(emu, max_new_tokens: int, read_timeout: float = 30) -> tuple[int, list]:
    """Stream one /generate; return the last completion_tokens seen and the events (until timeout or close)."""
    events: list = []
    try:
        with httpx.stream("POST", f"{emu.url}/generate", timeout=httpx.Timeout(read_timeout, connect=5), json={
                "text": "go", "stream": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
    except httpx.TransportError:  # read timeout, or the server died (possibly before accepting)
        pass
    seen = [e["meta_info"]["completion_tokens"] for e in events if isinstance(e, dict)]
    return (seen[-1] if seen else 0), events


@pytest.mark.parametrize("extra,message", [
    (["--max-total-tokens", "0"], "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                                  "Current value: mem_fraction_static=0.854"),
    (["--mem-fraction-static", "0.3"], "ValueError: Loaded weights leave no GPU memory for the KV cache under "
                                       "--mem-fraction-static=0.3."),
    (eagle(8, 8, 32), "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate"),
    (eagle(2, 2, 8), "Exception: Capture cuda graph failed: selected index k out of range"),
])
def test_startup_failures_kill_the_tree(emulator, extra, message):
    emu = emulator(*QWEN, *FAST, *extra)
    assert emu.wait_exit() == -9
    log = emu.log
    assert SCHEDULER_CRASH in log and message in log and LAUNCH_SIGQUIT in log
    assert "Uvicorn running" not in log and "fired up" not in log
    if "cuda graph" in message:
        assert "Possible solutions:\n1. set --mem-fraction-static to a smaller value" in log


def test_tree_out_of_range_with_one_step_dies_at_first_decode(emulator):
    emu = emulator(*QWEN, *FAST, *eagle(1, 2, 4))
    assert emu.wait_exit() == -9
    log = emu.log
    assert "Uvicorn running" in log and "fired up" not in log
    assert "RuntimeError: selected index k out of range" in log and RUNNING_SIGQUIT in log


def test_kv_capacity_reduces_running_requests(emulator):
    emu = emulator(*LLAMA, *FAST, "--max-running-requests", "48", "--max-total-tokens", "2048").wait_ready()
    assert ("max_running_requests was reduced from the requested 48 to 32 (per dp worker) due to the available KV "
            "cache capacity.") not in emu.log
    with emu.client() as c:
        state = c.get("/server_info").json()["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == 48
    small = emulator(*LLAMA, *FAST, "--max-running-requests", "48", "--max-total-tokens", "64").wait_ready()
    assert ("max_running_requests was reduced from the requested 48 to 32 (per dp worker) due to the available KV "
            "cache capacity.") in small.log
    assert "max_running_requests=32, context_len=131072" in small.log


def test_startup_crash(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "startup-crash")
    assert emu.wait_exit() == -9
    log = emu.log
    assert "Load weight end." in log and SCHEDULER_CRASH in log and LAUNCH_SIGQUIT in log
    assert "kill_process_tree called" in log and not port_open(emu.port)


def test_startup_hang_never_opens_the_port(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "startup-hang")
    emu.wait_log("Load weight begin")
    time.sleep(1.5)
    assert emu.proc.poll() is None and not port_open(emu.port)
    assert "Load weight end" not in emu.log


def test_warmup_hang_keeps_health_503(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "warmup-hang")
    emu.wait_log("Uvicorn running")
    time.sleep(0.5)
    with emu.client() as c:
        assert c.get("/health").status_code == 503
        assert c.get("/health_generate").status_code == 503
        assert c.get("/ready").status_code == 503
        assert c.get("/model_info").status_code == 200
    assert "fired up" not in emu.log


def test_slow_start_keeps_the_port_closed_while_loading(emulator):
    tic = time.monotonic()
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "slow-start:1.5")
    emu.wait_log("Load weight begin")
    assert not port_open(emu.port)
    with httpx.Client() as c, pytest.raises(httpx.ConnectError):
        c.get(f"{emu.url}/health")
    emu.wait_ready()
    assert time.monotonic() - tic >= 1.5


def test_crash_after_tokens(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "crash-after:150").wait_ready()
    seen, events = stream_tokens(emu, 1000)
    assert emu.wait_exit() == -9
    assert seen < 1000 and "[DONE]" not in events
    log = emu.log
    assert SCHEDULER_CRASH in log and "CUDA error: an illegal memory access was encountered" in log
    assert RUNNING_SIGQUIT in log


def test_oom_under_load(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "oom-under-load:2").wait_ready()
    with emu.client() as c:
        assert c.post("/generate", json={"text": "one", "sampling_params": {"max_new_tokens": 20}}).status_code == 200
    threads = [threading.Thread(target=stream_tokens, args=(emu, 2000, 10)) for _ in range(4)]
    for t in threads:
        t.start()
    assert emu.wait_exit() == -9
    for t in threads:
        t.join()
    log = emu.log
    assert SCHEDULER_CRASH in log
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log and RUNNING_SIGQUIT in log


def test_stall_after_tokens(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "stall-after:120").wait_ready()
    seen, events = stream_tokens(emu, 1000, read_timeout=1.5)
    assert 0 < seen < 1000 and "[DONE]" not in events
    second, _ = stream_tokens(emu, 10, read_timeout=1.0)
    assert second == 0
    assert emu.proc.poll() is None
    with emu.client() as c:
        assert c.get("/health").status_code == 200


def test_errors_fail_requests_like_an_internal_error(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "errors:1.0").wait_ready()
    with emu.client() as c:
        failed = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 50}})
        _, events = stream_tokens(emu, 50)
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 20})
        with c.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 20, "stream": True}) as r:
            openai_events = sse_events(r)
        assert c.get("/health").status_code == 200
    assert failed.status_code == 500
    body = failed.json()
    assert body["object"] == "error" and body["code"] == 500 and body["type"] == "500"
    assert events[-1] == "[DONE]"
    reason = events[-2]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 500 and reason["err_type"] == "InternalServerError"
    assert chat.status_code == 500
    assert openai_events[-1] == "[DONE]"
    assert openai_events[-2]["error"]["code"] == 500 and openai_events[-2]["error"]["type"] == "INTERNAL_SERVER_ERROR"


def test_errors_fraction_fails_about_that_share(emulator):
    emu = emulator(*LLAMA, *FAST, "--sim-fault", "errors:0.5").wait_ready()
    with emu.client() as c:
        codes = [c.post("/generate", json={"text": f"q{i}", "sampling_params": {"max_new_tokens": 4}}).status_code
                 for i in range(40)]
    assert set(codes) == {200, 500}
    assert 8 <= codes.count(500) <= 32
