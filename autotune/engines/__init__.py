"""Serving engines: one module per engine behind ``Engine`` (base.py); ``ENGINES`` maps a study file's ``kind`` to
its class."""
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
from autotune.engines.llamacpp import LlamaCpp
from autotune.engines.sglang import SGLang

__all__ = ["ENGINES", "AdaptiveRules", "ArgValue", "Args", "Engine", "GenerationRequest", "LlamaCpp", "Message",
           "SGLang", "Sampling", "ServerInfo", "StreamUpdate", "ValidRange", "config_key", "get_engine"]

ENGINES: dict[str, type[Engine]] = {
    SGLang.kind: SGLang,
    LlamaCpp.kind: LlamaCpp,
}


def get_engine(kind: str) -> Engine:
    """The engine named ``kind`` (a key of ENGINES)."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r}; allowed: {', '.join(ENGINES)}")
    return ENGINES[kind]()
