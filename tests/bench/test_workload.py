"""Prompts: the built-in set is varied, and no prompt text is sent twice within a trial."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from autotune.bench.workload import PromptStream, load_prompts
from autotune.errors import UserError


def test_builtin_set_is_large_and_varied() -> None:
    prompts = load_prompts("builtin", Path("."))
    assert len(prompts) >= 200
    assert len(set(prompts)) == len(prompts)
    from importlib import resources

    lines = resources.files("autotune.bench").joinpath("prompts.jsonl").read_text().splitlines()
    categories = Counter(json.loads(line)["category"] for line in lines)
    assert set(categories) == {"code", "chat", "reasoning", "summarisation", "structured"}
    assert min(categories.values()) >= 40


def test_no_prompt_repeats_even_past_the_end_of_the_set() -> None:
    stream = PromptStream(["a", "b", "c"], seed=1)
    sent = [stream.next() for _ in range(10)]
    assert len(set(sent)) == 10
    assert set(sent[:3]) == {"a", "b", "c"}
    # later rounds lead with a distinct tag, so no prefix is shared with an earlier request's first tokens either
    assert all(p.startswith("[request ") for p in sent[3:])


def test_user_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "one"}\n\n{"prompt": "two"}\n')
    assert load_prompts("p.jsonl", tmp_path) == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "one"}\n{"text": "two"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl: line 2: needs a non-empty string field \"prompt\""):
        load_prompts("bad.jsonl", tmp_path)
    (tmp_path / "dup.jsonl").write_text('{"prompt": "one"}\n{"prompt": "one"}\n')
    with pytest.raises(UserError, match="prompts repeat"):
        load_prompts("dup.jsonl", tmp_path)
    with pytest.raises(UserError, match="cannot read"):
        load_prompts("missing.jsonl", tmp_path)
