"""What the tuner takes of the host's answer, and for how long it keeps it (autotune/run/hostresolve.py, hostrules.py):
the engine's own values only, never a flag autotune or the target owns nor a value the study's rules refuse; an answer
stands while the host that gave it does (its SGLang, its GPU, its model), and `run --forget-host-answers` forgets them
all. The host is a real python importing a stand-in SGLang (tests/support/fake_sglang.py)."""
from __future__ import annotations

import logging
from pathlib import Path

import optuna
import pytest

from autotune.engines.sglang import SGLang
from autotune.run.hostresolve import HostResolver
from autotune.record import study as record_study
from autotune.studyfile.spec import ParamSpec
from autotune.targets.local import LocalSpec, LocalTarget
from autotune.testing.studies import one_config_space, write_study
from tests.support.cli import kept, run_autotune, status
from tests.support.fake_sglang import FakeSGLang

ENGINE = SGLang()
STEPS = ParamSpec(name="speculative-num-steps", type="int", low=1, high=4)


def _resolver(host: FakeSGLang, tmp_path: Path) -> HostResolver:
    target = LocalTarget(LocalSpec(engine="sglang", env=host.env), cwd=tmp_path)
    return HostResolver(ENGINE, target, host.command, host.env, (STEPS,))


def _args(model: str = "/m", steps: int = 2) -> dict[str, object]:
    return ENGINE.resolve({"model-path": model, "port": 30000, "host": "127.0.0.1", "api-key": "k-123",
                           "speculative-algorithm": "EAGLE", "speculative-num-steps": steps,
                           "speculative-eagle-topk": 1, "speculative-num-draft-tokens": steps + 1, "page-size": 1,
                           "context-length": 4096, "attention-backend": "fa3"})


def test_a_hosts_answer_changes_only_the_engines_own_values(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = FakeSGLang(tmp_path / "host")
    host.answer({"port": 31999, "host": "0.0.0.0", "model_path": "/elsewhere", "api_key": "stolen",
                 "speculative_num_steps": "3;$(touch pwned)\n", "context_length": "4096 --port 1",
                 "attention_backend": "-oProxyCommand=x", "page_size": 16})
    asked = _resolver(host, tmp_path)
    with caplog.at_level(logging.INFO, logger="autotune"):
        runs = asked.effective(_args(), "k", None)
    assert runs == {**_args(), "page-size": 16}  # the engine's own rewrite, and nothing else
    said = "\n".join(r.getMessage() for r in caplog.records)
    for flag, why in [("port", "the server's port"), ("host", "the address autotune reaches the server at"),
                      ("model-path", "the model the study measures"), ("api-key", "the API key autotune sends"),
                      ("speculative-num-steps", "speculative-num-steps is a number (int), not text"),
                      ("context-length", "context-length is a number (int), not text"),
                      ("attention-backend", "opens with '-'")]:
        assert f"the engine there answers {flag}=" in said and why in said, (flag, said)
    assert "stolen" not in said and not (tmp_path / "pwned").exists()


def test_an_answer_stands_while_its_host_does(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Kept in the study, an answer is not asked again on the same host; a new SGLang release, another GPU or
    another model (its config.json) there expires it, as forgetting does."""
    host = FakeSGLang(tmp_path / "host")
    host.answer({"page_size": 16})
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}')
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    args = _args(str(model))

    def asks() -> int:
        """Questions about ``args`` from a run that starts now: its probe (of the baseline) and its trial's."""
        resolver = _resolver(host, tmp_path)
        before = len(host.asked)
        resolver.probe(_args(str(model), steps=1), "baseline")
        assert resolver.effective(args, "k", study) == {**args, "page-size": 16}
        return len(host.asked) - before - 1

    with caplog.at_level(logging.INFO, logger="autotune"):
        assert asks() == 1
        assert asks() == 0  # the same host: answered from the study
        host.version = "0.5.24"
        assert asks() == 1
        assert asks() == 0
        host.gpu = "NVIDIA B200, 10.0"
        assert asks() == 1
        (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80}')
        assert asks() == 1
        assert asks() == 0
        assert record_study.forget_host_answers(study) == 1
        assert asks() == 1
    said = [r.getMessage() for r in caplog.records if "were given by" in r.getMessage()]
    assert len(said) == 3, said
    assert "engine 0.5.23 on NVIDIA H100 80GB HBM3, serving LlamaForCausalLM" in said[0]
    assert "this host is engine 0.5.24 on NVIDIA H100 80GB HBM3" in said[0]
    assert "this host is engine 0.5.24 on NVIDIA B200" in said[1]

@pytest.mark.slow
def test_a_study_whose_host_answers_nonsense_runs_its_own_configs(tmp_path: Path) -> None:
    """The host answers a port of its own and shell syntax for a tuned flag, for every config: each launch comes up
    where autotune waits (not one startup_timeout), and `best` prints what the study's rules allow."""
    host = FakeSGLang(tmp_path / "host")
    host.answer({"port": 31999, "speculative_num_steps": "3;$(touch pwned)\n"})
    space = '[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = 2\n'
    study = host.serve(write_study(tmp_path, sampler="grid", launches=2, space=space,
                                   args={"speculative-num-draft-tokens": None}))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    trials = kept(status(study)["trials"])
    assert len(trials) == 2 and all(t["state"] == "COMPLETE" and t["launched"] for t in trials), trials
    assert not [t for t in trials if t["host_rewrote"]], trials
    assert "the engine there answers port=31999: not taken" in r.stdout
    best = run_autotune("best", "--study", str(study), cwd=tmp_path)
    assert best.returncode == 0 and "--port 31999" not in best.stdout and "touch" not in best.stdout, best.stdout
    assert len(host.asked) >= 2 and not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_the_host_is_asked_in_the_servers_own_environment(tmp_path: Path) -> None:
    """SGLang's resolution reads its environment (SGLANG_USE_CPU_ENGINE turns a CPU host's attention backend from
    torch_native to intel_amx): the question runs with the environment the server starts with, [engine.env] over the
    target's, or its answer is another server's (a real CPU study had every config rewritten to a backend that
    cannot verify and crashed)."""
    host = FakeSGLang(tmp_path / "host")
    study = host.serve(write_study(tmp_path, sampler="grid", launches=1, space=one_config_space(2, 1, 3)))
    study.write_text(study.read_text().replace("[engine.args]", '[engine.env]\nFAKE_SGLANG_MARK = "engine"\n\n'
                                                                "[engine.args]", 1))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert host.asked_under and set(host.asked_under) == {"engine"}, host.asked_under
