"""A stand-in tokenizer and text generator: deterministic, word-ish, counted in tokens rather than characters."""
from __future__ import annotations

import random
import re
import zlib

_PIECE = re.compile(r"\w+|[^\w\s]")
_MAX_WORD = 6  # long words split into pieces of this many characters, like a BPE vocabulary would

_WORDS = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this",
    "are", "from", "at", "or", "an", "have", "which", "not", "but", "they", "one", "their", "all", "we", "can",
    "more", "time", "there", "has", "been", "would", "when", "also", "about", "into", "model", "data",
    "system", "these", "than", "other", "some", "its", "what", "only", "new", "used", "may", "first", "two",
    "each", "after", "most", "where", "over", "such", "between", "many", "could", "should", "then", "because",
    "while", "same", "those", "through", "during", "both", "under", "number", "however", "three", "process",
    "results", "value", "server", "request", "memory", "token", "batch", "layer", "cache", "speed", "order",
    "group", "point", "state", "level", "result", "way", "example", "case", "part", "work", "use", "form",
    "large", "small", "high", "low", "early", "later", "fast", "simple", "clear", "useful", "common",
]


_SPACED = [" " + w for w in _WORDS]
_CAPITALIZED = [" " + w.capitalize() for w in _WORDS]


def encode(text: str, vocab_size: int) -> list[int]:
    """Token ids for ``text``: one per word piece or punctuation mark (ids are stable hashes)."""
    ids = []
    for piece in _PIECE.findall(text):
        for i in range(0, len(piece), _MAX_WORD):
            ids.append(zlib.crc32(piece[i:i + _MAX_WORD].encode()) % (vocab_size - 1000) + 1000)
    return ids


def prompt_seed(ids: list[int]) -> int:
    """A seed that depends on the prompt only (greedy decoding of the same prompt repeats itself)."""
    return zlib.crc32(",".join(map(str, ids[:4096])).encode())


class TextGenerator:
    """Produces one token piece at a time: words with spaces, commas and sentence ends."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._sentence_start = True
        self._since_punct = 0

    def next(self) -> tuple[int, str]:
        """Return (token id, text piece)."""
        r = self._rng.random()
        if self._since_punct > 4 and r < 0.12:
            self._since_punct = 0
            if r < 0.07:
                self._sentence_start = True
                return 13, "."
            return 11, ","
        idx = int(self._rng.random() * len(_WORDS))
        self._since_punct += 1
        if self._sentence_start:
            self._sentence_start = False
            return 2000 + idx, _CAPITALIZED[idx]
        return 1000 + idx, _SPACED[idx]
