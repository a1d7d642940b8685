"""The engine on the target asked before a config's first launch (autotune/run/hostresolve.py), on the emulator as a
local target: a config it rejects is pruned with its own message and costs no launch, one it rewrites is recorded
as what runs (and reused when that was measured), answers are kept in the study, and a host that cannot answer is
said once while the rules decide. (The same through the real test sshd: tests/ssh/test_host_resolution.py.)"""
from __future__ import annotations

import ast
import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.engines.sglang import SGLang
from autotune.errors import HostRejected
from autotune.run.hostresolve import HostResolver
from autotune.targets.local import LocalSpec, LocalTarget
from autotune.targets.programs import FIND_ENGINE_PYTHON, script, source
from autotune.testing.studies import write_study
from tests.support.cli import run_autotune, status
from tests.support.host_resolution import TOO_LONG, assert_host_decided, host_space

ENGINE = SGLang()


@pytest.mark.slow
def test_a_study_prunes_what_the_host_rejects_and_runs_what_it_rewrites(tmp_path: Path) -> None:
    study = write_study(tmp_path, sampler="grid", launches=4, space=host_space(),
                        args={"sim-fault": "force-arg:page-size=16"})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert_host_decided(status(study), (tmp_path / "t.log").read_text())
    shown = run_autotune("status", "--study", str(study), cwd=tmp_path).stdout
    assert "host_rejected: ValueError: Warning: User-specified context_length (1000000)" in shown
    assert "the target ran page-size=16 (not 1)" in shown


@pytest.mark.slow
def test_an_older_host_is_said_once_and_the_rules_decide(tmp_path: Path) -> None:
    space = f'[space.context-length]\ntype = "categorical"\nchoices = [4096, {TOO_LONG}]\n'
    study = write_study(tmp_path, sampler="grid", launches=3, space=space, args={"sim-fault": "old-release"})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "t.log").read_text()
    said = [line for line in log.splitlines() if "cannot be asked about a config" in line]
    assert len(said) == 1 and "hostargs.ServerArgs has no resolve_once()" in said[0], said
    trials = status(study)["trials"]
    assert not [t for t in trials if t["reason"] == "host_rejected" or t["host_rewrote"]]
    # the rules do not know the model's context length: that config is launched, and SGLang refuses it at start
    long = [t for t in trials if t["params"].get("context-length") == TOO_LONG]
    assert len(long) == 1 and long[0]["launched"] and long[0]["reason"] == "invalid_args", long


def _args(context: int) -> dict[str, object]:
    return ENGINE.resolve({"model-path": "/m", "context-length": context, "port": 30000})


def test_answers_are_kept_in_the_study_for_a_resumed_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    target = LocalTarget(LocalSpec(engine="sglang"), cwd=tmp_path)
    asked = HostResolver(ENGINE, target, [sys.executable, "-m", "autotune.sim"], {})
    with pytest.raises(HostRejected, match=r"User-specified context_length \(1000000\)"):
        asked.effective(_args(TOO_LONG), "long", study)
    assert asked.effective(_args(4096), "short", study) == _args(4096)

    # a resumed run whose host can no longer answer still knows what it answered, and asks nothing new
    resumed = HostResolver(ENGINE, target, [str(tmp_path / "gone" / "python3"), "-m", "autotune.sim"], {})
    with caplog.at_level(logging.INFO, logger="autotune"):
        with pytest.raises(HostRejected, match=r"context_length \(1000000\)"):
            resumed.effective(_args(TOO_LONG), "long", study)
        assert resumed.available is None  # answered from the study: never asked
        assert resumed.effective(_args(8192), "other", study) == _args(8192)
        assert resumed.effective(_args(16384), "another", study) == _args(16384)
    said = [r.getMessage() for r in caplog.records if "cannot be asked" in r.getMessage()]
    assert len(said) == 1 and "gone/python3" in said[0], said


def _engine_python(command: str) -> subprocess.CompletedProcess[str]:
    """The words of the python that runs ``command``, one a line (FIND_ENGINE_PYTHON)."""
    return subprocess.run(["sh", "-c", f"CMD={shlex.quote(command)}\n{FIND_ENGINE_PYTHON}\nprintf '%s\\n' \"$@\""],
                          capture_output=True, text=True, check=False)


