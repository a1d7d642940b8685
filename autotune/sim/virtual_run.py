"""The emulator's own account of a workload: the figures a perfect client would measure on it, free of measurement
noise.

The emulator's scheduler (scheduler.py: the same code, and the same per-request variation, a running emulator
serves with) is driven on a virtual clock, over runs long enough that the figures settle (about 0.3%; a
deterministic run would lock into one arbitrary pattern of completions, which the variation keeps mixing), by a
client that reacts at once:

* single stream: one request at a time over the workload's prompts; the figure is completion tokens over the
  requests' whole time (sent to last token, prefill included), as autotune measures it;
* concurrency c: a closed loop of c requests in flight, a new one sent as soon as one finishes. The client's request
  reaches the server while it is in its next iteration (any real client does), so it joins the one after. The ramp
  (the first request of each slot, of graded lengths, so completions spread as they do in steady state) is left
  out; the figure is the output tokens emitted in the window that follows, over its length.

Figures are at the server's speed, i.e. multiplied by ``--sim-speedup`` as the running emulator would serve them.
An adaptive server (``--speculative-adaptive``) is driven the same way: its controller routes each decode batch and
moves between steps inside the scheduler, so its truth comes from the code path that serves it.
"""
from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass

from autotune.sim import model
from autotune.sim.args import build_parser, resolve, sim_options
from autotune.sim.faults import Faults
from autotune.sim.metrics import Metrics
from autotune.sim.profile import load_profile
from autotune.sim.scheduler import Clock, Request, Scheduler

#: a replacement request arrives this long (model seconds) after the request it replaces ended: after the server
#: began its next iteration
REACTION = 1e-9


@dataclass(frozen=True)
class Length:
    """How long the virtual runs are: the single stream's requests, and the completions inside a concurrency level's
    steady-state window per request in flight. By default the figures settle to about 0.1% (single stream) and
    0.3-0.4% (concurrency 32) of each other over seeds; ``QUICK`` runs a third as long and settles to about 0.2% and
    0.4-0.5%, for benches that need the truth of many hosts."""

    single_requests: int = 1000
    window_turns: int = 30


