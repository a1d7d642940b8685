"""SGLang's rules as a user of the tuner meets them, on a known GPU and model (the cases the issue found wrong); the
whole rule set is checked against real SGLang by test_sglang_oracle.py."""
from __future__ import annotations

import pytest

from autotune.engines.base import Platform
from autotune.engines.sglang import SGLang
from autotune.errors import InvalidConfig

H100_LLAMA = Platform("NVIDIA H100 80GB HBM3", architecture="LlamaForCausalLM")
B200_LLAMA = Platform("NVIDIA B200", architecture="LlamaForCausalLM")
B200_DEEPSEEK = Platform("NVIDIA B200", architecture="DeepseekV3ForCausalLM")
TREE = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


def tree(steps: int, topk: int, draft: int, algorithm: str = "EAGLE") -> dict[str, str | int]:
    return {"speculative-algorithm": algorithm, **dict(zip(TREE, (steps, topk, draft), strict=True))}


def test_the_gpu_is_known_by_name_or_by_its_compute_capability() -> None:
    assert Platform("NVIDIA H100 80GB HBM3").capability == (9, 0)
    assert Platform("NVIDIA B200").major == 10
    assert Platform("NVIDIA RTX PRO 6000 Blackwell Server Edition").major == 12
    assert Platform("Some Future GPU").capability is None
    assert Platform("Some Future GPU", compute_capability=(10, 3)).major == 10


def test_a_b200_runs_a_llama_chain_on_trtllm_mha_with_pages_of_64() -> None:
    out = SGLang().resolve({**tree(3, 1, 9), "page-size": 1}, B200_LLAMA)
    assert (out["attention-backend"], out["page-size"], out[TREE[2]]) == ("trtllm_mha", 64, 4)
    assert SGLang().resolve(tree(3, 1, 4), H100_LLAMA)["attention-backend"] == "fa3"
    assert SGLang().resolve(tree(3, 2, 6), H100_LLAMA)["attention-backend"] == "flashinfer"


def test_deepseek_on_a_b200_refuses_every_tree_wider_than_a_chain() -> None:
    assert SGLang().resolve(tree(3, 1, 4), B200_DEEPSEEK)["attention-backend"] == "trtllm_mla"
    with pytest.raises(InvalidConfig, match="not trtllm_mla"):
        SGLang().resolve(tree(3, 2, 6), B200_DEEPSEEK)


def test_ngram_dflash_and_dspark_are_rewritten_as_sglang_does() -> None:
    ngram = SGLang().resolve({"speculative-algorithm": "NGRAM"}, H100_LLAMA)
    assert [ngram[name] for name in TREE] == [1, 10, 12]
    with pytest.raises(InvalidConfig, match="only on the flashinfer"):
        SGLang().resolve({"speculative-algorithm": "NGRAM", "page-size": 16}, H100_LLAMA)
    for algorithm in ("DFLASH", "DSPARK"):
        out = SGLang().resolve({**tree(4, 3, 9, algorithm), "speculative-draft-model-path": "/m/d"}, H100_LLAMA)
        assert [out[name] for name in TREE] == [1, 1, 9]


def test_backends_force_their_page_sizes_and_then_refuse_trees() -> None:
    out = SGLang().resolve({**tree(3, 1, 4), "attention-backend": "flashmla", "page-size": 16})
    assert out["page-size"] == 64
    with pytest.raises(InvalidConfig, match="trtllm_mha supports only"):
        SGLang().resolve({**tree(3, 2, 6), "decode-attention-backend": "trtllm_mha"})


def test_an_unknown_platform_assumes_nothing_gpu_dependent() -> None:
    out = SGLang().resolve(tree(3, 2, 6))
    assert "attention-backend" not in out and "page-size" not in out
    assert SGLang().resolve({"speculative-algorithm": "EAGLE"}) == {"speculative-algorithm": "EAGLE"}
    standalone = SGLang().resolve({"speculative-algorithm": "STANDALONE"})
    assert [standalone[name] for name in TREE] == [3, 1, 4]
