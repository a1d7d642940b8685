"""The requests a study sends: a dataset in one of the formats people keep their traffic in, read into
``TrafficRequest``s.

Formats, told apart by what each line (or the whole file) holds:

* OpenAI chat requests, JSONL: ``{"messages": [...], "max_tokens"?, "temperature"?, "top_p"?}`` (also
  ``max_completion_tokens``);
* OpenAI batch files, JSONL: ``{"custom_id": ..., "url": "/v1/chat/completions", "body": {...}}``, the body a chat
  request or a completion request (``{"prompt": ...}``);
* ShareGPT, a JSON array or JSONL of ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``: the
  turns up to the last human turn are the prompt, the reply after it gives the output length (``REPLY_CHARS_PER_TOKEN``
  characters a token: the server's tokenizer is not at hand before a launch);
* raw prompts, JSONL: ``{"prompt": ...}`` (sent to the completion endpoint, as autotune always did).

Any line may carry ``"category"`` (a word: the report groups figures by it). One dataset holds chat requests or raw
prompts, not both (a level sends to one endpoint). Every problem is one ``UserError`` line naming the file, the line
and what is wrong.

A JSONL line ends at a line feed, a carriage return or both (``json_lines``), never at a separator JSON lets a string
hold (U+2028, U+0085: ``str.splitlines`` would cut such a line in two). Every text that is sent must be one a server
can decode (``sendable``: no lone surrogate, which JSON's ``\\ud800`` escape can carry), and every user turn, like
every raw prompt, must say something.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from autotune.errors import UserError

#: ShareGPT gives a reply's text, not its length: this many characters count as one token (English prose and code
#: under the usual BPE vocabularies run 3.5-4.5)
REPLY_CHARS_PER_TOKEN = 4.0
#: the longest output a request may ask for
MAX_OUTPUT_TOKENS = 1_000_000
#: the roles a chat message may have, and ShareGPT's speakers as chat roles
ROLES = ("system", "developer", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "assistant": "assistant", "system": "system"}
#: endpoints a batch line may name
BATCH_URLS = ("/v1/chat/completions", "/v1/completions")
#: what ends a JSONL line (a line feed, a carriage return, or both): the breaks JSON never lets a string hold raw
LINE_END = re.compile(r"\r\n|\r|\n")
#: the longest whole number read: Python's own limit for turning digits into an int
MAX_DIGITS = 4300


class _LongNumber(ValueError):
    """A whole number past ``MAX_DIGITS`` in the JSON: named as what it is, not as broken JSON."""

    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _whole(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise _LongNumber(digits)
    return int(text)


def json_value(text: str, at: str, hint: str) -> Any:
    """``text`` parsed as JSON; one ``UserError`` line at ``at`` when it is not (``hint``: what the file should
    hold), a whole number too long to read named as such."""
    try:
        return json.loads(text, parse_int=_whole)
    except _LongNumber as e:
        raise UserError(f"{at}: a number of {e.digits} digits; at most {MAX_DIGITS} are read") from None
    except (ValueError, RecursionError) as e:
        line = getattr(e, "lineno", None)
        where = at if line is None or ": line " in at else f"{at}: line {line}"
        raise UserError(f"{where}: not valid JSON {hint}") from None


def json_lines(text: str, where: str, hint: str) -> Iterator[tuple[int, Any]]:
    """The JSON value of each non-blank line of ``text`` (JSONL), with its line number; a leading byte-order mark
    is no part of the first line."""
    for n, line in enumerate(LINE_END.split(text.removeprefix("\ufeff")), 1):
        if line.strip():
            yield n, json_value(line, f"{where}: line {n}", hint)


def sendable(text: str, at: str) -> str:
    """``text``, refused at ``at`` when it holds a lone surrogate (JSON's ``\\ud800`` escape reads into one): no
    UTF-8 encodes it, so a server would refuse every request that carries it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{at}: a lone surrogate \\u{ord(text[e.start]):04x} at character {e.start + 1}: not a "
                        "character (no UTF-8 encodes it; a server refuses the request)") from None
    return text


