"""Every bad input, through the command line: exit 2, exactly one line on stderr naming the file, table and key (or
the flag) and what is allowed, no traceback, and nothing written (no database, log or artifacts near the study, and
every file that was there before, a database included, byte for byte as it was).

Table-driven: ``CASES`` maps a case to what it writes first (the study file, a prompts file, a database) and the
command line it runs. Cases run in this process through the same ``main()`` the `autotune` script runs (its umask,
its error handling and exit status); the cases the last audit found (``AUDIT``) run again as a real subprocess."""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import sys
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.run import study_terms
from autotune.bench.traffic import parse
from autotune.cli import main
from autotune.run.plan import requests_of
from autotune.record import study as record_study
from autotune.studyfile.spec import parse_study
from autotune.testing.ports import free_port
from tests.support.cli import run_autotune
from tests.support.study_texts import VALID

SSH = VALID.replace('[target]\nkind = "local"\nserver_port = 31555',
                    '[target]\nkind = "ssh-process"\nhost = "gpu1"\nserver_port = 31555')
SYSTEMD = VALID.replace('[target]\nkind = "local"\nserver_port = 31555',
                        '[target]\nkind = "ssh-systemd"\nhost = "gpu1"\nunit = "sglang.service"\nserver_port = 31555')
MULTI = VALID.replace('[target]\nkind = "local"\nserver_port = 31555',
                      '[targets.a]\nkind = "local"\nserver_port = 31555\n[targets.b]\nkind = "local"\n'
                      'server_port = 31556')
assert SSH != VALID and SYSTEMD != VALID and MULTI != VALID


def edit(old: str, new: str, base: str = VALID) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


def study_key(line: str) -> str:
    """VALID with ``line`` added to its [study] table."""
    return edit("trials = 10", f"trials = 10\n{line}")


def target_key(line: str, base: str = VALID) -> str:
    """``base`` with ``line`` added to its [target] table."""
    return edit("server_port = 31555", f"server_port = 31555\n{line}", base)


def engine_arg(line: str) -> str:
    return edit('model-path = "/m"', f'model-path = "/m"\n{line}')


def workload(lines: str) -> str:
    return f"{VALID}[workload]\n{lines}\n"


def space(table: str) -> str:
    return f"{VALID}{table}\n"


@dataclass(frozen=True)
class Case:
    #: the study file S.toml (None: none is written; bytes are written as they are)
    study: str | bytes | None = VALID
    #: the command line after `autotune`; "S" is the study file's path
    argv: tuple[str, ...] = ("run", "--study", "S")
    #: what the one stderr line must match (after "autotune: error: ")
    pattern: str = ""
    #: other files the case writes first, by name
    files: dict[str, str | bytes] = field(default_factory=dict)
    #: environment variables set for the command
    env: dict[str, str] = field(default_factory=dict)
    #: makes what the case needs beside the files (a database) in the case's directory
    setup: Callable[[Path], None] | None = None


#: the command a case runs when running the study would start a server had the input been taken
VALIDATE = ("validate", "--study", "S")


def run(argv: tuple[str, ...], pattern: str, **kw: object) -> Case:
    return Case(argv=argv, pattern=pattern, **kw)  # type: ignore[arg-type]


# -- databases a case points autotune at -------------------------------------------------------------------------

def another_programs_database(directory: Path) -> None:
    """An SQLite database of some other program: its own tables, its own rows."""
    with sqlite3.connect(directory / "app.db") as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO customers (name) VALUES ('ada')")


def another_tools_study(directory: Path) -> None:
    """An Optuna study named like ours ("S") that another tool made, with a trial that tool is running now."""
    study = optuna.create_study(study_name="S", storage=f"sqlite:///{directory / 'other.db'}")
    study.ask()


def autotunes_study(directory: Path) -> None:
    """The study file's own study, as `autotune run` creates it (no trials yet)."""
    study = optuna.create_study(study_name="S", storage=f"sqlite:///{directory / 'S.db'}", direction="maximize")
    record_study.describe(study, "weighted", VALID, str(directory / "S.toml"))


def interrupted_trial(directory: Path) -> None:
    """The study with its baseline measured and trial 1 cut short by a stop request while its server started."""
    autotunes_study(directory)
    study = optuna.load_study(study_name="S", storage=f"sqlite:///{directory / 'S.db'}")
    for state, attrs in ((TrialState.COMPLETE, {"baseline": True}), (TrialState.FAIL, {"reason": "interrupted"})):
        study.add_trial(optuna.trial.create_trial(
            state=state, value=1.0 if state == TrialState.COMPLETE else None,
            user_attrs={**attrs, "config": {"model-path": "/m", "port": 31555},
                        "command": ["autotune-sim", "--model-path", "/m", "--port", "31555"]}))


def study_of(then: str, dataset: str | None = None) -> Callable[[Path], None]:
    """The study file's own study as `autotune run` created it from the study file ``then`` (whose dataset, when
    it named one, held ``dataset``)."""
    def make(directory: Path) -> None:
        autotunes_study(directory)
        study = optuna.load_study(study_name="S", storage=f"sqlite:///{directory / 'S.db'}")
        spec = parse_study(tomllib.loads(then), directory / "S.toml")
        requests = parse(dataset, "d.jsonl") if dataset is not None else requests_of(spec)
        record_study.set_traffic(study, study_terms.traffic(spec, requests))
        record_study.set_space(study, study_terms.space(spec.space), 0)
    return make


def planted(name: str, directory_link: bool) -> Callable[[Path], None]:
    """A link planted beside the study as ``name``, to a file (or a directory) elsewhere: what autotune would write
    there would land in the link's target."""
    def plant(directory: Path) -> None:
        victim = directory / "elsewhere"
        victim.mkdir()
        (victim / "keep.txt").write_text("not autotune's\n")
        (directory / name).symlink_to(victim if directory_link else victim / "keep.txt")
    return plant


def not_a_database(directory: Path) -> None:
    (directory / "junk.db").write_bytes(b"this is no database\n" * 100)


