"""The emulator held to the real SGLang 0.5.23 server: the same requests to both, and what autotune reads of the
answers compared (status codes, JSON keys and their types, the framing of each stream, the start-up and failure
lines). Speed and acceptance figures are never compared: the emulator models a GPU host, the real server runs
SmolLM2-135M on this CPU.

Every difference is either fixed in the emulator or listed in ``LISTED`` with its reason; any other fails the
test, naming the request and the path of the difference. The requests are the product's own (``SGLang``'s
generation and chat requests) plus the endpoints it and its tests read, and requests SGLang refuses."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from autotune.engines import Sampling
from autotune.engines.sglang import SGLang
from autotune.testing import sglang_cpu
from tests.support import requires
from tests.support.emulator import Emulator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE = SGLang()
#: the speculative config both servers run: a chain of the draft model (STANDALONE on the real server)
CHAIN = ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "3"]
#: a KV pool smaller than the context, so that a prompt can fit the one and not the other
SHARED = ["--disable-cuda-graph", "--context-length", "2048", "--max-total-tokens", "1024", "--max-running-requests",
          "4", "--enable-metrics"]
#: the emulator as an 8B Llama host starting at once, decoding at that host's pace (faster, its streams would
#: carry several tokens an event); its figures are not compared
EMULATED = ["--sim-profile", "llama8b", "--sim-time-scale", "0.01"]

#: differences the emulator keeps on purpose, by the path they are found at (a regular expression over
#: "request: path"), each with its reason. None today: every difference this test found when it was written (the
#: meta_info timings, the sglext event of speculative figures, the /v1/loads sections, ServerArgs' fields that no flag
#: sets, ...) was fixed in the emulator.
LISTED: dict[str, str] = {}


@dataclass(frozen=True)
class Call:
    """One request, sent the same to both servers."""

    name: str
    method: str
    path: str
    body: Any = None
    stream: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def _product_calls() -> list[Call]:
    """The generation requests exactly as autotune's load generator sends them."""
    sampling = Sampling(temperature=0.0, ignore_eos=True)
    generate = ENGINE.generation_request("The capital of France is", 12, 0.0, sampling)
    chat = ENGINE.chat_request([("user", "Say hello in three words.")], 12, sampling)
    return [Call("generate stream", "POST", generate.path, generate.body, stream=True),
            Call("chat stream", "POST", chat.path, chat.body, stream=True)]


CALLS = [
    Call("ready", "GET", "/ready"),
    Call("health", "GET", "/health"),
    Call("health_generate", "GET", "/health_generate"),
    Call("models", "GET", "/v1/models"),
    Call("model_info", "GET", "/model_info"),
    Call("get_model_info", "GET", "/get_model_info"),
    Call("server_info", "GET", "/server_info"),
    Call("get_server_info", "GET", "/get_server_info"),
    Call("loads", "GET", "/v1/loads"),
    Call("flush_cache", "POST", "/flush_cache"),
    *_product_calls(),
    Call("generate", "POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 6,
                                                                               "temperature": 0}}),
    Call("chat", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                  "temperature": 0, "return_spec_tokens_details": True}),
    Call("completions stream", "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6,
                                                           "temperature": 0, "stream": True}, stream=True),
    Call("chat, not JSON", "POST", "/v1/chat/completions", "hello", headers=(("content-type", "text/plain"),)),
    Call("chat, no messages", "POST", "/v1/chat/completions", {"max_tokens": 4}),
    Call("generate, longer than the context", "POST", "/generate",
         {"text": "word " * 3000, "sampling_params": {"max_new_tokens": 4}}),
    *(Call(f"{endpoint}{', stream' if stream else ''}, longer than the KV pool", "POST", path,
           {**body, "stream": stream, "stream_options": {"include_usage": True}} if stream and "messages" in body
           else {**body, "stream": stream}, stream=stream)
      for endpoint, path, body in (
          ("generate", "/generate", {"text": "word " * 1500, "sampling_params": {"max_new_tokens": 4}}),
          ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 1500}],
                                            "max_tokens": 4}))
      for stream in (False, True)),
]


