"""Endpoints, shapes, status codes and log lines of a running emulator, over real HTTP."""
from __future__ import annotations

import itertools
import re
import threading
import time

import httpx

from tests.support.emulator import sse_events


def generate(client: httpx.Client, max_new_tokens: int, text: str = "Explain speculative decoding.", **params):
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                              "ignore_eos": True, **params}}
    return client.post("/generate", json=body)


def test_startup_log_lines(qwen_server):
    log = qwen_server.log
    assert "Max running requests is reset to 48 for speculative decoding." in log
    assert ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
            in log)
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=\{'model_path': ", log, re.MULTILINE)
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin\. avail mem=\d+\.\d\d GB$", log,
                     re.MULTILINE)
    assert "Load weight end. elapsed=" in log and "type=Qwen3_5MoeForConditionalGeneration, quant=fp8" in log
    assert "KV Cache is allocated. dtype: torch.bfloat16, #tokens: " in log
    assert "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=3" in log
    assert "Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 21]" in log
    assert "max_running_requests is capped to 21 by the mamba state cache" in log
    assert re.search(r"TP0\] max_total_num_tokens=\d+, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                     r"max_running_requests=21, context_len=262144, available_gpu_mem=\d+\.\d\d GB", log)
    # the port opens only after loading, and "fired up" comes after the warm-up request
    order = [log.index(s) for s in ("Load weight end", "KV Cache is allocated", "Capture draft extend CUDA graph end",
                                    "max_total_num_tokens=", "Uvicorn running on", "The server is fired up")]
    assert order == sorted(order)
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in qwen_server.out  # multimodal warm-up


def test_models_and_model_info(qwen_server):
    with qwen_server.client() as c:
        models = c.get("/v1/models").json()
        assert models["object"] == "list"
        card = models["data"][0]
        assert card == {**card, "id": "qwen3.5-122b", "object": "model", "owned_by": "sglang",
                        "root": "qwen3.5-122b", "parent": None, "max_model_len": 262144}
        info = c.get("/model_info").json()
        assert info["model_path"] == "/shared/models/Qwen3.5-122B-A10B"
        assert info["served_model_name"] == "qwen3.5-122b" and info["is_generation"] is True
        assert info["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
        assert c.get("/get_model_info").json() == info
    qwen_server.wait_log("Endpoint '/get_model_info' is deprecated")


def test_server_info_resolved_args_and_internal_state(qwen_server):
    with qwen_server.client() as c:
        info = c.get("/server_info").json()
        assert c.get("/get_server_info").status_code == 200
    assert info["version"] == "0.5.23" and info["status"] == "ready"
    assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == ("EAGLE", 2, 1, 3)
    assert info["max_running_requests"] == 48  # the resolved argument; the effective one is per DP below
    assert info["tp_size"] == 4 and info["port"] == qwen_server.port and info["mem_fraction_static"] == 0.863
    assert info["served_model_name"] == "qwen3.5-122b"
    assert "--speculative-num-draft-tokens 5" in info["launch_command"]
    assert info["max_total_num_tokens"] > 100000 and info["max_req_input_len"] == 262144 - 1 - 5
    assert set(info["startup_time"]) >= {"load_weight", "kv_cache_allocation", "cuda_graph", "tokenizer_e2e"}
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == 21
    assert set(state["memory_usage"]) >= {"weight", "kvcache", "token_capacity", "graph"}
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert state["memory_usage"]["graph"]["target_verify"] > 0
    assert "last_gen_throughput" in state


def test_generate_non_streaming_meta_info(qwen_server):
    with qwen_server.client() as c:
        out = generate(c, 48).json()
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 48 == len(out["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 48}
    assert meta["prompt_tokens"] == 7  # tokens ("Explai|n specul|ative decodi|ng ."), not characters
    assert meta["cached_tokens"] >= 0 and meta["e2e_latency"] > 0
    assert meta["spec_verify_ct"] > 0
    assert abs(meta["spec_accept_length"] - 48 / meta["spec_verify_ct"]) < 1e-9
    assert 0 < meta["spec_accept_rate"] <= 1
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 2
    assert len(out["text"].split()) >= 30


def test_generate_streaming_is_cumulative_then_done(qwen_server):
    with qwen_server.client() as c, c.stream("POST", "/generate", json={
            "input_ids": [1, 2, 3, 4], "stream": True,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) > 3
    for before, after in itertools.pairwise(chunks):
        assert after["text"].startswith(before["text"])
        assert after["meta_info"]["completion_tokens"] > before["meta_info"]["completion_tokens"]
    assert all(ch["meta_info"]["finish_reason"] is None for ch in chunks[:-1])
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"]["type"] == "length" and last["completion_tokens"] == 40
    assert last["prompt_tokens"] == 4 and "spec_verify_ct" in last


def test_eos_stops_early_unless_ignored(qwen_server):
    with qwen_server.client() as c:
        outs = [generate(c, 3000, text=f"Write essay {i}", ignore_eos=False).json()["meta_info"] for i in range(4)]
        full = generate(c, 300, text="Write essay 0", ignore_eos=True).json()["meta_info"]
    stopped = [m for m in outs if m["finish_reason"]["type"] == "stop"]
    assert stopped and all(m["finish_reason"]["matched"] == 248046 and m["completion_tokens"] < 3000
                           for m in stopped)
    assert full["completion_tokens"] == 300


def test_openai_completions_and_chat(qwen_server):
    with qwen_server.client() as c:
        comp = c.post("/v1/completions", json={"model": "qwen3.5-122b", "prompt": "Once upon a time",
                                               "max_tokens": 12, "temperature": 0, "ignore_eos": True}).json()
        assert comp["object"] == "text_completion" and comp["choices"][0]["finish_reason"] == "length"
        assert comp["usage"]["completion_tokens"] == 12 and comp["usage"]["prompt_tokens"] == 4
        with c.stream("POST", "/v1/chat/completions", json={
                "model": "qwen3.5-122b", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 20,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}) as r:
            events = sse_events(r)
        with c.stream("POST", "/v1/completions", json={
                "model": "m", "prompt": "abc", "max_tokens": 9, "stream": True, "ignore_eos": True}) as r:
            plain = sse_events(r)
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 7, "ignore_eos": True}).json()
        wrong_type = c.post("/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"})
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 20
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 20
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2])
    assert len(text.split()) >= 10
    assert plain[-1] == "[DONE]" and plain[-2]["choices"][0]["finish_reason"] == "length"
    assert all("usage" in e and e["usage"] is None for e in plain[:-1])  # no usage chunk without include_usage
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 7
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert wrong_type.status_code == 400


