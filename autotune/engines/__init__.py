"""Serving engines: one module per engine behind ``Engine`` (base.py)."""
from __future__ import annotations

from autotune.engines.base import (
    AdaptiveRules,
    Args,
    ArgValue,
    Engine,
    GenerationRequest,
    Message,
    Sampling,
    ServerInfo,
    StreamUpdate,
    ValidRange,
    config_key,
)

__all__ = ["ENGINES", "AdaptiveRules", "ArgValue", "Args", "Engine", "GenerationRequest", "Message", "Sampling",
           "ServerInfo", "StreamUpdate",
           "ValidRange", "config_key", "get_engine"]

ENGINES = ("sglang", "llamacpp")


def get_engine(kind: str) -> Engine:
    """The engine named ``kind`` (one of ENGINES)."""
    if kind == "sglang":
        from autotune.engines.sglang import SGLang

        return SGLang()
    if kind == "llamacpp":
        from autotune.engines.llamacpp import LlamaCpp

        return LlamaCpp()
    raise ValueError(f"unknown engine {kind!r}; allowed: {', '.join(ENGINES)}")
