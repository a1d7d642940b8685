"""The HTTP face of the emulator: SGLang 0.5.23's native endpoints on FastAPI (the OpenAI ones are in openai_api,
what both share in serving)."""
from __future__ import annotations

import asyncio
import datetime
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from autotune.sim import openai_api, tokens
from autotune.sim.scheduler import Request as GenRequest
from autotune.sim.serving import (
    BadRequest,
    InputTooLong,
    State,
    json_response,
    make_request,
    meta_info,
    sse,
    updates,
    wait_finished,
)

VERSION = "0.5.23"
# Endpoints SGLang marks ADMIN_OPTIONAL: --admin-api-key guards them when set, else --api-key.
ADMIN_PATHS = ("/flush_cache", "/freeze_gc", "/set_internal_state")


class ApiKeyMiddleware:
    """SGLang's --api-key check: Bearer token on every path except /health*, /ready*, /metrics* and OPTIONS."""

    def __init__(self, app, api_key: str | None, admin_api_key: str | None) -> None:
        self.app, self.api_key, self.admin_api_key = app, api_key, admin_api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await json_response({"error": "Unauthorized"}, 401)(scope, receive, send)

    def _allowed(self, scope) -> bool:
        path = scope["path"]
        if scope["method"] == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
            return True
        key = self.admin_api_key if path in ADMIN_PATHS and self.admin_api_key else self.api_key
        if not key:
            return True
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token, key)



#: server args /server_info lists but not in its internal_states (the launching process's own)
LAUNCHER_ONLY = ("custom_sigquit_handler",)


def server_info(state: State) -> dict[str, Any]:
    """/server_info: resolved server args, launch command, scheduler info, internal_states, version."""
    sched, plan = state.scheduler, state.plan
    # the scheduler's copy of the server args: the ones the launcher alone uses are not in it
    internal = {k: v for k, v in state.fields.items() if k not in LAUNCHER_ONLY}
    graphs = state.startup_time["graph_memory"]
    internal.update(
        world_size=state.fields["tp_size"] * state.fields["dp_size"],
        startup_time=state.startup_time["scheduler"],
        effective_max_running_requests_per_dp=plan.max_running_requests,
        last_gen_throughput=sched.last_gen_throughput,
        memory_usage=memory_usage(state),
        decode_cuda_graph_bs=[] if state.resolved.config.disable_cuda_graph else list(plan.capture_bs),
        decode_cuda_graph_memory_gb=round(sum(gb for phase, gb in graphs.items() if "prefill" not in phase), 3),
    )
    if sched.controller is not None:  # the live tier; the top level keeps the startup values
        internal.update(speculative_num_steps=sched.steps, speculative_num_draft_tokens=sched.steps + 1)
    accept = sched.avg_spec_accept_length
    if accept is not None:
        internal["avg_spec_accept_length"] = accept
    return {
        **state.fields,
        "launch_command": state.resolved.launch_command,
        "status": "ready",
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_req_input_len": state.max_req_input_len,
        "startup_time": state.startup_time["engine"],
        "hicache_object_layout": None,
        "kv_events": None,
        "internal_states": [internal],
        "version": VERSION,
        "frontend": "python",
    }


