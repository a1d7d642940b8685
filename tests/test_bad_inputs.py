"""Every bad input, through the real command line: exit 2, exactly one line on stderr naming the file or flag and
what is allowed, no traceback, and nothing written (no database, no log, no artifacts) anywhere near the study.

Table-driven: the study file (each table and key), target settings, storage URLs and the command line's flags."""
from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.cli import run_autotune
from tests.support.study_texts import VALID

SSH = VALID.replace('[target]\nkind = "local"\nserver_port = 31555',
                    '[target]\nkind = "ssh-process"\nhost = "gpu1"\nserver_port = 31555')
assert SSH != VALID


def _study(old: str, new: str, base: str = VALID) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


#: case -> (study file text, extra command line words after `run --study FILE`, pattern of the one stderr line)
STUDY_FILE = {
    "toml": ("[study\n", [], r"bad\.toml: not valid TOML"),
    "unknown table": (VALID + "\n[tuning]\nx = 1\n", [], r"\[?tuning\]?: unknown key; allowed: study, target"),
    "unknown study key": (_study("trials = 10", "trials = 10\ntrails = 3"), [], r"\[study\] trails: unknown key"),
    "zero launches": (_study("trials = 10", "launches = 0"), [], r"\[study\] launches: must be at least 1, got 0"),
    "launches text": (_study("trials = 10", 'launches = "ten"'), [], r"\[study\] launches: must be a whole number"),
    "two budgets": (_study("trials = 10", "trials = 10\nlaunches = 4"), [], r"\[study\] trials: and launches"),
    "sampler": (_study("trials = 10", 'trials = 10\nsampler = "cmaes"'), [], r"\[study\] sampler: must be one of"),
    "objective": (_study("trials = 10", 'trials = 10\nobjective = "fast"'), [], r"\[study\] objective: must be one"),
    "negative seed": (_study("trials = 10", "trials = 10\nseed = -1"), [], r"\[study\] seed: must be at least 0"),
    "memory storage": (_study("trials = 10", 'trials = 10\nstorage = "sqlite:///:memory:"'), [],
                       r"\[study\] storage: must name a database file"),
    "storage scheme": (_study("trials = 10", 'trials = 10\nstorage = "redis://h/0"'), [],
                       r"\[study\] storage: must be sqlite:///PATH or postgresql://"),
    "storage password hidden": (_study("trials = 10", 'trials = 10\nstorage = "redis://u:hunter2@h/0"'), [],
                                r"\[study\] storage: .*'redis://u:\*\*\*@h/0'"),
    "target kind": (_study('kind = "local"', 'kind = "k8s"'), [], r"\[target\] kind: must be one of"),
    "port zero": (_study("server_port = 31555", "server_port = 0"), [], r"\[target\] server_port: must be from 1"),
    "port too high": (_study("server_port = 31555", "server_port = 70000"), [],
                      r"\[target\] server_port: must be from 1 to 65535"),
    "ssh without host": (_study('host = "gpu1"\n', "", SSH), [], r"\[target\] host: is required"),
    "host is an option": (_study('host = "gpu1"', 'host = "-oProxyCommand=touch /tmp/pwned"', SSH), [],
                          r"\[target\] host: must be a host name or address"),
    "host with space": (_study('host = "gpu1"', 'host = "gpu1 gpu2"', SSH), [], r"\[target\] host: must be a host"),
    "user": (_study('host = "gpu1"', 'host = "gpu1"\nuser = "root;id"', SSH), [], r"\[target\] user: must be a login"),
    "relative workdir": (_study('host = "gpu1"', 'host = "gpu1"\nworkdir = "autotune"', SSH), [],
                         r"\[target\] workdir: must be an absolute path"),
    "password in study": (_study('host = "gpu1"', 'host = "gpu1"\npassword_env = "hunter2!"', SSH), [],
                          r"\[target\] password_env: names an environment variable"),
    "target env name": (_study('server_port = 31555', 'server_port = 31555\nenv = { "1X" = "y" }'), [],
                        r"\[target\.env\] 1X: environment variable names"),
    "engine kind": (_study('kind = "sglang"', 'kind = "vllm"'), [], r"\[engine\] kind: must be one of"),
    "empty command": (_study('command = ["autotune-sim"]', "command = []"), [], r"\[engine\] command: is required"),
    "shell in an arg": (_study('model-path = "/m"', 'model-path = "/m"\nx = "$(touch /tmp/pwned)"'), [],
                        r"\[engine\.args\] x: must not contain \$"),
    "dashed flag": (_study('model-path = "/m"', 'model-path = "/m"\n"--tp" = 4'), [],
                    r"\[engine\.args\] --tp: flag names are written without leading dashes"),
    "env by bad reference": (VALID + '[engine.env]\nHF_TOKEN = { file = "/etc/passwd" }\n', [],
                             r"\[engine\.env\] HF_TOKEN: a value by reference is \{ env = \"NAME\" \}"),
    "unset secret": (VALID + '[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_NEVER_SET" }\n', [],
                     r"\[engine\.env\] HF_TOKEN: environment variable AUTOTUNE_TEST_NEVER_SET is not set"),
    "env value": (VALID + '[engine.env]\nX = "a b"\n', [], r"\[engine\.env\] X: must be a plain string value"),
    "space type": (VALID + '[space.x]\ntype = "bool"\n', [], r"\[space\.x\] type: must be one of"),
    "low above high": (_study("low = 2\nhigh = 8", "low = 9\nhigh = 8"), [], r"low: must not exceed high"),
    "float step count": (VALID + '[space.mem-fraction-static]\ntype = "float"\nlow = 0.5\nhigh = 0.9\n'
                                 'step = 1e-12\n', [], r"\[space\.mem-fraction-static\] step: gives about"),
    "huge grid": (_study("trials = 10", 'trials = 10\nsampler = "grid"').replace("high = 8", "high = 2000000000"),
                  [], r"\[study\] sampler: \"grid\" would list"),
    "max_tokens": (VALID + "[workload]\nmax_tokens = 1\n", [], r"\[workload\] max_tokens: must be from 2"),
    "concurrency zero": (VALID + "[workload]\nconcurrency = [0]\n", [], r"\[workload\] concurrency"),
    "window of no requests": (VALID + "[workload]\nwindow_generations = 0\n", [],
                              r"\[workload\] window_generations: must be from 1"),
    "tolerance": (VALID + "[workload]\ntolerance = 2\n", [], r"\[workload\] tolerance: must be from"),
    "tolerance nan": (VALID + "[workload]\ntolerance = nan\n", [], r"\[workload\] tolerance: must be a number"),
    "health interval": (VALID + "[health]\ninterval = 5\n", [], r"\[health\] interval: must be from 0\.25"),
    "constraint key": (VALID + "[constraints]\nmax_ttft = 3\n", [], r"\[constraints\] max_ttft: unknown key"),
}