def test_the_python_of_a_server_command(tmp_path: Path) -> None:
    trampoline = tmp_path / "sglang"  # pip's console script when its interpreter's path is too long for #!
    trampoline.write_text("#!/bin/sh\n'''exec' \"/opt/a very long/venv/bin/python\" \"$0\" \"$@\"\n' '''\n")
    script = tmp_path / "autotune-sim"
    script.write_text("#!/usr/bin/env python3\nprint()\n")
    for path in (trampoline, script):
        path.chmod(0o755)
    assert _engine_python(str(trampoline)).stdout.splitlines() == ["/opt/a very long/venv/bin/python"]
    assert _engine_python(str(script)).stdout.splitlines() == ["/usr/bin/env", "python3"]
    assert _engine_python("/usr/bin/python3").stdout.splitlines() == ["/usr/bin/python3"]
    assert _engine_python("/opt/my env/bin/python3.11").stdout.splitlines() == ["/opt/my env/bin/python3.11"]
    binary = _engine_python("/bin/ls")
    assert binary.returncode == 126 and "/bin/ls is not a Python program" in binary.stderr
    missing = _engine_python(str(tmp_path / "nothing"))
    assert missing.returncode == 127 and "is not found" in missing.stderr


def test_a_server_python_whose_path_has_a_space_answers(tmp_path: Path) -> None:
    """The python of ``/opt/my envs/py */bin/python3 -m sglang.launch_server`` is one word, spaces and a glob
    character included: asked, it answers (split, it was not found, and the host said it could not answer)."""
    where = tmp_path / "my envs" / "py *" / "bin"
    where.mkdir(parents=True)
    (where / "python3").symlink_to(sys.executable)
    target = LocalTarget(LocalSpec(engine="sglang"), cwd=tmp_path)
    question = ENGINE.host.question([str(where / "python3"), "-m", "autotune.sim"], ["--model-path", "/m"])
    assert not isinstance(question, str) and question.launcher == str(where / "python3")
    done = target.run_engine_program(question.launcher, "engine_resolve",
                                     json.dumps({**question.request, "op": "resolve"}).encode(), 60)
    assert done.ok, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["answer"] == "resolved"


def test_the_emulator_answers_as_sglang_does(tmp_path: Path) -> None:
    """The question program, run with the emulator's python, answers what the emulator's own start would do."""
    target = LocalTarget(LocalSpec(engine="sglang"), cwd=tmp_path)
    command = [sys.executable, "-m", "autotune.sim"]

    def ask(*flags: str) -> dict[str, object]:
        question = ENGINE.host.question(command, ["--model-path", "/m", *flags])
        assert not isinstance(question, str)
        done = target.run_engine_program(question.launcher, "engine_resolve",
                                         json.dumps({**question.request, "op": "probe"}).encode(), 60)
        return json.loads(done.stdout.splitlines()[-1])

    ran = ask("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "9")
    assert ran["answer"] == "resolved" and ran["gpus"] and "NVIDIA" in ran["gpus"][0]
    values = ran["values"]
    assert (values["speculative_algorithm"], values["speculative_num_draft_tokens"]) == ("EAGLE", 4)
    refused = ask("--no-such-flag", "1")
    assert refused["answer"] == "rejected" and "unrecognized arguments: --no-such-flag" in refused["message"]
    old = ask("--sim-fault", "old-release")
    assert old["answer"] == "unavailable" and "resolve_once" in old["reason"]


def test_the_question_is_python_36(tmp_path: Path) -> None:
    """It runs with whatever python the engine's launcher has: 3.6's grammar, the standard library, and an answer
    (not a traceback) from a python without the engine."""
    ast.parse(source("engine_resolve"), feature_version=(3, 6))
    request = {"op": "probe", "module": "no_such_engine.server_args", "factory": "f", "resolve": "r", "result": "d",
               "args": []}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script("engine_resolve")], input=json.dumps(request),
                          capture_output=True, text=True, timeout=60, env={"PATH": "/nonexistent"}, check=False)
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["answer"] == "unavailable" and "No module named 'no_such_engine'" in answer["reason"], answer
    assert answer["gpus"] == []  # no nvidia-smi on that PATH


@pytest.mark.slow
def test_the_rules_take_the_gpu_read_at_preflight(tmp_path: Path) -> None:
    """The emulator's profile is a Llama on an H100: read at preflight, the rules predict SGLang's default backend
    for it (fa3 for a chain, flashinfer for a tree), and the servers run what was predicted."""
    space = '[space.speculative-eagle-topk]\ntype = "categorical"\nchoices = [1, 4]\n'
    study = write_study(tmp_path, sampler="grid", launches=2, space=space,
                        args={"sim-profile": "llama8b", "tp-size": 1, "model-path": "/m"})
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    log = (tmp_path / "t.log").read_text()
    assert "1 x NVIDIA H100 80GB HBM3 (compute capability 9.0), serving LlamaForCausalLM" in log
    trials = status(study)["trials"]
    backends = {t["config"]["speculative-eagle-topk"]: t["config"]["attention-backend"] for t in trials}
    assert backends == {1: "fa3", 4: "flashinfer"}, trials
    assert all(t["state"] == "COMPLETE" and t["launched"] for t in trials), trials
