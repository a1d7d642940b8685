"""What a study will send, before any launch (`autotune workload`): its requests' count, endpoint and ends, input
and output lengths, sampling and categories, and how many requests each level's measurement uses; and the check
that no request is longer than the server's context where the study's args set it (every command's plan).

Input lengths are estimates (``traffic.REPLY_CHARS_PER_TOKEN`` characters a token): the server's tokenizer is not at
hand before a launch. A request is refused only when even a generous estimate (``DENSE_CHARS_PER_TOKEN``: few tokens
for its characters) does not fit, so no request the server would take is refused.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from autotune.bench.measure import SPARE_GENERATIONS, shape_of
from autotune.bench.stats import percentile
from autotune.bench.traffic import REPLY_CHARS_PER_TOKEN, TrafficRequest
from autotune.engines import ArgValue, Engine
from autotune.errors import UserError
from autotune.studyfile.spec import StudySpec
from autotune.visible import visible

#: the most characters a token holds in practice (long English words, runs of spaces in code): the estimate a
#: request's length is refused by
DENSE_CHARS_PER_TOKEN = 8.0
QUANTILES = (10, 50, 90, 99)


def input_tokens(request: TrafficRequest, chars_per_token: float = REPLY_CHARS_PER_TOKEN) -> int:
    return max(1, round(len(request.text) / chars_per_token))


def check_context(spec: StudySpec, engine: Engine, args: dict[str, ArgValue], requests: list[TrafficRequest]) -> None:
    """Refuse a request longer than the server's context (where ``args`` set it), in one line."""
    context = engine.context_length(args)
    if context is None:
        return
    w = spec.workload
    for r in requests:
        low = input_tokens(r, DENSE_CHARS_PER_TOKEN)
        need = low + r.output_tokens(w.max_tokens)
        if need > context:
            where = w.dataset or w.prompts
            raise UserError(f"{where}: line {r.line or '?'}: at least {low} prompt tokens and "
                            f"{r.output_tokens(w.max_tokens)} to generate exceed the server's context of {context} "
                            "tokens (its [engine.args]); shorten it or raise the context")


def describe(spec: StudySpec, requests: list[TrafficRequest]) -> dict[str, Any]:
    """What the study will send, as a JSON-able document."""
    w = spec.workload
    shape = shape_of(w)
    inputs = [input_tokens(r) for r in requests]
    outputs = [r.output_tokens(w.max_tokens) for r in requests]
    temps = Counter(shape.sampling(r).temperature for r in requests)
    top_p = Counter(shape.sampling(r).top_p for r in requests)
    chat = bool(requests) and requests[0].chat
    levels = {1: w.requests} | {c: w.window_generations * c for c in sorted(set(w.concurrency)) if c > 1}
    handed = {c: (w.window_generations + SPARE_GENERATIONS) * c for c in levels if c > 1}
    return {
        "source": w.dataset or (f"prompts {w.prompts}"),
        "requests": len(requests),
        "kind": "chat" if chat else "raw",
        "ends": "ignore_eos (every request runs to its length)" if w.forced_length else "natural (no ignore_eos)",
        "input_tokens": _quantiles(inputs),
        "output_tokens": _quantiles(outputs),
        "output_from_data": sum(1 for r in requests if r.max_tokens is not None),
        "temperature": {str(k): v for k, v in sorted(temps.items())},
        "top_p": {str(k): v for k, v in sorted(top_p.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
        "categories": dict(Counter(r.category or "(none)" for r in requests).most_common()),
        "window_requests": {str(c): n for c, n in levels.items()},
        "handed_out": {str(c): n for c, n in handed.items()},
        "warmup": w.warmup,
        "repeats": [w.min_repeats, w.max_repeats],
        "input_lengths": inputs,
        "output_lengths": outputs,
    }


def _quantiles(values: list[int]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in QUANTILES}
    out["min"], out["max"] = (min(values), max(values)) if values else (None, None)
    out["mean"] = round(sum(values) / len(values), 1) if values else None
    return out


def text(view: dict[str, Any]) -> str:
    """The document as the command line prints it."""
    def q(d: dict[str, float | None]) -> str:
        return "  ".join(f"{k} {v:.0f}" for k, v in d.items() if v is not None)

    endpoint = "the chat endpoint (the server applies its chat template)" if view["kind"] == "chat" else \
        "the completion endpoint (raw prompts)"
    lines = [
        f"source: {view['source']}: {view['requests']} requests, sent through {endpoint}",
        f"ends: {view['ends']}",
        f"input tokens (about {REPLY_CHARS_PER_TOKEN:g} characters a token): {q(view['input_tokens'])}",
        f"output tokens ({view['output_from_data']} of {view['requests']} from the data): {q(view['output_tokens'])}",
        "temperature: " + ", ".join(f"{k} x{v}" for k, v in view["temperature"].items()),
        "top_p: " + ", ".join(f"{'server default' if k == 'None' else k} x{v}" for k, v in view["top_p"].items()),
        "categories: " + ", ".join(f"{visible(k)} {v}" for k, v in view["categories"].items()),
        "each level's measurement: " + ", ".join(
            f"{'single stream' if c == '1' else 'c=' + c} {n}" for c, n in view["window_requests"].items())
        + f" requests (warm-up {view['warmup']}; repeats {view['repeats'][0]}-{view['repeats'][1]})",
    ]
    if view["handed_out"]:
        lines.append("distinct requests handed to each concurrency level (window, ramp, in flight, sent ahead): "
                     + ", ".join(f"c={c} {n}" for c, n in view["handed_out"].items())
                     + "; past the dataset's end a request is sent again with a tag in front")
    return "\n".join(lines)
