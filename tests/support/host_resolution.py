"""What the host-resolution studies share (tests/run/test_host_resolution.py on a local target, tests/ssh/ on the
test sshd): a grid the emulator as the host has views on that the rules do not, and the checks of what it decided.

The grid crosses a page size the host forces (the fault ``force-arg:page-size=16``: a release that rewrites what
the rules keep) with a context length longer than the model's, which SGLang refuses in its own words and the rules
cannot know (they do not read the model's config)."""
from __future__ import annotations

from typing import Any

from tests.support.cli import kept

#: a context length beyond the emulated model's (262144 tokens)
TOO_LONG = 1_000_000


def host_space() -> str:
    return ('[space.page-size]\ntype = "categorical"\nchoices = [1, 16]\n'
            f'[space.context-length]\ntype = "categorical"\nchoices = [4096, {TOO_LONG}]\n')


def assert_host_decided(report: dict[str, Any], log: str) -> None:
    """A study of ``host_space`` with the host forcing page size 16: the long contexts pruned with SGLang's message
    and no launch, page size 1 recorded as the 16 it runs and measured once for both, the GPU read at preflight."""
    trials = kept(report["trials"])
    rejected = [t for t in trials if t["params"].get("context-length") == 1_000_000]
    assert len(rejected) == 2, trials
    for t in rejected:
        assert t["state"] == "PRUNED" and t["reason"] == "host_rejected" and not t["launched"], t
        assert "ValueError: Warning: User-specified context_length (1000000) is greater than the derived " \
               "context_length (262144)" in t["detail"], t["detail"]
    short = [t for t in trials if t["params"].get("context-length") == 4096]
    assert len(short) == 2 and all(t["state"] == "COMPLETE" for t in short), short
    rewritten = [t for t in short if t["host_rewrote"]]
    assert len(rewritten) == 1, short
    assert rewritten[0]["host_rewrote"] == {"page-size": [1, 16]}
    assert all(t["params"]["page-size"] == 16 and t["config"]["page-size"] == 16 for t in short), short
    assert sum(t["launched"] for t in short) == 1 and [t["reused_from"] for t in short].count(None) == 1, short
    # the baseline and one config of page size 16: two launches for five trials
    assert report["launches"] == 2
    assert "x NVIDIA RTX PRO 6000 Blackwell Server Edition" in log
