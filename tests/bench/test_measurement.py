"""Measurements a user can trust: failures under load, a server stopped mid-measurement, memory and latency
constraints, staged pruning, and `autotune bench` measuring what is deployed now."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import optuna
import pytest

from autotune import record
from autotune.bench.measure import Bench
from autotune.bench.workload import load_prompts
from autotune.engines import get_engine
from autotune.errors import TrialFailure
from autotune.studyfile.spec import WorkloadSpec
from autotune.testing.ports import free_port
from autotune.testing.studies import one_config_space, write_study
from tests.support.cli import run_autotune, status
from tests.support.emulator import start_emulator

FAST = ("max_tokens = 48\nconcurrency = [1, 4]\nrequests = 4\n"
        "window_generations = 1\nwarmup = 1\nstall_timeout = 2\ntolerance = 0.5")


@pytest.mark.slow
def test_failures_under_load_have_reasons_and_teach_the_sampler(tmp_path: Path) -> None:
    space = ('[space.sim-fault]\ntype = "categorical"\n'
             'choices = ["oom-under-load:2", "crash-after:150", "stall-after:100", "errors:1.0"]\n')
    study = write_study(tmp_path, sampler="grid", launches=5, space=space, workload=FAST)
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    by_fault = {t["params"].get("sim-fault"): t for t in status(study)["trials"]}
    assert by_fault["oom-under-load:2"]["reason"] == "oom_under_load"
    assert "CUDA out of memory" in by_fault["oom-under-load:2"]["detail"]
    assert by_fault["crash-after:150"]["reason"] == "crashed_under_load"
    assert by_fault["stall-after:100"]["reason"] == "stalled"
    assert by_fault["errors:1.0"]["reason"] == "errors"
    db = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    for t in db.trials[1:]:
        # infeasible, not retried: pruned with every constraint violated, so TPE ranks the region last
        assert t.state == optuna.trial.TrialState.PRUNED
        assert t.constraints == {"failed": 1.0}
        assert t.user_attrs["stage"] == "measuring"


@pytest.mark.timeout(60)
def test_a_server_stopped_mid_level_fails_the_measurement_at_once(tmp_path: Path) -> None:
    """SIGTERM (what `systemctl stop` sends) while 32 requests are in flight: the server shuts down, new connections
    are refused, and the measurement must end as the server's failure within moments, having sent a few hundred
    requests at most (the client once went on sending failed requests, thousands a second, for good)."""
    port = free_port()
    # an 8B model on one GPU: its requests finish quickly, so its slots are often between requests, connecting
    server = start_emulator(port, steps=3, topk=1, draft=4, speedup=1.5, model="/shared/models/Llama-3.1-8B-Instruct",
                            profile="llama8b", tp=1)
    workload = WorkloadSpec(max_tokens=128, concurrency=(32,), window_generations=32, warmup=1, max_repeats=1)

    def check() -> None:
        if server.poll() is not None:
            raise TrialFailure("crashed", f"the server exited with {server.returncode}")

    bench = Bench(f"http://127.0.0.1:{port}", get_engine("sglang"), workload, load_prompts("builtin", tmp_path),
                  check=check, levels=(32,))
    stopper = threading.Timer(1.0, server.send_signal, (signal.SIGTERM,))
    stopper.start()
    started = time.monotonic()
    try:
        with pytest.raises(TrialFailure) as failure:
            bench.run()
    finally:
        stopper.cancel()
        server.kill()
        server.wait()
    assert failure.value.reason in ("crashed", "errors"), failure.value
    assert time.monotonic() - started < 10
    records = [r for lv in bench.measurement.level(32) for r in lv.records]
    assert 32 <= len(records) < 500
    assert any(r.cancelled for r in records), "the requests in flight when the level ended were cut off"


@pytest.mark.slow
def test_memory_and_latency_constraints(tmp_path: Path) -> None:
    space = ('[space.speculative-num-steps]\ntype = "categorical"\nchoices = [1, 4]\n'
             '[space.speculative-eagle-topk]\ntype = "categorical"\nchoices = [1]\n'
             '[space.speculative-num-draft-tokens]\ntype = "categorical"\nchoices = [2]\n')
    # steps 1 admits 25 running requests on the emulated host, steps 4 only 15
    study = write_study(tmp_path, sampler="grid", launches=3, space=space, workload=FAST,
                        extra="[constraints]\nmin_running_requests = 20\n")
    assert run_autotune("run", "--study", str(study), cwd=tmp_path).returncode == 0
    # the grid's steps-1 point is the baseline itself: measured once, as trial 0
    rows = status(study)["trials"]
    assert len(rows) == 2
    trials = {t["params"]["speculative-num-steps"]: t for t in rows}
    assert trials[4]["reason"] == "constraints" and trials[4]["state"] == "PRUNED"
    assert "max_running_requests 15 < min_running_requests 20" in trials[4]["detail"]
    assert "levels" not in trials[4] or not trials[4].get("metrics"), \
        "a config failing the memory limit is not measured"
    assert trials[1]["state"] == "COMPLETE" and trials[1]["metrics"]["max_running_requests"] == 25

    # a latency ceiling nothing meets: everything is measured, nothing is feasible, nothing is "best"
    strict = write_study(tmp_path, "strict", sampler="grid", launches=2, space=space, workload=FAST,
                         extra="[constraints]\nmax_ttft_p99_ms = 0.01\n")
    assert run_autotune("run", "--study", str(strict), cwd=tmp_path).returncode == 0
    rows = status(strict)["trials"]
    assert all(t["state"] == "COMPLETE" and t["reason"] == "constraints" for t in rows)
    assert all(t["metrics"]["ttft_p99_ms"] > 0.01 for t in rows)
    r = run_autotune("best", "--study", str(strict), "--json")
    assert r.returncode == 2 and "no feasible measured trial" in r.stderr


@pytest.mark.alone
@pytest.mark.slow
def test_staged_pruning_stops_a_clearly_worse_config_early(tmp_path: Path) -> None:
    # five configs at about four times the model's speed (at ten times the client fell behind at concurrency 4 on a
    # busy machine, and a retried launch shifted the trials) and one ten times slower
    speeds = (4.0, 4.1, 4.2, 4.3, 4.4, 0.4)
    space = f'[space.sim-speedup]\ntype = "categorical"\nchoices = {list(speeds)}\n'
    study = write_study(tmp_path, sampler="random", objective="single", launches=7, space=space,
                        workload="max_tokens = 48\nconcurrency = [1, 4]\nrequests = 4\n"
                                 "window_generations = 1\nwarmup = 1\ntolerance = 0.5")
    # queue the five fast configs first, so the slow one meets a pruner that has seen enough
    db = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}", direction="maximize")
    record.study.describe(db, "single", study.read_text(), str(study))  # autotune's study, its first trials queued
    for speed in speeds:
        db.enqueue_trial({"sim-speedup": speed})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = status(study)["trials"]
    slow = trials[5]
    assert slow["params"] == {"sim-speedup": speeds[-1]}
    assert slow["state"] == "PRUNED" and slow["reason"] == "pruned" and slow["stage"] == "single"
    fast = [t for t in trials[:5] if t["state"] == "COMPLETE"]
    assert len(fast) == 5
    # the pruned trial measured only the single stream; the complete ones every level
    db = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    assert [lv["concurrency"] for lv in db.trials[5].user_attrs["levels"]] == [1]
    assert [lv["concurrency"] for lv in db.trials[0].user_attrs["levels"]] == [1, 4]
    assert "pruned after single" in r.stdout


@pytest.mark.alone
@pytest.mark.slow
def test_weighted_pruning_keeps_a_poor_single_stream_with_the_best_concurrent_figure(tmp_path: Path) -> None:
    # llama70b at concurrency 32 (`autotune sim surface --profile llama70b`): the deep topk-8 trees stream fastest
    # alone (253 tok/s) and reach about 2100 tok/s under load; the chain (3, 1, 4) streams at 172 tok/s alone, which
    # a pruner on the single stream drops, but it has the best concurrent figure (3032 tok/s) and an equal weighted
    # score. Pruning judges the whole objective, so it runs to the end.
    configs = [(5, 8, 32), (5, 8, 31), (5, 8, 30), (3, 1, 4)]
    space = "".join(f'[space.{name}]\ntype = "categorical"\nchoices = {sorted({c[i] for c in configs})}\n'
                    for i, name in enumerate(("speculative-num-steps", "speculative-eagle-topk",
                                              "speculative-num-draft-tokens")))
    study = write_study(tmp_path, sampler="random", launches=len(configs) + 1, space=space,
                        args={"model-path": "/shared/models/Llama-3.3-70B-Instruct", "tp-size": 8,
                              "sim-profile": "llama70b", "sim-speedup": 2},
                        workload="max_tokens = 128\nconcurrency = [1, 32]\nrequests = 32\n"
                                 "window_generations = 1\nwarmup = 1\n"
                                 "tolerance = 0.1")
    study.write_text(study.read_text().replace("[study]\n", '[study]\nranges = "fixed"\n'))  # the values as queued
    # the baseline first (the weighted score is relative to it), then the four configs in this order
    r = run_autotune("run", "--study", str(study), "--launches", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    db = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}")
    for steps, topk, draft in configs:
        db.enqueue_trial({"speculative-num-steps": steps, "speculative-eagle-topk": topk,
                          "speculative-num-draft-tokens": draft})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    by_config = {tuple(t["params"].values()): t for t in status(study)["trials"]}
    chain = by_config[(3, 1, 4)]
    assert chain["state"] == "COMPLETE", chain
    deep = [by_config[c] for c in configs[:3]]
    assert all(t["state"] == "COMPLETE" for t in deep)
    assert chain["metrics"]["single_tok_s"] < 0.8 * min(t["metrics"]["single_tok_s"] for t in deep)
    assert chain["metrics"]["concurrent_tok_s"] > 1.2 * max(t["metrics"]["concurrent_tok_s"] for t in deep)
    assert "pruned" not in r.stdout


@pytest.mark.alone
@pytest.mark.slow
def test_bench_measures_what_is_deployed_now(tmp_path: Path) -> None:
    port = free_port()
    # at twice the model's speed the client keeps up on a busy machine (at ten times it fell behind at c4)
    server = start_emulator(port, steps=3, topk=1, draft=4, speedup=2)
    try:
        workload = ("max_tokens = 256\nconcurrency = [1, 4]\nrequests = 8\n"
                    "window_generations = 2\nwarmup = 1\ntolerance = 0.1")
        # the deployed config alone, so `sim surface --study` computes only its truth
        study = write_study(tmp_path, port=port, space=one_config_space(3, 1, 4), args={"sim-speedup": 2},
                            workload=workload)
        r = run_autotune("bench", "--study", str(study), "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["server"]["speculative-num-steps"] == 3
        surface = run_autotune("sim", "surface", "--study", str(study), "--json", cwd=tmp_path)
        truth = next(c for c in json.loads(surface.stdout)["configs"]
                     if c["params"] == {"speculative-num-steps": 3, "speculative-eagle-topk": 1,
                                        "speculative-num-draft-tokens": 4})
        assert abs(out["metrics"]["single_tok_s"] / truth["single_tok_s"] - 1) < 0.05
        assert abs(out["metrics"]["concurrent_tok_s"] / truth["concurrent_tok_s"] - 1) < 0.05
        assert out["metrics"]["accept_length"] > 2.5
        assert [lv["concurrency"] for lv in out["levels"]] == [1, 4]
        assert not (tmp_path / "t.db").exists(), "bench deploys nothing and creates no study"
    finally:
        server.kill()
