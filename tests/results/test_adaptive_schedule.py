"""`autotune best --format sglang-adaptive`: the schedule comes from the study's per-level estimates (chains within
the tolerance of the best chain at each load, levels mapped to running batch sizes), never holds what the study did
not measure, and is a file the emulator loads."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest

from autotune.results import adaptive_schedule, adaptive_versus_fixed, tally
from autotune.record import write
from autotune.engines import config_key, get_engine
from autotune.errors import UserError
from autotune.testing.ports import free_port
from autotune.testing.studies import write_study
from tests.support.cli import kept, run_autotune, status

ENGINE = get_engine("sglang")
BASE = {"model-path": "/m", "speculative-algorithm": "EAGLE"}
CROSSOVER = Path(__file__).parent.parent / "sim" / "data" / "crossover.toml"


def chain(steps: int, **extra) -> dict:
    return {**BASE, **extra, "speculative-num-steps": steps, "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": steps + 1}


def add(study: optuna.Study, config: dict, levels: dict[int, float], value: float, running: int = 48) -> None:
    """A measured trial of ``config``, written the way the objective writes one."""
    trial = study.ask()
    write.candidate(trial, {k: config[k] for k in config if k.startswith("speculative-num")}, config,
                     config_key(config))
    write.launched(trial, ENGINE.render(["autotune-sim"], config), "server.log")
    write.verified(trial, config_key(config), {"max_running_requests": running})
    write.measured(trial, {"max_running_requests": running},
                    [{"concurrency": c, "output_tok_s": v, "output_tok_s_rel_ci": 0.01} for c, v in levels.items()],
                    None)
    study.tell(trial, value)


def study_of(*trials: tuple[dict, dict[int, float], float] | tuple[dict, dict[int, float], float, int]):
    study = optuna.create_study(direction="maximize", study_name="s")
    for t in trials:
        add(study, *t)
    return study


def test_each_load_gets_the_chains_within_tolerance_of_its_best():
    study = study_of(
        (chain(7), {1: 500.0, 8: 1700.0, 32: 2400.0}, 1.00),
        (chain(6), {1: 490.0, 8: 1800.0, 32: 2530.0}, 1.02),
        (chain(5), {1: 470.0, 8: 1840.0, 32: 2660.0}, 1.04),
        (chain(3), {1: 410.0, 8: 1780.0, 32: 2790.0}, 1.03),
        # a tree: not a chain, never in the schedule, however fast
        ({**BASE, "speculative-num-steps": 3, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8},
         {1: 900.0, 8: 2000.0, 32: 3000.0}, 2.0),
    )
    s = adaptive_schedule.build(study, ENGINE, tolerance=0.03)
    assert s.document == {"1": {"candidate_steps": [6, 7]}, "2": {"candidate_steps": [5, 6]},
                          "9": {"candidate_steps": [3]}}
    assert [(x.concurrency, x.batch, x.best) for x in s.slots] == [(1, 1, 7), (8, 8, 5), (32, 32, 3)]
    assert s.skipped == [] and s.max_running_requests == 48 and s.deepest == 7
    # deployed on the chains' own config, starting (as SGLang would) on the middle of the union [3, 5, 6, 7]
    assert s.args == {**BASE, "speculative-num-steps": 6, "speculative-eagle-topk": 1,
                      "speculative-num-draft-tokens": 7, "speculative-adaptive": True,
                      "speculative-adaptive-config": "adaptive.json"}
    lines = adaptive_schedule.summary(s, lambda args: shlex.join(ENGINE.render(["sglang"], args)))
    assert lines[1].startswith("  batch 1       (c1, 1 running): steps [6, 7]; measured tok/s 7: 500.0 [")
    assert lines[3].startswith("  batch 9+      (c32, 32 running): steps [3]; measured tok/s 3: 2790.0 [")


def test_a_chains_figure_counts_only_at_the_batch_the_adaptive_server_runs():
    # a hybrid model: the 8-step chain's state pool holds 10 requests, the 4-step one's 15
    study = study_of(
        (chain(8), {1: 270.0, 8: 1300.0, 10: 1450.0, 32: 1500.0}, 1.0, 10),
        (chain(4), {1: 240.0, 8: 1200.0, 10: 1600.0, 32: 1870.0}, 1.1, 15),
    )
    s = adaptive_schedule.build(study, ENGINE, tolerance=0.03)
    # the adaptive server (sized for 8 steps) runs 10 requests at c32, where the 4-step chain ran 15: its 1870 tok/s
    # there is not a measurement of that batch; at c10 both ran 10, and the 4-step chain was faster
    assert [(x.key, x.concurrency, x.batch, x.steps) for x in s.slots] == [(1, 1, 1, (8,)), (9, 10, 10, (4,))]
    assert [(x.concurrency, x.batch) for x in s.skipped] == [(8, 8), (32, 10)]
    assert s.max_running_requests == 10 and s.deepest == 8
    lines = adaptive_schedule.summary(s, str)
    assert "  c8 adds no slot: the same chains as c1, whose slot serves it" in lines
    assert ("  c32 adds no slot: its batch of 10 routes like c10's (not counted, measured at another batch than 10: "
            "the 4-step chain ran 15)") in lines


def test_a_deep_chain_chosen_nowhere_does_not_size_the_server():
    # the 8-step chain was measured alone only (pruned after), and lost there: the server is sized for 4 steps
    study = study_of((chain(8), {1: 200.0}, 0.9, 10), (chain(4), {1: 240.0, 16: 1800.0}, 1.1, 15))
    s = adaptive_schedule.build(study, ENGINE, tolerance=0.03)
    assert s.document == {"1": {"candidate_steps": [4]}}
    assert s.max_running_requests == 15 and s.deepest == 4


def test_a_batch_that_pads_onto_the_previous_level_adds_no_slot():
    study = study_of((chain(5), {1: 100.0, 9: 600.0, 10: 650.0, 12: 800.0}, 1.0),
                     (chain(2), {1: 80.0, 9: 620.0, 10: 700.0, 12: 780.0}, 1.0))
    s = adaptive_schedule.build(study, ENGINE, tolerance=0.01)
    # a batch of 9 is padded to the captured size 10: levels 9 and 10 are one slot, from level 9
    assert [(x.key, x.concurrency, x.steps) for x in s.slots] == [(1, 1, (5,)), (2, 9, (2,)), (11, 12, (5,))]
    assert [(x.concurrency, x.batch) for x in s.skipped] == [(10, 10)]


def test_only_the_best_chains_family_and_only_measured_levels():
    other = {"mem-fraction-static": 0.7}
    study = study_of(
        (chain(4), {1: 300.0, 8: 1000.0}, 1.2),
        (chain(6), {1: 320.0}, 1.1),                    # measured at c1 only (pruned after it, say)
        (chain(2, **other), {1: 100.0, 8: 5000.0}, 0.5),  # another family: its fast c8 is not ours to use
    )
    s = adaptive_schedule.build(study, ENGINE, tolerance=0.03)
    assert s.document == {"1": {"candidate_steps": [6]}, "2": {"candidate_steps": [4]}}
    assert "mem-fraction-static" not in s.args


def test_no_chain_no_schedule():
    tree = {**BASE, "speculative-num-steps": 3, "speculative-eagle-topk": 2, "speculative-num-draft-tokens": 6}
    with pytest.raises(UserError, match="no feasible measured chain"):
        adaptive_schedule.build(study_of((tree, {1: 100.0}, 1.0)), ENGINE, tolerance=0.03)
    with pytest.raises(UserError, match="the llamacpp engine has no adaptive speculative mode"):
        adaptive_schedule.build(study_of((chain(3), {1: 100.0}, 1.0)), get_engine("llamacpp"), tolerance=0.03)
    # dp attention makes SGLang fall back to static params: such chains cannot make a schedule either
    with pytest.raises(UserError, match="no feasible measured chain"):
        adaptive_schedule.build(study_of((chain(3, **{"enable-dp-attention": True}), {1: 100.0}, 1.0)), ENGINE, 0.03)


def test_an_adaptive_server_is_compared_with_the_fixed_configs_never_ranked_among_them():
    study = study_of((chain(7), {1: 500.0, 32: 2400.0}, 1.00), (chain(3), {1: 410.0, 32: 2790.0}, 1.05))
    document = {"1": {"candidate_steps": [7]}, "2": {"candidate_steps": [3]}}
    trial = study.ask()
    trial.set_user_attr("adaptive", True)
    write.schedule(trial, document, "s-adaptive-trial-0002.json", [0, 1], 1, [])
    config = {**chain(5), "speculative-adaptive": True, "speculative-adaptive-config": "s-adaptive-trial-0002.json"}
    write.candidate(trial, {}, config, config_key(config))
    write.launched(trial, ENGINE.render(["autotune-sim"], config), "server.log")
    write.measured(trial, {}, [{"concurrency": 1, "output_tok_s": 495.0, "output_tok_s_rel_ci": 0.01},
                               {"concurrency": 32, "output_tok_s": 2780.0, "output_tok_s_rel_ci": 0.01}], None)
    study.tell(trial, 1.2)
    # faster on the objective than any fixed chain, yet no config to pick, nor a chain of a schedule
    assert tally.best(study).number == 1
    assert [r.best.trials for r in tally.per_concurrency(study)] == [(0,), (1,)]
    assert adaptive_schedule.build(study, ENGINE, tolerance=0.03).trials == [0, 1]
    c = adaptive_versus_fixed.compare(study)
    assert (c.trial, c.fixed_trial, c.built_from, c.schedule) == (2, 1, [0, 1], document)
    assert c.gain == pytest.approx(1.2 / 1.05 - 1) and c.verdict == "beat"
    # at c1 against the best fixed config (3 steps): +20.7%, beyond both intervals; against the fastest fixed
    # config there (7 steps) -1.0%, inside them
    c1, c32 = c.levels
    assert c1.against(c1.fixed) == (pytest.approx(495 / 410 - 1), "beat")
    assert c1.best_here_trial == 0 and c1.against(c1.best_here) == (pytest.approx(495 / 500 - 1), "tie")
    assert c32.against(c32.fixed) == (pytest.approx(2780 / 2790 - 1), "tie")
    assert adaptive_versus_fixed.lines(c)[2].split() == ["c1", "495.0", "490.1-499.9", "410.0", "405.9-414.1", "+20.7%",
                                                     "beat", "500.0", "0", "-1.0%", "(tie)"]


def test_the_engine_refuses_to_write_what_sglang_would_refuse():
    rules = ENGINE.adaptive
    with pytest.raises(ValueError, match=re.escape("BS 4: candidate_steps must be a list of non-negative ints, "
                                                   "got []")):
        rules.document({1: [3], 4: []})
    with pytest.raises(ValueError, match="at least one integer-string BS key"):
        rules.document({})
    assert rules.padded_batch(9, None) == 10 and rules.padded_batch(11, 11) == 11 and rules.padded_batch(33, 48) == 40


# ------------------------------------------------------------------------------------ a real study, end to end


CHAINS = ('[space.speculative-num-steps]\ntype = "categorical"\nchoices = [3, 5, 7]\n'
          '[space.speculative-eagle-topk]\ntype = "categorical"\nchoices = [1]\n')


@pytest.mark.slow
def test_best_writes_a_schedule_the_emulator_runs(tmp_path: Path):
    # the crossover test profile: 7 steps stream fastest alone, 5 at concurrency 8, 3 at 32
    study = write_study(tmp_path, "chains", sampler="grid", launches=3, space=CHAINS,
                        workload="max_tokens = 256\nconcurrency = [1, 8, 32]\nrequests = 8\nwindow_generations = 1\n"
                                 "warmup = 1\ntolerance = 0.2\nmax_repeats = 1",
                        args={"model-path": "/models/Llama-3.1-8B-Instruct", "tp-size": 1,
                              "sim-profile": str(CROSSOVER), "speculative-num-steps": 3,
                              "speculative-num-draft-tokens": 4, "sim-speedup": 1})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    r = run_autotune("best", "--study", str(study), "--format", "sglang-adaptive", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    schedule = json.loads(r.stdout)
    # the study's own figures, level by level, from `status --json` (a busy machine may have given a chain up)
    trials = [t for t in status(study)["trials"] if t["state"] == "COMPLETE"]
    figures = {t["params"]["speculative-num-steps"]: t["metrics"]["level_output_tok_s"] for t in trials}
    assert len(figures) >= 2, trials
    expected, last = {}, None
    for key, level in (("1", "1"), ("2", "8"), ("9", "32")):  # one running batch per level (48 fit every chain)
        best = max(f[level] for f in figures.values())
        steps = sorted(s for s, f in figures.items() if f[level] >= 0.8 * best)
        if steps != last:  # a level with the same chains as the slot before it is served by that slot
            expected[key] = {"candidate_steps": steps}
        last = steps
    assert schedule == expected
    # the emulator runs it, with the command best printed
    path = tmp_path / "adaptive.json"
    path.write_text(r.stdout)
    deploy = next(line for line in r.stderr.splitlines() if line.startswith("deploy: "))
    argv = shlex.split(deploy.removeprefix("deploy: "))
    assert argv[0] == "autotune-sim" and argv[argv.index("--speculative-adaptive-config") + 1] == "adaptive.json"
    argv[argv.index("--speculative-adaptive-config") + 1] = str(path)
    port = free_port()
    log = tmp_path / "server.err"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "autotune.sim", *argv[1:], "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        info = _ready(f"http://127.0.0.1:{port}", proc, log)
        assert info["speculative_adaptive"] is True
        union = sorted({s for slot in schedule.values() for s in slot["candidate_steps"]})
        assert info["speculative_num_steps"] == union[len(union) // 2]
        assert "AdaptiveSpeculativeParams initialized" in log.read_text()
    finally:
        proc.kill()
        proc.wait(10)


def _ready(url: str, proc: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return httpx.get(f"{url}/server_info", timeout=5).json()
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def test_format_sglang_adaptive_prints_the_file_only(tmp_path: Path):
    study = write_study(tmp_path, "s")
    r = run_autotune("best", "--study", str(study), "--format", "sglang-adaptive", "--json", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "--format sglang-adaptive prints the schedule file: no --json or --per-concurrency" in r.stderr


# ------------------------------------------------------- the adaptive server among a study's candidates, measured


@pytest.mark.slow
@pytest.mark.parametrize("loads", ["mix", "single"])
def test_a_study_measures_its_adaptive_server_against_its_best_fixed_chain(tmp_path: Path, loads: str):
    # the crossover profile: 7 steps stream fastest alone, 5 at concurrency 8, 3 at 32; the baseline is the 3-step
    # chain, the grid adds 5 and 7 (its 3 reuses the baseline): 3 launches, the fourth is the adaptive server's
    # on the mix, each slot the one chain fastest at its load (a tolerance of 1%); on the one load, a slot of every
    # chain within 20% of the fastest there
    levels = "concurrency = [1, 8, 32]\nmix = { 1 = 0.34, 8 = 0.33, 32 = 0.33 }\ntolerance = 0.01" if loads == "mix" \
        else "concurrency = [8]\nmix = { 8 = 1.0 }\ntolerance = 0.2"
    study = write_study(tmp_path, loads, sampler="grid", launches=4, space=CHAINS, objective="mix",
                        workload=f"max_tokens = 256\n{levels}\nrequests = 8\nwindow_generations = 1\nwarmup = 1\n"
                                 "max_repeats = 1",
                        args={"model-path": "/models/Llama-3.1-8B-Instruct", "tp-size": 1,
                              "sim-profile": str(CROSSOVER), "speculative-num-steps": 3,
                              "speculative-num-draft-tokens": 4, "sim-speedup": 1})
    study.write_text(study.read_text().replace("[study]\n", "[study]\nadaptive = true\n", 1))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = status(study)["trials"]
    # launched once, the study's last launch, counted against the budget of 4 (an attempt a busy machine cut short,
    # the adaptive server's too, is queued again and not counted: `kept`)
    ours = [t for t in kept(trials) if t["adaptive"]]
    assert len(ours) == 1 and ours[0]["state"] == "COMPLETE" and ours[0]["launched"], ours
    assert sum(t["launched"] for t in kept(trials)) == 4 and ours[0]["number"] == max(t["number"] for t in trials)
    ran = ours[0]
    assert ran["params"] == {} and ran["role"] == "adaptive"
    # its schedule is the one `best --format sglang-adaptive` writes from the fixed chains' measurements; the server
    # ran it from the file beside the study
    r = run_autotune("best", "--study", str(study), "--format", "sglang-adaptive", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ran["schedule"]["document"] == json.loads(r.stdout)
    command = ran["command"]
    assert "--speculative-adaptive" in command
    placed = Path(command[command.index("--speculative-adaptive-config") + 1])
    assert placed == tmp_path / ran["schedule"]["file"] and json.loads(placed.read_text()) == json.loads(r.stdout)
    fixed = {t["params"]["speculative-num-steps"]: t for t in trials
             if t["state"] == "COMPLETE" and not t["adaptive"] and t["reused_from"] is None}
    assert sorted(fixed) == [3, 5, 7], trials
    # best picks a fixed chain, and says how the adaptive server did against it, load by load, with intervals
    r = run_autotune("best", "--study", str(study), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["number"] != ran["number"] and doc["params"]["speculative-num-steps"] in fixed
    versus = doc["adaptive"]
    assert versus["trial"] == ran["number"] and versus["best_fixed"]["trial"] == doc["number"]
    assert versus["value"]["low"] < ran["value"] < versus["value"]["high"]
    assert [lv["concurrency"] for lv in versus["levels"]] == ([1, 8, 32] if loads == "mix" else [8])
    for lv in versus["levels"]:
        figure = ran["metrics"]["level_output_tok_s"][str(lv["concurrency"])]
        assert lv["adaptive"]["low"] < figure < lv["adaptive"]["high"]
        assert lv["gain"] == pytest.approx(figure / lv["best_fixed"]["value"] - 1)
    if loads == "mix":
        # each load runs the chain that served it best: on the mix it beats the best fixed chain
        assert versus["gain"] > 0 and versus["verdict"] != "lost", versus
    else:
        # on one load the slot holds the chains within the tolerance, and the controller walks by acceptance, not
        # speed: it does not beat the best fixed chain there (its figure, +-7% here with one window of 8 requests,
        # read from -2.7% to +2.9% of the fixed chain's over runs; never outside the intervals)
        assert len(ran["schedule"]["document"]) == 1 and versus["verdict"] != "beat", versus
    r = run_autotune("best", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"adaptive server (trial {ran['number']}; steps by batch " in r.stdout
    out = tmp_path / "report"
    assert run_autotune("report", "--study", str(study), "--out", str(out), cwd=tmp_path).returncode == 0
    summary = (out / "summary.md").read_text()
    assert "## Adaptive server against the best fixed config" in summary
    assert f"adaptive server (trial {ran['number']}; " in summary
