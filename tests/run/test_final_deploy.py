"""The deploy at the end of a study (Tuner._finish): the best config, started once more after a failure of the
infrastructure, then the next-best config that beats the baseline, then the original; the log says which, and the
log of those starts (final.log) holds no secret.

Real servers (the emulator) on a local target that keeps its server at the end, as a remote target does; the server
command is a wrapper that makes the next N starts fail: a stale server (it runs the baseline's speculative flags, not
the requested ones: ``wrong_args``, the infrastructure's fault) or a crash at startup (the config's fault)."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx
import optuna
import pytest
from optuna.distributions import IntDistribution

from autotune.results.adaptive_schedule import file_name as adaptive_file_name
from autotune.run.plan import make_plan
from autotune.record import study as record_study
from autotune.studyfile.space import ServerFile
from autotune.studyfile.spec import read_study_file
from autotune.targets.local import LocalTarget, port_open
from autotune.testing.ports import free_port
from autotune.testing.studies import port_of, write_study
from autotune.run.tuner import RunOptions, Tuner
from tests.support.cli import run_autotune

KEY = "sk-final-deploy-6610"
STEPS, TOPK, DRAFT = "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"
WRAPPER = """#!{python}
import os, sys
args = sys.argv[1:]
left = int(open({counter!r}).read())
if left > 0:
    open({counter!r}, "w").write(str(left - 1))
    if {mode!r} == "crash":
        print("crashing on purpose", flush=True)
        sys.exit(1)
    for flag, value in (("--speculative-num-steps", 1), ("--speculative-num-draft-tokens", 2)):
        args[args.index(flag) + 1] = str(value)
