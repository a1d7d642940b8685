"""The Prometheus text SGLang serves on /metrics with --enable-metrics (the sglang: series a tuner reads)."""
from __future__ import annotations

import bisect

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]


class Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times


class Metrics:
    """Counters and histograms of the tokenizer side, gauges copied from the scheduler at each decode log."""

    def __init__(self, served_model_name: str, max_total_num_tokens: int) -> None:
        self.tokenizer_labels = {"model_name": served_model_name, "engine_type": "unified"}
        self.scheduler_labels = {**self.tokenizer_labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.max_total_num_tokens = max_total_num_tokens
        self.gauges: dict[str, float] = {name: 0.0 for name, _ in _GAUGES}
        self.ttft = {True: Histogram(TTFT_BUCKETS), False: Histogram(TTFT_BUCKETS)}
        self.e2e = {True: Histogram(E2E_BUCKETS), False: Histogram(E2E_BUCKETS)}
        self.itl = Histogram(ITL_BUCKETS)
        self.prompt_tokens = {True: 0, False: 0}
        self.generation_tokens = {True: 0, False: 0}
        self.requests = 0

    def observe_ttft(self, seconds: float, streaming: bool) -> None:
        self.ttft[streaming].observe(seconds)

    def observe_itl(self, seconds: float, tokens: int) -> None:
        self.itl.observe(seconds, tokens)

    def observe_finished(self, streaming: bool, prompt_tokens: int, completion_tokens: int,
                         e2e_seconds: float) -> None:
        self.e2e[streaming].observe(e2e_seconds)
        self.prompt_tokens[streaming] += prompt_tokens
        self.generation_tokens[streaming] += completion_tokens
        self.requests += 1

    def update_gauges(self, running: int, queued: int, used_tokens: int, gen_throughput: float,
                      accept_length: float, accept_rate: float, num_steps: int = 0, num_draft_tokens: int = 0) -> None:
        """Copy the scheduler's figures; ``num_steps``/``num_draft_tokens`` are the live speculative tier."""
        self.gauges.update(
            spec_num_steps=num_steps,
            spec_num_draft_tokens=num_draft_tokens,
            num_running_reqs=running,
            num_queue_reqs=queued,
            num_used_tokens=used_tokens,
            token_usage=round(used_tokens / max(self.max_total_num_tokens, 1), 2),
            gen_throughput=gen_throughput,
            spec_accept_length=accept_length,
            spec_accept_rate=accept_rate,
        )

    def render(self) -> str:
        out: list[str] = []
        for name, doc in _GAUGES:
            _family(out, f"sglang:{name}", doc, "gauge")
            out.append(_sample(f"sglang:{name}", self.scheduler_labels, self.gauges[name]))
        _family(out, "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "gauge")
        out.append(_sample("sglang:max_total_num_tokens", self.scheduler_labels, self.max_total_num_tokens))
        for name, doc, values in (("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
                                  ("generation_tokens", "Number of generation tokens processed.",
                                   self.generation_tokens)):
            _family(out, f"sglang:{name}", doc, "counter")
            for streaming, value in values.items():
                labels = {**self.tokenizer_labels, "is_streaming": str(streaming).lower()}
                out.append(_sample(f"sglang:{name}_total", labels, value))
        _family(out, "sglang:num_requests", "Number of requests processed.", "counter")
        out.append(_sample("sglang:num_requests_total", self.tokenizer_labels, self.requests))
        for name, doc, hists in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e),
        ):
            _family(out, f"sglang:{name}", doc, "histogram")
            for streaming, hist in hists.items():
                _histogram(out, f"sglang:{name}", {**self.tokenizer_labels, "is_streaming": str(streaming).lower()},
                           hist)
        _family(out, "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                "histogram")
        _histogram(out, "sglang:inter_token_latency_seconds", self.tokenizer_labels, self.itl)
        return "\n".join(out) + "\n"


_GAUGES = [
    ("num_running_reqs", "The number of running requests."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("spec_accept_length", "The average acceptance length of speculative decoding."),
    ("spec_accept_rate", ("The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` "
                         "in batch).")),
    ("spec_num_steps", "The current number of speculative decoding steps."),
    ("spec_num_draft_tokens", "The current number of speculative draft tokens."),
]


def _family(out: list[str], name: str, doc: str, kind: str) -> None:
    family = name.removesuffix("_total")
    out.append(f"# HELP {family} {doc}")
    out.append(f"# TYPE {family} {kind}")


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    return f"{name}{_labels(labels)} {float(value)}"


def _histogram(out: list[str], name: str, labels: dict[str, str], hist: Histogram) -> None:
    running = 0
    for bound, count in zip([*hist.buckets, float("inf")], hist.counts, strict=False):
        running += count
        le = "+Inf" if bound == float("inf") else str(float(bound))
        out.append(_sample(f"{name}_bucket", {**labels, "le": le}, running))
    out.append(_sample(f"{name}_count", labels, hist.count))
    out.append(_sample(f"{name}_sum", labels, hist.sum))
