"""The whole model through the real SGLang on this CPU and this project's kernels, against transformers: in float32,
every token's log-probability SGLang reports (its prompt's and the greedy answer's) within 1e-3 of transformers' own
for the same token ids, and the answer transformers' argmax at every step. Speculative decoding on top of it must
change nothing of a greedy answer: a STANDALONE chain and tree, and NGRAM, answer as the plain server does."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.testing import sglang_cpu
from tests.support import requires

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "The three primary colours of light are"
ANSWER_TOKENS = 16
REFERENCE = Path(sglang_cpu.__file__).with_name("reference_logprobs.py")


def _reference(ids: list[int], top: int) -> dict:
    """transformers' float32 log-probabilities of ``ids``, in the sglang-cpu venv."""
    done = subprocess.run([str(sglang_cpu.python()), str(REFERENCE), str(sglang_cpu.model())],
                          input=json.dumps({"ids": ids, "top": top}), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _generate(server: sglang_cpu.RealSGLang, **extra: object) -> dict:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": ANSWER_TOKENS, "temperature": 0,
                                                 "ignore_eos": True}, **extra}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text[:500]
    return response.json()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sglang_cpu.RealSGLang]:
    """The plain server, in float32."""
    requires.sglang_cpu()
    server = sglang_cpu.RealSGLang(["--dtype", "float32"], tmp_path_factory.mktemp("plain"))
    try:
        yield server.wait_ready()
    finally:
        server.kill()
        assert SGLang().fatal_lines(server.log.splitlines()) == []


def test_float32_log_probabilities_are_transformers_within_1e_3(plain: sglang_cpu.RealSGLang) -> None:
    out = _generate(plain, return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    meta = out["meta_info"]
    prompt, answer = meta["input_token_logprobs"], meta["output_token_logprobs"]
    ids = [token for _, token, _ in prompt] + [token for _, token, _ in answer]
    ours = [logprob for logprob, _, _ in prompt[1:]] + [logprob for logprob, _, _ in answer]
    reference = _reference(ids, top=1)
    worst = max(abs(a - b) for a, b in zip(ours, reference["logprobs"], strict=True))
    print(f"{len(ours)} tokens, the largest difference from transformers' log-probability {worst:.2e}")
    assert worst < 1e-3
    greedy = [top[0][0] for top in reference["top"][len(prompt) - 1:]]
    assert [token for _, token, _ in answer] == greedy


@pytest.mark.parametrize("speculative", [
    ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
     "--speculative-num-draft-tokens", "4"],
    ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "4",
     "--speculative-num-draft-tokens", "6"],
    ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6",
     "--speculative-ngram-max-bfs-breadth", "2"],
], ids=["chain", "tree", "ngram"])
def test_speculative_decoding_answers_as_the_plain_server_does(plain: sglang_cpu.RealSGLang, tmp_path: Path,
                                                               speculative: list[str]) -> None:
    """float32, so that batched verification's arithmetic cannot flip a near tie; the draft's figures in meta_info."""
    draft = ["--speculative-draft-model-path", str(sglang_cpu.model(sglang_cpu.DRAFT))]
    drafted = sglang_cpu.RealSGLang(["--dtype", "float32", *speculative,
                                     *(draft if "STANDALONE" in speculative else [])], tmp_path)
    try:
        drafted.wait_ready()
        got = _generate(drafted)
    finally:
        drafted.kill()
    assert SGLang().fatal_lines(drafted.log.splitlines()) == []
    assert got["output_ids"] == _generate(plain)["output_ids"]
    meta = got["meta_info"]
    assert meta["spec_verify_ct"] >= 1 and 1.0 <= meta["spec_accept_length"] <= ANSWER_TOKENS
