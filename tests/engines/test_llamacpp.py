"""llama-server engine: its rules, argv, log lines and stream format, then the real server with SmolLM2 on the CPU.

The fixtures below were captured from the llama-server that scripts/build-llama-server.sh builds (llama-cpp-python
0.3.36, server 0.5.0-dev commit 0c1e570) serving SmolLM2-135M-Instruct.Q4_1.gguf. The tests marked ``real`` start
that binary; they are skipped only when the binary or the model is not in the cache (see the skip reason).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.engines import config_key, get_engine
from autotune.engines.base import StreamUpdate
from autotune.engines.llamacpp import LlamaCpp
from autotune.errors import REASONS, InvalidConfig
from tests.support.llama_cache import cache_root, cached_model, cached_server_binary

ENGINE = LlamaCpp()
MODEL = "/m/SmolLM2-135M-Instruct.Q4_1.gguf"

# ---------------------------------------------------------------------------------------------------------------
# captured from the real server

#: a streamed /completion event (one per token, also when a verify step accepts several)
EVENT = {"index": 0, "content": " planet", "tokens": [3925], "stop": False, "id_slot": -1, "tokens_predicted": 5,
         "tokens_evaluated": 8}
#: the last event of a draft-simple request (-md same model, --spec-draft-n-max 4, n_predict 12);
#: generation_settings trimmed
FINAL_DRAFT = {
    "index": 0, "content": "", "tokens": [], "id_slot": 1, "stop": True,
    "model": "/work/main/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "tokens_predicted": 12,
    "tokens_evaluated": 8, "generation_settings": {"n_predict": 12, "ignore_eos": True,
                                                   "speculative.types": "none,draft-simple"},
    "prompt": "List the planets of the solar system.", "has_new_line": True, "truncated": False,
    "stop_type": "limit", "stopping_word": "", "tokens_cached": 19,
    "timings": {"cache_n": 0, "prompt_n": 8, "prompt_ms": 220.235, "prompt_per_token_ms": 27.529375,
                "prompt_per_second": 36.324834835516604, "predicted_n": 12, "predicted_ms": 931.783,
                "predicted_per_token_ms": 84.70754545454545, "predicted_per_second": 11.805323771736552,
                "draft_n": 8, "draft_n_accepted": 8},
}
#: ... and of a request without speculation: no draft_n / draft_n_accepted at all
FINAL_PLAIN = {
    "index": 0, "content": "", "tokens": [], "id_slot": 1, "stop": True, "tokens_predicted": 5, "tokens_evaluated": 8,
    "stop_type": "limit", "stopping_word": "", "tokens_cached": 12,
    "timings": {"cache_n": 0, "prompt_n": 8, "prompt_ms": 54.345, "prompt_per_token_ms": 6.793125,
                "prompt_per_second": 147.2076547980495, "predicted_n": 5, "predicted_ms": 35.663,
                "predicted_per_token_ms": 8.91575, "predicted_per_second": 112.16106328687997},
}
#: the server's own line for FINAL_DRAFT's request (it counts only steps that had a draft: 1 + 8/2)
LOG_ACCEPT = ("0.02.798.415 I slot print_timing: id  1 | task 0 | draft acceptance = 1.00000 (    8 accepted /"
              "     8 generated), mean len =  5.00")
#: error answers (HTTP 400/500 bodies; in a stream they arrive as data: {"error": ...})
ERROR_400 = {"error": {"code": 400, "message": "Field 'n_probs': [json.exception.type_error.302] type must be number,"
                       " but is string", "type": "invalid_request_error"}}

LOG_READY = """\
0.00.002.141 I srv  llama_server: initializing ...
0.00.005.112 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)
0.00.005.358 W srv  llama_server: security: no API key is set and CORS allows all origins (see https://github.com/ggml-org/llama.cpp/pull/25655)
0.00.007.193 I srv    load_model: loading model '/work/main/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf'
0.00.446.338 I cmn          init: llama threadpool init, n_threads = 2
0.00.483.020 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = 'false'
0.00.486.856 I srv  llama_server: model loaded
0.00.486.870 I srv  llama_server: listening on http://127.0.0.1:18080
0.12.955.996 I slot print_timing: id  1 | task 1 | prompt eval time =      54.34 ms /     8 tokens (    6.79 ms per \
token,   147.21 tokens per second)
0.12.956.015 I slot      release: id  1 | task 1 | stop processing: n_tokens = 12, truncated = 0
"""

FATAL_LINES = {
    # -m /tmp/nope.gguf (exit status 1)
    "0.00.008.020 E gguf_init_from_file: failed to open GGUF file '/tmp/nope.gguf' (No such file or directory)":
        "invalid_args",
    "0.00.008.905 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
    "/tmp/nope.gguf": "invalid_args",
    "0.00.009.408 E srv    load_model: failed to load model, '/tmp/nope.gguf'": "invalid_args",
    # bad flags (stderr, exit status 1)
    "error: invalid argument: --no-such-flag": "invalid_args",
    'error while handling argument "--spec-draft-n-max": invalid value': "invalid_args",
    'error while handling argument "--draft-max": the argument has been removed. use --spec-draft-n-max or '
    "--spec-ngram-mod-n-max": "invalid_args",
    'error while handling argument "--spec-type": unknown speculative type: foo': "invalid_args",
    'error while handling argument "-np": error: invalid value for n_parallel': "invalid_args",
    # --spec-type draft-simple without -md: the server would run without speculation
    "0.00.621.041 E srv    load_model: failed to initialize speculative decoding context: draft-simple requires a "
    "draft context": "invalid_args",
    # -c 100000000
    "0.19.986.296 E ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)": "oom",
    "0.19.986.322 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 2304000000000": "oom",
    "0.20.533.103 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache":
        "oom",
    "0.20.533.143 E srv    load_model: failed to create_context with model '/m/SmolLM2-135M-Instruct.Q4_1.gguf'": "oom",
    # --spec-draft-n-max 0 aborts at the first request
    "/tmp/llama-build.vTmGpa/llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-context.cpp:2273: "
    "GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) failed": "crashed",
    # the port is taken
    "0.00.005.538 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 18092": "port_busy",
}

ORDINARY_LINES = [
    *LOG_READY.splitlines(),
    LOG_ACCEPT,
    # warnings a healthy start prints
    "0.14.130.101 W common_fit_params: failed to fit params to free device memory: was unable to fit model into "
    "system memory by reducing context, abort",
    "0.14.257.653 W llama_context: n_ctx_seq (100000000) > n_ctx_train (8192) -- possible training context overflow",
    # the generic last line of both a missing model and an out-of-memory start: the line before names the cause
    "0.00.010.049 E srv  llama_server: exiting due to model loading error",
]


# ---------------------------------------------------------------------------------------------------------------
# resolve: llama-server's rules


def key(args: dict) -> str:
    return config_key(ENGINE.resolve(args))


def test_get_engine_and_interface() -> None:
    eng = get_engine("llamacpp")
    assert isinstance(eng, LlamaCpp)
    assert eng.kind == "llamacpp"
    assert eng.readiness_paths == ("/health",)
    assert eng.port_flag == "port"
    assert set(eng.fatal_kinds) >= {"oom", "invalid_args", "crashed"}


def test_spec_type_none_drops_draft_knobs() -> None:
    base = {"m": MODEL, "c": 2048, "t": 2, "np": 2}
    plain = ENGINE.resolve(base)
    assert plain["spec-type"] == "none"                           # the default made explicit
    variants = [
        {"spec-type": "none"},
        {"spec-type": "none", "spec-draft-n-max": 8, "spec-draft-n-min": 2, "draft-p-min": 0.5},
        {"spec-type": "none", "md": MODEL, "spec-draft-n-max": 2},    # -md alone: loaded, then unused
        {"spec-draft-n-max": 5},
        {"spec-type": "ngram-simple,none"},                        # "none" anywhere turns it off
    ]
    for v in variants:
        assert key({**base, **v}) == key(base), v
    assert "spec-draft-n-max" not in ENGINE.resolve({**base, "spec-draft-n-max": 5})
    assert "md" not in ENGINE.resolve({**base, "md": MODEL})


def test_ngram_types_ignore_draft_knobs_but_keep_their_own() -> None:
    base = {"m": MODEL, "spec-type": "ngram-simple"}
    # measured: --spec-draft-n-max 2 and 16 give the same drafts (10 drafted, 6 accepted) with ngram-simple
    assert key({**base, "spec-draft-n-max": 2, "draft-p-min": 0.9}) == key({**base, "spec-draft-n-max": 16})
    r = ENGINE.resolve(base)
    assert r["spec-ngram-simple-size-n"] == 12 and r["spec-ngram-simple-size-m"] == 48   # server defaults
    assert key({**base, "spec-ngram-simple-size-n": 12}) == key(base)
    assert key({**base, "spec-ngram-simple-size-n": 3}) != key(base)
    # another type's knobs drop out
    assert key({**base, "spec-ngram-map-k-size-n": 3}) == key(base)
    mk = ENGINE.resolve({"m": MODEL, "spec-type": "ngram-map-k", "spec-ngram-simple-size-m": 8})
    assert "spec-ngram-simple-size-m" not in mk and mk["spec-ngram-map-k-size-m"] == 48
    with pytest.raises(InvalidConfig, match="within"):
        ENGINE.resolve({**base, "spec-ngram-simple-size-n": 0})


def test_spec_type_lists_are_sets_in_server_order() -> None:
    a = ENGINE.resolve({"spec-type": "draft-simple,ngram-simple", "md": MODEL})
    b = ENGINE.resolve({"spec-type": "ngram-simple,draft-simple", "md": MODEL})
    assert a == b and a["spec-type"] == "ngram-simple,draft-simple"
    with pytest.raises(InvalidConfig, match="unknown speculative type 'eagle'"):
        ENGINE.resolve({"spec-type": "eagle"})


def test_draft_simple_rules() -> None:
    with pytest.raises(InvalidConfig, match=r"draft-simple needs a draft model \(-md\)"):
        ENGINE.resolve({"m": MODEL, "spec-type": "draft-simple", "spec-draft-n-max": 4})
    r = ENGINE.resolve({"m": MODEL, "spec-type": "draft-simple", "md": MODEL})
    assert (r["spec-draft-n-max"], r["spec-draft-n-min"], r["spec-draft-p-min"]) == (3, 0, 0.0)   # defaults explicit
    ds = {"m": MODEL, "spec-type": "draft-simple", "md": MODEL}
    assert key({**ds, "spec-draft-n-max": 3, "draft-p-min": 0}) == key(ds)
    # --draft-p-min is an alias: written under the primary spelling, so it meets the default made explicit
    assert ENGINE.resolve({**ds, "draft-p-min": 0.5})["spec-draft-p-min"] == 0.5
    assert key({**ds, "draft-p-min": 0.5}) == key({**ds, "spec-draft-p-min": 0.5})
    with pytest.raises(InvalidConfig, match=r"n-min \(5\) > spec-draft-n-max \(4\)"):
        ENGINE.resolve({**ds, "spec-draft-n-max": 4, "spec-draft-n-min": 5})
    assert ENGINE.resolve({**ds, "spec-draft-n-max": 4, "spec-draft-n-min": 4})["spec-draft-n-min"] == 4
    with pytest.raises(InvalidConfig, match=r"p-min must be within \[0, 1\]"):
        ENGINE.resolve({**ds, "draft-p-min": 1.5})
    with pytest.raises(InvalidConfig, match="aborts at its first request"):
        ENGINE.resolve({**ds, "spec-draft-n-max": 0})
    with pytest.raises(InvalidConfig, match=">= 1"):
        ENGINE.resolve({**ds, "spec-draft-n-max": -1})
    with pytest.raises(InvalidConfig, match="same llama-server option"):
        ENGINE.resolve({**ds, "draft-p-min": 0.5, "spec-draft-p-min": 0.5})


def test_other_rejects() -> None:
    with pytest.raises(InvalidConfig, match="removed this flag; use spec-draft-n-max"):
        ENGINE.resolve({"draft-max": 4})
    with pytest.raises(InvalidConfig, match="0 slots"):
        ENGINE.resolve({"np": 0})
    for msg in (str(e) for e in _rejects()):
        assert "\n" not in msg


def _rejects() -> Iterator[InvalidConfig]:
    for bad in ({"spec-type": "draft-simple"}, {"spec-type": "x"}, {"np": 0}, {"draft": 3},
                {"spec-type": "draft-simple", "md": MODEL, "spec-draft-n-min": 9}):
        try:
            ENGINE.resolve(bad)
        except InvalidConfig as e:
            yield e


# ---------------------------------------------------------------------------------------------------------------
# render


def test_render_spells_flags_as_llama_server_does() -> None:
    args = {"m": MODEL, "c": 2048, "t": 2, "np": 2, "host": "127.0.0.1", "port": 18080, "spec-type": "draft-simple",
            "md": MODEL, "spec-draft-n-max": 4, "spec-draft-p-min": 0.5, "spec-ngram-simple-size-n": 3, "ngl": 0,
            "jinja": True, "no-warmup": False}
    argv = ENGINE.render(["/bin/llama-server"], args)
    assert argv == [
        "/bin/llama-server", "-m", MODEL, "-c", "2048", "-t", "2", "-np", "2", "--host", "127.0.0.1",
        "--port", "18080", "--spec-type", "draft-simple", "-md", MODEL, "--spec-draft-n-max", "4",
        "--spec-draft-p-min", "0.5", "--spec-ngram-simple-size-n", "3", "-ngl", "0", "--jinja",
    ]


# ---------------------------------------------------------------------------------------------------------------
# log lines


@pytest.mark.parametrize(("line", "kind"), list(FATAL_LINES.items()))
def test_fatal_lines(line: str, kind: str) -> None:
    assert ENGINE.fatal_reason(line) == kind
    assert kind in ENGINE.fatal_kinds


@pytest.mark.parametrize("line", ORDINARY_LINES)
def test_ordinary_lines(line: str) -> None:
    assert ENGINE.fatal_reason(line) is None


def test_exit_status_is_a_crash_and_reasons_exist() -> None:
    assert ENGINE.exit_reason(1) == "crashed"       # llama-server exits 1 for everything; the log tells why
    assert ENGINE.exit_reason(-11) == "crashed"
    for kind in ("invalid_args", "crashed", "port_busy"):
        assert kind in REASONS


def test_capacity_from_log() -> None:
    assert ENGINE.capacity_from_log(LOG_READY) == {"max_running_requests": 2, "max_total_num_tokens": 2048,
                                                   "n_ctx_slot": 1024}
    unified = "I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'"
    assert ENGINE.capacity_from_log(unified)["max_total_num_tokens"] == 4096
    assert ENGINE.capacity_from_log("nothing here") == {}


# ---------------------------------------------------------------------------------------------------------------
# stream format


def test_generation_request() -> None:
    req = ENGINE.generation_request("Hello", 32, 0.0)
    assert req.path == "/completion"
    assert req.body == {"prompt": "Hello", "n_predict": 32, "ignore_eos": True, "temperature": 0.0, "stream": True,
                        "cache_prompt": False}


def test_parse_events() -> None:
    assert ENGINE.parse_event(EVENT) == StreamUpdate(tokens=5)
    final = ENGINE.parse_event(FINAL_DRAFT)
    assert final.finished and final.tokens == 12 and final.finish_reason == "length" and final.error is None
    # 12 tokens: 1 from the prompt pass + 3 decode steps (two accepted 4 drafted tokens each, the last had no room)
    assert final.verify_steps == 3
    assert final.accept_length == pytest.approx(4.0)
    plain = ENGINE.parse_event(FINAL_PLAIN)
    assert plain.finished and plain.tokens == 5 and plain.accept_length is None and plain.verify_steps == 4
    err = ENGINE.parse_event(ERROR_400)
    assert err.finished and err.error and "n_probs" in err.error


# ---------------------------------------------------------------------------------------------------------------
# the real server

BINARY = cached_server_binary()
GGUF = cached_model()
real = pytest.mark.usefixtures("llama_parts")

FAST = {"c": 2048, "t": 2, "np": 2, "host": "127.0.0.1"}
#: OpenMP threads that sleep instead of spinning at barriers: on a busy 2-core machine a spinning team runs up to
#: 10x slower (the study sets the same in [engine.env])
SERVER_ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
#: repetitive text, so the n-gram drafters find matches within a few dozen tokens
REPEAT_PROMPT = ("one two three four five six seven eight nine ten, one two three four five six seven eight nine ten, "
                 "one two three four five six seven eight nine ten, one two")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: dict, tmp: Path) -> None:
        self.port = _free_port()
        self.args = ENGINE.resolve({"m": str(GGUF), **FAST, **args, "port": self.port})
        self.argv = ENGINE.render([str(BINARY)], self.args)
        self.log_path = tmp / f"llama-{self.port}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=SERVER_ENV)
        # llama-server's HTTP layer closes idle keep-alive connections on its own: one connection per request
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120,
                                   limits=httpx.Limits(max_keepalive_connections=0))

    def wait_ready(self, timeout: float = 60) -> list[int | None]:
        seen: list[int | None] = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"llama-server exited {self.proc.returncode}: {self.log_text()[-2000:]}"
            try:
                code = self.client.get(ENGINE.readiness_paths[0]).status_code
            except httpx.HTTPError:
                code = None
            seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.02)
        raise AssertionError(f"not ready after {timeout} s: {self.log_text()[-2000:]}")

    def generate(self, prompt: str, max_tokens: int) -> tuple[list[StreamUpdate], StreamUpdate]:
        req = ENGINE.generation_request(prompt, max_tokens, 0.0)
        updates = []
        with self.client.stream("POST", req.path, json=req.body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data:"):
                    updates.append(ENGINE.parse_event(json.loads(line[5:])))
        finals = [u for u in updates if u.finished]
        assert len(finals) == 1 and updates[-1] is finals[0]
        return updates, finals[0]

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    servers: list[Server] = []

    def _start(**args) -> Server:
        s = Server(args, tmp_path)
        servers.append(s)
        return s

    yield _start
    for s in servers:
        s.stop()


def _check_stream(updates: list[StreamUpdate], final: StreamUpdate, max_tokens: int) -> None:
    counts = [u.tokens for u in updates if u.tokens is not None]
    assert counts == sorted(counts) and counts[-1] == max_tokens
    assert final.tokens == max_tokens and final.finish_reason == "length" and final.error is None


@real
def test_real_readiness_info_and_plain_generation(start) -> None:
    s = start()
    seen = s.wait_ready()
    assert seen[-1] == 200 and set(seen[:-1]) <= {None, 503}      # 503 "Loading model" until the model is loaded
    body = s.client.get("/health").json()
    assert body == {"status": "ok"}
    info = ENGINE.server_info(s.client)
    assert info.applied["spec-type"] == "none" and info.applied["np"] == 2
    assert info.max_running_requests == 2 and info.max_total_num_tokens == 2048
    assert ENGINE.mismatches({"spec-type": "none", "np": 2}, info) == []
    assert ENGINE.capacity_from_log(s.log_text()) == {"max_running_requests": 2, "max_total_num_tokens": 2048,
                                                      "n_ctx_slot": 1024}
    updates, final = s.generate("Write a haiku about autumn.", 24)
    _check_stream(updates, final, 24)
    assert final.accept_length is None and final.verify_steps == 23


@real
@pytest.mark.parametrize("spec", [
    {"spec-type": "ngram-simple", "spec-ngram-simple-size-n": 4, "spec-ngram-simple-size-m": 8},
    {"spec-type": "ngram-map-k", "spec-ngram-map-k-size-n": 4, "spec-ngram-map-k-size-m": 8},
])
def test_real_ngram_acceptance(start, spec: dict) -> None:
    s = start(**spec)
    s.wait_ready()
    info = ENGINE.server_info(s.client)
    assert info.applied["spec-type"] == spec["spec-type"]
    assert ENGINE.mismatches({"spec-type": spec["spec-type"]}, info) == []
    assert ENGINE.mismatches({"spec-type": "none"}, info)           # a stale server would be caught
    updates, final = s.generate(REPEAT_PROMPT, 48)
    _check_stream(updates, final, 48)
    # measured: 56 of 56 drafted tokens accepted for 64 tokens; the loop keeps counting to ten
    assert final.accept_length is not None and final.accept_length > 1.5
    assert final.verify_steps is not None and 0 < final.verify_steps < 47


@real
def test_real_draft_simple_acceptance(start) -> None:
    s = start(**{"spec-type": "draft-simple", "md": str(GGUF), "spec-draft-n-max": 4})
    s.wait_ready()
    info = ENGINE.server_info(s.client)
    assert info.applied["spec-type"] == "draft-simple"
    updates, final = s.generate("List the planets of the solar system.", 16)
    _check_stream(updates, final, 16)
    # the draft is the target itself: greedy drafts are all accepted, 4 per step (the last step has no room)
    assert final.verify_steps is not None and final.verify_steps <= 6
    assert final.accept_length is not None and final.accept_length >= 16 / 6


def _run_to_exit(argv: list[str], timeout: float = 60) -> tuple[int, list[str]]:
    r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=SERVER_ENV)
    return r.returncode, (r.stdout + r.stderr).splitlines()


@real
def test_real_fatal_missing_model(tmp_path: Path) -> None:
    args = ENGINE.resolve({"m": str(tmp_path / "nope.gguf"), **FAST, "port": _free_port()})
    code, lines = _run_to_exit(ENGINE.render([str(BINARY)], args))
    kinds = [k for k in map(ENGINE.fatal_reason, lines) if k]
    assert code != 0 and kinds and set(kinds) == {"invalid_args"}, lines
    assert ENGINE.exit_reason(code) == "crashed"


@real
@pytest.mark.parametrize(("extra", "needle"), [
    (["--no-such-flag", "3"], "invalid argument"),
    (["--spec-draft-n-max", "-1"], "invalid value"),
    (["--spec-type", "foo"], "unknown speculative type"),
])
def test_real_fatal_bad_flag(extra: list[str], needle: str) -> None:
    args = ENGINE.resolve({"m": str(GGUF), **FAST, "port": _free_port()})
    code, lines = _run_to_exit([*ENGINE.render([str(BINARY)], args), *extra])
    fatal = [(ENGINE.fatal_reason(ln), ln) for ln in lines if ENGINE.fatal_reason(ln)]
    assert code == 1 and fatal and fatal[0][0] == "invalid_args" and needle in fatal[0][1], lines


@real
def test_real_fatal_port_busy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        args = ENGINE.resolve({"m": str(GGUF), **FAST, "port": s.getsockname()[1]})
        code, lines = _run_to_exit(ENGINE.render([str(BINARY)], args))
    assert code == 1 and "port_busy" in [ENGINE.fatal_reason(ln) for ln in lines], lines


def test_cache_lookup_follows_autotune_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert cached_server_binary() is None and cached_model() is None
    (tmp_path / "llama" / "bin").mkdir(parents=True)
    binary = tmp_path / "llama" / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    assert cached_server_binary() == binary
    assert cached_model() == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv("AUTOTUNE_CACHE")
    assert cache_root() == Path(__file__).resolve().parents[2] / ".cache"
    assert os.fspath(cache_root()).endswith(".cache")
