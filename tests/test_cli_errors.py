"""Bad input through the real command line: one clear line, non-zero exit, no traceback, no study created."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_autotune
from tests.support.study_texts import VALID

#: (the bad study files every command refuses alike are tests/test_bad_inputs.py's table)
CASES = {
    "empty_space": (VALID.split("[space.")[0], r"space: is empty"),
    "impossible_space": (VALID.replace("choices = [1, 2]", "choices = [2]")
                         .replace("low = 1\nhigh = 4", "low = 1\nhigh = 1")
                         .replace("low = 2\nhigh = 8", "low = 5\nhigh = 8"), r"\[space\] is impossible"),
    "missing_command": (VALID.replace('command = ["autotune-sim"]', 'command = ["no-such-server-xyz"]'),
                        r"server command not found on PATH: no-such-server-xyz"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_refuses_bad_input_cleanly(tmp_path: Path, case: str) -> None:
    import re

    text, pattern = CASES[case]
    study = tmp_path / "bad.toml"
    study.write_text(text)
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("autotune: error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert not list(tmp_path.glob("*.db")), "a study database was created"
    assert not (tmp_path / "bad.log").exists()


def test_unknown_study_name(tmp_path: Path) -> None:
    (tmp_path / "studies").mkdir()
    r = run_autotune("run", "--study", "nope", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == f"autotune: error: unknown study 'nope': {tmp_path}/studies/nope.toml does not exist; " \
                               f"no studies in {tmp_path}/studies"


def test_status_of_a_study_never_run(tmp_path: Path) -> None:
    study = tmp_path / "fresh.toml"
    study.write_text(VALID)
    r = run_autotune("status", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 2
    assert "no study database" in r.stderr and "autotune run" in r.stderr
    assert not list(tmp_path.glob("*.db"))


def test_bad_option_value_is_a_usage_error(tmp_path: Path) -> None:
    study = tmp_path / "s.toml"
    study.write_text(VALID)
    r = run_autotune("run", "--study", str(study), "--until", "7am", cwd=tmp_path)
    assert r.returncode == 2
    assert "--until: expected HH:MM" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_gp_sampler_without_torch_names_the_extra(tmp_path: Path, command: str) -> None:
    """sampler = "gp" needs the optional [gp] extra; without torch both validate and run say so, creating nothing."""
    hidden = tmp_path / "no-gp"
    for name in ("torch", "scipy"):  # both hidden: the test does not depend on what this machine has installed
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(
            f'raise ModuleNotFoundError("No module named {name!r}", name={name!r})\n')
    study = tmp_path / "gp.toml"
    study.write_text(VALID.replace("trials = 10", 'trials = 10\nsampler = "gp"'))
    r = run_autotune(command, "--study", str(study), cwd=tmp_path, env={"PYTHONPATH": str(hidden)})
    assert r.returncode == 2
    assert r.stderr == (f"autotune: error: {study}: [study] sampler = \"gp\" needs torch and scipy "
                        "(torch and scipy are missing): pip install 'autotune[gp]'\n")
    assert sorted(p.name for p in tmp_path.glob("gp.*")) == ["gp.toml"], "a study database or log was created"
