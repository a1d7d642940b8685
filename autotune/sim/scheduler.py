"""Continuous batching against the model's clock: prefill and decode iterations, token emission, decode logs.

Model time runs ``speedup`` times faster than wall time and iterations are scheduled against absolute
deadlines (iteration i ends at t0 + (sum of model durations) / speedup), so a busy event loop delays delivery
a little but never accumulates drift: when the loop wakes late it processes every iteration already due.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
import uuid
from collections import deque
from collections.abc import Callable

from autotune.sim import adaptive_controller, model
from autotune.sim.faults import Faults
from autotune.sim.metrics import Metrics
from autotune.sim.profile import Profile
from autotune.sim.tokens import TextGenerator, prompt_seed

#: a request asking for fewer tokens than this is no answer's length (a warm-up, a probe): it ends where the profile's
#: answers end, almost always past its limit
SHORTEST_ANSWER = 32
INTERNAL_ERROR = "The scheduler aborted the request after an internal error in the forward pass."


@dataclasses.dataclass(eq=False)
class Request:
    """One generation request as the scheduler tracks it."""

    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool
    temperature: float
    stream: bool
    log_metrics: bool = True
    #: what the request asks for, as acceptance sees it (sim/traffic.py), and whether a chat template wrapped it
    category: str = "chat"
    chat: bool = False
    rid: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    # set by the scheduler
    arrival: float = 0.0
    arrival_v: float = 0.0
    natural_length: int | None = None
    reach: list[float] = dataclasses.field(default_factory=list)
    #: the reach past the natural end (a request that ignores end-of-sequence goes on into text drafted differently)
    reach_past: list[float] = dataclasses.field(default_factory=list)
    rng: random.Random | None = None
    carry: float = 0.0
    abort_at: int | None = None
    generator: TextGenerator | None = None
    prefilled: int = 0
    cached_tokens: int = 0
    output_ids: list[int] = dataclasses.field(default_factory=list)
    pieces: list[str] = dataclasses.field(default_factory=list)
    verify_ct: int = 0
    correct_drafts: int = 0
    #: verify steps by how many drafts each accepted (SGLang's spec_correct_drafts_histogram)
    correct_histogram: list[int] = dataclasses.field(default_factory=list)
    #: when it arrived, as the epoch (SGLang's request_received_ts); ``arrival`` is the same moment, monotonic
    received_ts: float = 0.0
    first_token_time: float = 0.0
    last_emit: float = 0.0
    finish_time: float = 0.0
    finish_reason: dict | None = None
    #: set at every output; ``done`` once the request has finished
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclasses.dataclass
class Iteration:
    """One scheduler iteration, ending at ``end`` (model seconds): a prefill of ``prefill``, else a decode step;
    ``crash`` is the exception an injected fault dies with instead."""

    end: float
    prefill: list[Request]
    crash: str | None = None
    crash_phase: str = "running"


class Clock:
    """Model seconds since start; model time runs ``speedup`` times faster than the monotonic clock."""

    def __init__(self, speedup: float) -> None:
        self.t0 = time.monotonic()
        self.speedup = speedup

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.speedup

    def wall(self, model_time: float) -> float:
        return self.t0 + model_time / self.speedup


class Scheduler:
    """SGLang's scheduler as seen from outside: queue, running batch, prefill/decode iterations, logs, stats."""

    def __init__(
        self,
        profile: Profile,
        config: model.Config,
        plan: model.MemoryPlan,
        *,
        speedup: float,
        noise: float,
        seed: int | None,
        faults: Faults,
        log: logging.Logger,
        decode_log_interval: int,
        metrics: Metrics,
        crash: Callable[[str, str], None],
        deferred_error: tuple[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.profile, self.config, self.plan = profile, config, plan
        self.clock = clock or Clock(speedup)
        self.noise = noise
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.rng = random.Random(self.seed)
        self.faults = faults
        self.log = log
        self.metrics = metrics
        self.crash = crash
        self.deferred_error = deferred_error
        self.decode_log_interval = max(1, decode_log_interval)
        self.capacity = plan.max_running_requests * config.dp
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_cache: list[tuple[int, ...]] = []
        self._wake = asyncio.Event()
        self._end = 0.0
        self.total_generated = 0
        self.stalled = False
        self.serving = False  # set once warm-up is done: injected request errors spare the warm-up request
        self.last_output_time = 0.0
        self._reach_cache: dict[tuple[float, float], list[float]] = {}
        self._graph = True
        self._pending_new = 0
        self._round_batch = 0
        # adaptive speculative decoding: the controller, the live step and each step's config
        self.controller: adaptive_controller.Controller | None = None
        self.steps = config.spec.steps if config.spec else 0
        self._at_steps: dict[int, model.Config] = {}
        self._reach_spec = config.spec
        if config.adaptive is not None:
            graph_bs = None if config.disable_cuda_graph else plan.capture_bs
            self.controller = adaptive_controller.Controller(config.adaptive, graph_bs, log.info)
            self._at_steps = {s: config.at_steps(s) for s in config.adaptive.candidate_steps}
            self._reach_spec = self._at_steps[max(self._at_steps)].spec
        self.reset_stats()

    # ------------------------------------------------------------------------------------------ public API

    def reset_stats(self) -> None:
        """SGLang's metrics reset (also done by /flush_cache): decode counters and spec totals."""
        self.forward_ct_decode = 0
        self.num_generated_tokens = 0
        self.spec_accept_tokens = 0
        self.spec_correct_drafts = 0
        self.spec_proposed_drafts = 0
        self.spec_forward_ct = 0
        self.spec_total_accept_tokens = 0
        self.spec_total_forward_ct = 0
        self.last_decode_log = time.monotonic()
        self.last_prefill_log = time.monotonic()
        self.last_gen_throughput = 0.0
        self.last_accept_rate = 0.0
        self.last_accept_length = 0.0

    @property
    def avg_spec_accept_length(self) -> float | None:
        if self.config.spec is None or self.spec_total_forward_ct <= 0:
            return None
        return self.spec_total_accept_tokens / self.spec_total_forward_ct

    @property
    def live_config(self) -> model.Config:
        """The config decoding runs with now: an adaptive server's live step, else the server's own."""
        return self._at_steps.get(self.steps, self.config)

    @property
    def spec_accept_length_so_far(self) -> float | None:
        """Accepted tokens per verify pass (bonus included) since the last reset, logged or not."""
        passes = self.spec_total_forward_ct + self.spec_forward_ct
        if self.config.spec is None or passes <= 0:
            return None
        return (self.spec_total_accept_tokens + self.spec_accept_tokens) / passes

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def submit(self, req: Request) -> Request:
        """Queue a request; its tokens arrive through ``req.event`` as iterations complete."""
        req.arrival, req.received_ts = time.monotonic(), time.time()
        req.arrival_v = self.clock.now()
        seed = prompt_seed(req.prompt_ids) ^ self.seed if req.temperature <= 0 else self.rng.randrange(2**31)
        rng = random.Random(seed)
        req.generator = TextGenerator(seed)
        mean = self.profile.acceptance.mean_output_tokens
        # drawn from the request's own randomness first, as it always was, so every later draw stays the same
        drawn = None if req.ignore_eos else max(1, int(rng.expovariate(1.0 / mean)) + 1)
        req.natural_length = self._natural_length(req, seed, drawn)
        acc = self.profile.acceptance
        kind = acc.factor(req.category, req.chat)
        factor = 1.0 + self.noise * _clipped_gauss(rng)
        req.reach = [min(1.0, r * factor) for r in self._reach(req.temperature, kind)]
        if req.ignore_eos and acc.past_end_factor != 1.0:
            req.reach_past = [min(1.0, r * factor) for r in self._reach(req.temperature, kind * acc.past_end_factor)]
        req.carry = rng.random()
        req.rng = rng
        if self.serving and self.faults.error_fraction and rng.random() < self.faults.error_fraction:
            # within what the request generates, so an injected error always strikes
            last = req.max_new_tokens if req.ignore_eos else min(req.max_new_tokens, req.natural_length)
            req.abort_at = rng.randrange(max(last, 1))
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        """Drop a request whose client went away (SGLang aborts it and frees its slot)."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if not req.finished:
            req.finish_reason = {"type": "abort", "message": "The client disconnected.", "status_code": None,
                                 "err_type": None}
            req.done.set()

    def used_tokens(self) -> int:
        return sum(r.context for r in self.running)

    async def run(self) -> None:
        """The event loop: run iterations back to back while there is work, sleep when idle."""
        since_yield = 0
        while True:
            if self.stalled:
                await asyncio.Event().wait()
            iteration = self.next_iteration()
            if iteration is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            if iteration.crash is not None:
                self.crash(iteration.crash_phase, iteration.crash)
                return
            await self._until(iteration.end)
            self.finish(iteration)
            since_yield += 1
            if since_yield >= 8:
                since_yield = 0
                await asyncio.sleep(0)

    # ---------------------------------------------------------------------------------------- iterations

    def next_iteration(self) -> Iteration | None:
        """The iteration the scheduler runs next, decided now: a prefill of the requests that arrived (while slots,
        KV room and the chunk budget allow) or a decode step of the running batch. None while there is no work."""
        start = self._next_start()
        if start is None:
            return None
        admitted = self._admit(start)
        if admitted:
            return Iteration(start + self._prefill_duration(admitted) / 1000.0, admitted)
        batch = len(self.running)
        if self.faults.oom_under_load is not None and batch > self.faults.oom_under_load:
            return Iteration(start, [], crash=model.oom_message(0.4 + 0.05 * batch, self.profile, 0.3))
        if self.deferred_error and self.deferred_error[0] in ("running", "verify"):
            return Iteration(start, [], crash=self.deferred_error[1], crash_phase=self.deferred_error[0])
        return Iteration(start + self._decode_duration(batch) / 1000.0, [])

    def finish(self, iteration: Iteration) -> None:
        """Complete ``iteration`` (at its end time): emit its tokens, retire finished requests, log."""
        if iteration.prefill:
            self._finish_prefill(iteration.prefill, iteration.end)
        else:
            self._finish_decode(iteration.end)
        self._end = iteration.end

    def _next_start(self) -> float | None:
        if self.running:
            return self._end
        if not self.waiting:
            return None
        return max(self._end, min(r.arrival_v for r in self.waiting))

    async def _until(self, model_time: float) -> None:
        delay = self.clock.wall(model_time) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _admit(self, start: float) -> list[Request]:
        """Move arrived requests into a prefill batch while slots, KV room and the chunk budget allow."""
        batch: list[Request] = []
        budget = self.plan.chunked_prefill_size
        room = self.plan.max_total_num_tokens * self.config.dp - self.used_tokens()
        reserve = self.config.kv_reserve_tokens * 2 if self.config.spec else 1
        while self.waiting and len(self.running) + len(batch) < self.capacity and budget > 0:
            req = self.waiting[0]
            if req.arrival_v > start:
                break
            need = req.prompt_tokens + reserve
            if need > room and (self.running or batch):
                break
            self.waiting.popleft()
            if req.prefilled == 0:
                req.cached_tokens = self._cached_prefix(req.prompt_ids)
                req.prefilled = req.cached_tokens
            batch.append(req)
            budget -= req.prompt_tokens - req.prefilled
            room -= need
        return batch

    def _cached_prefix(self, ids: list[int]) -> int:
        """Tokens of ``ids`` already in the radix cache (the longest prefix shared with a cached prompt)."""
        if self.config.disable_radix_cache or not ids:
            return 0
        key = tuple(ids)
        best = max((_common_prefix(cached, key) for cached in self.prefix_cache if cached[0] == key[0]), default=0)
        # The last prompt token is always recomputed to produce the first output token.
        return min(best, len(ids) - 1) // self.config.page_size * self.config.page_size

    def _prefill_duration(self, batch: list[Request]) -> float:
        new_tokens = 0
        budget = self.plan.chunked_prefill_size
        for req in batch:
            take = min(req.prompt_tokens - req.prefilled, max(budget, 1))
            new_tokens += take
            budget -= take
        self._pending_new = new_tokens
        return model.prefill_ms(self.profile, self.config, new_tokens, len(batch)) * self._jitter()

    def _finish_prefill(self, batch: list[Request], end: float) -> None:
        now = self.clock.wall(end)  # when the modelled GPU finished the forward (the event loop may run late)
        budget = self.plan.chunked_prefill_size
        chunked: list[Request] = []
        cached = sum(r.cached_tokens for r in batch if r.prefilled == r.cached_tokens)
        for req in batch:
            take = min(req.prompt_tokens - req.prefilled, max(budget, 1))
            req.prefilled += take
            budget -= take
            if req.finished:  # aborted by its client during this forward
                continue
            if req.prefilled < req.prompt_tokens:
                chunked.append(req)
                continue
            self._remember_prompt(req.prompt_ids)
            self.running.append(req)
            self._emit(req, 1, now)
            if req.finished:
                self.running.remove(req)
        for req in reversed(chunked):
            self.waiting.appendleft(req)
        gap = now - self.last_prefill_log
        self.last_prefill_log = now
        self.log.info(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {self._pending_new}, #cached-token: {cached}, "
            f"{self._usage_parts(self.used_tokens(), len(self.running), prefill=True)}"
            f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
            f"#pending-token: 0, cuda graph: False, input throughput (token/s): "
            f"{self._pending_new / gap if gap > 0 else 0.0:.2f}"
        )
        self._after_tokens()

    def _decode_duration(self, batch: int) -> float:
        per_worker = max(1, math.ceil(batch / self.config.dp))
        self._round_batch = per_worker
        if self.controller is not None:
            self._activate(self.controller.steps_for_batch(per_worker))
        context = self.used_tokens() / self.config.dp
        cfg = self.live_config
        self._graph = model.graph_ok(self.plan, cfg, per_worker)
        return model.step_ms(self.profile, cfg, per_worker, int(context), self._graph) * self._jitter()

    def _activate(self, steps: int) -> None:
        """Swap the adaptive runtime state to ``steps`` (SGLang logs every switch)."""
        if steps == self.steps:
            return
        self.log.info(f"Switch adaptive runtime state: steps {self.steps} -> {steps}, "
                      f"draft_tokens {self.steps + 1} -> {steps + 1}")
        self.steps = steps

    def _finish_decode(self, end: float) -> None:
        now = self.clock.wall(end)
        spec = self.live_config.spec
        batch, used = len(self.running), self.used_tokens()
        verified: list[int] = []
        for req in list(self.running):
            if spec is not None:
                accepted = self._accepted(req, spec.steps)
                verified.append(accepted)
                req.verify_ct += 1
                req.correct_drafts += accepted
                req.correct_histogram += [0] * (accepted + 1 - len(req.correct_histogram))
                req.correct_histogram[accepted] += 1
                self.spec_accept_tokens += 1 + accepted
                self.spec_correct_drafts += accepted
                self.spec_proposed_drafts += spec.draft - 1
                self.spec_forward_ct += 1
                count = 1 + accepted
            else:
                count = 1
            self._emit(req, count, now)
            if req.finished:
                self.running.remove(req)
        if self.controller is not None:
            self._verify_complete(verified)
        self.forward_ct_decode += 1
        if self.forward_ct_decode % self.decode_log_interval == 0:
            self._decode_log(now, batch, used)
        self._after_tokens()

    def _emit(self, req: Request, count: int, now: float) -> None:
        """Append ``count`` tokens (fewer at EOS, max_new_tokens or an injected error) and wake the client."""
        count = min(count, req.max_new_tokens - req.completion_tokens)
        eos = (not req.ignore_eos and req.natural_length is not None
               and req.completion_tokens + count >= req.natural_length)
        if eos:
            count = req.natural_length - req.completion_tokens
        abort = req.abort_at is not None and req.completion_tokens + count > req.abort_at
        if abort:
            count, eos = max(req.abort_at - req.completion_tokens, 0), False
        gen = req.generator
        for i in range(count):
            if eos and i == count - 1:
                req.output_ids.append(self.profile.model.eos_token_id)
            else:
                token, piece = gen.next()
                req.output_ids.append(token)
                req.pieces.append(piece)
        if count:
            if req.first_token_time == 0.0:
                req.first_token_time = now
                if req.log_metrics:
                    self.metrics.observe_ttft(now - req.arrival, req.stream)
            elif req.log_metrics:
                self.metrics.observe_itl((now - req.last_emit) / count, count)
            req.last_emit = now
            self.total_generated += count
            self.num_generated_tokens += count
            self.last_output_time = now
        if abort:
            req.finish_reason = {"type": "abort", "message": INTERNAL_ERROR, "status_code": 500,
                                 "err_type": "InternalServerError"}
        elif req.completion_tokens >= req.max_new_tokens:
            req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        elif eos:
            req.finish_reason = {"type": "stop", "matched": self.profile.model.eos_token_id}
        if req.finished:
            req.finish_time = now
            if req.log_metrics:
                self.metrics.observe_finished(req.stream, req.prompt_tokens, req.completion_tokens,
                                              now - req.arrival)
            req.done.set()
        req.event.set()

    def _after_tokens(self) -> None:
        f = self.faults
        if f.crash_after_tokens is not None and self.total_generated >= f.crash_after_tokens:
            self.crash("running", "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                       "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                       "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                       "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        if f.stall_after_tokens is not None and self.total_generated >= f.stall_after_tokens:
            self.stalled = True

    def _remember_prompt(self, ids: list[int]) -> None:
        if self.config.disable_radix_cache:
            return
        self.prefix_cache.append(tuple(ids))
        if len(self.prefix_cache) > 256:
            self.prefix_cache.pop(0)

    def flush_prefix_cache(self) -> None:
        self.prefix_cache.clear()

    # ----------------------------------------------------------------------------------------------- logs

    def _usage_parts(self, used: int, running: int, prefill: bool = False) -> str:
        usage = used / max(self.plan.max_total_num_tokens * self.config.dp, 1)
        if self.profile.model.hybrid_linear_attention and self.plan.mamba_cache_size:
            mamba_used = running
            mamba_usage = mamba_used / max(self.plan.mamba_cache_size * self.config.dp, 1)
            if prefill:
                return f"full token usage: {usage:.2f}, mamba usage: {mamba_usage:.2f}, "
            return (f"#full token: {used}, full token usage: {usage:.2f}, mamba num: {mamba_used}, "
                    f"mamba usage: {mamba_usage:.2f}, ")
        if prefill:
            return f"token usage: {usage:.2f}, "
        return f"#token: {used}, token usage: {usage:.2f}, "

    def _decode_log(self, now: float, batch: int, used: int) -> None:
        gap = now - self.last_decode_log
        self.last_decode_log = now
        self.last_gen_throughput = self.num_generated_tokens / gap if gap > 0 else 0.0
        self.num_generated_tokens = 0
        msg = f"Decode batch, #running-req: {batch}, {self._usage_parts(used, batch)}"
        if self.config.spec is not None:
            length = self.spec_accept_tokens / self.spec_forward_ct if self.spec_forward_ct else 0.0
            proposed = self.spec_proposed_drafts
            rate = self.spec_correct_drafts / proposed if proposed else 0.0
            self.spec_total_accept_tokens += self.spec_accept_tokens
            self.spec_total_forward_ct += self.spec_forward_ct
            self.spec_accept_tokens = self.spec_correct_drafts = self.spec_forward_ct = self.spec_proposed_drafts = 0
            self.last_accept_length, self.last_accept_rate = length, rate
            msg += f"accept len: {length:.2f}, accept rate: {rate:.2f}, "
        msg += (f"cuda graph: {self._graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                f"#queue-req: {len(self.waiting)}")
        self.log.info(msg)
        live = self.live_config.spec
        self.metrics.update_gauges(len(self.running), len(self.waiting), self.used_tokens(),
                                   self.last_gen_throughput, self.last_accept_length, self.last_accept_rate,
                                   live.steps if live else 0, live.draft if live else 0)

    # ---------------------------------------------------------------------------------------------- model

    def _natural_length(self, req: Request, seed: int, drawn: int | None) -> int:
        """Where the model would end the request's answer: about the length the request allows (a dataset's lengths
        come from real answers), or, for a request that allows far more than answers run or fewer than
        ``SHORTEST_ANSWER`` tokens (a warm-up's, a probe's), the profile's answer length. Drawn apart from the
        request's other randomness (but ``drawn``, the profile's answer length a request that ends naturally drew from
        it), so a request's draws are the same either way."""
        ends = random.Random(seed ^ 0x5EED)
        mean = self.profile.acceptance.mean_output_tokens
        if SHORTEST_ANSWER <= req.max_new_tokens <= 4 * mean:
            return max(1, round(req.max_new_tokens * ends.uniform(0.8, 1.2)))
        return drawn if drawn is not None else max(1, int(ends.expovariate(1.0 / mean)) + 1)

    def _reach(self, temperature: float, factor: float = 1.0) -> list[float]:
        key = (round(max(temperature, 0.0), 3), round(factor, 6))
        if key not in self._reach_cache:
            self._reach_cache[key] = model.reach_probabilities(self.profile, self._reach_spec, *key)
        return self._reach_cache[key]

    def _accepted(self, req: Request, steps: int) -> int:
        """Draft tokens accepted this step with a chain of ``steps`` (a tree's reach has one entry per step):
        drawn from the depth-reach probabilities, or, with noise off, exactly the expected number spread over
        steps (so timing follows the model precisely)."""
        past = req.reach_past and req.natural_length is not None and req.completion_tokens >= req.natural_length
        reach = (req.reach_past if past else req.reach)[:steps]
        if self.noise > 0:
            u = req.rng.random()
            return sum(1 for r in reach if u < r)
        req.carry += sum(reach)
        accepted = int(req.carry)
        req.carry -= accepted
        return accepted

    def _verify_complete(self, accepted: list[int]) -> None:
        """Feed the round's accepted drafts to its slot; a schedule knob of the wrong type fails there, as in
        SGLang's scheduler."""
        try:
            moved = self.controller.on_verify_complete(accepted, self._round_batch)
        except (TypeError, ValueError, ZeroDivisionError) as e:
            self.crash("running", f"{type(e).__name__}: {e}")
            return
        if moved is not None:
            self._activate(moved)

    def _jitter(self) -> float:
        if self.noise <= 0:
            return 1.0
        return 1.0 + 0.5 * self.noise * _clipped_gauss(self.rng)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix, by bisection on slice equality (C speed even for long prompts)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _clipped_gauss(rng: random.Random) -> float:
    return max(-3.0, min(3.0, rng.gauss(0.0, 1.0)))
