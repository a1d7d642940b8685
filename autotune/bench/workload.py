"""What a study sends: the built-in varied set, the study's own prompts file, or its dataset (traffic.py reads the
formats); every file read through ``read_text`` (a regular file, UTF-8, at most ``MAX_FILE_BYTES``).

Within one trial no prompt text is ever sent twice, so a prefix cache can never turn a repeated prompt into an
inflated result (one peer's replayed prompts doubled a figure that way): prompts are handed out in a shuffled order
and, once the set is used up, the next round carries a distinct request tag in front, which also defeats prefix
matching.
"""
from __future__ import annotations

import os
import random
import stat
from importlib import resources
from pathlib import Path
from typing import Generic, TypeVar

from autotune.bench.traffic import TrafficRequest, json_lines, parse, sendable
from autotune.errors import UserError

#: the largest prompts file or dataset read (a bigger one is refused, not read in part)
MAX_FILE_BYTES = 256 * 1024 * 1024

T = TypeVar("T")


def resolve(source: str, base: Path) -> Path:
    path = Path(source).expanduser()
    return path if path.is_absolute() else base / path


def read_text(path: Path, key: str) -> str:
    """A file's text for ``[workload] key``: a regular file (never a FIFO or a device, which could block or never
    end), at most MAX_FILE_BYTES, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(f"[workload] {key}: cannot read {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"[workload] {key}: {path} is not a regular file (a FIFO, a device or a directory is "
                        "refused)")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_FILE_BYTES:
            raise UserError(f"[workload] {key}: cannot read {path}: {st.st_size} bytes; at most {MAX_FILE_BYTES} "
                            "are read")
        try:
            data = f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise UserError(f"[workload] {key}: cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:  # it grew while read
        raise UserError(f"[workload] {key}: cannot read {path}: more than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: not UTF-8 text (a byte {data[e.start]:#04x} at offset {e.start})"
                        ) from None


def load_traffic(dataset: str, base: Path) -> list[TrafficRequest]:
    """A dataset's requests (``"builtin"``: the built-in traffic set, chat requests by category)."""
    if dataset == "builtin":
        text = resources.files("autotune.bench").joinpath("traffic.jsonl").read_text(encoding="utf-8")
        return parse(text, "builtin traffic")
    path = resolve(dataset, base)
    return parse(read_text(path, "dataset"), str(path))


def load_prompts(source: str, base: Path) -> list[str]:
    """``"builtin"`` or a JSONL file (relative to ``base``) of {"prompt": ...} objects."""
    if source == "builtin":
        text = resources.files("autotune.bench").joinpath("prompts.jsonl").read_text()
        where = "builtin prompts"
    else:
        path = resolve(source, base)
        text = read_text(path, "prompts")
        where = str(path)
    prompts = []
    for n, item in json_lines(text, where, "(or nested too deeply)"):
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError(f"{where}: line {n}: needs a non-empty string field \"prompt\"")
        prompts.append(sendable(prompt, f"{where}: line {n}: \"prompt\""))
    if not prompts:
        raise UserError(f"{where}: no prompts")
    if len(set(prompts)) != len(prompts):
        raise UserError(f"{where}: prompts repeat; every prompt must be distinct")
    return prompts


class PromptStream(Generic[T]):
    """Hands out prompts (or requests) so that none repeats within the stream's life (one trial): a later round's
    strings carry a tag; a request's tag is added where it is sent (``round``)."""

    def __init__(self, prompts: list[T], seed: int | None = None) -> None:
        self._prompts = list(prompts)
        self._rng = random.Random(seed)
        self._order: list[T] = []
        self._round = 0
        self.issued = 0

    def next_request(self) -> tuple[T, int]:
        """The next item and the round it belongs to (1: never sent before in this stream)."""
        if not self._order:
            self._order = self._prompts[:]
            self._rng.shuffle(self._order)
            self._round += 1
        self.issued += 1
        return self._order.pop(), self._round

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
