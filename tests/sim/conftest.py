"""Fixtures that run the emulator as a real process on a free port and always kill its process group."""
from __future__ import annotations

import pytest

from tests.support.emulator import FAST, LLAMA, QWEN, Emulator


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
