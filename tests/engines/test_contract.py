"""Every registered engine keeps the engine interface (autotune/testing/engine_contract.py): an engine added to
ENGINES without its case here fails."""
from __future__ import annotations

import pytest

from autotune.engines import ENGINES, LlamaCpp, SGLang
from autotune.testing.engine_contract import EngineCase, EngineContract

MODEL = "/m/SmolLM2-135M-Instruct.Q4_1.gguf"

CASES = {
    "sglang": EngineCase(
        engine=SGLang(),
        valid={"model-path": "/m", "speculative-algorithm": "EAGLE", "speculative-num-steps": 3,
               "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4},
        invalid={"model-path": "/m", "speculative-algorithm": "NOPE"},
        fatal={"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "oom",
               "sglang serve: error: unrecognized arguments: --bogus": "invalid_args",
               "[2026-12-02 10:00:00 TP0] Scheduler hit an exception: boom": "crashed"},
        ordinary=["[2026-12-02 10:00:00] Load weight end. type=LlamaForCausalLM",
                  "[2026-12-02 10:00:01] The server is fired up and ready to roll!"],
        server={"/server_info": {"model_path": "/m", "speculative_algorithm": "eagle", "speculative_num_steps": 3,
                                 "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                                 "max_total_num_tokens": 65536,
                                 "internal_states": [{"effective_max_running_requests_per_dp": 48}]}},
        reported={"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 1,
                  "speculative-num-draft-tokens": 4},
        command=("python3", "-m", "sglang.launch_server"),
    ),
    "llamacpp": EngineCase(
        engine=LlamaCpp(),
        valid={"m": MODEL, "c": 2048, "np": 2, "spec-type": "ngram-simple", "spec-ngram-simple-size-n": 3},
        invalid={"np": 0},
        fatal={"error: invalid argument: --no-such-flag": "invalid_args",
               "0.19.986.296 E ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)": "oom",
               "0.00.005.538 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 18092":
                   "port_busy"},
        ordinary=["0.00.483.020 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = "
                  "'false'", "0.00.486.870 I srv  llama_server: listening on http://127.0.0.1:18080"],
        server={"/props": {"total_slots": 2, "model_path": MODEL, "default_generation_settings": {"n_ctx": 1024}},
                "/slots": [{"id": 0, "n_ctx": 1024, "speculative": False},
                           {"id": 1, "n_ctx": 1024, "speculative": False}]},
        reported={"np": 2, "m": MODEL, "spec-type": "none"},
        command=("/bin/llama-server",),
    ),
}


def test_every_engine_has_a_case() -> None:
    assert set(CASES) == set(ENGINES)


class TestEngines(EngineContract):
    @pytest.fixture(params=sorted(CASES))
    def case(self, request: pytest.FixtureRequest) -> EngineCase:
        return CASES[request.param]