DEEP = "[" * 200_000
CASES: dict[str, Case] = {
    # -- the file itself
    "toml": Case("[study\n", pattern=r"S\.toml: not valid TOML"),
    "study file not UTF-8": Case(VALID.encode().replace(b"/m", b"/m\xff\xfe"),
                                 pattern=r"S\.toml: not UTF-8 text \(byte 0xff at offset \d+\)"),
    "study file latin-1": Case(VALID.replace('"/m"', '"/modèle"').encode("latin-1"), pattern=r"S\.toml: not UTF-8"),
    "study file nested too deeply": Case(VALID + f"x = {DEEP}\n", pattern=r"S\.toml: not valid TOML"),
    "NUL byte": Case(VALID.replace('"/m"', '"/m\0"'), pattern=r"S\.toml: not valid TOML"),
    "empty file": Case("", pattern=r"S\.toml: \[engine\] kind: is required"),
    "unknown table": Case(VALID + "\n[tuning]\nx = 1\n", pattern=r"S\.toml: tuning: unknown key; allowed: study"),
    "a table is a number": Case("study = 3\n" + VALID.replace("[study]\ntrials = 10\n", ""),
                                pattern=r"S\.toml: study: must be a table"),
    # -- [study]
    "unknown study key": Case(study_key("trails = 3"), pattern=r"\[study\] trails: unknown key"),
    "zero launches": Case(edit("trials = 10", "launches = 0"), pattern=r"\[study\] launches: must be at least 1"),
    "launches text": Case(edit("trials = 10", 'launches = "ten"'), pattern=r"\[study\] launches: must be a whole"),
    "launches fraction": Case(edit("trials = 10", "launches = 1.5"), pattern=r"\[study\] launches: must be a whole"),
    "launches true": Case(edit("trials = 10", "launches = true"), pattern=r"\[study\] launches: must be a whole"),
    "two budgets": Case(study_key("launches = 4"), pattern=r"\[study\] trials: and launches"),
    "sampler": Case(study_key('sampler = "cmaes"'), pattern=r"\[study\] sampler: must be one of"),
    "objective": Case(study_key('objective = "fast"'), pattern=r"\[study\] objective: must be one"),
    "negative seed": Case(study_key("seed = -1"), pattern=r"\[study\] seed: must be from 0"),
    "seed beyond 32 bits": Case(study_key("seed = 4294967296"),
                                pattern=r"\[study\] seed: must be from 0 to 4294967295, got 4294967296"),
    "seed fraction": Case(study_key("seed = 1.5"), pattern=r"\[study\] seed: must be a whole number"),
    "startup_trials": Case(study_key("startup_trials = -1"), pattern=r"\[study\] startup_trials: must be at least 0"),
    "ranges": Case(study_key('ranges = "any"'), pattern=r"\[study\] ranges: must be one of engine, fixed"),
    "initial_design": Case(study_key('initial_design = "sobol"'), pattern=r"\[study\] initial_design: must be one"),
    "adaptive not a bool": Case(study_key('adaptive = "yes"'), pattern=r"\[study\] adaptive: must be"),
    "adaptive on an engine without it": Case(edit('kind = "sglang"', 'kind = "llamacpp"',
                                                      study_key("adaptive = true")),
        pattern=r"\[study\] adaptive: the llamacpp engine has no adaptive speculative mode \(allowed: false\)"),
    "pruning text": Case(study_key('pruning = "yes"'), pattern=r"\[study\] pruning: must be true or false"),
    "pareto pruning": Case(study_key('objective = "pareto"\npruning = true'),
                           pattern=r"\[study\] pruning: is not available with objective = \"pareto\""),
    "heartbeat zero": Case(study_key("heartbeat = 0"), pattern=r"\[study\] heartbeat: must be from 1"),
    "heartbeat inf": Case(study_key("heartbeat = inf"), pattern=r"\[study\] heartbeat: must be a number"),
    "name with a newline": Case(study_key('name = "demo\\n"'),
                                pattern=r"\[study\] name: must be one line without control characters"),
    "name with a slash": Case(study_key('name = "../x"'), pattern=r"\[study\] name: must be letters, digits"),
    "empty name": Case(study_key('name = ""'), pattern=r"\[study\] name: must be letters, digits"),
    "name starts with a dot": Case(study_key('name = ".x"'), pattern=r"\[study\] name: must be letters, digits"),
    "name with an escape": Case(study_key('name = "x\\u001b[2J"'), pattern=r"\[study\] name: must be one line"),
    "memory storage": Case(study_key('storage = "sqlite:///:memory:"'), pattern=r"\[study\] storage: must name a"),
    "storage scheme": Case(study_key('storage = "redis://h/0"'), pattern=r"\[study\] storage: must be sqlite:///"),
    "storage password hidden": Case(study_key('storage = "redis://u:hunter2@h/0"'),
                                    pattern=r"\[study\] storage: .*'redis://u:\*\*\*@h/0'"),
    "storage sslpassword hidden": Case(study_key('storage = "redis://h/0?sslpassword=hunter22"'),
                                       pattern=r"\[study\] storage: .*sslpassword=\*\*\*'$"),
    "storage a number": Case(study_key("storage = 5"), pattern=r"\[study\] storage: must be a string"),
    "storage with a newline": Case(study_key('storage = "sqlite:///x\\n.db"'), pattern=r"\[study\] storage: must be"),
    # -- [target] and [targets.NAME]
    "target kind": Case(edit('kind = "local"', 'kind = "k8s"'), pattern=r"\[target\] kind: must be one of"),
    "target key of another kind": Case(target_key('host = "gpu1"'),
                                       pattern=r"\[target\] host: only applies to kind = ssh"),
    "unknown target key": Case(target_key("tunel = true"), pattern=r"\[target\] tunel: unknown key"),
    "port zero": Case(edit("server_port = 31555", "server_port = 0"), pattern=r"\[target\] server_port: must be"),
    "port too high": Case(edit("server_port = 31555", "server_port = 70000"),
                          pattern=r"\[target\] server_port: must be from 1 to 65535"),
    "port text": Case(edit("server_port = 31555", 'server_port = "80"'),
                      pattern=r"\[target\] server_port: must be a whole number"),
    "port and --port both": Case(engine_arg("port = 31000"),
                                 pattern=r"\[engine\.args\] port = 31000 but the target's server_port is 31555"),
    "target and targets": Case(VALID + '[targets.a]\nkind = "local"\n',
                               pattern=r"targets: give either \[target\] or \[targets\.NAME\]"),
    "empty targets": Case(MULTI.replace('[targets.a]\nkind = "local"\nserver_port = 31555\n[targets.b]\nkind = '
                                        '"local"\nserver_port = 31556', "[targets]"),
                          pattern=r"targets: needs at least one \[targets\.NAME\] table"),
    "a target that is no table": Case(MULTI.replace('[targets.b]\nkind = "local"\nserver_port = 31556', ""
                                                    ).replace("[targets.a]", "[targets]\nb = 3\n[targets.a]"),
                                      pattern=r"\[targets\] b: must be a table"),
    "target name with a newline": Case(MULTI.replace("[targets.b]", '[targets."b\\n"]'),
                                       pattern=r"\[targets\] b\\n: target names must be"),
    "target name with a dash first": Case(MULTI.replace("[targets.b]", '[targets."-b"]'),
                                          pattern=r"\[targets\] -b: target names must be"),
    "two local targets on one port": Case(MULTI.replace("server_port = 31556", "server_port = 31555"),
                                          ("validate", "--study", "S"),
                                          r"\[targets\] b: is the server of \[targets\.a\] too \(local:31555\): each "
                                          r"target needs a port \(or unit\) of its own"),
    "several targets, none chosen": Case(MULTI, pattern=r"several targets \(a, b\); choose one with --target"),
    "target env name": Case(target_key('env = { "1X" = "y" }'), pattern=r"\[target\.env\] 1X: environment variable"),
    "target env name with a newline": Case(target_key('env = { "X\\n" = "y" }'),
                                           pattern=r"\[target\.env\] X\\n: environment variable names"),
    "target env value a number": Case(target_key("env = { X = 3 }"), pattern=r"\[target\.env\] X: must be a plain"),
    "target env not a table": Case(target_key('env = "X=1"'), pattern=r"\[target\] env: must be a table"),
    "ssh without host": Case(edit('host = "gpu1"\n', "", SSH), pattern=r"\[target\] host: is required"),
    "host is an option": Case(edit('host = "gpu1"', 'host = "-oProxyCommand=touch /tmp/pwned"', SSH),
                              pattern=r"\[target\] host: must be a host name"),
    "host opens with a dash": Case(edit('host = "gpu1"', 'host = "-oProxyCommand=x"', SSH),
                                   pattern=r"\[target\] host: must be a host name \(labels of letters, digits, '-' and "
                                           r"'_' between dots, none opening or closing with '-'\) or an IP address, "
                                           r"got '-oProxyCommand=x'$"),
    "host with an empty label": Case(edit('host = "gpu1"', 'host = "gpu1..lan"', SSH),
                                     pattern=r"\[target\] host: must be a host name"),
    "host with an option as its scope": Case(edit('host = "gpu1"', 'host = "fe80::1%-oProxyCommand=x"', SSH),
                                             pattern=r"\[target\] host: must be a host name"),
    "host with a space": Case(edit('host = "gpu1"', 'host = "gpu1 gpu2"', SSH), pattern=r"\[target\] host: must be"),
    "host with a newline": Case(edit('host = "gpu1"', 'host = "gpu1\\n"', SSH), pattern=r"\[target\] host: must be"),
    "user": Case(target_key('user = "root;id"', SSH), pattern=r"\[target\] user: must be a login"),
    "user with a newline": Case(target_key('user = "root\\n"', SSH), pattern=r"\[target\] user: must be one line"),
    "relative workdir": Case(target_key('workdir = "autotune"', SSH), pattern=r"\[target\] workdir: must be an"),
    "another user's workdir": Case(target_key('workdir = "~other/x"', SSH),
                                   pattern=r"\[target\] workdir: must be an absolute path .* under ~/"),
    "workdir with a space": Case(target_key('workdir = "/tmp/a b"', SSH), pattern=r"\[target\] workdir: must be"),
    "password in study": Case(target_key('password_env = "hunter2!"', SSH),
                              pattern=r"\[target\] password_env: names an environment variable"),
    "password_env with a newline": Case(target_key('password_env = "SSH_PW\\n"', SSH),
                                        pattern=r"\[target\] password_env: must be one line"),
    "workdir with a newline": Case(target_key('workdir = "/srv/at\\n"', SSH),
                                   pattern=r"\[target\] workdir: must be one line"),
    "ssh port": Case(target_key("port = 0", SSH), pattern=r"\[target\] port: must be from 1 to 65535"),
    "connect_timeout": Case(target_key("connect_timeout = 0", SSH),
                            pattern=r"\[target\] connect_timeout: must be from 0\.5"),
    "reconnect_timeout": Case(target_key("reconnect_timeout = -1", SSH),
                              pattern=r"\[target\] reconnect_timeout: must be from 0"),
    "tunnel text": Case(target_key('tunnel = "yes"', SSH), pattern=r"\[target\] tunnel: must be true or false"),
    "known_hosts with a newline": Case(target_key('known_hosts = "/k\\nx"', SSH),
                                       pattern=r"\[target\] known_hosts: must be one line"),
    "systemd without unit": Case(edit('unit = "sglang.service"\n', "", SYSTEMD), pattern=r"\[target\] unit: is req"),
    "unit with a newline": Case(edit('unit = "sglang.service"', 'unit = "sglang.service\\n"', SYSTEMD),
                                pattern=r"\[target\] unit: must be"),
    "unit that is no service": Case(edit('unit = "sglang.service"', 'unit = "sglang"', SYSTEMD),
                                    pattern=r"\[target\] unit: "),
    # -- [engine]
    "engine kind": Case(edit('kind = "sglang"', 'kind = "vllm"'), pattern=r"\[engine\] kind: must be one of"),
    "no engine kind": Case(edit('kind = "sglang"\n', ""), pattern=r"\[engine\] kind: is required"),
    "unknown engine key": Case(edit('kind = "sglang"', 'kind = "sglang"\nflags = []'),
                               pattern=r"\[engine\] flags: unknown key"),
    "empty command": Case(edit('command = ["autotune-sim"]', "command = []"), pattern=r"\[engine\] command: is req"),
    "command a string": Case(edit('command = ["autotune-sim"]', 'command = "autotune-sim"'),
                             pattern=r"\[engine\] command: must be a list"),
    "command of numbers": Case(edit('command = ["autotune-sim"]', "command = [1]"), pattern=r"\[engine\] command: "),
    "command with a newline": Case(edit('command = ["autotune-sim"]', 'command = ["autotune-sim", "x\\ny"]'),
                                   pattern=r"\[engine\] command: is required: a non-empty list of one-line strings"),
    "command not found": Case(edit('command = ["autotune-sim"]', 'command = ["no-such-server-xyz"]'),
                              pattern=r"server command not found on PATH: no-such-server-xyz"),
    "shell in an arg": Case(engine_arg('x = "$(touch /tmp/pwned)"'), pattern=r"\[engine\.args\] x: must not contain"),
    "backtick in an arg": Case(engine_arg('x = "a`id`"'), pattern=r"\[engine\.args\] x: must not contain `"),
    "a secret's shell characters not shown": Case(engine_arg('api-key = "sk-abc;def"'),
                                                  pattern=r"\[engine\.args\] api-key: must not contain ;.*got \*\*\*$"),
    "dashed flag": Case(engine_arg('"--tp" = 4'), pattern=r"\[engine\.args\] --tp: flag names are written"),
    "flag name with a newline": Case(engine_arg('"tp\\n" = 4'), pattern=r"\[engine\.args\] tp\\n: flag names"),
    "flag by reference with a newline": Case(engine_arg('"k\\n" = { env = "HOME" }'),
                                             pattern=r"\[engine\.args\] k\\n: flag names"),
    "arg with a newline": Case(engine_arg('x = "a\\nb"'), pattern=r"\[engine\.args\] x: must be a non-empty single"),
    "empty arg": Case(engine_arg('x = ""'), pattern=r"\[engine\.args\] x: must be a non-empty single-line string"),
    "arg a list": Case(engine_arg("x = [1, 2]"), pattern=r"\[engine\.args\] x: must be a string, number or true"),
    "arg nan": Case(engine_arg("x = nan"), pattern=r"\[engine\.args\] x: must be a finite number"),
    "arg a table": Case(engine_arg("x = { a = 1 }"), pattern=r"\[engine\.args\] x: a value by reference is"),
    "arg by reference unset": Case(engine_arg('api-key = { env = "AUTOTUNE_TEST_NEVER_SET" }'),
                                   pattern=r"\[engine\.args\] api-key: environment variable AUTOTUNE_TEST_NEVER_SET"),
    "invalid baseline": Case(engine_arg("speculative-eagle-topk = 0"),
                             pattern=r"\[engine\.args\] the baseline \(the fixed args\) is invalid"),
    "env by bad reference": Case(VALID + '[engine.env]\nHF_TOKEN = { file = "/etc/passwd" }\n',
                                 pattern=r"\[engine\.env\] HF_TOKEN: a value by reference is \{ env = \"NAME\" \}"),
    "env reference and secret both": Case(VALID + '[engine.env]\nX = { env = "HOME", secret = "abcdef" }\n',
                                          pattern=r"\[engine\.env\] X: a value by reference.*got a table of 'env', "
                                                  r"'secret'$"),
    "unset secret": Case(VALID + '[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_NEVER_SET" }\n',
                         pattern=r"\[engine\.env\] HF_TOKEN: environment variable AUTOTUNE_TEST_NEVER_SET is not set"),
    "secret too short to mask": Case(VALID + '[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_SHORT" }\n',
                                     env={"AUTOTUNE_TEST_SHORT": "ab"},
                                     pattern=r"\[engine\.env\] HF_TOKEN: environment variable AUTOTUNE_TEST_SHORT has "
                                             r"2 characters; a secret needs at least 4"),
    "secret with a newline": Case(VALID + '[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_NL" }\n',
                                  env={"AUTOTUNE_TEST_NL": "abcd\nrm -rf /"},
                                  pattern=r"\[engine\.env\] HF_TOKEN: environment variable AUTOTUNE_TEST_NL holds a "
                                          r"control character"),
    "marked secret empty": Case(VALID + '[engine.env]\nX = { secret = "" }\n',
                                pattern=r"\[engine\.env\] X: \{ secret = \.\.\. \} must be a non-empty one-line"),
    "marked secret short": Case(VALID + '[engine.env]\nX = { secret = "abc" }\n',
                                pattern=r"\[engine\.env\] X: the secret has 3 characters"),
    "marked secret a number": Case(VALID + "[engine.env]\nX = { secret = 1234 }\n",
                                   pattern=r"\[engine\.env\] X: \{ secret = \.\.\. \} must be"),
    "env value": Case(VALID + '[engine.env]\nX = "a b"\n', pattern=r"\[engine\.env\] X: must be a plain string value"),
    "a secret's bad value not shown": Case(VALID + '[engine.env]\nPGPASSWORD = "pa ss"\n',
                                           pattern=r"\[engine\.env\] PGPASSWORD: must be a plain.*got \*\*\*$"),
    "env name with a newline": Case(VALID + '[engine.env]\n"X\\n" = "y"\n',
                                    pattern=r"\[engine\.env\] X\\n: environment variable names"),
    "env name with a dash": Case(VALID + '[engine.env]\n"A-B" = "y"\n',
                                 pattern=r"\[engine\.env\] A-B: environment variable names"),
    "env name with a space": Case(VALID + '[engine.env]\n"A B" = "y"\n',
                                  pattern=r"\[engine\.env\] A B: environment variable names"),
    # -- [space]
    "space type": Case(space('[space.x]\ntype = "bool"'), pattern=r"\[space\.x\] type: must be one of"),
    "space without type": Case(space("[space.x]\nlow = 1"), pattern=r"\[space\.x\] type: is required"),
    "space entry no table": Case(VALID.replace("[space.speculative-num-steps]", "[space]\nx = 1\n"
                                               "[space.speculative-num-steps]"),
                                 pattern=r"\[space\] x: must be a table"),
    "space name with a newline": Case(space('[space."tp-size\\n"]\ntype = "categorical"\nchoices = [1]'),
                                      pattern=r"\[space\] tp-size\\n: flag names"),
    "space name dashed": Case(space('[space."--tp-size"]\ntype = "categorical"\nchoices = [1]'),
                              pattern=r"\[space\] --tp-size: flag names"),
    "choice with a newline": Case(space('[space.x]\ntype = "categorical"\nchoices = ["a\\n"]'),
                                  pattern=r"\[space\.x\] choices: values must be numbers, true/false or plain tokens"),
    "choice with a space": Case(space('[space.x]\ntype = "categorical"\nchoices = ["a b"]'),
                                pattern=r"\[space\.x\] choices: values must be"),
    "choice with shell": Case(edit("choices = [1, 2]", 'choices = [1, "2; rm -rf /"]'),
                              pattern=r"choices: values must be numbers, true/false or plain tokens"),
    "choice nan": Case(space('[space.x]\ntype = "categorical"\nchoices = [nan]'),
                       pattern=r"\[space\.x\] choices: numbers must be finite"),
    "choice huge": Case(space('[space.x]\ntype = "categorical"\nchoices = [1e300]'),
                        pattern=r"\[space\.x\] choices: numbers must be finite, at most 1e\+15"),
    "choice a table": Case(space('[space.x]\ntype = "categorical"\nchoices = [{ a = 1 }]'),
                           pattern=r"\[space\.x\] choices: values must be"),
    "no choices": Case(space('[space.x]\ntype = "categorical"\nchoices = []'),
                       pattern=r"\[space\.x\] choices: must be a non-empty list"),
    "duplicate choices": Case(space('[space.x]\ntype = "categorical"\nchoices = [1, 1]'),
                              pattern=r"\[space\.x\] choices: has duplicate values"),
    "categorical with low": Case(space('[space.x]\ntype = "categorical"\nchoices = [1]\nlow = 1'),
                                 pattern=r"\[space\.x\] low: unknown key"),
    "int without high": Case(space('[space.x]\ntype = "int"\nlow = 1'), pattern=r"\[space\.x\] high: is required"),
    "int fraction": Case(space('[space.x]\ntype = "int"\nlow = 1.5\nhigh = 4'),
                         pattern=r"\[space\.x\] low: and high must be whole numbers"),
    "int step fraction": Case(space('[space.x]\ntype = "int"\nlow = 1\nhigh = 4\nstep = 1.5'),
                              pattern=r"\[space\.x\] step: must be a whole number"),
    "low above high": Case(edit("low = 2\nhigh = 8", "low = 9\nhigh = 8"), pattern=r"low: must not exceed high"),
    "high huge": Case(space('[space.x]\ntype = "float"\nlow = 0\nhigh = 1e308'),
                      pattern=r"\[space\.x\] high: must be from -1000000000000000 to 1000000000000000"),
    "low text": Case(space('[space.x]\ntype = "float"\nlow = "0"\nhigh = 1'), pattern=r"\[space\.x\] low: must be a"),
    "step zero": Case(space('[space.x]\ntype = "float"\nlow = 0\nhigh = 1\nstep = 0'),
                      pattern=r"\[space\.x\] step: must be positive"),
    "step negative": Case(space('[space.x]\ntype = "float"\nlow = 0\nhigh = 1\nstep = -1'),
                          pattern=r"\[space\.x\] step: must be from 0"),
    "log from zero": Case(space('[space.x]\ntype = "float"\nlow = 0\nhigh = 1\nlog = true'),
                          pattern=r"\[space\.x\] log: needs low > 0 and no step"),
    "log with a step": Case(space('[space.x]\ntype = "float"\nlow = 1\nhigh = 4\nstep = 0.5\nlog = true'),
                            pattern=r"\[space\.x\] log: needs low > 0 and no step"),
    "float step count": Case(space('[space.mem-fraction-static]\ntype = "float"\nlow = 0.5\nhigh = 0.9\n'
                                   'step = 1e-12'), pattern=r"\[space\.mem-fraction-static\] step: gives about"),
    "grid float without step": Case(study_key('sampler = "grid"') + '[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n',
                                    pattern=r"\[space\.x\] step: is required for a float parameter"),
    "huge grid": Case(study_key('sampler = "grid"').replace("low = 1\nhigh = 4", "low = 1\nhigh = 2000000000"),
                      pattern=r"\[study\] sampler: \"grid\" would list"),
    "draft tokens to two billion": Case(edit("low = 2\nhigh = 8", "low = 2\nhigh = 2000000000"),
                                        pattern=r"\[space\.speculative-num-draft-tokens\] high: 2000000000 is more "
                                                r"than sglang accepts anywhere in this space.*\(at most 15\)"),
    "empty space": Case(VALID.split("[space.")[0], pattern=r"space: is empty"),
    "impossible space": Case(VALID.replace("choices = [1, 2]", "choices = [2]")
                             .replace("low = 1\nhigh = 4", "low = 1\nhigh = 1")
                             .replace("low = 2\nhigh = 8", "low = 5\nhigh = 8"),
                             pattern=r"\[space\] is impossible"),
    # -- [workload]
    "max_tokens": Case(workload("max_tokens = 1"), pattern=r"\[workload\] max_tokens: must be from 2"),
    "max_tokens huge": Case(workload("max_tokens = 2000000"), pattern=r"\[workload\] max_tokens: must be from 2"),
    "temperature negative": Case(workload("temperature = -1"), pattern=r"\[workload\] temperature: must be from 0"),
    "temperature high": Case(workload("temperature = 3"), pattern=r"\[workload\] temperature: must be from 0 to 2"),
    "requests zero": Case(workload("requests = 0"), pattern=r"\[workload\] requests: must be from 1"),
    "warmup negative": Case(workload("warmup = -1"), pattern=r"\[workload\] warmup: must be from 0"),
    "request_timeout": Case(workload("request_timeout = 0"), pattern=r"\[workload\] request_timeout: must be from 1"),
    "stall_timeout": Case(workload("stall_timeout = 0.1"), pattern=r"\[workload\] stall_timeout: must be from 0\.5"),
    "min_repeats": Case(workload("min_repeats = 0"), pattern=r"\[workload\] min_repeats: must be from 1"),
    "max below min repeats": Case(workload("min_repeats = 3\nmax_repeats = 2"),
                                  pattern=r"\[workload\] max_repeats: must be at least min_repeats \(3\)"),
    "concurrency zero": Case(workload("concurrency = [0]"), pattern=r"\[workload\] concurrency: must be a non-empty"),
    "concurrency huge": Case(workload("concurrency = [100000000000]"),
                             pattern=r"\[workload\] concurrency: must be a non-empty list of positive integers up "
                                     r"to 10000"),
    "concurrency empty": Case(workload("concurrency = []"), pattern=r"\[workload\] concurrency: must be a non-empty"),
    "concurrency twice": Case(workload("concurrency = [1, 1]"), pattern=r"\[workload\] concurrency: has duplicate"),
    "concurrency fraction": Case(workload("concurrency = [1.5]"), pattern=r"\[workload\] concurrency: must be"),
    "concurrency true": Case(workload("concurrency = [true]"), pattern=r"\[workload\] concurrency: must be"),
    "concurrency text": Case(workload('concurrency = "8"'), pattern=r"\[workload\] concurrency: must be a list"),
    "window of no requests": Case(workload("window_generations = 0"),
                                  pattern=r"\[workload\] window_generations: must be from 1"),
    "tolerance": Case(workload("tolerance = 2"), pattern=r"\[workload\] tolerance: must be from"),
    "tolerance nan": Case(workload("tolerance = nan"), pattern=r"\[workload\] tolerance: must be a number"),
    "unknown workload key": Case(workload("prompt = 1"), pattern=r"\[workload\] prompt: unknown key"),
    "mix level in superscript": Case(study_key('objective = "mix"') + '[workload]\nmix = { "²" = 1 }\n',
                                     pattern=r"\[workload\.mix\] ²: must be one of the concurrency levels"),
    "mix shares of 1e308": Case(study_key('objective = "mix"') + "[workload]\nmix = { 1 = 1e308, 8 = 1e308 }\n",
                                pattern=r"\[workload\.mix\] 1: must be a share above 0 and at most 1e\+12"),
    "mix share zero": Case(study_key('objective = "mix"') + "[workload]\nmix = { 1 = 0, 8 = 1 }\n",
                           pattern=r"\[workload\.mix\] 1: must be a share above 0"),
    "mix share negative": Case(study_key('objective = "mix"') + "[workload]\nmix = { 8 = -1 }\n",
                               pattern=r"\[workload\.mix\] 8: must be a share above 0"),
    "mix share text": Case(study_key('objective = "mix"') + '[workload]\nmix = { 8 = "half" }\n',
                           pattern=r"\[workload\.mix\] 8: must be a share"),
    "mix level not measured": Case(study_key('objective = "mix"') + "[workload]\nmix = { 2 = 1 }\n",
                                   pattern=r"\[workload\.mix\] 2: must be one of the concurrency levels \[1, 8, 32\]"),
    "mix level twice": Case(study_key('objective = "mix"') + '[workload]\nmix = { 8 = 1, "08" = 1 }\n',
                            pattern=r"\[workload\.mix\] 08: names level 8 twice"),
    "mix level with a newline": Case(study_key('objective = "mix"') + '[workload]\nmix = { "8\\n" = 1 }\n',
                                     pattern=r"\[workload\.mix\] 8\\n: must be one of the concurrency levels"),
    "mix without its objective": Case(workload("mix = { 8 = 1 }"),
                                      pattern=r"\[workload\] mix: and objective = \"mix\" go together"),
    "mix objective without mix": Case(study_key('objective = "mix"'),
                                      pattern=r"\[workload\] mix: and objective = \"mix\" go together"),
    # -- the prompts file
    "prompts missing": Case(workload('prompts = "p.jsonl"'),
                            pattern=r"\[workload\] prompts: cannot read .*p\.jsonl: No such file"),
    "prompts not UTF-8": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": b'{"prompt": "caf\xe9"}\n'},
                              pattern=r"p\.jsonl: line 1: not UTF-8 text \(a byte 0xe9 at offset 15\)"),
    "prompts nested too deeply": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": DEEP + "\n"},
                                      pattern=r"p\.jsonl: line 1: not valid JSON \(or nested too deeply\)"),
    "prompts not JSON": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": '{"prompt": "a"}\nnope\n'},
                             pattern=r"p\.jsonl: line 2: not valid JSON"),
    "prompts without prompt": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": '{"text": "a"}\n'},
                                   pattern=r"p\.jsonl: line 1: needs a non-empty string field \"prompt\""),
    "prompts empty prompt": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": '{"prompt": " "}\n'},
                                 pattern=r"p\.jsonl: line 1: needs a non-empty string field"),
    "prompts a list": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": '["a"]\n'},
                           pattern=r"p\.jsonl: line 1: needs a non-empty string field"),
    "prompts empty file": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": "\n\n"},
                               pattern=r"p\.jsonl: no prompts"),
    "prompts repeat": Case(workload('prompts = "p.jsonl"'), files={"p.jsonl": '{"prompt": "a"}\n{"prompt": "a"}\n'},
                           pattern=r"p\.jsonl: prompts repeat"),
    "prompts a directory": Case(workload('prompts = "."'), pattern=r"\[workload\] prompts: .* is not a regular file"),
    "prompts path with a newline": Case(workload('prompts = "p.jsonl\\n"'),
                                        pattern=r"\[workload\] prompts: must be one line"),
    # -- a dataset (bench/traffic.py)
    "dataset in none of the formats": Case(workload('dataset = "d.jsonl"'), files={"d.jsonl": '{"text": "a"}\n'},
                                           pattern=r"d\.jsonl: line 1: in none of the formats: needs \"messages\""),
    "dataset empty": Case(workload('dataset = "d.jsonl"'), files={"d.jsonl": " \n\n"},
                          pattern=r"d\.jsonl: empty: a dataset needs at least one request"),
    "dataset not UTF-8": Case(workload('dataset = "d.jsonl"'),
                              files={"d.jsonl": b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n'},
                              pattern=r"d\.jsonl: line 2: not UTF-8 text"),
    "dataset conversation without a user turn": Case(
        workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"messages": [{"role": "system", "content": "Be brief."}]}\n'},
        pattern=r"d\.jsonl: line 1: no user message"),
    "dataset sharegpt without a human turn": Case(
        workload('dataset = "d.json"'), files={"d.json": '[{"conversations": [{"from": "gpt", "value": "Hi"}]}]'},
        pattern=r"d\.json: item 1: no human turn"),
    "dataset sharegpt without a reply": Case(
        workload('dataset = "d.json"'),
        files={"d.json": '[{"conversations": [{"from": "human", "value": "Hi"}]}]'},
        pattern=r"d\.json: item 1: nothing to generate: no reply follows the last human turn"),
    "dataset nothing to generate": Case(
        workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}\n'},
        pattern=r"d\.jsonl: line 1: nothing to generate: \"max_tokens\" must be a whole number from 1"),
    "dataset batch to another endpoint": Case(
        workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"url": "/v1/embeddings", "body": {"input": "a"}}\n'},
        pattern=r"d\.jsonl: line 1: \"url\" '/v1/embeddings': autotune sends /v1/chat/completions or"),
    "dataset mixes chat and raw": Case(
        workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"messages": [{"role": "user", "content": "Hi"}]}\n{"prompt": "a"}\n'},
        pattern=r"d\.jsonl: line 2: a raw prompt among chat requests"),
    "dataset lone surrogate": Case(
        argv=VALIDATE, study=workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"messages": [{"role": "user", "content": "Hi"}]}\n{"messages": [{"role": "system", '
                          '"content": "S"}, {"role": "user", "content": "a\\ud800"}]}\n'},
        pattern=r"d\.jsonl: line 2: message 2: a lone surrogate \\ud800 at character 2: not a character"),
    "dataset lone surrogate in a prompt": Case(
        argv=VALIDATE, study=workload('dataset = "d.jsonl"'), files={"d.jsonl": '{"prompt": "\\udfff x"}\n'},
        pattern=r"d\.jsonl: line 1: \"prompt\": a lone surrogate \\udfff at character 1"),
    "prompts lone surrogate": Case(argv=VALIDATE, study=workload('prompts = "p.jsonl"'),
                                   files={"p.jsonl": '{"prompt": "ok \\ud83d"}\n'},
                                   pattern=r"p\.jsonl: line 1: \"prompt\": a lone surrogate \\ud83d at character 4"),
    "dataset empty user message": Case(
        argv=VALIDATE, study=workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " "}]}'
                          '\n'},
        pattern=r"d\.jsonl: line 1: message 2: an empty user message: a user turn, like a raw prompt, must say "
                r"something"),
    "dataset empty human turn": Case(
        argv=VALIDATE, study=workload('dataset = "d.json"'),
        files={"d.json": '[{"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "Hi"}]}]'},
        pattern=r"d\.json: item 1: turn 1: an empty human turn"),
    "dataset a number of 5000 digits": Case(
        argv=VALIDATE, study=workload('dataset = "d.jsonl"'),
        files={"d.jsonl": '{"prompt": "a", "id": ' + "7" * 5000 + '}\n'},
        pattern=r"d\.jsonl: line 1: a number of 5000 digits; at most 4300 are read"),
    "prompts a number of 4301 digits": Case(
        argv=VALIDATE, study=workload('prompts = "p.jsonl"'),
        files={"p.jsonl": '{"prompt": "a"}\n{"prompt": "b", "n": -' + "1" * 4301 + '}\n'},
        pattern=r"p\.jsonl: line 2: a number of 4301 digits; at most 4300 are read"),
    "dataset a FIFO": Case(workload('dataset = "fifo.jsonl"'), setup=lambda d: os.mkfifo(d / "fifo.jsonl"),
                           pattern=r"\[workload\] dataset: .*fifo\.jsonl is not a regular file"),
    "dataset a device": Case(workload('dataset = "/dev/zero"'),
                             pattern=r"\[workload\] dataset: /dev/zero is not a regular file"),
    "dataset longer than the context": Case(
        workload('dataset = "d.jsonl"').replace('model-path = "/m"', 'model-path = "/m"\ncontext-length = 512'),
        files={"d.jsonl": '{"prompt": "short", "max_tokens": 20}\n'
                          + json.dumps({"prompt": "word " * 800, "max_tokens": 100}) + "\n"},
        pattern=r"d\.jsonl: line 2: at least 500 prompt tokens and 100 to generate exceed the server's context of "
                r"512 tokens"),
    "dataset and prompts": Case(workload('dataset = "d.jsonl"\nprompts = "p.jsonl"'),
                                pattern=r"\[workload\] dataset: and prompts are two sources of requests"),
    "ignore_eos not a boolean": Case(workload('ignore_eos = "yes"'),
                                     pattern=r"\[workload\] ignore_eos: must be"),
    "top_p zero": Case(workload("top_p = 0"), pattern=r"\[workload\] top_p: must be above 0"),
    "prompts a number": Case(workload("prompts = 3"), pattern=r"\[workload\] prompts: must be a string"),
    # -- [constraints], [health]
    "constraint key": Case(VALID + "[constraints]\nmax_ttft = 3\n", pattern=r"\[constraints\] max_ttft: unknown key"),
    "min_running_requests": Case(VALID + "[constraints]\nmin_running_requests = 0\n",
                                 pattern=r"\[constraints\] min_running_requests: must be at least 1"),
    "max_ttft negative": Case(VALID + "[constraints]\nmax_ttft_p99_ms = -1\n",
                              pattern=r"\[constraints\] max_ttft_p99_ms: must be a number of milliseconds above 0"),
    "capacity without an SLO": Case(study_key('objective = "capacity"'),
                                    pattern=r"\[constraints\] max_ttft_p99_ms: or max_itl_p99_ms is required with "
                                            r"objective = \"capacity\""),
    "capacity with only other constraints": Case(study_key('objective = "capacity"') + "[constraints]\n"
                                                 "min_running_requests = 4\n",
                                                 pattern=r"\[constraints\] max_ttft_p99_ms: or max_itl_p99_ms is "
                                                         r"required"),
    "capacity SLO zero": Case(study_key('objective = "capacity"') + "[constraints]\nmax_ttft_p99_ms = 0\n",
                              pattern=r"\[constraints\] max_ttft_p99_ms: must be a number of milliseconds above 0, "
                                      r"got 0"),
    "capacity ITL SLO negative": Case(study_key('objective = "capacity"') + "[constraints]\nmax_itl_p99_ms = -2.5\n",
                                      pattern=r"\[constraints\] max_itl_p99_ms: must be a number of milliseconds "
                                              r"above 0, got -2\.5"),
    "capacity ITL SLO text": Case(study_key('objective = "capacity"') + '[constraints]\nmax_itl_p99_ms = "50ms"\n',
                                  pattern=r"\[constraints\] max_itl_p99_ms: must be a number, got '50ms'"),
    "capacity with a mix": Case(study_key('objective = "capacity"') + "[workload]\nmix = { 8 = 1 }\n"
                                "[constraints]\nmax_ttft_p99_ms = 500\n",
                                pattern=r"\[workload\] mix: and objective = \"mix\" go together"),
    "max_error_rate": Case(VALID + "[constraints]\nmax_error_rate = 2\n",
                           pattern=r"\[constraints\] max_error_rate: must be from 0 to 1"),
    "health interval": Case(VALID + "[health]\ninterval = 5\n", pattern=r"\[health\] interval: must be from 0\.25"),
    "health timeout": Case(VALID + "[health]\ntimeout = 0\n", pattern=r"\[health\] timeout: must be from 1"),
    "health key": Case(VALID + "[health]\ntimout = 9\n", pattern=r"\[health\] timout: unknown key"),
    # -- the command line
    "negative budget": run(("run", "--study", "S", "--launches", "-3"), r"--launches.*-3 is not in the range"),
    "zero budget": run(("run", "--study", "S", "--launches", "0"), r"--launches.*0 is not in the range"),
    "nan timeout": run(("run", "--study", "S", "--timeout", "nan"), r"--timeout.*'nan' is not a finite number"),
    "inf timeout": run(("run", "--study", "S", "--timeout", "inf"), r"--timeout.*'inf' is not a finite number"),
    "negative timeout": run(("run", "--study", "S", "--timeout", "-1"), r"--timeout.*at least 0"),
    "until": run(("run", "--study", "S", "--until", "25:00"), r"--until: expected HH:MM"),
    "until minutes": run(("run", "--study", "S", "--until", "12:60"), r"--until: expected HH:MM"),
    "until words": run(("run", "--study", "S", "--until", "7am"), r"--until: expected HH:MM"),
    "trial number": run(("apply", "--study", "S", "--trial", "abc"), r"--trial.*'abc' is not a valid integer"),
    "negative trial number": run(("apply", "--study", "S", "--trial", "-1"), r"--trial.*-1 is not in the range"),
    "missing value": run(("report", "--study", "S", "--out"), r"--out.* requires an argument"),
    "unknown option": run(("run", "--study", "S", "--frobnicate"), r"No such option '--frobnicate'"),
    "unknown command": run(("tune", "--study", "S"), r"No such command 'tune'"),
    "no study": run(("run",), r"Missing option '--study'"),
    "unknown target": run(("run", "--study", "S", "--target", "nope"), r"S\.toml: no target 'nope'; targets: default"),
    "target with a newline": run(("run", "--study", "S", "--target", "default\n"),
                                 r"S\.toml: no target 'default\\n'; targets: default"),
    "all targets and one": run(("run", "--study", "S", "--all-targets", "--target", "default"),
                               r"--all-targets and --target exclude each other"),
    "unknown study name": Case(None, ("run", "--study", "nope"), r"unknown study 'nope': .*studies/nope\.toml does "
                                                                 r"not exist"),
    "study name with a newline": Case(None, ("run", "--study", "no\npe"),
                                      r"unknown study 'no\\npe': .*studies/no\\npe\.toml does not exist"),
    "study file missing": Case(None, ("validate", "--study", "gone.toml"), r"study file .*gone\.toml does not exist"),
    "study file a directory": Case(None, ("validate", "--study", "d.toml"), r"study file .*d\.toml does not exist",
                                   setup=lambda d: (d / "d.toml").mkdir()),
    "best format": run(("best", "--study", "S", "--format", "xml"), r"--format.*'xml' is not one of"),
    "best per concurrency as args": run(("best", "--study", "S", "--per-concurrency", "--format", "args"),
                                        r"--per-concurrency prints a table or --json, not --format args",
                                        setup=autotunes_study),
    "dashboard port": run(("dashboard", "--study", "S", "--port", "0"), r"--port.*0 is not in the range"),
    "dashboard on all addresses": run(("dashboard", "--study", "S", "--host", "0.0.0.0"),
                                      r"--host 0\.0\.0\.0 is not a loopback address", setup=autotunes_study),
    "dashboard host unknown": run(("dashboard", "--study", "S", "--host", "nonexistent.invalid", "--allow-remote"),
                                  r"--host nonexistent\.invalid: ", setup=autotunes_study),
    "dashboard host no name": run(("dashboard", "--study", "S", "--host", "a..b", "--allow-remote"),
                                  r"--host a\.\.b: not a host name or address", setup=autotunes_study),
    "report into a file": run(("report", "--study", "S", "--out", "f"), r"--out.*'f' is a file",
                              files={"f": "x"}),
    "sim surface study and profile": run(("sim", "surface", "--study", "S", "--profile", "qwen122b"),
                                         r"--study takes the profile and the space from the study file"),
    "sim profile seed": run(("sim", "profile", "--random", "-1"), r"--random.*-1 is not in the range"),
    "sim surface profile": run(("sim", "surface", "--profile", "nope"),
                               r"no profile 'nope' \(known names: .*qwen122b.*; or give a path to a \.toml\)"),
    # -- storage
    "memory storage flag": run(("run", "--study", "S", "--storage", "sqlite:///:memory:"),
                               r"--storage.*must name a database file"),
    "storage scheme flag": run(("status", "--study", "S", "--storage", "foo://x"),
                               r"--storage.*must be sqlite:///PATH or postgresql://"),
    "storage flag password hidden": run(("status", "--study", "S", "--storage", "foo://u:hunter22@h/x?sslpassword=zq9"),
                                        r"--storage.*'foo://u:\*\*\*@h/x\?sslpassword=\*\*\*'"),
    "postgres sslpassword hidden": run(("status", "--study", "S", "--storage",
                                        "postgresql://u@127.0.0.1:1/x?sslpassword=zq9secret"),
                                       r"cannot open storage postgresql://u@127\.0\.0\.1:1/x\?sslpassword=\*\*\*: "),
    "unwritable storage": run(("run", "--study", "S", "--storage", "sqlite:////proc/autotune-no/x.db"),
                              r"cannot open storage sqlite:////proc/autotune-no/x\.db: cannot create"),
    "status of a study never run": run(("status", "--study", "S"), r"no study database at .*S\.db: run `autotune run`"),
    "best of a study never run": run(("best", "--study", "S"), r"no study database at .*S\.db"),
    "report of a study never run": run(("report", "--study", "S", "--out", "r"), r"no study database at .*S\.db"),
    "dashboard of a study never run": run(("dashboard", "--study", "S"), r"no study database at .*S\.db"),
    "apply of a study never run": run(("apply", "--study", "S"), r"no study database at .*S\.db"),
    "no such study in the database": run(("status", "--study", "S"), r"no study 'S' in sqlite:///.*S\.db: run",
                                         setup=lambda d: optuna.create_study(study_name="other",
                                                                             storage=f"sqlite:///{d / 'S.db'}")),
    "status of another program's database": run(("status", "--study", "S", "--storage", "sqlite:///app.db"),
                                                r"no study database at sqlite:///.*app\.db: it holds no Optuna tables",
                                                setup=another_programs_database),
    "best of another program's database": run(("best", "--study", "S", "--storage", "sqlite:///app.db"),
                                              r"it holds no Optuna tables", setup=another_programs_database),
    "run on another program's database": run(("run", "--study", "S", "--storage", "sqlite:///app.db"),
                                             r"storage sqlite:///.*app\.db is another program's database \(tables "
                                             r"customers, none of Optuna's\)", setup=another_programs_database),
    "run on another tool's study": run(("run", "--study", "S", "--storage", "sqlite:///other.db"),
                                       r"study 'S' in sqlite:///.*other\.db was not created by autotune",
                                       setup=another_tools_study),
    "status of another tool's study": run(("status", "--study", "S", "--storage", "sqlite:///other.db"),
                                          r"study 'S' in sqlite:///.*other\.db was not created by autotune",
                                          setup=another_tools_study),
    "report of another tool's study": run(("report", "--study", "S", "--out", "r", "--storage", "sqlite:///other.db"),
                                          r"was not created by autotune", setup=another_tools_study),
    "storage not a database": run(("status", "--study", "S", "--storage", "sqlite:///junk.db"),
                                  r"cannot open storage sqlite:///.*junk\.db: file is not a database",
                                  setup=not_a_database),
    **{f"{name} a planted link": Case(setup=planted(name, directory_link), pattern=rf".*/{re.escape(name)} is a "
                                      rf"symbolic link \(to .*elsewhere.*\): autotune writes the study's {what} there "
                                      "itself and follows no link; remove the link$")
       for name, directory_link, what in (("S.log", False, "event log"), ("S-logs", True, "server logs"),
                                          ("S-artifacts", True, "trials' artifacts"))},
    **{f"{name} a planted link for restore": run(("restore", "--study", "S"), rf".*/{name} is a symbolic link",
                                               setup=planted(name, False))
       for name in ("S.log", "S-logs")},
    "event log a directory": Case(setup=lambda d: (d / "S.log").mkdir(),
                                  pattern=r".*/S\.log is not a regular file: autotune keeps the study's event log "
                                          r"there; move it away$"),
    "server logs a file": Case(setup=lambda d: (d / "S-logs").write_text("x"),
                               pattern=r".*/S-logs is not a directory: autotune keeps the study's server logs there"),
    "study resumed under other traffic": Case(
        workload('dataset = "d.jsonl"'), files={"d.jsonl": '{"prompt": "Once upon a time"}\n'},
        setup=study_of(workload('dataset = "d.jsonl"'),
                       '{"prompt": "Once upon a time"}\n{"prompt": "In a land far away"}\n'),
        pattern=r"study 'S' in sqlite:///.*S\.db was created with other traffic: 2 requests of d\.jsonl \(digest "
                r"[0-9a-f]{16}\), the study file now sends 1 requests of d\.jsonl \(digest [0-9a-f]{16}\); its "
                r"measurements and baseline are of that traffic: put it back, or give the study a new name "
                r"\(--warm-start S measures its best configs first\)$"),
    "study resumed at other loads": Case(
        workload("concurrency = [1, 8]"), setup=study_of(VALID),
        pattern=r"study 'S' in sqlite:///.*S\.db was created with other traffic: concurrency = \[1, 8, 32\], the "
                r"study file now sends concurrency = \[1, 8\]"),
    "study resumed with other choices": Case(
        space('[space.page-size]\ntype = "categorical"\nchoices = [1, 16, 64]'),
        setup=study_of(space('[space.page-size]\ntype = "categorical"\nchoices = [1, 16]')),
        pattern=r"study 'S' in sqlite:///.*S\.db was created with \[space\.page-size\] choices = \[1, 16\], the "
                r"study file now says \[1, 16, 64\]: a study keeps its choices for its life \(Optuna's rule\); put "
                r"it back, or give the study a new name \(--warm-start S measures its best configs first\)$"),
    "study resumed with another type": Case(
        space('[space.page-size]\ntype = "int"\nlow = 1\nhigh = 16'),
        setup=study_of(space('[space.page-size]\ntype = "categorical"\nchoices = [1, 16]')),
        pattern=r"was created with \[space\.page-size\] type = \"categorical\", the study file now says \"int\""),
    "study resumed under another objective": Case(study_key('objective = "single"'), setup=autotunes_study,
                                                  pattern=r"study 'S' in sqlite:///.*S\.db was created with objective "
                                                          r"= 'weighted', the study file now says 'single': put "
                                                          r"'weighted' back, or give the study a new name$"),
    **{f"[space.{flag}]": Case(space(f'[space.{flag}]\ntype = "categorical"\nchoices = [{value}]'),
                               ("validate", "--study", "S"), rf"\[space\.{flag}\]: {flag} is {why}, not a flag to tune")
       for flag, value, why in (
           ("port", "31555, 31556", "the server's port, which the target's server_port sets"),
           ("host", '"127.0.0.1", "0.0.0.0"', "the address autotune reaches the server at"),
           ("model-path", '"/m", "/n"', "the model the study measures"),
           ("api-key", '"a", "b"', "the API key autotune sends with every request"),
           ("admin-api-key", '"a", "b"', "a secret, given to the server by autotune"),
           ("speculative-adaptive-config", '"a.json"', "the adaptive server's schedule file, which autotune writes"))},
    "apply an interrupted trial": run(("apply", "--study", "S", "--trial", "1"),
                                      r"trial 1 was never measured \(interrupted\): apply a measured trial "
                                      r"\(`autotune status` lists them\), or the best \(no --trial\)$",
                                      setup=interrupted_trial),
    "storage a directory": run(("run", "--study", "S", "--storage", "sqlite:///sub"), r"cannot open storage",
                               setup=lambda d: (d / "sub").mkdir()),
    # -- the third audit: unbounded reads, names that become file names, choices the sampler confuses
    "prompts from /dev/zero": Case(workload('prompts = "/dev/zero"'),
                                   pattern=r"\[workload\] prompts: /dev/zero is not a regular file"),
    "prompts a FIFO": Case(workload('prompts = "p.fifo"'), setup=lambda d: os.mkfifo(d / "p.fifo"),
                           pattern=r"\[workload\] prompts: .*p\.fifo is not a regular file"),
    "prompts name too long": Case(workload(f'prompts = "{"p" * 300}"'),
                                  pattern=r"\[workload\] prompts: cannot read .*: File name too long"),
    "name of 300 characters": Case(study_key(f'name = "{"n" * 300}"'),
                                   pattern=r"\[study\] name: is 300 characters long; at most 100"),
    "status of a 300-character name": Case(study_key(f'name = "{"n" * 300}"'), argv=("status", "--study", "S"),
                                           pattern=r"\[study\] name: is 300 characters long"),
    "best of a 300-character name": Case(study_key(f'name = "{"n" * 300}"'), argv=("best", "--study", "S"),
                                         pattern=r"\[study\] name: is 300 characters long"),
    "report of a 300-character name": Case(study_key(f'name = "{"n" * 300}"'),
                                           argv=("report", "--study", "S", "--out", "r"),
                                           pattern=r"\[study\] name: is 300 characters long"),
    "dashboard of a 300-character name": Case(study_key(f'name = "{"n" * 300}"'), argv=("dashboard", "--study", "S"),
                                              pattern=r"\[study\] name: is 300 characters long"),
    "study path too long": run(("validate", "--study", "s" * 300 + ".toml"), r"study file s+\.toml does not exist"),
    "study name too long": run(("status", "--study", "s" * 300), r"unknown study 's+': .* does not exist"),
    "storage name too long": run(("status", "--study", "S", "--storage", "sqlite:///" + "d" * 300),
                                 r"cannot open storage sqlite:///.*d+: File name too long"),
    "study file of 5 MiB": Case(VALID + "# " + "x" * 5 * 2**20 + "\n",
                                pattern=r"S\.toml: larger than 4 MiB: not a study file"),
    "choices true and 1": Case(space('[space.cuda-graph]\ntype = "categorical"\nchoices = [true, 1]'),
                               pattern=r"\[space\.cuda-graph\] choices: has duplicate values: true and 1 \(equal"),
    "choices 1 and 1.0": Case(space('[space.chunk]\ntype = "categorical"\nchoices = [1, 2, 1.0]'),
                              pattern=r"\[space\.chunk\] choices: has duplicate values: 1 and 1\.0 \(equal"),
    "choices false and 0.0": Case(space('[space.chunk]\ntype = "categorical"\nchoices = [false, 0.0]'),
                                  pattern=r"\[space\.chunk\] choices: has duplicate values: false and 0\.0"),
}