def _shape(value: Any) -> Any:
    """A JSON value's shape: objects by key, arrays by their first element, scalars by type (a number is a number)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


def _differences(real: Any, emulated: Any, path: str = "") -> Iterator[str]:
    if isinstance(real, dict) and isinstance(emulated, dict):
        for key in sorted(real.keys() | emulated.keys()):
            if key not in emulated:
                yield f"{path}.{key}: the real server has it ({_brief(real[key])}), the emulator has not"
            elif key not in real:
                yield f"{path}.{key}: the emulator has it ({_brief(emulated[key])}), the real server has not"
            else:
                yield from _differences(real[key], emulated[key], f"{path}.{key}")
    elif isinstance(real, list) and isinstance(emulated, list) and real and emulated:
        yield from _differences(real[0], emulated[0], f"{path}[0]")
    elif real != emulated and "null" not in (real, emulated) and [] not in (real, emulated):
        yield f"{path}: the real server's is {_brief(real)}, the emulator's {_brief(emulated)}"


def _brief(shape: Any) -> str:
    return json.dumps(shape)[:80]


def _events(text: str) -> list[Any]:
    """A stream's events in order: each ``data:`` payload's shape, "[DONE]", or "event: NAME"."""
    out: list[Any] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data:"):
                payload = line[5:].strip()
                out.append(payload if payload == "[DONE]" else _shape(json.loads(payload)))
            elif line.startswith("event:"):
                out.append(line)
    return out


def _framing(events: list[Any]) -> list[str]:
    """The stream's kinds of event in order, repeats of a kind collapsed: its framing, whatever its length."""
    kinds: list[str] = []
    for event in events:
        kind = event if isinstance(event, str) else _kind(event)
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def _kind(event: dict[str, Any]) -> str:
    if "sglext" in event:
        return "sglext"
    if "error" in event:
        return "error"
    choices = event.get("choices")
    if choices == [] or (choices is None and "meta_info" not in event):
        return "usage"
    if choices:
        choice = choices[0]
        delta = choice.get("delta") or {}
        if choice.get("finish_reason") != "null":
            return "finish"
        return "role" if "role" in delta else "text"
    return "meta_info finished" if event["meta_info"].get("finish_reason") not in (None, "null") else "meta_info"


def _first_of_each_kind(events: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for event in events:
        if not isinstance(event, str):
            out.setdefault(_kind(event), event)
    return out


def _ask(url: str, call: Call) -> tuple[int, Any]:
    """(status, body shape) of a plain call; (status, the stream's events) of a streaming one."""
    headers = dict(call.headers)
    content = call.body if isinstance(call.body, str) else None
    body = None if isinstance(call.body, str) else call.body
    with httpx.Client(base_url=url, timeout=120) as client:
        response = client.request(call.method, call.path, json=body, content=content, headers=headers)
    if call.stream and response.status_code == 200:
        return response.status_code, _events(response.text)
    try:
        return response.status_code, _shape(response.json())
    except ValueError:
        return response.status_code, "text"


def _listed(where: str) -> bool:
    return any(re.fullmatch(pattern, where.split(": the ")[0]) for pattern in LISTED)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sglang_cpu.RealSGLang, Emulator]]:
    requires.sglang_cpu()
    workdir = tmp_path_factory.mktemp("differential")
    draft = ["--speculative-draft-model-path", str(sglang_cpu.model(sglang_cpu.DRAFT))]
    real = sglang_cpu.RealSGLang([*CHAIN, *draft, *SHARED], workdir)
    emulated = Emulator(["--model-path", str(sglang_cpu.model()), *CHAIN, *draft, *SHARED, *EMULATED], workdir)
    try:
        emulated.wait_ready(60)
        real.wait_ready()
        yield real, emulated
    finally:
        real.kill()
        emulated.kill()


