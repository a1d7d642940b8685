"""SGLang 0.5.23's own server on this CPU, as tests, scripts and the ``sglang-cpu`` studies run it.

``scripts/build-sglang-cpu.sh`` (called by scripts/setup.sh) builds it into ``<cache>/sglang-cpu``: a venv with
SGLang and torch's CPU build, this project's torch ``sgl_kernel`` (``sgl_kernel/``, copied in), the start-up module
that routes SGLang to those kernels on any x86 CPU (``sglang_cpu_platform.py``) and SmolLM2-135M-Instruct with a
draft cut from it (``make_models.py``). ``RealSGLang`` runs one server: ``python -m sglang.launch_server`` with the
flags every server here needs (``SERVING``), in its own session, its log in a file. docs/real-sglang.md says what
it proves and what it does not.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from autotune.testing.ports import free_port

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]
STUDIES = REPO / "studies"
SETUP = "scripts/setup.sh"
TARGET = "SmolLM2-135M-Instruct"
DRAFT = f"{TARGET}-draft"

#: the flags every CPU server here runs with (docs/real-sglang.md): SGLang's CPU path with its kernel attention
#: backend (the one that verifies a speculative batch), bfloat16 (torch's CPU matmuls are fast in it; float16 takes
#: a slow path once a batch has more than a few rows, as every verify does), no CUDA graphs, a sleeping scheduler
#: when idle (otherwise it keeps most of a core busy), a KV pool and a batch sized for a 2-core machine; a later
#: --dtype (a test's float32) wins
SERVING = ("--device", "cpu", "--attention-backend", "intel_amx", "--dtype", "bfloat16", "--disable-cuda-graph",
           "--sleep-on-idle", "--mem-fraction-static", "0.3", "--max-total-tokens", "16384", "--context-length",
           "2048", "--max-running-requests", "4")
#: the server's environment: SGLang's CPU engine, one torch thread (two on 2 shared cores stall at every barrier)
ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}


class Missing(RuntimeError):
    """The sglang-cpu venv or its models are not built (scripts/setup.sh builds them)."""


def cache_dir() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE") or REPO / ".cache") / "sglang-cpu"


def python() -> Path:
    """The venv's python; ``Missing`` (naming the set-up command) when it is not built."""
    found = cache_dir() / "venv" / "bin" / "python"
    if not found.is_file():
        raise Missing(f"SGLang on this CPU is not built: no {found} (run {SETUP})")
    return found


def model(name: str = TARGET) -> Path:
    """A model directory made by scripts/build-sglang-cpu.sh (the target, or ``DRAFT``)."""
    found = cache_dir() / "models" / name
    if not (found / "config.json").is_file():
        raise Missing(f"the model {name} is not built: no {found} (run {SETUP})")
    return found


def command() -> list[str]:
    """The server command, as a study's ``[engine] command`` names it."""
    return [str(python()), "-m", "sglang.launch_server"]


def _absolute(value: Any) -> Any:
    """A path a shipped study names relative to studies/ ("../.cache/sglang-cpu/...", "NAME.jsonl"), absolute."""
    if isinstance(value, str) and value.startswith("../.cache/sglang-cpu/"):
        return str(cache_dir() / value.removeprefix("../.cache/sglang-cpu/"))
    if isinstance(value, str) and value.endswith(".jsonl") and "/" not in value:
        return str(STUDIES / value)
    return value


def study_file(directory: Path, base: str = "sglang-cpu", name: str = "t", **sections: dict[str, Any]) -> Path:
    """``studies/BASE.toml`` as a study NAME in ``directory``, its paths into the cache and to its datasets made
    absolute; each keyword replaces keys of that section (``study``, ``workload``, ``engine_args``...; a value None
    removes the key; ``space`` replaces the whole [space], ``target`` the whole [target])."""
    data = tomllib.loads((STUDIES / f"{base}.toml").read_text())
    data["engine"]["command"] = [_absolute(v) for v in data["engine"]["command"]]
    data["engine"]["args"] = {k: _absolute(v) for k, v in data["engine"]["args"].items()}
    data["workload"] = {k: _absolute(v) for k, v in data["workload"].items()}
    for section, changes in sections.items():
        if section in ("space", "target"):
            data[section] = changes
            continue
        table = data["engine"]["args"] if section == "engine_args" else data.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = _absolute(value)
    path = directory / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


class RealSGLang:
    """One SGLang server on a free port of 127.0.0.1, started with ``SERVING``, the target model and ``args``."""

    def __init__(self, args: Sequence[str], workdir: Path, *, port: int | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*command(), "--model-path", str(model()), *SERVING, *args, "--host", "127.0.0.1",
                     "--port", str(self.port)]
        self.log_path = workdir / f"sglang-{self.port}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **ENV, **(env or {})})

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> RealSGLang:
        """Poll /ready until 200; RuntimeError with the log's end if the process dies or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {self.proc.returncode} before it was ready:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"SGLang not ready after {timeout:.0f} s:\n{self.tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        """The exit status once the process ended, within ``timeout`` seconds (None: still running)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout)
        return None

    def tail(self, lines: int = 30) -> str:
        return "\n".join(line[:400] for line in self.log.splitlines()[-lines:])

    def kill(self) -> None:
        """The whole process group (the launcher, its scheduler and detokenizer), at once."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