@dataclass(frozen=True)
class TrafficRequest:
    """One request of a workload: chat messages (sent through the chat endpoint, the server applying its chat
    template) or a raw prompt (the completion endpoint); what the data says of its length and sampling (None: the
    study's)."""

    messages: tuple[tuple[str, str], ...] | None = None     # (role, text) in order
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    category: str | None = None
    line: int = 0

    @property
    def chat(self) -> bool:
        return self.messages is not None

    @property
    def text(self) -> str:
        """Everything the request's prompt says (messages joined), for lengths and distinctness."""
        if self.messages is not None:
            return "\n".join(text for _, text in self.messages)
        return self.prompt or ""

    def output_tokens(self, default: int) -> int:
        return self.max_tokens if self.max_tokens is not None else default


def raw(prompt: str) -> TrafficRequest:
    return TrafficRequest(prompt=prompt)


def parse(text: str, where: str) -> list[TrafficRequest]:
    """The requests of a dataset's text (``where`` names it in errors)."""
    text = text.removeprefix("\ufeff")
    stripped = text.lstrip()
    if not stripped:
        raise UserError(f"{where}: empty: a dataset needs at least one request (JSONL: one JSON object a line)")
    if stripped.startswith("["):
        items: Iterator[tuple[int, Any]] = _array(text, where)
        label = "item"
    else:
        items = _lines(text, where)
        label = "line"
    out = [_request(item, n, f"{where}: {label} {n}") for n, item in items]
    if not out:
        raise UserError(f"{where}: no requests (JSONL: one JSON object a line)")
    kinds = {r.chat for r in out}
    if len(kinds) > 1:
        first_raw = next(r for r in out if not r.chat)
        raise UserError(f"{where}: {label} {first_raw.line}: a raw prompt among chat requests: one dataset holds chat "
                        "requests or raw prompts, not both")
    seen: dict[str, int] = {}
    for r in out:
        key = r.text if not r.chat else json.dumps(r.messages)
        if key in seen:
            raise UserError(f"{where}: {label} {r.line}: repeats {label} {seen[key]}; every request must be distinct")
        seen[key] = r.line
    return out


def _lines(text: str, where: str) -> Iterator[tuple[int, Any]]:
    return json_lines(text, where, "(or nested too deeply); a dataset is JSONL (one JSON object a line) or a "
                                   "ShareGPT JSON array")


def _array(text: str, where: str) -> Iterator[tuple[int, Any]]:
    data = json_value(text, where, "(a dataset that opens with '[' is a ShareGPT JSON array)")
    for i, item in enumerate(data, 1):
        yield i, item  # a JSON array's items are numbered in place of lines


def _request(item: Any, n: int, at: str) -> TrafficRequest:
    if not isinstance(item, dict):
        raise UserError(f"{at}: must be a JSON object, got {type(item).__name__}")
    category = _category(item, at)
    if "body" in item:
        return _batch(item, n, at, category)
    if "conversations" in item:
        return _sharegpt(item, n, at, category)
    if "messages" in item:
        return _chat(item, n, at, category)
    if "prompt" in item:
        return _completion(item, n, at, category)
    raise UserError(f"{at}: in none of the formats: needs \"messages\" (OpenAI chat), \"body\" (OpenAI batch), "
                    "\"conversations\" (ShareGPT) or \"prompt\" (raw prompt)")


def _category(item: dict[str, Any], at: str) -> str | None:
    value = item.get("category")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 40:
        raise UserError(f"{at}: \"category\" must be a short non-empty string")
    return sendable(value.strip(), f"{at}: \"category\"")


def _chat(body: dict[str, Any], n: int, at: str, category: str | None) -> TrafficRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{at}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise UserError(f"{at}: message {i}: needs a \"role\" of {', '.join(ROLES)}")
        out.append((m["role"], _content(m.get("content"), f"{at}: message {i}")))
    _said(out, at, "message", "user message")
    if not any(role == "user" for role, _ in out):
        raise UserError(f"{at}: no user message: a chat request needs at least one message with role \"user\"")
    if out[-1][0] == "assistant":
        raise UserError(f"{at}: ends with an assistant message: the request must end where the server answers")
    return TrafficRequest(messages=tuple(out), max_tokens=_max_tokens(body, at), line=n, category=category,
                          **_sampling(body, at))


