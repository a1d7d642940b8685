"""Real SGLang's argument resolution as an oracle, for tests and benchmarks: flags + GPU -> what SGLang runs, or its
error.

The oracle is SGLang 0.5.23 in the venv that serves it on this CPU (scripts/build-sglang-cpu.sh, called by
scripts/setup.sh; autotune/testing/sglang_cpu), run as one
long-lived subprocess (``sglang_oracle_server.py``) that answers one config per JSON line, so hundreds of configs
take seconds. A model is a directory holding only a config.json (``model_dir``): resolution reads nothing else.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from autotune.engines.base import Platform
from autotune.testing import sglang_cpu

SERVER = Path(__file__).with_name("sglang_oracle_server.py")

#: config.json of the model kinds the oracle is asked about: a Llama (MHA) and a DeepSeek V3 (MLA, MTP draft layer)
MODELS: dict[str, dict[str, Any]] = {
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 128000,
        "eos_token_id": 128009,
    },
    "deepseek": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
        "num_key_value_heads": 128, "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "first_k_dense_replace": 3,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840, "rope_theta": 10000,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 0,
        "eos_token_id": 1, "moe_layer_freq": 1,
    },
}


class OracleMissing(RuntimeError):
    """The oracle venv is not built (scripts/setup.sh builds it)."""


class OracleFailed(RuntimeError):
    """The oracle process died or did not answer; the message ends with what it wrote to standard error."""


@dataclass(frozen=True)
class Answer:
    """SGLang's verdict on one command line: the resolved server args, or the error it stops with."""

    resolved: dict[str, Any] | None
    error: str | None = None
    log: list[str] = field(default_factory=list)     # "LEVEL: message" lines SGLang logged while resolving

    @property
    def accepted(self) -> bool:
        return self.resolved is not None


def oracle_python() -> Path:
    """The venv's python; ``OracleMissing`` (naming the set-up command) when it is not built."""
    try:
        return sglang_cpu.python()
    except sglang_cpu.Missing as e:
        raise OracleMissing(str(e)) from None


def model_dir(kind: str, root: Path) -> Path:
    """A directory under ``root`` holding only the config.json of model ``kind`` (a key of ``MODELS``)."""
    path = root / f"{kind}-model"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODELS[kind], indent=1))
    return path


class Oracle:
    """One oracle process; ``resolve`` asks it about one command line. Use as a context manager."""

    def __init__(self, timeout: float = 300.0, fresh_parser: bool = False) -> None:
        """``fresh_parser``: let SGLang build its argument parser for every answer (slower; the same answers)."""
        python = oracle_python()
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the process writes it until close()
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("PYTHONPATH", None)
        self._proc = subprocess.Popen(
            [str(python), str(SERVER), *(["--fresh-parser"] if fresh_parser else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, cwd=tempfile.gettempdir(),
            text=True, bufsize=1,
        )
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        hello = self._read()
        self.version: str = hello.get("version", "")

    def resolve(self, argv: Sequence[str], platform: Platform) -> Answer:
        """What SGLang makes of ``argv`` (the flags after ``launch_server``, ``--model-path`` among them) on
        ``platform``, whose compute capability must be known."""
        capability = platform.capability
        if capability is None:
            raise ValueError(f"the oracle needs a GPU of known compute capability, not {platform.gpu!r}")
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"argv": list(argv), "capability": list(capability)}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise OracleFailed(self._failure("the oracle process is gone")) from None
        reply = self._read()
        if reply.get("ok"):
            return Answer(resolved=reply["resolved"], log=reply.get("log", []))
        return Answer(resolved=None, error=reply.get("error", "?"), log=reply.get("log", []))

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        if not self._selector.select(self.timeout):
            self.close()
            raise OracleFailed(self._failure(f"the oracle did not answer within {self.timeout:.0f} s"))
        line = self._proc.stdout.readline()
        if not line:
            raise OracleFailed(self._failure(f"the oracle process exited ({self._proc.wait()})"))
        return json.loads(line)

    def _failure(self, what: str) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()[-20:]
        return what + (":\n" + "\n".join(tail) if tail else "")

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._selector.close()
        self._stderr.close()

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
