"""Prompts for measurement: the built-in varied set or the study's own JSONL file.

Within one trial no prompt text is ever sent twice, so a prefix cache can never turn a repeated prompt into an
inflated result (one peer's replayed prompts doubled a figure that way): prompts are handed out in a shuffled order
and, once the set is used up, the next round carries a distinct request tag in front, which also defeats prefix
matching.
"""
from __future__ import annotations

import json
import os
import random
import stat
from importlib import resources
from pathlib import Path

from autotune.errors import UserError


#: the largest prompts file read (a few thousand long prompts are a few MB)
MAX_PROMPTS_BYTES = 256 * 2**20


def _read_file(path: Path) -> bytes:
    """The bytes of the regular file ``path``: a device (/dev/zero), a FIFO (which would wait for a writer) or a
    directory is refused, and so is a file larger than MAX_PROMPTS_BYTES, before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(f"[workload] prompts: cannot read {path}: {e.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PROMPTS_BYTES:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"[workload] prompts: {path} is not a regular file (a JSONL file of prompts)")
        raise UserError(f"[workload] prompts: {path} is {info.st_size / 2**20:.0f} MiB; at most "
                        f"{MAX_PROMPTS_BYTES // 2**20} MiB")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_PROMPTS_BYTES + 1)
        except OSError as e:
            raise UserError(f"[workload] prompts: cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_PROMPTS_BYTES:
        raise UserError(f"[workload] prompts: {path} grew past {MAX_PROMPTS_BYTES // 2**20} MiB while read")
    return data


def load_prompts(source: str, base: Path) -> list[str]:
    """``"builtin"`` or a JSONL file (relative to ``base``) of {"prompt": ...} objects."""
    if source == "builtin":
        text = resources.files("autotune.bench").joinpath("prompts.jsonl").read_text()
        where = "builtin prompts"
    else:
        path = Path(source).expanduser()
        path = path if path.is_absolute() else base / path
        raw = _read_file(path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: not UTF-8 text (a byte {e.object[e.start]:#04x} at offset {e.start})") from None
        where = str(path)
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise UserError(f"{where}: line {n}: not valid JSON (or nested too deeply)") from None
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{where}: line {n}: needs a non-empty string field \"prompt\"")
        prompts.append(prompt)
    if not prompts:
        raise UserError(f"{where}: no prompts")
    if len(set(prompts)) != len(prompts):
        raise UserError(f"{where}: prompts repeat; every prompt must be distinct")
    return prompts


class PromptStream:
    """Hands out prompts so that none repeats within the stream's life (one trial)."""

    def __init__(self, prompts: list[str], seed: int | None = None) -> None:
        self._prompts = list(prompts)
        self._rng = random.Random(seed)
        self._order: list[str] = []
        self._round = 0
        self.issued = 0

    def next(self) -> str:
        if not self._order:
            self._order = self._prompts[:]
            self._rng.shuffle(self._order)
            self._round += 1
        prompt = self._order.pop()
        self.issued += 1
        if self._round > 1:
            return f"[request {self.issued}] {prompt}"
        return prompt