def loads(state: State) -> dict[str, Any]:
    """/v1/loads (entrypoints/v1_loads.py): the accelerator and one rank's load, its "core" fields (LoadSnapshot)."""
    sched, plan = state.scheduler, state.plan
    used, total = sched.used_tokens(), plan.max_total_num_tokens
    core = {
        "timestamp": time.time(), "dp_rank": 0, "num_running_reqs": len(sched.running),
        "num_waiting_reqs": len(sched.waiting), "num_waiting_uncached_tokens": 0, "num_used_tokens": used,
        "num_total_tokens": used, "num_active_tokens": used, "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": total, "max_running_requests": plan.max_running_requests,
        "token_usage": round(used / total, 4) if total else 0.0, "gen_throughput": sched.last_gen_throughput,
        "cache_hit_rate": 0.0, "utilization": round(len(sched.running) / max(1, plan.max_running_requests), 4),
        "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None,
        "memory": {"weight_gb": round(plan.weights_gb, 3), "kv_cache_gb": round(plan.kv_gb + plan.draft_kv_gb, 3),
                   "graph_gb": round(plan.graph_gb, 3), "token_capacity": total},
        "disaggregation": {"mode": state.fields["disaggregation_mode"], "prefill_bootstrap_queue_reqs": 0,
                           "prefill_inflight_queue_reqs": 0, "decode_prealloc_queue_reqs": 0,
                           "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                           "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0},
        "queues": {"waiting": len(sched.waiting), "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }
    return {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": VERSION,
        "accelerator": state.profile.hardware.gpu_name, "num_accelerators": state.fields["tp_size"], "loads": [core],
    }


def memory_usage(state: State) -> dict[str, Any]:
    plan = state.plan
    graph = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0)
    for phase, gb in state.startup_time["graph_memory"].items():
        graph[phase] = round(gb, 3)
    return {
        "weight": round(plan.weights_gb, 3),
        "kvcache": round(plan.kv_gb + plan.draft_kv_gb, 3),
        "startup_available": round(plan.available_gb, 3),
        "token_capacity": plan.max_total_num_tokens,
        "token_capacity_swa": None,
        "graph": graph,
    }


def model_info(state: State) -> dict[str, Any]:
    f, m = state.fields, state.profile.model
    return {
        "model_path": f["model_path"],
        "served_model_name": state.resolved.served_model_name,
        "tokenizer_path": f["tokenizer_path"] or f["model_path"],
        "is_generation": True,
        "preferred_sampling_params": f["preferred_sampling_params"],
        "weight_version": "default",
        "load_format": f["load_format"],
        "reasoning_parser": f["reasoning_parser"],
        "tool_call_parser": f["tool_call_parser"],
        "disaggregation_mode": f["disaggregation_mode"],
        "has_image_understanding": m.multimodal,
        "has_audio_understanding": False,
        "model_type": m.model_type,
        "architectures": [m.architecture],
        "embedding": EMBEDDING_OFF,
    }


#: /model_info's embedding section for a generation model (0.5.23): embeddings not served
EMBEDDING_OFF: dict[str, Any] = {
    "family": "none", "task": "none", "execution": "none", "attention": "none", "pooling": "model_defined",
    "normalize": False, "postprocessor": "none", "tokenizer_special_tokens": "model_default",
    "supports_dimensions": False, "supports_token_embeddings": False, "supports_multimodal": False,
    "requires_embedding_flag": False, "auto_enable_embedding": False, "bcg_eligibility": "disabled",
    "safe_disable_kv_cache": False, "safe_disable_radix_cache": False, "safe_disable_chunked_prefill": False,
    "enabled": False, "matryoshka_dimensions": [],
    "bcg": {"prefill_backend": "disabled", "enabled": False, "capture_token_budget": 4096, "capture_batch_sizes": []},
    "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False, "chunked_prefill_disabled": False},
}


def output(state: State, req: GenRequest, first: bool = False) -> dict[str, Any]:
    return {"text": req.text, "output_ids": list(req.output_ids), "meta_info": meta_info(state, req, first)}


def create_app(state: State) -> FastAPI:
    """The FastAPI application with SGLang's routes (and /metrics only with --enable-metrics)."""
    app = FastAPI(openapi_url=None)
    app.state.sim = state
    fields = state.fields
    if fields["api_key"] or fields["admin_api_key"]:
        app.add_middleware(ApiKeyMiddleware, api_key=fields["api_key"], admin_api_key=fields["admin_api_key"])
    _health_routes(app, state)
    _info_routes(app, state)
    _generate_routes(app, state)
    _admin_routes(app, state)
    _model_routes(app, state)
    if fields["enable_metrics"]:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
    openai_api.add_routes(app, state)
    return app


def _health_routes(app: FastAPI, state: State) -> None:
    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if state.status == "Up" else 503)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        # SGLang generates one token and answers once any scheduler output arrived (first check after 1 s).
        if state.status != "Up":
            return Response(status_code=503)
        await asyncio.sleep(1)
        return Response(status_code=200)


def _info_routes(app: FastAPI, state: State) -> None:
    def deprecated(old: str, new: str) -> None:
        state.launcher_log.warning(f"Endpoint '{old}' is deprecated and will be removed in a future version. Please "
                                   f"use '{new}' instead.")

    @app.get("/model_info")
    async def get_model_info() -> Response:
        return json_response(model_info(state))

    @app.get("/get_model_info")
    async def get_model_info_deprecated() -> Response:
        deprecated("/get_model_info", "/model_info")
        return json_response(model_info(state))

    @app.get("/server_info")
    async def get_server_info() -> Response:
        return json_response(server_info(state))

    @app.get("/get_server_info")
    async def get_server_info_deprecated() -> Response:
        deprecated("/get_server_info", "/server_info")
        return json_response(server_info(state))

    @app.get("/v1/loads")
    async def get_loads() -> Response:
        return json_response(loads(state))


