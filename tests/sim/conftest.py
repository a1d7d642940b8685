"""Fixtures that run the emulator as a real process on a free port and always kill its process group."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

QWEN = ["--model-path", "/shared/models/Qwen3.5-122B-A10B", "--tp-size", "4"]
LLAMA = ["--model-path", "/shared/models/Llama-3.1-8B-Instruct", "--sim-profile", "llama8b"]
FAST = ["--sim-time-scale", "0.01", "--sim-speedup", "20", "--sim-seed", "7"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Emulator:
    """``python -m autotune.sim`` in its own session; stderr/stdout go to files the test can read."""

    def __init__(self, args: list[str], workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.args = [*args, "--port", str(self.port)]
        self.stderr_path = workdir / f"emulator-{self.port}.err"
        self.stdout_path = workdir / f"emulator-{self.port}.out"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.sim", *self.args],
            stdout=self.stdout_path.open("wb"), stderr=self.stderr_path.open("wb"), start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def out(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30), **kwargs)

    def wait_ready(self, timeout: float = 30.0) -> Emulator:
        """Poll /ready (answers at once, unlike /health) until 200; fail with the log if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"emulator exited with {self.proc.returncode}:\n{self.log[-3000:]}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"emulator not ready after {timeout}s:\n{self.log[-3000:]}")

    def wait_log(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log
            if text in log:
                return log
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not logged:\n{self.log[-3000:]}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"emulator still running after {timeout}s:\n{self.log[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def emulator(tmp_path):
    """Factory: ``emulator(*args)`` starts one emulator; every one started is killed at teardown."""
    started: list[Emulator] = []

    def start(*args: str, port: int | None = None) -> Emulator:
        emu = Emulator(list(args), tmp_path, port)
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.kill()


def _shared(tmp_path_factory, name: str, args: list[str]):
    emu = Emulator(args, tmp_path_factory.mktemp(name))
    try:
        emu.wait_ready(60)
        yield emu
    finally:
        emu.kill()


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    """qwen122b, EAGLE steps 2 / topk 1 (draft given as 5: rewritten to 3), metrics on."""
    yield from _shared(tmp_path_factory, "qwen", [
        *QWEN, *FAST, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5", "--enable-metrics",
        "--served-model-name", "qwen3.5-122b", "--decode-log-interval", "10",
    ])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama8b without speculative decoding, protected by --api-key."""
    yield from _shared(tmp_path_factory, "llama", [*LLAMA, *FAST, "--api-key", "sekret"])


def sse_events(response: httpx.Response) -> list:
    """The JSON payloads of an SSE response, then the literal "[DONE]" if it was sent."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
