"""The tuner's figures against the truth and against an independent client.

For configs from chains to topk-8 trees, short and long requests: `autotune bench` (the measurement every trial
makes) must agree with the emulator's own statement of the truth for the study's workload (`autotune sim surface
--study`) and with tests/support/reference_client.py, a closed-loop client that shares no code with autotune/bench.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune import commands
from autotune.bench.workload import PromptStream, load_prompts
from autotune.plan import make_plan
from autotune.truth import study_surface
from autotune.study import load_study
from tests.studies import one_config_space, write_study
from tests.support import reference_client

CONFIGS = [(1, 1, 2), (2, 1, 3), (4, 1, 5), (8, 1, 9), (3, 2, 7), (3, 4, 11), (2, 8, 9), (8, 8, 11)]
#: max_tokens -> measurements: (objective, emulator speedup, size, concurrency levels); the size is the single stream's
#: requests, or a concurrency level's window in generations (c requests each). Fast enough for a test, slow enough that
#: both clients keep up (the single stream is timed by the server, so it may run fast; a request under load spends a
#: fixed few milliseconds in the client and the emulator's HTTP stack, about 1% of a 96-token request at x1 or of a
#: 512-token one at x4 here; on a slower CI machine (8, 8, 11)'s 96-token requests at c8 and x1 spent 1.6% there, over
#: the 1.5% a 3% tolerance allows, so that level runs at half the model's speed); enough requests that the figures' own
#: spread stays inside the limits (96-token requests differ by about 6% in speed, 512-token ones by 3%; (8, 8, 11)'s
#: more: 96 of them at c8 read 2.7% above the truth, so that level takes 160, 20 generations). At concurrency 32, above
#: every one of these configs' max_running_requests (8-25), requests wait in the server's queue and the figure wanders
#: with how their arrivals bunch into prefills: a window of 256 96-token requests on (2, 1, 3) (21 running) read from
#: +0.3% to +4.0% of the truth over six runs, and the reference client's window wanders as much, hence the wider limit
#: there
SETTINGS = {
    96: [("single", 16, 128, (1,)), ("concurrent", 0.5, 20, (8,)), ("concurrent", 1, 8, (32,))],
    512: [("single", 16, 32, (1,)), ("concurrent", 4, 4, (8,)), ("concurrent", 4, 1, (32,))],
}
LIMITS = {1: 0.02, 8: 0.03, 32: 0.04}


@pytest.fixture
def emulator() -> Iterator[callable]:
    started: list[subprocess.Popen[bytes]] = []

    def start(study: Path, seed: int) -> str:
        """The study's baseline config on the emulator, at the study's port; its URL once ready."""
        plan = make_plan(load_study(str(study)))
        argv = [*plan.engine.render([sys.executable, "-m", "autotune.sim"], plan.baseline.args), "--sim-seed",
                str(seed)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        started.append(proc)
        url = f"http://127.0.0.1:{plan.target.server_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the emulator did not come up")

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs: list[float]) -> list[int]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        out = [0] * len(xs)
        for rank, i in enumerate(order):
            out[i] = rank
        return out
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


def _measure(directory: Path, name: str, config: tuple[int, int, int], max_tokens: int, objective: str,
             speedup: int, size: int, levels: tuple[int, ...], seed: int, emulator, tagged) -> list[tuple]:
    """One emulator run: the truth, `autotune bench`'s figures and the reference client's, per level."""
    steps, topk, draft = config
    study = write_study(directory, name, objective=objective, space=one_config_space(*config), args={
        "speculative-num-steps": steps, "speculative-eagle-topk": topk, "speculative-num-draft-tokens": draft,
        "sim-speedup": speedup, "sim-time-scale": 0.001},
        workload=f"max_tokens = {max_tokens}\nconcurrency = {list(levels)}\nwarmup = 1\n"
                 + (f"requests = {size}" if levels == (1,) else f"window_generations = {size}"))
    # what `autotune sim surface --study` and `autotune bench --study` print (tests/test_measurement.py runs those
    # commands; here their functions, to spare two process starts per run)
    plan = make_plan(load_study(str(study)))
    truth = {int(c): v for c, v in study_surface(plan)["configs"][0]["level_tok_s"].items()}
    url = emulator(study, seed=seed)
    tuned = {lv["concurrency"]: lv for lv in commands.bench(plan)["levels"]}
    out = []
    for c in levels:
        if c == 1:
            # the single stream's very requests again (`autotune bench` orders its prompts with seed 0): both see
            # the same server-side randomness, timed by the server in both; the cache is emptied first
            order = PromptStream(load_prompts("builtin", directory), 0)
            sent = [order.next() for _ in range(1 + size)][1:]   # after the one warm-up request
            httpx.post(url + "/flush_cache", timeout=10)
            reference = reference_client.single_stream(url, sent, max_tokens)["server_output_tok_s"]
        else:
            duration = c * max_tokens / truth[c]   # one request's time at that load
            ref = reference_client.closed_loop(url, [next(tagged) for _ in range(2000)], max_tokens, c,
                                               ramp_s=1.5 * duration, window_s=max(duration * size, 1.0),
                                               stagger_s=duration)
            assert ref["errors"] == 0, ref
            reference = ref["output_tok_s"]
        out.append((config, c, speedup, tuned[c]["output_tok_s"], truth[c], reference,
                    tuned[c]["output_tok_s_rel_ci"]))
    return out


@pytest.mark.timeout(2400)  # 13 minutes here for 96 tokens beside a busy core; a CI machine may be slower
@pytest.mark.parametrize("max_tokens", sorted(SETTINGS))
def test_figures_agree_with_truth_and_an_independent_client(max_tokens: int, tmp_path: Path, emulator) -> None:
    tagged = iter(f"[reference {i}] {p}" for i in range(1000) for p in load_prompts("builtin", tmp_path))
    rows = []
    for n, config in enumerate(CONFIGS):
        for k, (objective, speedup, size, levels) in enumerate(SETTINGS[max_tokens]):
            rows += _measure(tmp_path, f"c{n}-{k}", config, max_tokens, objective, speedup, size, levels,
                             seed=n, emulator=emulator, tagged=tagged)
    table = [f"max_tokens {max_tokens}: config, level, --sim-speedup: tuner / truth (error) / reference (error)"]
    table += [f"{config} c{c} x{k}: {tuned:.0f} / {truth:.0f} ({tuned / truth - 1:+.1%}) / {ref:.0f} "
              f"({tuned / ref - 1:+.1%}), 95% interval +-{half:.1%}" for config, c, k, tuned, truth, ref, half in rows]
    print("\n".join(table))
    for config, c, _, tuned, truth, reference, _ in rows:
        assert abs(tuned / truth - 1) <= LIMITS[c], (config, c, "\n".join(table))
        assert abs(tuned / reference - 1) <= LIMITS[c], (config, c, "\n".join(table))
    # the interval `autotune best` reports and the search weighs rivals by: a 95% interval holds the truth in
    # about 19 of 20 launches (one from the spread of the requests' latencies under load held it in about half)
    loaded = [(tuned, truth, half) for _, c, _, tuned, truth, _, half in rows if c > 1]
    held = sum(abs(truth / tuned - 1) <= half for tuned, truth, half in loaded)
    assert held >= 0.75 * len(loaded), (held, len(loaded), "\n".join(table))
    for level in LIMITS:
        pairs = [(tuned, truth) for _, c, _, tuned, truth, _, _ in rows if c == level]
        rho = _spearman([a for a, _ in pairs], [b for _, b in pairs])
        assert rho >= 0.95, (level, rho, "\n".join(table))