#: the bad inputs the last audit found wrong, run again as a real `autotune` process
AUDIT = ("study file not UTF-8", "prompts not UTF-8", "prompts nested too deeply", "mix level in superscript",
         "seed beyond 32 bits", "concurrency huge", "mix shares of 1e308", "another user's workdir",
         "dashboard host unknown", "draft tokens to two billion", "env name with a newline", "name with a newline",
         "target name with a newline", "flag name with a newline", "choice with a newline",
         "run on another tool's study", "status of another program's database")


def prepare(tmp_path: Path, case: Case) -> tuple[list[str], dict[str, str], str]:
    """Write the case's files; its command line (the study file's path for "S"), environment and pattern. The
    study's ports 31555 and 31556 become two of this case's own: a case that gets as far as the one-tuner lock
    (a lock on the port, machine-wide) never meets another case's lock on the next worker."""
    port = free_port()
    ports = {b"31555": str(port).encode(), b"31556": str(port + 1).encode()}

    def own(data: bytes) -> bytes:
        for old, new in ports.items():
            data = data.replace(old, new)
        return data
    if case.study is not None:
        data = case.study if isinstance(case.study, bytes) else case.study.encode()
        (tmp_path / "S.toml").write_bytes(own(data))
    for name, content in case.files.items():
        (tmp_path / name).write_bytes(own(content if isinstance(content, bytes) else content.encode()))
    if case.setup is not None:
        case.setup(tmp_path)
    argv = [str(tmp_path / "S.toml") if a == "S" else a for a in case.argv]
    return argv, dict(case.env), own(case.pattern.encode()).decode()