#: case -> (command line after `autotune`, with FILE for the valid study file's path; pattern)
FLAGS = {
    "negative budget": (["run", "--study", "FILE", "--launches", "-3"], r"--launches.*-3 is not in the range"),
    "nan timeout": (["run", "--study", "FILE", "--timeout", "nan"], r"--timeout.*'nan' is not a finite number"),
    "negative timeout": (["run", "--study", "FILE", "--timeout", "-1"], r"--timeout.*at least 0"),
    "until": (["run", "--study", "FILE", "--until", "25:00"], r"--until: expected HH:MM"),
    "trial number": (["apply", "--study", "FILE", "--trial", "abc"], r"--trial.*'abc' is not a valid integer"),
    "missing value": (["report", "--study", "FILE", "--out"], r"--out.* requires an argument"),
    "unknown option": (["run", "--study", "FILE", "--frobnicate"], r"No such option '--frobnicate'"),
    "dashboard port": (["dashboard", "--study", "FILE", "--port", "0"], r"--port.*0 is not in the range"),
    "unknown target": (["run", "--study", "FILE", "--target", "nope"], r"target 'nope'.*default"),
    "memory storage flag": (["run", "--study", "FILE", "--storage", "sqlite:///:memory:"],
                            r"--storage.*must name a database file"),
    "storage scheme flag": (["status", "--study", "FILE", "--storage", "foo://x"],
                            r"--storage.*must be sqlite:///PATH or postgresql://"),
    "unwritable storage": (["run", "--study", "FILE", "--storage", "sqlite:////proc/autotune-no/x.db"],
                           r"cannot open storage sqlite:////proc/autotune-no/x\.db: cannot create"),
    "unknown command": (["tune", "--study", "FILE"], r"No such command 'tune'"),
}


def _state(directory: Path) -> dict[str, str]:
    """The user's machine-wide state (locks) beside the case's directory, not in it: only the study's own
    directory must stay untouched."""
    return {"XDG_STATE_HOME": str(directory.parent / f"{directory.name}-state")}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every case run as a user runs it, each `autotune` in a fresh process in a directory of its own; four at a
    time (a process start is most of each case's cost): case -> (the finished process, its directory)."""
    jobs: dict[str, tuple[list[str], Path]] = {}
    for case, (text, extra, _) in STUDY_FILE.items():
        directory = tmp_path_factory.mktemp("bad-study")
        (directory / "bad.toml").write_text(text)
        jobs[f"file: {case}"] = (["run", "--study", str(directory / "bad.toml"), *extra], directory)
    for case, (argv, _) in FLAGS.items():
        directory = tmp_path_factory.mktemp("bad-flag")
        (directory / "ok.toml").write_text(VALID)
        jobs[f"flag: {case}"] = ([str(directory / "ok.toml") if a == "FILE" else a for a in argv], directory)

    def run(job: tuple[list[str], Path]) -> subprocess.CompletedProcess[str]:
        argv, directory = job
        return run_autotune(*argv, cwd=directory, env=_state(directory))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return {case: (r, jobs[case][1]) for case, r in zip(jobs, pool.map(run, jobs.values()), strict=True)}


def _check(r: subprocess.CompletedProcess[str], directory: Path, pattern: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr, r.stdout[-500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("autotune: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    written = sorted(p.name for p in directory.iterdir() if p.name not in ("bad.toml", "ok.toml"))
    assert written == [], f"bad input left {written}"


@pytest.mark.parametrize("case", sorted(STUDY_FILE))
def test_a_bad_study_file_is_one_line_and_writes_nothing(outcomes, case: str) -> None:
    r, directory = outcomes[f"file: {case}"]
    _check(r, directory, STUDY_FILE[case][2])
    assert re.search(r"bad\.toml: ", r.stderr), "the message names the file"


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_a_bad_flag_is_one_line_and_writes_nothing(outcomes, case: str) -> None:
    r, directory = outcomes[f"flag: {case}"]
    _check(r, directory, FLAGS[case][1])


def test_the_table_covers_forty_bad_inputs() -> None:
    assert len(STUDY_FILE) + len(FLAGS) >= 40