def _generate_routes(app: FastAPI, state: State) -> None:
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return json_response({"error": {"message": "Invalid JSON body"}}, 400)
        if not isinstance(body, dict):
            return json_response({"error": "The request body must be a JSON object."}, 400)
        return await _generate(state, body, request)


def _admin_routes(app: FastAPI, state: State) -> None:
    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = 0.0) -> Response:
        sched = state.scheduler
        deadline = time.monotonic() + max(timeout, 0.0)
        while not sched.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if not sched.idle:
            state.scheduler_log.warning(
                f"Cache not flushed because there are pending requests. #queue-req: {len(sched.waiting)}, "
                f"#running-req: {len(sched.running)}"
            )
            message = "Timed out waiting for idle state." if timeout > 0 else "Flush cache failed.\n"
            return Response(message, status_code=400)
        sched.flush_prefix_cache()
        sched.reset_stats()
        state.scheduler_log.info("Cache flushed successfully!")
        return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                        "waiting requests, the operation will not be performed.)\n", status_code=200)

    @app.api_route("/freeze_gc", methods=["GET", "POST"])
    async def freeze_gc() -> Response:
        return Response("Garbage collection frozen.\n", status_code=200)


def _model_routes(app: FastAPI, state: State) -> None:
    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [model_card(state, state.resolved.served_model_name)]})

    @app.get("/v1/models/{name:path}")
    async def retrieve_model(name: str) -> Response:
        if name != state.resolved.served_model_name:
            return json_response({"error": {"message": f"The model '{name}' does not exist",
                                            "type": "invalid_request_error", "param": "model",
                                            "code": "model_not_found"}}, 404)
        return json_response(model_card(state, name))


def model_card(state: State, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": state.context_len}


async def _refused(state: State, e: InputTooLong) -> AsyncIterator[bytes]:
    """A /generate stream the scheduler refused: one event of a request that finished as it arrived, aborted."""
    now, clock = time.time(), time.monotonic()
    req = GenRequest(prompt_ids=[0], max_new_tokens=0, ignore_eos=False, temperature=0.0, stream=True, arrival=clock,
                     received_ts=now, finish_time=clock,
                     finish_reason={"type": "abort", "message": str(e), "status_code": 400,
                                    "err_type": "BadRequestError"})
    yield sse(output(state, req, first=True))
    yield b"data: [DONE]\n\n"


def prompt_ids_of(state: State, body: dict[str, Any]) -> list[int]:
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise BadRequest("input_ids must be a list of integers")
        return list(ids)
    text = body.get("text")
    if not isinstance(text, str):
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    return tokens.encode(text, state.profile.model.vocab_size)


async def _generate(state: State, body: dict[str, Any], request: Request) -> Response:
    params = body.get("sampling_params") or {}
    stream = bool(body.get("stream", False))
    if isinstance(body.get("text"), list) and not stream:
        outs = []
        for text in body["text"]:
            single = dict(body, text=text)
            result = await _generate(state, single, request)
            if result.status_code != 200:
                return result
            outs.append(json.loads(result.body))
        return json_response(outs)
    try:
        req = make_request(state, prompt_ids_of(state, body), params, stream,
                           log_metrics=body.get("log_metrics", True) is not False,
                           instruction=body["text"] if isinstance(body.get("text"), str) else "")
    except InputTooLong as e:
        if not stream:
            return json_response({"error": {"message": str(e)}}, 400)
        return StreamingResponse(_refused(state, e), media_type="text/event-stream")
    except BadRequest as e:
        state.launcher_log.error(f"[http_server] Error: {e}")
        return json_response({"error": {"message": str(e)}}, 400)
    state.scheduler.submit(req)
    if stream:
        async def chunks() -> AsyncIterator[bytes]:
            first = True
            async for r in updates(state, req):
                yield sse(output(state, r, first))
                first = False
            yield b"data: [DONE]\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")
    try:
        await wait_finished(state, req, request)
    except BadRequest as e:
        return json_response({"error": {"message": str(e)}}, 400)
    reason = req.finish_reason or {}
    if reason.get("type") == "abort" and reason.get("status_code"):
        return json_response({"object": "error", "message": reason["message"], "type": str(reason["status_code"]),
                              "param": None, "code": reason["status_code"]}, reason["status_code"])
    return json_response(output(state, req, True))
