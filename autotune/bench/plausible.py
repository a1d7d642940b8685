"""Figures checked before they are believed: a request's figures that no server can produce fail it, so that a
server that answers nonsense ends its trial (``bad_response``) instead of becoming the best.

A server may produce at most the tokens asked (``max_tokens``); it times a request at a positive, finite number of
seconds; and every verify step of speculative decoding yields at least one token and at most the draft tokens (the
first token comes from the prefill: tokens <= 1 + verify steps x draft tokens). An ``e2e_latency`` of -1e308 once
made a trial COMPLETE with value 0, and 1e30 completion tokens for a 16-token request 2.3e31 tok/s, the best.
"""
from __future__ import annotations

import math

from autotune.bench.client import RequestRecord


def doubt(rec: RequestRecord, most_accepted: int | None) -> str | None:
    """Why ``rec``'s figures cannot be a server's (None: they can); ``most_accepted``: the most tokens one verify
    step can yield under the server's config (None: unknown)."""
    if rec.tokens > rec.max_tokens:
        return f"{rec.tokens:.4g} completion tokens, {rec.max_tokens} asked"
    seconds = rec.server_e2e
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        return f"the server timed the request at {seconds!r} s"
    steps = rec.verify_steps
    if not steps:
        return None
    most = math.inf if most_accepted is None else most_accepted + 1 / steps
    for name, accept in (("accept length", rec.accept_length), ("tokens per verify step", rec.tokens / steps)):
        if accept is not None and not (math.isfinite(accept) and 1 <= accept <= most * (1 + 1e-9)):
            bound = "" if most_accepted is None else f" (at most {most_accepted} draft tokens each)"
            return f"{name} {accept!r} over {steps} verify steps{bound}"
    return None