def _said(messages: list[tuple[str, str]], at: str, label: str, what: str) -> None:
    """Refuse an empty user turn (``what``: as the format names it), as an empty raw prompt is refused: what it
    would measure is the chat template, not the traffic."""
    for i, (role, text) in enumerate(messages, 1):
        if role == "user" and not text.strip():
            raise UserError(f"{at}: {label} {i}: an empty {what}: a user turn, like a raw prompt, must say something "
                            "(an empty one measures the chat template, not the traffic)")


def _content(content: Any, at: str) -> str:
    """A message's text: a string, or OpenAI's list of parts (text parts only)."""
    if isinstance(content, str):
        return sendable(content, at)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise UserError(f"{at}: content parts must be {{\"type\": \"text\", \"text\": ...}} (autotune sends "
                                "text only)")
            texts.append(part["text"])
        return sendable("".join(texts), at)
    raise UserError(f"{at}: \"content\" must be a string or a list of text parts")


def _completion(body: dict[str, Any], n: int, at: str, category: str | None) -> TrafficRequest:
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f"{at}: needs a non-empty string field \"prompt\"")
    return TrafficRequest(prompt=sendable(prompt, f"{at}: \"prompt\""), max_tokens=_max_tokens(body, at), line=n,
                          category=category, **_sampling(body, at))


def _batch(item: dict[str, Any], n: int, at: str, category: str | None) -> TrafficRequest:
    body = item["body"]
    if not isinstance(body, dict):
        raise UserError(f"{at}: \"body\" must be a JSON object (the request)")
    url = item.get("url")
    if url is not None and url not in BATCH_URLS:
        raise UserError(f"{at}: \"url\" {url!r}: autotune sends {' or '.join(BATCH_URLS)} requests")
    category = category or _category(body, at)
    if "messages" in body:
        return _chat(body, n, at, category)
    if "prompt" in body:
        return _completion(body, n, at, category)
    raise UserError(f"{at}: \"body\" needs \"messages\" (a chat request) or \"prompt\" (a completion request)")


def _sharegpt(item: dict[str, Any], n: int, at: str, category: str | None) -> TrafficRequest:
    turns = item["conversations"]
    if not isinstance(turns, list) or not turns:
        raise UserError(f"{at}: \"conversations\" must be a non-empty list of {{\"from\", \"value\"}} turns")
    messages = []
    for i, turn in enumerate(turns, 1):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        role = SHAREGPT_ROLES.get(str(speaker).lower()) if isinstance(speaker, str) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role is None or not isinstance(value, str):
            raise UserError(f"{at}: turn {i}: needs \"from\" (human, gpt or system) and a string \"value\"")
        messages.append((role, sendable(value, f"{at}: turn {i}")))
    last_user = max((i for i, (role, _) in enumerate(messages) if role == "user"), default=None)
    if last_user is None:
        raise UserError(f"{at}: no human turn: the turns up to the last human turn are the prompt")
    _said(messages[:last_user + 1], at, "turn", "human turn")
    reply = next((text for role, text in messages[last_user + 1:] if role == "assistant"), None)
    if reply is None or not reply.strip():
        raise UserError(f"{at}: nothing to generate: no reply follows the last human turn (its length is the "
                        "request's output length)")
    tokens = max(1, math.ceil(len(reply) / REPLY_CHARS_PER_TOKEN))
    return TrafficRequest(messages=tuple(messages[:last_user + 1]), max_tokens=min(tokens, MAX_OUTPUT_TOKENS),
                          line=n, category=category)


def _max_tokens(body: dict[str, Any], at: str) -> int | None:
    for key in ("max_completion_tokens", "max_tokens", "n_predict", "max_new_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
            raise UserError(f"{at}: nothing to generate: \"{key}\" must be a whole number from 1 to "
                            f"{MAX_OUTPUT_TOKENS}, got {value!r}")
        return value
    return None


def _sampling(body: dict[str, Any], at: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not 0 <= value <= high
                                  or (key == "top_p" and value == 0)):
            span = "above 0 and at most" if key == "top_p" else "from 0 to"
            raise UserError(f"{at}: \"{key}\" must be a number {span} {high:g}, got {value!r}")
        out[key] = None if value is None else float(value)
    return out
