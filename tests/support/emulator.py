"""The emulator as a real process on a free port (its process group always killed), and what its answers hold."""
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

from autotune.testing.ports import free_port

QWEN = ["--model-path", "/shared/models/Qwen3.5-122B-A10B", "--tp-size", "4"]
LLAMA = ["--model-path", "/shared/models/Llama-3.1-8B-Instruct", "--sim-profile", "llama8b"]
FAST = ["--sim-time-scale", "0.01", "--sim-speedup", "20", "--sim-seed", "7"]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_emulator(port: int, steps: int, topk: int, draft: int, speedup: float = 10, model: str = "/m",
                   profile: str | None = None, tp: int = 4) -> subprocess.Popen[bytes]:
    """The emulator of an EAGLE config on ``port``, once it is ready (its process group is the
    caller's to kill)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.sim", "--model-path", model, "--tp-size", str(tp), "--port", str(port),
         "--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps), "--speculative-eagle-topk",
         str(topk), "--speculative-num-draft-tokens", str(draft), "--sim-time-scale", "0.005", "--sim-speedup",
         str(speedup), *(("--sim-profile", profile) if profile else ())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("emulator did not start")


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


def sse_events(response: httpx.Response) -> list:
    """The JSON payloads of an SSE response, then the literal "[DONE]" if it was sent."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
