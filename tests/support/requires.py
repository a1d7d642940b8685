"""The machine's parts the suite needs, each found or the test failed with one line naming the set-up command.

A missing part never skips a test: a skipped test looks like a passing one to whoever reads the summary, and the
suite is meant to run whole on every machine `scripts/setup.sh` has set up."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from autotune.testing import postgres
from autotune.testing import sglang_cpu as real_sglang
from autotune.testing.sglang_oracle import OracleMissing, oracle_python
from autotune.testing.sshd import find_sshd
from tests.support.llama_cache import cached_model, cached_server_binary

SETUP = "scripts/setup.sh"


def missing(part: str) -> NoReturn:
    pytest.fail(f"{part} is not on this machine: run {SETUP}", pytrace=False)


def sshd() -> str:
    found = find_sshd()
    return found if found is not None else missing("OpenSSH's server (sshd)")


def postgres_initdb() -> str:
    found = postgres.find_bin("initdb")
    return found if found is not None else missing(f"PostgreSQL (initdb), and {postgres.ENV} is not set,")


def llama_server() -> Path:
    found = cached_server_binary()
    return found if found is not None else missing("llama-server (built by scripts/build-llama-server.sh)")


def smollm2() -> Path:
    found = cached_model()
    return found if found is not None else missing("SmolLM2 (scripts/fetch-smollm2.sh)")


def torch() -> None:
    try:
        import torch as _torch  # noqa: F401
        import scipy  # noqa: F401
    except ImportError as e:
        missing(f"{e.name} (the [gp] extra, with torch==2.13.0's CPU build)")


def old_python(*versions: str) -> str:
    """The oldest Python of ``versions`` that runs: a pyenv install, or one on the PATH (not a pyenv shim)."""
    for version in versions:
        candidates = [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]
        candidates.append(shutil.which(f"python{version}") or "")
        for found in candidates:
            if found and "shims" not in found and subprocess.run(
                    [found, "-c", "pass"], capture_output=True, check=False).returncode == 0:
                return found
    missing(f"a Python {' or '.join(versions)}")


def sglang_oracle() -> Path:
    """The python of SGLang 0.5.23's argument resolution, the venv scripts/build-sglang-cpu.sh builds."""
    try:
        return oracle_python()
    except OracleMissing:
        missing("SGLang 0.5.23's venv (scripts/build-sglang-cpu.sh)")


def sglang_cpu() -> None:
    """SGLang 0.5.23 serving on this CPU, with its models (scripts/build-sglang-cpu.sh)."""
    try:
        real_sglang.python()
        real_sglang.model(real_sglang.TARGET)
        real_sglang.model(real_sglang.DRAFT)
        return
    except real_sglang.Missing:
        pass
    missing("SGLang serving on this CPU, or its models (scripts/build-sglang-cpu.sh)")