def test_every_answer_has_the_real_servers_status_keys_types_and_framing(servers) -> None:
    real, emulated = servers
    unlisted: list[str] = []
    for call in CALLS:
        real_status, real_body = _ask(real.url, call)
        emulated_status, emulated_body = _ask(emulated.url, call)
        if real_status != emulated_status:
            unlisted.append(f"{call.name}: status {real_status} from the real server, {emulated_status} from the "
                            "emulator")
            continue
        if call.stream and real_status == 200:
            real_framing, emulated_framing = _framing(real_body), _framing(emulated_body)
            if real_framing != emulated_framing:
                unlisted.append(f"{call.name}: framing {real_framing} from the real server, {emulated_framing} "
                                "from the emulator")
            real_body, emulated_body = _first_of_each_kind(real_body), _first_of_each_kind(emulated_body)
        for difference in _differences(real_body, emulated_body):
            where = f"{call.name}: {difference}"
            if not _listed(where):
                unlisted.append(where)
    assert not unlisted, "the emulator differs from SGLang 0.5.23:\n" + "\n".join(unlisted)


def test_the_emulators_metrics_are_sglangs(servers) -> None:
    """/metrics (with --enable-metrics) in Prometheus' text format on both, and every metric the emulator exports is
    one the real server exports (it has fewer: the real server's 100-odd include its CPU, cache and tokenizer)."""
    names: list[set[str]] = []
    for server in servers:
        response = httpx.get(f"{server.url}/metrics", timeout=30)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        names.append({re.split(r"[{ ]", line)[0] for line in response.text.splitlines()
                      if line and not line.startswith("#")})
    real, emulated = names
    assert emulated and not emulated - real, f"the emulator's metrics SGLang has not: {sorted(emulated - real)}"


def test_both_start_up_logs_read_the_same_to_autotune(servers) -> None:
    """No line of a healthy start reads as fatal, and the capacity line autotune cross-checks is in both."""
    real, emulated = servers
    for log in (real.log, emulated.log):
        assert ENGINE.fatal_lines(log.splitlines()) == []
    real_capacity, emulated_capacity = ENGINE.capacity_from_log(real.log), ENGINE.capacity_from_log(emulated.log)
    assert real_capacity.keys() == emulated_capacity.keys() == {"max_total_num_tokens", "max_running_requests",
                                                                "context_len"}
    assert real_capacity["max_running_requests"] == 4 == emulated_capacity["max_running_requests"]


def test_a_tree_of_too_few_draft_tokens_crashes_both_at_the_first_verify(tmp_path: Path) -> None:
    """Steps 3, topk 2, draft 2: both resolve it and start, and the scheduler dies at the first verify (SGLang's own
    warm-up request), before the server is ever ready: the same fatal kind for autotune, the same exception of
    SGLang's _compact_accept_to_front, and the same lines after it."""
    requires.sglang_cpu()
    tree = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
            str(sglang_cpu.model(sglang_cpu.DRAFT)), "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "2", "--disable-cuda-graph"]
    real = sglang_cpu.RealSGLang(tree, tmp_path)
    emulated = Emulator(["--model-path", str(sglang_cpu.model()), *tree, *EMULATED], tmp_path)
    try:
        assert emulated.wait_exit(60) != 0
        assert real.wait_exit(240) is not None, real.tail()
        for server in (real, emulated):
            kinds = [kind for kind, _ in ENGINE.fatal_lines(server.log.splitlines())]
            assert kinds[:1] == ["crashed"], (kinds, server.log[-2000:])
            log = server.log
            assert "_compact_accept_to_front" in log
            assert "The expanded size of the tensor (2) must match the existing size (4)" in log
            assert log.index("Scheduler hit an exception") < log.index("SIGQUIT received") \
                < log.index("No live scheduler processes found")
    finally:
        real.kill()
        emulated.kill()
