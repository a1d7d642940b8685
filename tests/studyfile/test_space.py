"""The search space and SGLang's rules: what is rejected before deploying, and which configs are the same."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.engines import get_engine
from autotune.errors import InvalidConfig, UserError
from autotune.studyfile.space import Space
from autotune.studyfile.spec import read_study_file
from tests.support.study_texts import VALID, write


@pytest.fixture
def space(tmp_path: Path) -> Space:
    spec = read_study_file(str(write(tmp_path, VALID)))
    return Space(spec, get_engine("sglang"), 31555)


def test_topk_one_rewrites_draft_tokens_so_configs_collapse(space: Space) -> None:
    a = space.candidate({"speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 8})
    b = space.candidate({"speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 2})
    assert a.args["speculative-num-draft-tokens"] == 4
    assert a.key == b.key
    c = space.candidate({"speculative-num-steps": 3, "speculative-eagle-topk": 2, "speculative-num-draft-tokens": 4})
    assert c.key != a.key


def test_too_many_draft_tokens_for_the_tree_is_invalid(space: Space) -> None:
    # steps 1, topk 2: the tree has at most topk + 1 = 3 tokens
    with pytest.raises(InvalidConfig, match="selected index k out of range"):
        space.candidate({"speculative-num-steps": 1, "speculative-eagle-topk": 2, "speculative-num-draft-tokens": 4})
    assert space.candidate({"speculative-num-steps": 1, "speculative-eagle-topk": 2,
                            "speculative-num-draft-tokens": 3}).args["speculative-num-draft-tokens"] == 3


def test_partial_speculative_triple_is_invalid() -> None:
    engine = get_engine("sglang")
    with pytest.raises(InvalidConfig, match="pass all three or none"):
        engine.resolve({"speculative-algorithm": "EAGLE", "speculative-num-steps": 2})
    auto = engine.resolve({"speculative-algorithm": "nextn"})
    assert auto == {"speculative-algorithm": "EAGLE"}
    with pytest.raises(InvalidConfig, match="Unknown speculative algorithm name: MEDUSA"):
        engine.resolve({"speculative-algorithm": "medusa"})


def test_the_port_comes_from_the_target(space: Space) -> None:
    assert space.baseline().args["port"] == 31555
    argv = get_engine("sglang").render(["python3", "-m", "sglang.launch_server"], space.baseline().args)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--port") + 1] == "31555"


def test_render_bare_flags() -> None:
    argv = get_engine("sglang").render(["x"], {"enable-metrics": True, "disable-cuda-graph": False, "tp-size": 4})
    assert argv == ["x", "--enable-metrics", "--tp-size", "4"]


def test_space_check_counts_distinct_effective_configs(space: Space) -> None:
    # steps 1-4 x topk {1,2} x draft 2-8: topk 1 gives one config per step count (draft = steps + 1);
    # topk 2 allows steps + 1 <= draft and draft - 1 <= 2 + (steps - 1) * 4
    expected = 4 + sum(1 for s in range(1, 5) for d in range(2, 9) if s + 1 <= d and d - 1 <= 2 + (s - 1) * 4)
    assert space.check() == (expected, False)


def test_impossible_space_is_refused(tmp_path: Path) -> None:
    text = VALID.replace("choices = [1, 2]", "choices = [2]").replace("low = 1\nhigh = 4", "low = 1\nhigh = 1") \
        .replace("low = 2\nhigh = 8", "low = 5\nhigh = 8")
    spec = read_study_file(str(write(tmp_path, text)))
    with pytest.raises(UserError, match=r"\[space\] is impossible: the sglang rules reject every config"):
        Space(spec, get_engine("sglang"), 31555).check()
