"""SGLang's OpenAI-compatible routes: /v1/completions and /v1/chat/completions, streaming and not."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from autotune.sim import tokens
from autotune.sim.scheduler import Request as GenRequest
from autotune.sim.serving import (
    BadRequest,
    InputTooLong,
    State,
    json_response,
    make_request,
    meta_info,
    updates,
    wait_finished,
)

# Tokens a chat template adds around each message and before the assistant's answer.
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_REPLY = 3
IMAGE_TOKENS = 256


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def usage(req: GenRequest, drop_none: bool) -> dict[str, Any]:
    body = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.completion_tokens,
            "completion_tokens": req.completion_tokens, "prompt_tokens_details": None, "reasoning_tokens": 0,
            "completion_tokens_details": None}
    return {k: v for k, v in body.items() if v is not None} if drop_none else body


def chat_prompt(state: State, messages: Any) -> list[int]:
    """Token ids of the messages under a generic chat template (text parts counted, images as fixed tokens)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    vocab = state.profile.model.vocab_size
    ids: list[int] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        ids += [1] * TEMPLATE_TOKENS_PER_MESSAGE
        content = message.get("content") or ""
        parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "text":
                ids += tokens.encode(str(part.get("text", "")), vocab)
            elif isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                ids += [3] * IMAGE_TOKENS
    return ids + [1] * TEMPLATE_TOKENS_REPLY


def last_user_text(messages: list[Any]) -> str:
    """The text of the last user message (the instruction the answer follows)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content") or ""
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content)
    return ""


def completion_prompt(state: State, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return list(prompt)
    if isinstance(prompt, str):
        return tokens.encode(prompt, state.profile.model.vocab_size)
    raise BadRequest("prompt must be a string, a list of token ids or a one-element list")


def sampling(body: dict[str, Any], default_max: int | None, prompt_len: int, state: State) -> dict[str, Any]:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max if default_max is not None else max(state.context_len - prompt_len, 0)
    return {"max_new_tokens": max_tokens, "temperature": body.get("temperature", 1.0),
            "ignore_eos": body.get("ignore_eos", False)}


def spec_tokens_details(state: State, req: GenRequest) -> dict[str, Any] | None:
    """The request's speculative figures as SGLang's ``sglext.spec_tokens_details`` (None: it was not verified)."""
    meta = meta_info(state, req, first=False)
    if "spec_verify_ct" not in meta:
        return None
    return {"spec_accept_rate": meta["spec_accept_rate"], "spec_accept_length": meta["spec_accept_length"],
            "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": meta["spec_num_correct_drafts"],
            "spec_num_proposed_drafts": meta["spec_num_proposed_drafts"], "spec_verify_ct": meta["spec_verify_ct"],
            "spec_correct_drafts_histogram": meta["spec_correct_drafts_histogram"], "spec_cap_lens_histogram": []}


def add_routes(app: FastAPI, state: State) -> None:
    """Register the OpenAI routes on ``app``."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(state, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(state, request, chat=True)


