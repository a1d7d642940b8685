"""The tuner's figures against the truth and against an independent client.

For configs from chains to topk-8 trees, short and long requests: `autotune bench` (the measurement every trial
makes) must agree with the emulator's own statement of the truth for the study's workload (`autotune sim surface
--study`) and with autotune/testing/reference_client.py, a closed-loop client that shares no code with autotune/bench.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from autotune.run import commands
from autotune.bench.workload import PromptStream, load_prompts
from autotune.run.plan import make_plan
from autotune.studyfile.spec import read_study_file
from autotune.testing.ports import free_port
from autotune.testing.studies import one_config_space, write_study
from autotune.testing import reference_client
from tests.support import truths

CONFIGS = [(1, 1, 2), (2, 1, 3), (4, 1, 5), (8, 1, 9), (3, 2, 7), (3, 4, 11), (2, 8, 9), (8, 8, 11)]


@dataclass(frozen=True)
class Setting:
    """One measurement of a config: ``size`` is the single stream's requests, or a concurrency level's window in
    generations (``level`` requests each)."""

    max_tokens: int
    objective: str
    speedup: float
    size: int
    level: int


#: Fast enough for a test, slow enough that both clients keep up (the single stream is timed by the server, so it may
#: run fast; a request under load spends a fixed few milliseconds in the client and the emulator's HTTP stack, about
#: 1% of a 96-token request at x1 or of a 512-token one at x4 here; on a slower CI machine (8, 8, 11)'s 96-token
#: requests at c8 and x1 spent 1.6% there, over the 1.5% a 3% tolerance allows, so that level runs at half the
#: model's speed); enough requests that the figures' own spread stays inside the limits (96-token requests differ by
#: about 6% in speed, 512-token ones by 3%; (8, 8, 11)'s more: 96 of them at c8 read 2.7% above the truth, so that
#: level takes 160, 20 generations). At concurrency 32, above every one of these configs' max_running_requests
#: (8-25), requests wait in the server's queue and the figure wanders with how their arrivals bunch into prefills: a
#: window of 256 96-token requests on (2, 1, 3) (21 running) read from +0.3% to +4.0% of the truth over six runs,
#: and the reference client's window wanders as much, hence the wider limit there
SETTINGS = [
    Setting(96, "single", 16, 128, 1), Setting(96, "concurrent", 0.5, 20, 8), Setting(96, "concurrent", 1, 8, 32),
    Setting(512, "single", 16, 32, 1), Setting(512, "concurrent", 4, 4, 8), Setting(512, "concurrent", 4, 1, 32),
]
LIMITS = {1: 0.02, 8: 0.03, 32: 0.04}
#: At the model's own speed or slower the measurements wait on the emulated GPU, not on this machine: a config's
#: emulator and both clients keep a tenth to a fifth of one core busy there (x0.5 and x1, here; the whole machine's
#: load average stayed under 0.5 with two at a time), so four configs are measured at a time, each in a process of
#: its own. The faster settings (x4, x16) keep more of a core busy and run
#: one at a time, and the truths are all worked out before any measurement starts.
LANES = 4
SLOWEST_SHARED = 1


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


def _study(directory: Path, config: tuple[int, int, int], setting: Setting, port: int | None = None) -> Path:
    steps, topk, draft = config
    s = setting
    return write_study(
        directory, f"s{steps}-{topk}-{draft}-{s.max_tokens}-c{s.level}-x{s.speedup:g}", objective=s.objective,
        space=one_config_space(*config), port=port,
        args={"speculative-num-steps": steps, "speculative-eagle-topk": topk, "speculative-num-draft-tokens": draft,
              "sim-speedup": s.speedup, "sim-time-scale": 0.001},
        workload=f"max_tokens = {s.max_tokens}\nconcurrency = [{s.level}]\nwarmup = 1\n"
                 + (f"requests = {s.size}" if s.level == 1 else f"window_generations = {s.size}"))


def _serve(directory: Path, seed: int, config: tuple[int, int, int], settings: list[Setting],
           truth: dict[Setting, dict[int, float]]) -> list[tuple]:
    """One emulator of ``config`` at the settings' (one) speedup, measured by `autotune bench` and by the reference
    client in turn for each setting: rows (config, setting, tuned, truth, reference, tuned's 95% half-width)."""
    port = free_port()
    studies = {s: _study(directory, config, s, port) for s in settings}
    plans = {s: make_plan(read_study_file(str(path))) for s, path in studies.items()}
    first = plans[settings[0]]
    argv = [*first.engine.render([sys.executable, "-m", "autotune.sim"], first.baseline.args), "--sim-seed", str(seed)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    tagged = (f"[reference {seed}-{i}] {p}" for i in range(1000) for p in load_prompts("builtin", directory))
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the emulator did not come up: {argv}")
            time.sleep(0.1)
        rows = []
        for s in settings:
            # what `autotune bench --study` prints (tests/bench/test_measurement.py runs the command; here its function)
            tuned = next(lv for lv in commands.bench(plans[s])["levels"] if lv["concurrency"] == s.level)
            want = truth[s][s.level]
            if s.level == 1:
                # the single stream's very requests again (`autotune bench` orders its prompts with seed 0): both see
                # the same server-side randomness, timed by the server in both; the cache is emptied first
                order = PromptStream(load_prompts("builtin", directory), 0)
                sent = [order.next() for _ in range(1 + s.size)][1:]   # after the one warm-up request
                httpx.post(url + "/flush_cache", timeout=10)
                reference = reference_client.single_stream(url, sent, s.max_tokens)["server_output_tok_s"]
            else:
                duration = s.level * s.max_tokens / want   # one request's time at that load
                ref = reference_client.closed_loop(url, [next(tagged) for _ in range(2000)], s.max_tokens, s.level,
                                                   ramp_s=1.5 * duration, window_s=max(duration * s.size, 1.0),
                                                   stagger_s=duration)
                assert ref["errors"] == 0, ref
                reference = ref["output_tok_s"]
            rows.append((config, s, tuned["output_tok_s"], want, reference, tuned["output_tok_s_rel_ci"]))
        return rows
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _lane(job: tuple) -> list[tuple]:
    return _serve(*job)


def _stop_on_sigterm() -> None:
    """A lane that is stopped (the test failed or timed out) still stops its emulator."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 12 minutes here beside a busy core; a CI machine may be slower
def test_figures_agree_with_truth_and_an_independent_client(tmp_path: Path) -> None:
    truth_dir = tmp_path / "truth"
    truth_dir.mkdir()
    studies = {(config, s): _study(truth_dir, config, s) for config in CONFIGS for s in SETTINGS}
    truths.work_out(list(studies.values()))
    truth = {key: truths.level_truth(make_plan(read_study_file(str(path)))) for key, path in studies.items()}

    # one emulator per config and speed, serving every setting at that speed
    jobs = []
    for n, config in enumerate(CONFIGS):
        for speedup in sorted({s.speedup for s in SETTINGS}, reverse=True):
            settings = [s for s in SETTINGS if s.speedup == speedup]
            work = tmp_path / f"c{n}-x{speedup:g}"
            work.mkdir()
            jobs.append((work, n, config, settings, {s: truth[config, s] for s in settings}))
    alone = [job for job in jobs if job[3][0].speedup > SLOWEST_SHARED]
    shared = sorted((job for job in jobs if job[3][0].speedup <= SLOWEST_SHARED),   # the longest first
                    key=lambda job: -sum(s.size * s.level * s.max_tokens / job[4][s][s.level] for s in job[3]))
    rows = [row for job in alone for row in _serve(*job)]
    pool = multiprocessing.get_context("spawn").Pool(LANES, initializer=_stop_on_sigterm)
    try:
        for found in pool.imap_unordered(_lane, shared):
            rows += found
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()

    for max_tokens in sorted({s.max_tokens for s in SETTINGS}):
        mine = [(config, s.level, s.speedup, tuned, want, ref, half) for config, s, tuned, want, ref, half in rows
                if s.max_tokens == max_tokens]
        mine.sort(key=lambda r: (CONFIGS.index(r[0]), r[1]))
        table = [f"max_tokens {max_tokens}: config, level, --sim-speedup: tuner / truth (error) / reference (error)"]
        table += [f"{config} c{c} x{k:g}: {tuned:.0f} / {want:.0f} ({tuned / want - 1:+.1%}) / {ref:.0f} "
                  f"({tuned / ref - 1:+.1%}), 95% interval +-{half:.1%}"
                  for config, c, k, tuned, want, ref, half in mine]
        print("\n".join(table))
        for config, c, _, tuned, want, reference, half in mine:
            # the single stream's few requests are a sample of the prompts, whose acceptance differs by what each
            # asks (the emulator's categories): against the truth over all of them it errs within its own interval
            bound = max(LIMITS[c], half) if c == 1 else LIMITS[c]
            assert abs(tuned / want - 1) <= bound, (config, c, "\n".join(table))
            assert abs(tuned / reference - 1) <= LIMITS[c], (config, c, "\n".join(table))
        # the interval `autotune best` reports and the search weighs rivals by: a 95% interval holds the truth in
        # about 19 of 20 launches (one from the spread of the requests' latencies under load held it in about half)
        loaded = [(tuned, want, half) for _, c, _, tuned, want, _, half in mine if c > 1]
        held = sum(abs(want / tuned - 1) <= half for tuned, want, half in loaded)
        assert held >= 0.75 * len(loaded), (held, len(loaded), "\n".join(table))
        for level in LIMITS:
            pairs = [(tuned, want) for _, c, _, tuned, want, _, _ in mine if c == level]
            rho = _spearman([a for a, _ in pairs], [b for _, b in pairs])
            assert rho >= 0.95, (level, rho, "\n".join(table))
