"""The independent reference client (tests/support/reference_client.py) measures the emulator plausibly: no errors,
throughput near the model's noise-free figures, and a window that counts tokens from several requests."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from autotune.sim import tokens
from autotune.sim.surface import surface
from autotune.testing.ports import free_port
from autotune.testing import reference_client

SPEEDUP = 4
STEPS, TOPK, DRAFT = 3, 1, 4
# Words of at most 6 letters: each is one token for the emulator's tokenizer.
WORDS = ["the", "model", "reads", "each", "token", "of", "a", "prompt", "and", "then", "emits", "new", "ones", "while",
         "other", "jobs", "share", "its", "batch", "so", "cache", "grows", "as", "time", "goes", "by"]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running emulator's base URL (one for the module's tests); its process group is killed afterwards, whatever
    the tests did."""
    tmp_path = tmp_path_factory.mktemp("reference")
    port = free_port()
    log = (tmp_path / "sim.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.sim", "--model-path", "/m", "--tp-size", "4", "--port", str(port),
         "--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(STEPS), "--speculative-eagle-topk",
         str(TOPK), "--speculative-num-draft-tokens", str(DRAFT), "--sim-time-scale", "0.005",
         "--sim-speedup", str(SPEEDUP), "--sim-seed", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"emulator did not start:\n{(tmp_path / 'sim.log').read_text()[-3000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def prompts(n: int, tag: str) -> list[str]:
    """n distinct prompts of exactly 256 tokens for the emulator's tokenizer, distinct from their first token."""
    out = []
    for i in range(n):
        words = [f"{tag}{i}"] + [WORDS[(i + k) % len(WORDS)] for k in range(255)]
        out.append(" ".join(words))
        assert len(tokens.encode(out[-1], 248320)) == 256
    return out


def expected() -> tuple[float, float]:
    """The emulator's noise-free single-stream decode and concurrency-4 throughput for this config, at SPEEDUP."""
    for cfg in surface("qwen122b", 4)["configs"]:
        if list(cfg["params"].values()) == [STEPS, TOPK, DRAFT]:
            return cfg["single_tok_s"] * SPEEDUP, cfg["concurrent_tok_s"] * SPEEDUP
    raise AssertionError("config not in the surface")


@pytest.mark.alone
def test_reference_client_matches_the_emulator_model(emulator: str) -> None:
    single_expected, concurrent_expected = expected()

    single = reference_client.single_stream(emulator, prompts(4, "s"), max_tokens=256)
    print(f"\nsingle_stream: {single}  (surface decode {single_expected:.1f} tok/s)")
    assert single["requests"] == 4
    assert 0.7 * single_expected <= single["decode_tok_s"] <= 1.3 * single_expected
    assert single["output_tok_s"] <= single["decode_tok_s"]  # end-to-end includes time to first token

    # The surface's concurrent figure assumes 256-token prompts and outputs, as these are.
    loop = reference_client.closed_loop(emulator, prompts(300, "c"), max_tokens=256, concurrency=4, ramp_s=1.5,
                                        window_s=3.0)
    print(f"closed_loop: {loop}  (surface c4 {concurrent_expected:.1f} tok/s)")
    assert loop["errors"] == 0, loop["first_error"]
    assert 0.7 * concurrent_expected <= loop["output_tok_s"] <= 1.3 * concurrent_expected
    assert loop["completed_in_window"] >= 8
    assert loop["requests_in_window"] > loop["completed_in_window"]  # requests cut by the window edges count too


def test_reference_client_reports_errors(emulator: str) -> None:
    with pytest.raises(RuntimeError, match="HTTP 4"):
        reference_client.single_stream(emulator, ["x"], max_tokens=10**8)  # beyond the context
    with pytest.raises(ValueError, match="distinct"):
        reference_client.single_stream(emulator, ["a", "a"], max_tokens=4)
    with pytest.raises(ValueError, match="ran out of prompts"):
        reference_client.closed_loop(emulator, prompts(6, "r"), max_tokens=64, concurrency=2, ramp_s=1, window_s=1)


def test_chunked_sse_framing_split_anywhere() -> None:
    """Events split across chunks (and chunks split across reads) are reassembled; CRLF lines and trailers work."""
    events = [b'data: {"meta_info": {"completion_tokens": 1, "finish_reason": null}}\r\n\r\n',
              b': comment\n\ndata: {"meta_info": \ndata: {"completion_tokens": 3}}\n\n', b"data: [DONE]\n\n"]
    payload = b"".join(events)
    pieces = [payload[:10], payload[10:75], payload[75:76], payload[76:]]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"

    async def parse() -> list[str]:
        reader = asyncio.StreamReader()
        reader.feed_data(body)
        reader.feed_eof()
        chunks = reference_client._body(reader, {"transfer-encoding": "chunked"})
        return [data async for _, data in reference_client._sse(chunks)]

    assert asyncio.run(parse()) == ['{"meta_info": {"completion_tokens": 1, "finish_reason": null}}',
                                    '{"meta_info": \n{"completion_tokens": 3}}', "[DONE]"]
