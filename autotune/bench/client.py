"""One streamed generation's record, timed token by token.

Every figure comes from the response itself: completion tokens, and where the engine gives them the verify steps,
accept length and the server's own timing of this request alone, never the server's cumulative counters (which
/flush_cache resets and data-parallel ranks keep apart). The load generator (generator.py,
bench/loadgen.py) fills it as the stream arrives, so a request cut off at the end of a measurement window
keeps the tokens it received.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any




@dataclass
class RequestRecord:
    concurrency: int
    start: float                    # seconds since the level started
    max_tokens: int = 0             # what the request asked for
    ttft: float | None = None       # seconds from sending to the first token
    e2e: float | None = None        # seconds from sending to the last event
    tokens: int = 0                 # completion tokens
    #: (seconds since sending, completion tokens so far) at every event that brought tokens
    trace: list[tuple[float, int]] = field(default_factory=list)
    accept_length: float | None = None
    verify_steps: int | None = None
    server_e2e: float | None = None  # the request's duration as the server timed it
    finish_reason: str | None = None
    error: str | None = None        # why the request failed: "http 500: ...", "stalled", "connection: ..."
    ramp: bool = False              # a first request of its slot (steady state not reached yet): not measured
    cancelled: bool = False         # cut off when its level's window closed (not a failure)
    gap: float | None = None        # seconds its slot stood empty before it was sent (concurrency levels)
    category: str | None = None     # what the data says the request is (the report's figures by category)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def complete(self) -> bool:
        """Finished normally (not failed, not cut off)."""
        return self.ok and not self.cancelled and self.finish_reason is not None

    @property
    def end(self) -> float | None:
        """Seconds since the level started at which its last event arrived."""
        return None if self.e2e is None else self.start + self.e2e

    @property
    def itl(self) -> list[float]:
        """Seconds between successive token-carrying events (one event may carry several accepted tokens)."""
        return [b[0] - a[0] for a, b in itertools.pairwise(self.trace)]

    def tokens_by(self, t: float) -> int:
        """Completion tokens this request had received ``t`` seconds after its level started."""
        done = 0
        for at, tokens in self.trace:
            if self.start + at > t:
                break
            done = tokens
        return done

    @property
    def output_tok_s(self) -> float | None:
        """Tokens over the request's whole time, from sending to its last token (prefill included)."""
        if self.e2e is None or self.e2e <= 0 or not self.tokens:
            return None
        return self.tokens / self.e2e

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first, over the time after the first token: the per-request decode speed."""
        if self.ttft is None or self.e2e is None or self.tokens < 2 or self.e2e <= self.ttft:
            return None
        return (self.tokens - 1) / (self.e2e - self.ttft)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