def test_decode_log_lines_metrics_and_accept_length(qwen_server):
    with qwen_server.client() as c:
        generate(c, 200)
        log = qwen_server.wait_log("Decode batch")
        line = next(ln for ln in log.splitlines() if "Decode batch" in ln)
        assert re.search(r"TP0\] Decode batch, #running-req: \d+, #full token: \d+, full token usage: \d\.\d\d, "
                         r"mamba num: \d+, mamba usage: \d\.\d\d, accept len: \d\.\d\d, accept rate: \d\.\d\d, "
                         r"cuda graph: True, gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$", line), line
        state = c.get("/server_info").json()["internal_states"][0]
        assert 1.5 < state["avg_spec_accept_length"] < 3.0
        assert state["last_gen_throughput"] > 0
        metrics = c.get("/metrics").text
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                     "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:max_total_num_tokens",
                     "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                     "sglang:e2e_request_latency_seconds_count", "sglang:generation_tokens_total"):
            assert name in metrics, name
        assert 'model_name="qwen3.5-122b"' in metrics
        # /flush_cache while idle: 200 and the accept-length counters are reset
        flushed = c.post("/flush_cache")
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
        assert "avg_spec_accept_length" not in c.get("/server_info").json()["internal_states"][0]


def test_flush_cache_refused_while_busy(qwen_server):
    with qwen_server.client() as c:
        worker = threading.Thread(target=generate, args=(qwen_server.client(), 3000))
        worker.start()
        time.sleep(0.3)
        busy = c.get("/flush_cache")
        worker.join()
        idle = c.get("/flush_cache")
    assert busy.status_code == 400
    assert idle.status_code == 200
    assert "Cache not flushed because there are pending requests. #queue-req: 0, #running-req: 1" in qwen_server.log


def test_health_and_ready(qwen_server):
    with qwen_server.client() as c:
        assert c.get("/ready").status_code == 200
        tic = time.monotonic()
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        assert time.monotonic() - tic >= 2.0  # SGLang waits for a generated token (first check after 1 s)


def test_api_key_metrics_off_and_plain_decoding(llama_server):
    with llama_server.client() as c:
        denied = c.get("/v1/models")
        assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
        assert c.post("/generate", json={"text": "x"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/ready").status_code == 200  # health/ready/metrics paths are exempt
        assert c.get("/metrics").status_code == 404  # no --enable-metrics
        auth = {"Authorization": "Bearer sekret"}
        assert c.get("/v1/models", headers=auth).json()["data"][0]["max_model_len"] == 131072
        info = c.get("/server_info", headers=auth).json()
        out = c.post("/generate", headers=auth, json={
            "text": "hello", "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}}).json()
    assert info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]
    assert "spec_verify_ct" not in out["meta_info"] and out["meta_info"]["completion_tokens"] == 60
    assert "max_running_requests was reduced" not in llama_server.log
    log = llama_server.wait_log("Decode batch")
    line = next(ln for ln in log.splitlines() if "Decode batch" in ln)
    assert re.search(r"\] Decode batch, #running-req: \d+, #token: \d+, token usage: \d\.\d\d, cuda graph: True, "
                     r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$", line), line
    assert " TP0]" not in log  # tp 1: SGLang adds no rank prefix


def test_loads_endpoint_as_in_0_5_23(qwen_server):
    """/v1/loads counts the requests the server holds; 0.5.23 has no /get_load."""
    with qwen_server.client() as c:
        assert c.get("/get_load").status_code == 404
        idle = c.get("/v1/loads").json()
        assert idle["accelerator"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and idle["num_accelerators"] == 4
        assert idle["loads"][0]["num_running_reqs"] == 0 and idle["loads"][0]["max_total_num_tokens"] > 0
        thread = threading.Thread(target=generate, args=(c, 400))
        thread.start()
        deadline = time.monotonic() + 30
        busy = idle
        while busy["loads"][0]["num_running_reqs"] == 0 and time.monotonic() < deadline:
            busy = c.get("/v1/loads").json()
        thread.join()
    assert busy["loads"][0]["num_running_reqs"] == 1 and busy["loads"][0]["num_used_tokens"] > 0