async def _serve(state: State, request: Request, chat: bool) -> Response:
    media = request.headers.get("content-type", "").lower().split(";", 1)[0]
    if media != "application/json":
        message = ("1 validation error:\n  {'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: "
                   "Only 'application/json' is allowed\", 'type': 'value_error'}")
        return json_response(error_body(message, HTTPStatus.BAD_REQUEST.phrase), 400)
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if int(body.get("n", 1) or 1) != 1:
            raise BadRequest("autotune.sim serves n=1 only")
        ids = chat_prompt(state, body.get("messages")) if chat else completion_prompt(state, body.get("prompt"))
        params = sampling(body, None if chat else 16, len(ids), state)
        stream = bool(body.get("stream", False))
        instruction = last_user_text(body.get("messages")) if chat else str(body.get("prompt"))
        req = make_request(state, ids, params, stream, instruction=instruction, chat=chat)
    except InputTooLong as e:
        if not body.get("stream"):
            return json_response(error_body(str(e)), 400)
        name = body.get("model") or state.resolved.served_model_name
        usage_asked = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_refused(e, uuid.uuid4().hex, name, chat, usage_asked),
                                 media_type="text/event-stream")
    except (BadRequest, ValueError) as e:
        return json_response(error_body(str(e)), 400)
    state.scheduler.submit(req)
    name = body.get("model") or state.resolved.served_model_name
    details = bool(body.get("return_spec_tokens_details"))
    if stream:
        options = body.get("stream_options") or {}
        return StreamingResponse(
            _stream(state, req, name, chat, bool(options.get("include_usage")),
                    bool(options.get("continuous_usage_stats")), details),
            media_type="text/event-stream",
        )
    try:
        await wait_finished(state, req, request)
    except BadRequest as e:
        return json_response(error_body(str(e)), 400)
    reason = req.finish_reason or {}
    if reason.get("type") == "abort" and reason.get("status_code"):
        code = reason["status_code"]
        return json_response(error_body(reason["message"], str(code), code), code)
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": req.text, "reasoning_content": None}
    else:
        choice["text"] = req.text
    choice.update(logprobs=None, finish_reason=reason.get("type"), matched_stop=reason.get("matched"))
    response = {
        "id": req.rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [choice],
        "usage": usage(req, drop_none=False),
        "metadata": {"weight_version": "default",
                     "weight_versions": [{"version": "default", "start": 0, "end": req.completion_tokens}]},
    }
    spec = spec_tokens_details(state, req) if details else None
    if spec is not None:
        response["sglext"] = {"spec_tokens_details": spec}
    return json_response(response)


def _chunk(req: GenRequest, name: str, chat: bool, created: int, choice: dict[str, Any] | None,
           usage_body: dict[str, Any] | None = None, with_usage_key: bool = True) -> bytes:
    body: dict[str, Any] = {"id": req.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": created, "model": name, "choices": [choice] if choice else []}
    if usage_body is not None or (with_usage_key and not chat):
        body["usage"] = usage_body
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _refused(e: InputTooLong, rid: str, name: str, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
    """A stream the scheduler refused: SGLang's error event, then (asked for) a usage chunk of its own odd counts."""
    yield b"data: " + json.dumps({"error": error_body(str(e), HTTPStatus.BAD_REQUEST.name)}).encode() + b"\n\n"
    if include_usage:
        counts = {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": None,
                  "reasoning_tokens": 0, "completion_tokens_details": None}
        body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": name, "choices": [], "usage": counts}
        yield b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _stream(state: State, req: GenRequest, name: str, chat: bool, include_usage: bool,
                  continuous: bool, details: bool) -> AsyncIterator[bytes]:
    created = int(time.time())
    sent = 0
    first = True
    async for r in updates(state, req):
        reason = r.finish_reason
        if reason and reason.get("type") == "abort" and reason.get("status_code"):
            code = HTTPStatus(reason["status_code"])
            yield b"data: " + json.dumps({"error": error_body(reason["message"], code.name, code.value)}).encode() \
                + b"\n\n"
            break
        text = r.text
        delta, sent = text[sent:], len(text)
        running_usage = usage(r, drop_none=not chat) if continuous else None
        if chat:
            if first:
                yield _chunk(r, name, chat, created, {
                    "index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None, "matched_stop": None})
            if delta:
                yield _chunk(r, name, chat, created, {
                    "index": 0, "delta": {"reasoning_content": None, "content": delta}, "logprobs": None,
                    "finish_reason": None, "matched_stop": None}, running_usage)
            if reason:
                yield _chunk(r, name, chat, created, {
                    "index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
                    "finish_reason": reason["type"], "matched_stop": reason.get("matched")})
        else:
            yield _chunk(r, name, chat, created, {
                "index": 0, "text": delta, "logprobs": None, "finish_reason": reason["type"] if reason else None,
                "matched_stop": reason.get("matched") if reason else None}, running_usage)
        first = False
    else:
        spec = spec_tokens_details(state, req) if details else None
        if spec is not None:  # SGLang's sglext event, at the response's level, before the usage chunk
            body = {"id": req.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created, "model": name, "choices": [], "usage": None,
                    "sglext": {"spec_tokens_details": spec}}
            yield b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
        if include_usage:
            yield _chunk(req, name, chat, created, None, usage(req, drop_none=not chat))
    yield b"data: [DONE]\n\n"