os.execvp("autotune-sim", ["autotune-sim", *args])
"""


class KeptLocalTarget(LocalTarget):
    """The local target, leaving its server running at the end of a study as a remote target does."""

    keeps_server = True


def measured_study(plan: object, values: dict[int, float]) -> optuna.Study:
    """A study whose chains of ``values`` {steps: objective value} were measured (steps 1 is the baseline)."""
    study = optuna.create_study(direction="maximize")
    for steps, value in values.items():
        candidate = plan.space.candidate({STEPS: steps})  # type: ignore[attr-defined]
        argv = plan.engine.render(plan.spec.engine.command, candidate.args)  # type: ignore[attr-defined]
        study.add_trial(optuna.trial.create_trial(
            params={STEPS: steps}, distributions={STEPS: IntDistribution(1, 8)}, value=value,
            user_attrs={"params": {STEPS: steps}, "config": candidate.args, "config_key": candidate.key,
                        "command": argv, **({"baseline": True} if steps == 1 else {})}))
    return study


@pytest.mark.parametrize("mode, failures, ends_on, said", [
    ("stale", 0, 3, ["left running the best config: trial 1 (steps=3)"]),
    ("stale", 1, 3, ["the best config, trial 1 (steps=3), did not come up: wrong_args",
                     "starting it once more",
                     "left running the best config: trial 1 (steps=3) (at its second start)"]),
    ("stale", 2, 2, ["the best config, trial 1 (steps=3), did not come up: wrong_args",
                     "the best config, trial 1 (steps=3), did not come up again: wrong_args",
                     "left running the next-best config: trial 2 (steps=2)"]),
    ("crash", 1, 2, ["the best config, trial 1 (steps=3), did not come up: crashed",
                     "left running the next-best config: trial 2 (steps=2)"]),
    ("stale", 3, None, ["did not come up again", "the next-best config, trial 2 (steps=2), did not come up: wrong_args",
                        "neither the best nor the next-best config came up: restoring the original"]),
])
def test_the_final_deploy_retries_the_best_then_the_next_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, failures: int, ends_on: int | None,
        said: list[str]) -> None:
    counter = tmp_path / "fail-next"
    counter.write_text(str(failures))
    wrapper = tmp_path / "server"
    wrapper.write_text(WRAPPER.format(python=sys.executable, counter=str(counter), mode=mode))
    wrapper.chmod(0o755)
    path = write_study(tmp_path, space='[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = 8\n',
                       args={"sim-time-scale": 0.002})
    path.write_text(path.read_text().replace('command = ["autotune-sim"]', f'command = ["{wrapper}"]')
                    .replace("[engine.args]\n", '[engine.args]\napi-key = { env = "AUTOTUNE_TEST_FINAL_KEY" }\n'))
    monkeypatch.setenv("AUTOTUNE_TEST_FINAL_KEY", KEY)
    plan = make_plan(read_study_file(str(path)))
    # steps 5 is measured but does not beat the baseline: never deployed at the end
    study = measured_study(plan, {1: 1.0, 3: 1.6, 2: 1.3, 5: 0.9})
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("autotune")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not the attribute: it clears the level its children cached
    target = KeptLocalTarget(plan.target, cwd=tmp_path)
    try:
        best = Tuner(plan, RunOptions())._finish(study, target)
        running = None
        if ends_on is not None:
            info = httpx.get(f"http://127.0.0.1:{port_of(path)}/server_info",
                             headers={"Authorization": f"Bearer {KEY}"}, timeout=5).json()
            running = info["speculative_num_steps"]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        target.stop()
    assert best is not None and best.number == 1
    assert running == ends_on, lines
    text = "\n".join(lines)
    assert [s for s in said if s not in text] == [], text or "(no lines)"
    if mode == "crash":
        assert "starting it once more" not in text, "a config that crashed is not started again"
    final = (tmp_path / "t-logs" / "final.log").read_bytes()
    starts = final.count(b"server_args=") + final.count(b"crashing on purpose")
    assert starts == {0: 1, 1: 2, 2: 3, 3: 3}[failures], final[-2000:]
    assert b"'api_key': '***'" in final and KEY.encode() not in final


@pytest.mark.parametrize("how", ["another target", "a changed server_port"])
def test_apply_runs_the_recorded_config_on_the_target_in_force(tmp_path: Path, how: str) -> None:
    """A config measured on target a (its command names a's port) applied on target b, or after the study file moved
    the server to another port: the server starts on the port of the target in force, healthy, with the recorded
    config, and nothing starts on the old port."""
    path = write_study(tmp_path, space='[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = 8\n',
                       args={"sim-time-scale": 0.002})
    old, new = port_of(path), free_port()
    two = f'[targets.a]\nkind = "local"\nserver_port = {old}\n[targets.b]\nkind = "local"\nserver_port = {new}\n'
    path.write_text(path.read_text().replace(f'[target]\nkind = "local"\nserver_port = {old}\n', two))
    measured = make_plan(read_study_file(str(path)), "a")
    study = measured_study(measured, {1: 1.0, 3: 1.6})  # trial 1 (steps 3) is the best, run on a's port
    stored = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}", direction="maximize")
    record_study.describe(stored, "weighted", path.read_text(), str(path))
    for t in study.trials:
        stored.add_trial(t)
    assert f"--port {old}" in " ".join(stored.trials[1].user_attrs["command"])
    argv = ["apply", "--study", str(path), "--target", "b"]
    if how == "a changed server_port":
        path.write_text(path.read_text().replace(two, f'[target]\nkind = "local"\nserver_port = {new}\n'))
        argv = argv[:3]
    plan = make_plan(read_study_file(str(path)), "b" if "--target" in argv else None)
    target = LocalTarget(plan.target, cwd=tmp_path)
    try:
        r = run_autotune(*argv, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "trial 1 deployed and healthy" in r.stdout
        info = httpx.get(f"http://127.0.0.1:{new}/server_info", timeout=5).json()
        assert info["speculative_num_steps"] == 3 and info["port"] == new
        assert not port_open(old), "a server was started on the port of the target the trial ran on"
    finally:
        target._stop_orphan()  # the server apply left running, by the pid it recorded


def test_a_workers_final_deploy_runs_the_best_on_its_own_port(tmp_path: Path) -> None:
    """The best config of a study of two targets was measured by the worker on a: the worker on b leaves it running
    on b's port (its recorded command names a's)."""
    path = write_study(tmp_path, space='[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = 8\n',
                       args={"sim-time-scale": 0.002})
    a, b = port_of(path), free_port()
    path.write_text(path.read_text().replace(
        f'[target]\nkind = "local"\nserver_port = {a}\n',
        f'[targets.a]\nkind = "local"\nserver_port = {a}\n[targets.b]\nkind = "local"\nserver_port = {b}\n'))
    study = measured_study(make_plan(read_study_file(str(path)), "a"), {1: 1.0, 3: 1.6})
    plan = make_plan(read_study_file(str(path)), "b")
    target = KeptLocalTarget(plan.target, cwd=tmp_path)
    try:
        Tuner(plan, RunOptions())._finish(study, target)
        info = httpx.get(f"http://127.0.0.1:{b}/server_info", timeout=5).json()
        assert info["speculative_num_steps"] == 3 and info["port"] == b
        assert not port_open(a)
    finally:
        target.stop()


def test_apply_of_an_adaptive_server_places_its_schedule_again(tmp_path: Path) -> None:
    """An adaptive server's schedule file is written again where the target in force reads files (here it was
    deleted since the trial ran): the server starts with the recorded schedule."""
    path = write_study(tmp_path, space='[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = 8\n',
                       args={"sim-time-scale": 0.002})
    plan = make_plan(read_study_file(str(path)))
    rules = plan.engine.adaptive
    assert rules is not None
    slots = {1: [1, 3], 8: [1]}
    name = adaptive_file_name("t", 1)
    args = rules.deploy_args(plan.space.fixed, slots, name)
    document = rules.document(slots)
    candidate = plan.space.adaptive(args, ServerFile(rules.file_flag, name, json.dumps(document, indent=1)))
    stored = optuna.create_study(study_name="t", storage=f"sqlite:///{tmp_path / 't.db'}", direction="maximize")
    record_study.describe(stored, "weighted", path.read_text(), str(path))
    stored.add_trial(measured_study(plan, {1: 1.0}).trials[0])
    placed = tmp_path / name  # where the trial placed it, gone now
    stored.add_trial(optuna.trial.create_trial(value=1.2, user_attrs={
        "adaptive": True, "params": {}, "config": candidate.args, "config_key": candidate.key,
        "command": plan.engine.render(plan.spec.engine.command, {**candidate.args, rules.file_flag: str(placed)}),
        "schedule": {"document": document, "file": name, "built_from": [0], "family_trial": 0, "summary": []}}))
    target = LocalTarget(plan.target, cwd=tmp_path)
    try:
        r = run_autotune("apply", "--study", str(path), "--trial", "1", cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        info = httpx.get(f"http://127.0.0.1:{port_of(path)}/server_info", timeout=5).json()
        assert info["speculative_adaptive"] is True
        assert json.loads(Path(info["speculative_adaptive_config"]).read_text()) == document
    finally:
        target._stop_orphan()  # the server apply left running, by the pid it recorded