FULL = Length()
QUICK = Length(single_requests=300, window_turns=10)
_QUIET = logging.getLogger("autotune.sim.virtual_run")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class VirtualClock(Clock):
    """Model seconds, moved by the driver (never by the wall clock)."""

    def __init__(self) -> None:
        super().__init__(1.0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


@dataclass(frozen=True)
class Ask:
    """One request of a workload as the emulator sees it: its prompt's length in tokens (a chat template's included),
    its size, what it asks for (sim/traffic.py's category), whether a chat template wraps it, and how it samples and
    ends."""

    prompt_tokens: int
    max_tokens: int
    category: str = "chat"
    chat: bool = False
    temperature: float = 0.0
    ignore_eos: bool = True


Workload = list[int] | list[Ask]


@dataclass(frozen=True)
class Truth:
    """Noise-free figures of one config for one workload (tok/s at the emulator's --sim-speedup).

    ``accept_length`` is the model's expectation for a fixed config; for an adaptive server, whose steps move with
    the load and its controller, the mean accept length its single stream saw."""

    single_tok_s: float
    level_tok_s: dict[int, float]
    accept_length: float
    max_running_requests: int
    fits: bool
    error: str | None = None


def server(argv: list[str], seed: int = 0) -> tuple[Scheduler, VirtualClock, float]:
    """A scheduler for the emulator started with SGLang arguments ``argv`` (its --sim-* options included, but not
    its faults), on a virtual clock; and its --sim-speedup."""
    ns = build_parser().parse_args(argv)
    profile = load_profile(ns.sim_profile)
    resolved = resolve(ns, argv, profile, lambda message: None)
    options = sim_options(ns)
    plan = model.memory_plan(profile, resolved.config)
    clock = VirtualClock()
    metrics = Metrics(resolved.served_model_name, plan.max_total_num_tokens)
    noise = profile.noise if options.noise is None else options.noise
    scheduler = Scheduler(profile, resolved.config, plan, speedup=1.0, noise=noise, seed=seed, faults=Faults(),
                          log=_QUIET, decode_log_interval=1 << 30, metrics=metrics,
                          crash=lambda phase, exception: None, clock=clock)
    scheduler.serving = True
    return scheduler, clock, options.speedup


def figures(argv: list[str], prompt_lengths: Workload, max_tokens: int, levels: list[int],
            temperature: float = 0.0, seed: int = 0, runs: Length = FULL) -> Truth:
    """The figures of the emulator started with ``argv`` for a workload: prompts of ``prompt_lengths`` tokens (used
    in a shuffled order, as the client does), ``max_tokens`` per request, at concurrency 1 and each of ``levels``;
    or the workload's own requests (``Ask``s: their sizes, kinds and sampling instead of ``max_tokens`` and
    ``temperature``); ``runs``: how long the virtual runs are. With ``Ask``s the accept length is the one the single
    stream saw (it varies by request)."""
    scheduler, _, speedup = server(argv)
    plan, spec = scheduler.plan, scheduler.config.spec
    length = model.accept_length(scheduler.profile, spec, temperature)
    if plan.error is not None:
        return Truth(0.0, {c: 0.0 for c in levels}, length, plan.max_running_requests, False, plan.error)
    alone = server(argv, seed)[:2]
    single = _single(alone, _Prompts(prompt_lengths, seed), max_tokens, temperature, runs.single_requests)
    if scheduler.controller is not None or _asks(prompt_lengths):  # it varies: what the single stream saw
        length = alone[0].spec_accept_length_so_far or length
    level = {c: _closed_loop(server(argv, seed + c)[:2], _Prompts(prompt_lengths, seed + c), max_tokens, c,
                             runs.window_turns, temperature).tok_s for c in sorted(set(levels)) if c > 1}
    if 1 in levels:
        level[1] = single
    return Truth(single * speedup, {c: v * speedup for c, v in level.items()}, length, plan.max_running_requests,
                 True)


def _asks(workload: Workload) -> bool:
    return bool(workload) and isinstance(workload[0], Ask)


class _Prompts:
    """Distinct prompts of the given lengths (or requests) in a shuffled order (first tokens differ: no prefix is
    ever shared)."""

    def __init__(self, lengths: Workload, seed: int) -> None:
        self._lengths = list(lengths)
        random.Random(seed).shuffle(self._lengths)
        self._n = 0

    def next(self) -> tuple[list[int], Ask | None]:
        item = self._lengths[self._n % len(self._lengths)]
        self._n += 1
        n = item.prompt_tokens if isinstance(item, Ask) else item
        return [self._n, *([7] * max(0, n - 1))], item if isinstance(item, Ask) else None


def _request(prompts: _Prompts, max_tokens: int, temperature: float, share: float = 1.0) -> Request:
    """The next request; ``share``: the part of its size it asks for (a ramp request's)."""
    ids, ask = prompts.next()
    if ask is None:
        size = max(1, round(max_tokens * share))
        return Request(prompt_ids=ids, max_new_tokens=size, ignore_eos=True, temperature=temperature, stream=True,
                       log_metrics=False)
    return Request(prompt_ids=ids, max_new_tokens=max(1, round(ask.max_tokens * share)), ignore_eos=ask.ignore_eos,
                   temperature=ask.temperature, stream=True, log_metrics=False, category=ask.category, chat=ask.chat)


def _single(run: tuple[Scheduler, VirtualClock], prompts: _Prompts, max_tokens: int, temperature: float,
            requests: int) -> float:
    """Tokens over the whole request time, one request at a time."""
    scheduler, clock = run
    tokens = seconds = 0.0
    for _ in range(requests):
        req = scheduler.submit(_request(prompts, max_tokens, temperature))
        sent = clock.now()
        while not req.finished:
            _advance(scheduler, clock)
        tokens += req.completion_tokens
        seconds += clock.now() - sent
    return tokens / seconds


@dataclass(frozen=True)
class Load:
    """A closed loop's steady state at one concurrency (model seconds): output tok/s, and of the requests that
    finished inside the window, each one's time to its first token and every gap between its token-carrying
    emissions (a speculative step's accepted tokens leave in one emission: one gap)."""

    tok_s: float
    ttft: list[float]
    itl: list[float]


def load(argv: list[str], prompt_lengths: Workload, max_tokens: int, concurrency: int, temperature: float = 0.0,
         seed: int = 0, runs: Length = FULL) -> Load:
    """The steady state of the emulator started with ``argv`` under a closed loop of ``concurrency`` requests (1: one
    request at a time, measured like any other load), its times in model seconds (divide by --sim-speedup for the
    server's)."""
    return _closed_loop(server(argv, seed + concurrency)[:2], _Prompts(prompt_lengths, seed + concurrency),
                        max_tokens, concurrency, runs.window_turns, temperature)


def _closed_loop(run: tuple[Scheduler, VirtualClock], prompts: _Prompts, max_tokens: int, concurrency: int,
                 turns: int, temperature: float) -> Load:
    scheduler, clock = run
    ramp = []
    for i in range(concurrency):
        req = _request(prompts, max_tokens, temperature, (i + 1) / concurrency)
        ramp.append(scheduler.submit(req))
    in_flight = list(ramp)
    sent = {id(r): 0.0 for r in ramp}
    emitted: dict[int, list[float]] = {id(r): [] for r in ramp}
    window_start: float | None = None
    tokens_at_start = 0
    finished_in_window = 0
    ttft: list[float] = []
    itl: list[float] = []
    while True:
        before = {id(r): r.completion_tokens for r in in_flight}
        _advance(scheduler, clock)
        for r in in_flight:
            if r.completion_tokens > before[id(r)]:
                emitted[id(r)].append(clock.now())
        done = [r for r in in_flight if r.finished]
        if not done:
            continue
        if window_start is None and all(r.finished for r in ramp):
            window_start, tokens_at_start = clock.now(), scheduler.total_generated
        elif window_start is not None:
            finished_in_window += len(done)
            for r in done:
                times = emitted[id(r)]
                ttft.append(times[0] - sent[id(r)])
                itl.extend(b - a for a, b in itertools.pairwise(times))
            if finished_in_window >= turns * concurrency:
                return Load((scheduler.total_generated - tokens_at_start) / (clock.now() - window_start), ttft, itl)
        end = clock.now()
        clock.t = end + REACTION
        in_flight = [r for r in in_flight if not r.finished]
        for _ in done:
            req = scheduler.submit(_request(prompts, max_tokens, temperature))
            sent[id(req)], emitted[id(req)] = clock.now(), []
            in_flight.append(req)
        clock.t = end


def _advance(scheduler: Scheduler, clock: VirtualClock) -> None:
    """Run the scheduler's next iteration on the virtual clock."""
    iteration = scheduler.next_iteration()
    if iteration is None:
        raise RuntimeError("the emulated server has nothing to do")
    if iteration.crash is not None:
        raise RuntimeError(f"the emulated server died: {iteration.crash.splitlines()[0]}")
    clock.t = max(clock.t, iteration.end)
    scheduler.finish(iteration)