def snapshot(directory: Path) -> dict[str, str]:
    """Every file and folder under ``directory``, with a digest of each file's bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


def check(code: int, stderr: str, stdout: str, pattern: str) -> None:
    assert code == 2, (code, stderr, stdout[-500:])
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("autotune: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in stderr + stdout


def in_process(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`main()` as the `autotune` script runs it; what it changes in the process (umask, exception hooks) is put
    back."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["autotune", *argv])
    umask = os.umask(0o022)
    os.umask(umask)
    hooks = sys.excepthook, threading.excepthook
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.umask(umask)
        sys.excepthook, threading.excepthook = hooks
    out, err = capsys.readouterr()
    return code, err, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    argv, env, pattern = prepare(tmp_path, CASES[case])
    before = snapshot(tmp_path)
    code, err, out = in_process(argv, env, monkeypatch, capsys)
    check(code, err, out, pattern)
    assert snapshot(tmp_path) == before, "a bad input changed the study's directory"


@pytest.mark.parametrize("case", AUDIT)
def test_the_audits_bad_inputs_through_the_real_command(tmp_path: Path, case: str) -> None:
    argv, env, pattern = prepare(tmp_path, CASES[case])
    before = snapshot(tmp_path)
    r = run_autotune(*argv, cwd=tmp_path, env=env)
    check(r.returncode, r.stderr, r.stdout, pattern)
    assert snapshot(tmp_path) == before, "a bad input changed the study's directory"


def test_the_table_holds_150_bad_inputs() -> None:
    assert len(CASES) >= 150, len(CASES)
    assert set(AUDIT) <= set(CASES)
