"""What the emulator's route sets share: the server's state, JSON and SSE framing, turning a request body into a
scheduler request (with SGLang's length checks), and waiting for or streaming its outputs."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from autotune.sim import model
from autotune.sim.args import Resolved, SimOptions
from autotune.sim.metrics import Metrics
from autotune.sim.profile import Profile
from autotune.sim.scheduler import Request as GenRequest
from autotune.sim.scheduler import Scheduler
from autotune.sim.traffic import category_of

DEFAULT_MAX_NEW_TOKENS = 128
# SGLang re-checks a waiting non-streaming request for a client disconnect at this interval.
DISCONNECT_POLL_S = 4.0
# SGLang streams one chunk per decode step. Under --sim-speedup steps come faster than a Python HTTP stack (and
# its client) can frame them, so streams then coalesce steps: each sends at most one chunk per 2 ms, and all
# streams together about CHUNK_RATE_BUDGET chunks per second. Token counts stay exact and a request's last chunk
# is sent as soon as it finishes, so request times stay exact too.
MIN_CHUNK_INTERVAL_S = 0.002
CHUNK_RATE_BUDGET = 2000.0


@dataclasses.dataclass
class State:
    """Everything the endpoints need; ``status`` moves from Starting to Up after warm-up."""

    resolved: Resolved
    profile: Profile
    sim: SimOptions
    plan: model.MemoryPlan
    scheduler: Scheduler
    metrics: Metrics
    launcher_log: logging.Logger
    scheduler_log: logging.Logger
    startup_time: dict[str, Any]
    status: str = "Starting"
    open_streams: int = 0

    @property
    def fields(self) -> dict[str, Any]:
        return self.resolved.fields

    @property
    def context_len(self) -> int:
        return self.fields["context_length"] or self.profile.model.context_length

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_len - 1, self.plan.max_total_num_tokens - 1) - 5


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(json.dumps(content, separators=(",", ":")), status_code=status_code,
                    media_type="application/json")


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class BadRequest(ValueError):
    """A request SGLang's tokenizer manager rejects with HTTP 400."""


class InputTooLong(BadRequest):
    """A prompt the KV pool cannot hold (SGLang's scheduler refuses it, validate_input_length): a 400 where the
    answer is one JSON body, an error in the stream where it streams."""


def make_request(state: State, prompt_ids: list[int], params: dict[str, Any], stream: bool,
                 log_metrics: bool = True, instruction: str = "", chat: bool = False) -> GenRequest:
    """Validate lengths like SGLang's tokenizer manager and build a scheduler request; ``instruction`` (the last
    user turn, or the raw prompt) tells what it asks for, ``chat`` whether a chat template wraps it."""
    ctx = state.context_len
    if len(prompt_ids) >= ctx:
        raise BadRequest(f"The input ({len(prompt_ids)} tokens) is longer than the model's context length "
                         f"({ctx} tokens).")
    max_new = params.get("max_new_tokens")
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if not isinstance(max_new, int) or max_new < 0:
        raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
    if max_new + len(prompt_ids) > ctx:
        total = max_new + len(prompt_ids)
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a "
            f"total of {total} tokens: {len(prompt_ids)} tokens from the input messages and {max_new} tokens for "
            "the completion. Please reduce the number of tokens in the input messages or the completion to fit "
            "within the limit."
        )
    if len(prompt_ids) >= state.max_req_input_len:  # the scheduler's check, after the tokenizer manager's
        raise InputTooLong(f"Input length ({len(prompt_ids)} tokens) exceeds the maximum allowed length "
                           f"({state.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate.")
    temperature = params.get("temperature", 1.0)
    return GenRequest(
        prompt_ids=prompt_ids or [0],
        max_new_tokens=max_new,
        ignore_eos=bool(params.get("ignore_eos", False)),
        temperature=float(temperature if temperature is not None else 1.0),
        stream=stream,
        log_metrics=log_metrics,
        category=category_of(instruction),
        chat=chat,
    )


async def wait_finished(state: State, req: GenRequest, request: Request | None) -> None:
    """Wait for ``req`` to finish; abort it if the HTTP client goes away meanwhile."""
    while not req.finished:
        req.event.clear()
        try:
            await asyncio.wait_for(req.event.wait(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if request is not None and await request.is_disconnected():
                state.scheduler.abort(req)
                raise BadRequest(f"Request is disconnected from the client side (type 1). Abort request "
                                 f"obj.rid='{req.rid}'") from None


async def updates(state: State, req: GenRequest) -> AsyncIterator[GenRequest]:
    """Yield ``req`` after each scheduler output (coalesced if the consumer is slower), until it finishes.

    The request is aborted if the consumer stops early (client disconnect)."""
    state.open_streams += 1
    try:
        while True:
            await req.event.wait()
            req.event.clear()
            yield req
            if req.finished:
                return
            if state.sim.speedup > 1:
                # pace the chunks, but never hold the last one: a finished request is answered at once
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(req.done.wait(),
                                           max(MIN_CHUNK_INTERVAL_S, state.open_streams / CHUNK_RATE_BUDGET))
    finally:
        state.open_streams -= 1
        if not req.finished:
            state.scheduler.abort(req)


def meta_info(state: State, req: GenRequest, first: bool) -> dict[str, Any]:
    """SGLang's meta_info for one output of ``req``, its keys in SGLang's order (the timing and speculative ones once
    it finished; the time it was sent on the first output and the last)."""
    def epoch(moment: float) -> float:
        return req.received_ts + (moment - req.arrival)

    prefilled = epoch(req.first_token_time or req.arrival)
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": req.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "forward_entry_time": req.received_ts,
        "prefill_finished_time": prefilled,
        "queue_time": 0.0,
        "reasoning_tokens": 0,
        "completion_tokens": req.completion_tokens,
        "cached_tokens": req.cached_tokens,
    }
    if req.finished:
        meta["weight_versions"] = [{"version": "default", "start": 0, "end": req.completion_tokens}]
    meta["cached_tokens_details"] = {"device": req.cached_tokens, "host": 0} if req.cached_tokens else None
    meta["dp_rank"] = None
    if req.finished:
        meta["e2e_latency"] = req.finish_time - req.arrival
        spec = state.resolved.config.spec
        if spec is not None and req.verify_ct > 0:
            # the startup draft tokens, even when an adaptive server switched tiers (SGLang's tokenizer manager)
            proposed = req.verify_ct * (spec.draft - 1)
            meta["spec_accept_rate"] = req.correct_drafts / proposed if proposed else 0.0
            meta["spec_accept_length"] = req.completion_tokens / req.verify_ct
            meta["spec_num_correct_drafts"] = req.correct_drafts
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = req.verify_ct
            meta["spec_correct_drafts_histogram"] = list(req.correct_histogram)
        decode_s = req.finish_time - (req.first_token_time or req.arrival)
        meta.update(request_received_ts=req.received_ts,
                    first_token_latency=(req.first_token_time or req.finish_time) - req.arrival,
                    api_server_dispatch_finish_ts=req.received_ts)
    if first or req.finished:
        meta["response_sent_to_client_ts"] = prefilled if first else time.time()
    if req.finished:
        meta["request_finished_ts"] = epoch(req.finish_time)
        if req.first_token_time:  # it decoded (a request refused as it arrived did not)
            meta["decode_throughput"] = (req.completion_tokens - 1) / decode_s if decode_s > 0 else 0.0
    return meta
