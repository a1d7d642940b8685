"""Study files: a valid file loads; every kind of bad input names the file, the key and what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.studyfile.spec import read_study_file
from tests.support.study_texts import VALID, write

def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as e:
        read_study_file(str(write(tmp_path, text)))
    return str(e.value)


def test_valid_study_loads_with_defaults(tmp_path: Path) -> None:
    spec = read_study_file(str(write(tmp_path, VALID, "mine")))
    assert spec.name == "mine"
    assert spec.storage == f"sqlite:///{tmp_path / 'mine'}.db"
    assert spec.objective == "weighted" and spec.sampler == "tpe"
    assert spec.target().server_port == 31555
    assert [p.name for p in spec.space] == ["speculative-num-steps", "speculative-eagle-topk",
                                            "speculative-num-draft-tokens"]
    assert spec.workload.concurrency == (1, 8, 32)
    assert spec.health.interval == 0.5


def test_study_found_by_name_under_studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "studies").mkdir()
    write(tmp_path / "studies", VALID, "byname")
    monkeypatch.chdir(tmp_path)
    assert read_study_file("byname").name == "byname"
    with pytest.raises(UserError, match=r"unknown study 'nope'.*studies in .*: byname"):
        read_study_file("nope")


def test_repo_studies_validate() -> None:
    root = Path(__file__).resolve().parents[2] / "studies"
    for name in ("demo", "qwen122b"):
        spec = read_study_file(str(root / f"{name}.toml"))
        assert spec.engine.kind == "sglang"
    qwen = read_study_file(str(root / "qwen122b.toml"))
    assert qwen.target().kind == "ssh-systemd" and qwen.target().server_port == 30000
    assert qwen.engine.args["model-path"] == "/shared/models/Qwen3.5-122B-A10B"
    assert qwen.engine.args["served-model-name"] == "qwen3.5-122b"
    assert qwen.engine.args["tp-size"] == 4


@pytest.mark.parametrize("text, expected", [
    ("[study\ntrials = 1", r"s\.toml: not valid TOML"),
    (VALID + "\n[health]\nintervall = 1\n", r"s\.toml: \[health\] intervall: unknown key; allowed: interval, timeout"),
    (VALID.replace("trials = 10", "trials = 0"), r"\[study\] trials: must be at least 1, got 0"),
    (VALID.replace("trials = 10", "trials = \"ten\""), r"\[study\] trials: must be a whole number, got 'ten'"),
    (VALID.replace("trials = 10", "launches = 0"), r"\[study\] launches: must be at least 1, got 0"),
    (VALID.replace("trials = 10", "trials = 10\nlaunches = 5"),
     r"\[study\] trials: and launches are the same budget \(servers started\); give one of them"),
    (VALID.replace("trials = 10", "sampler = \"cmaes\""), r"\[study\] sampler: must be one of tpe, gp, random, grid"),
    (VALID.replace("trials = 10", "initial_design = \"sobol\""),
     r"\[study\] initial_design: must be one of engine, random"),
    (VALID + "\n[health]\ninterval = 5\n", r"\[health\] interval: must be from 0.25 to 1.0, got 5"),
    (VALID.replace("low = 1\nhigh = 4", "low = 5\nhigh = 4"),
     r"\[space.speculative-num-steps\] low: must not exceed high"),
    (VALID.replace('kind = "sglang"', 'kind = "vllm"'), r"\[engine\] kind: must be one of sglang, llamacpp"),
    (VALID.replace('command = ["autotune-sim"]', "command = []"), r"\[engine\] command: is required"),
    (VALID.replace("choices = [1, 2]", 'choices = [1, "2; rm -rf /"]'),
     r"choices: values must be numbers, true/false or plain tokens"),
    (VALID.replace('kind = "local"', 'kind = "ssh-systemd"\nhost = "h"'), r"\[target\] unit: is required"),
    (VALID + "\n[workload]\nconcurrency = [1, 0]\n",
     r"\[workload\] concurrency: must be a non-empty list of positive integers"),
    (VALID + "\n[workload]\nwindow_generations = 0\n", r"\[workload\] window_generations: must be from 1"),
])
def test_bad_input_names_file_key_and_allowed(tmp_path: Path, text: str, expected: str) -> None:
    import re

    message = error_of(tmp_path, text)
    assert re.search(expected, message), message
    assert "\n" not in message


def test_empty_space_is_refused(tmp_path: Path) -> None:
    text = VALID.split("[space.")[0]
    assert "s.toml: space: is empty: name at least one server flag to tune" in error_of(tmp_path, text)


def test_relative_sqlite_storage_is_beside_the_study(tmp_path: Path) -> None:
    spec = read_study_file(str(write(tmp_path, VALID.replace("trials = 10", 'trials = 10\nstorage = "sqlite:///x/y.db"'))))
    assert spec.storage == f"sqlite:///{tmp_path}/x/y.db"
