"""Measuring through an ssh-process target's default transport (the port forward over the real sshd on loopback):
at any token rate the figures agree with the truth as the direct ones do, or the level fails as client_bound with
its reason; never a silent error beyond what the figure's own spread allows (a tunnel the client cannot keep up
through reads 10-60% low)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autotune.bench.measure import Bench
from autotune.bench.workload import load_prompts
from autotune.engines import get_engine
from autotune.errors import TrialFailure
from autotune.run.health import wait_ready
from autotune.run.plan import make_plan
from autotune.sim.traffic import category_of
from autotune.studyfile.spec import WorkloadSpec, read_study_file
from autotune.targets.process import ProcessTarget
from autotune.testing.studies import one_config_space, write_study
from tests.support.ssh import SpecFactory
from tests.support.truths import level_truth

ENGINE = get_engine("sglang")
MAX_TOKENS = 128
#: level -> its size: the single stream (timed by the server) of 32 requests, and a window of 8 generations (256 short
#: requests) at concurrency 32
RUNS = ((1, 32), (32, 8))
#: how far a right figure may be from the truth: the single stream is timed by the server (within 0.5%); a window of
#: 256 requests at c32 wanders by about 1-1.5% (sd) with how queued arrivals bunch into prefills, and on (3, 1, 4)
#: it read +1.7% above the truth on average over 18 windows at x2 and x8 (the reference client: +0.7% over 5)
LIMITS = {1: 0.03, 32: 0.05}
#: the emulator's token rate: at the model's own speed (c32 about 1.7k tok/s) the client keeps up through the tunnel
#: even on a busy 2-core machine (at x2 a loaded CI machine spent 1.6% of the time outside the server, against 1.5%
#: allowed); at x32 it cannot keep up on any machine here
SPEEDUPS = (1, 32)


def _one_kind_of_prompts(directory: Path) -> Path:
    """The built-in raw prompts the emulator reads as chat. Its drafts are accepted by what a prompt asks (code and
    rewrites far better than chat), so 32 requests of the mixed set are a sample whose mix decides the single stream's
    figure (seed 0's 32 read 3.8% under the truth of all 240 for (8, 4, 11), on the live server and in the truth
    alike); this test is about the transport, so every request it sends is of one kind."""
    path = directory / "chat-prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in load_prompts("builtin", directory)
                            if category_of(p) == "chat"))
    return path


def _figure(url: str, prompts: list[str], level: int, size: int) -> float | str:
    """The level's figure through ``url``, or the client_bound failure's text."""
    workload = WorkloadSpec(max_tokens=MAX_TOKENS, concurrency=(level,), requests=size, window_generations=size,
                            warmup=1, max_repeats=1)
    try:
        m = Bench(url, ENGINE, workload, prompts, seed=0, levels=(level,)).run()
    except TrialFailure as e:
        assert e.reason == "client_bound", e
        return e.detail
    return m.summary(level)["output_tok_s"]


@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", [(3, 1, 4), (8, 4, 11)])
def test_tunnel_figures_are_right_or_client_bound(config: tuple[int, int, int], make_spec: SpecFactory,
                                                  cleanup, tmp_path: Path) -> None:
    steps, topk, draft = config
    prompts_file = _one_kind_of_prompts(tmp_path)
    prompts = load_prompts(prompts_file.name, tmp_path)
    rows = []
    for speedup in SPEEDUPS:
        study = write_study(tmp_path, f"k{speedup}", space=one_config_space(*config), args={
            "speculative-num-steps": steps, "speculative-eagle-topk": topk, "speculative-num-draft-tokens": draft,
            "sim-speedup": speedup, "sim-time-scale": 0.001},
            workload=f"max_tokens = {MAX_TOKENS}\nconcurrency = [1, 32]\nrequests = 32\nwindow_generations = 1\n"
                     f"prompts = \"{prompts_file.name}\"")
        plan = make_plan(read_study_file(str(study)))
        truth = level_truth(plan)
        spec = make_spec(tunnel=True)
        target = cleanup(ProcessTarget(spec))
        argv = plan.engine.render([sys.executable, "-m", "autotune.sim"],
                                  {**plan.baseline.args, "port": spec.server_port})
        deployment = target.deploy([*argv, "--sim-seed", "1"], {}, tmp_path / f"k{speedup}.log")
        wait_ready(deployment, ENGINE, 0.25, 60)
        for level, size in RUNS:
            for transport, url in (("direct", f"http://127.0.0.1:{spec.server_port}"),
                                   ("tunnel", deployment.base_url)):
                rows.append((speedup, level, transport, truth[level], _figure(url, prompts, level, size)))
        target.stop()
    table = "\n".join(f"x{k} c{c} {how}: " + (f"{got:.0f} vs truth {want:.0f} ({got / want - 1:+.1%})"
                                                if isinstance(got, float) else got) for k, c, how, want, got in rows)
    print(table)
    for _, level, _, want, got in rows:
        if isinstance(got, str):
            assert "the client fell behind the server" in got and "held fewer than" in got, table
        else:
            assert abs(got / want - 1) <= LIMITS[level], table
    # at the lowest speed every figure is measured, through the tunnel too
    assert all(isinstance(got, float) for k, _, _, _, got in rows if k == SPEEDUPS[0]), table
