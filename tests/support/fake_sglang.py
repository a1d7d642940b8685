"""A host's own SGLang as a test sets it: a real ``sglang`` package, written into a directory a real python imports
(the target's ``PYTHONPATH``), with a GPU named by an ``nvidia-smi`` there (the target's ``PATH``).

- ``python -m sglang.launch_server`` starts the emulator (autotune.sim) with the flags it is given;
- ``sglang.srt.server_args`` resolves as the emulator's host resolution does (autotune.sim.hostargs), with the values
  of the file ANSWER laid over its resolved values (a release whose rules, or whose bugs, answer what a test wants);
  every question adds a line to the file ASKED, and the environment variable FAKE_SGLANG_MARK it was asked under
  to the file ASKED_ENV;
- ``sglang.__version__`` is the text of the file VERSION, and ``nvidia-smi`` names the GPU of the file GPU.

Change a file between two runs and the host has changed: a new release, another GPU, another answer."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: the repository, whose autotune the stand-in imports
ROOT = Path(__file__).resolve().parents[2]

_INIT = '''import pathlib
__version__ = pathlib.Path(__file__).with_name("VERSION").read_text().strip()
'''
_LAUNCH = '''from autotune.sim.startup import main
main()
'''
_SERVER_ARGS = '''import json
import os
import pathlib
from autotune.sim import hostargs

HERE = pathlib.Path(__file__).resolve().parents[1]


class _Answer:
    def __init__(self, real):
        self._real = real

    def resolve_once(self):
        self._real.resolve_once()

    def resolved_dict(self):
        values = self._real.resolved_dict()
        values.update(json.loads((HERE / "ANSWER").read_text()))
        return values


def prepare_server_args(argv):
    with open(HERE / "ASKED", "a") as f:
        f.write(json.dumps(argv) + "\\n")
    with open(HERE / "ASKED_ENV", "a") as f:
        f.write(json.dumps(os.environ.get("FAKE_SGLANG_MARK")) + "\\n")
    return _Answer(hostargs.prepare_server_args(argv))
'''
_NVIDIA_SMI = '''#!/bin/sh
cat "$(dirname "$0")/GPU"
'''


class FakeSGLang:
    """The package in ``directory``; ``env`` is what the target's environment needs to find it."""

    def __init__(self, directory: Path, version: str = "0.5.23", gpu: str = "NVIDIA H100 80GB HBM3, 9.0") -> None:
        self.directory = directory
        package = directory / "sglang"
        (package / "srt").mkdir(parents=True)
        (package / "__init__.py").write_text(_INIT)
        (package / "launch_server.py").write_text(_LAUNCH)
        (package / "srt" / "__init__.py").write_text("")
        (package / "srt" / "server_args.py").write_text(_SERVER_ARGS)
        smi = directory / "bin" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text(_NVIDIA_SMI)
        smi.chmod(0o755)
        self.version = version
        self.gpu = gpu
        self.answer({})
        (package / "ASKED").write_text("")
        (package / "ASKED_ENV").write_text("")

    @property
    def command(self) -> list[str]:
        """The study's server command: this python, SGLang's launcher."""
        return [sys.executable, "-m", "sglang.launch_server"]

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": f"{self.directory}{os.pathsep}{ROOT}",
                "PATH": f"{self.directory / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    @property
    def version(self) -> str:
        return (self.directory / "sglang" / "VERSION").read_text()

    @version.setter
    def version(self, text: str) -> None:
        (self.directory / "sglang" / "VERSION").write_text(text)

    @property
    def gpu(self) -> str:
        return (self.directory / "bin" / "GPU").read_text()

    @gpu.setter
    def gpu(self, row: str) -> None:
        """nvidia-smi's row: "NAME, COMPUTE_CAP"."""
        (self.directory / "bin" / "GPU").write_text(row + "\n")

    def serve(self, study: Path) -> Path:
        """Make a study file of autotune.testing.studies run its servers here (its command and its target's env)."""
        text = study.read_text()
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.env.items())
        for old, new in (('command = ["autotune-sim"]', f"command = {json.dumps(self.command)}"),
                         ('kind = "local"\n', f'kind = "local"\nenv = {{ {env} }}\n')):
            assert old in text, old
            text = text.replace(old, new, 1)
        study.write_text(text)
        return study

    def answer(self, values: dict[str, Any]) -> None:
        """Lay ``values`` (SGLang's field names) over every resolution from now on."""
        (self.directory / "sglang" / "ANSWER").write_text(json.dumps(values))

    @property
    def asked(self) -> list[list[str]]:
        """The questions asked so far, each the flags it was asked about."""
        text = (self.directory / "sglang" / "ASKED").read_text()
        return [json.loads(line) for line in text.splitlines()]

    @property
    def asked_under(self) -> list[str | None]:
        """Each question's environment variable FAKE_SGLANG_MARK (None: not set), as the engine there saw it."""
        text = (self.directory / "sglang" / "ASKED_ENV").read_text()
        return [json.loads(line) for line in text.splitlines()]
