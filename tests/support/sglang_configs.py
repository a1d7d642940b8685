"""Random SGLang speculative configs for the differential test against real SGLang (tests/engines/
test_sglang_oracle.py): algorithms, draft trees (full, automatic, partial, over the tree's capacity), page sizes,
attention backends (also per phase), GPUs and model kinds."""
from __future__ import annotations

import random
from dataclasses import dataclass

from autotune.engines.base import Args, Platform

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
#: the GPUs drawn, as nvidia-smi names them: Hopper, datacenter Blackwell, and the seed host's RTX Blackwell (sm120)
GPUS = {"H100": "NVIDIA H100 80GB HBM3", "B200": "NVIDIA B200",
        "RTX PRO 6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
#: model kind (a key of autotune.testing.sglang_oracle.MODELS) -> its architecture
ARCHITECTURES = {"llama": "LlamaForCausalLM", "deepseek": "DeepseekV3ForCausalLM"}
BACKENDS = ("fa3", "flashinfer", "triton", "flashmla", "trtllm_mla", "cutedsl_mla", "trtllm_mha", "hpc_ops", "fa4")
PAGE_SIZES = (1, 8, 16, 32, 64, 128)
TREE = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


@dataclass(frozen=True)
class Case:
    """One drawn config: the model kind, the GPU, and the study's args (flag names without dashes)."""

    model: str
    gpu: str
    args: Args

    @property
    def platform(self) -> Platform:
        return Platform(gpu=GPUS[self.gpu], architecture=ARCHITECTURES[self.model])

    def describe(self) -> str:
        flags = " ".join(f"--{k} {v}" for k, v in self.args.items() if k != "speculative-draft-model-path")
        return f"{self.model} on {self.gpu}: {flags}"


def draw(rng: random.Random) -> Case:
    """One config; the draft model path (where one is needed) is the placeholder ``DRAFT``."""
    model = rng.choice(tuple(ARCHITECTURES))
    gpu = rng.choice(tuple(GPUS))
    algorithm = rng.choice(ALGORITHMS)
    args: Args = {"speculative-algorithm": algorithm}
    if algorithm not in ("NGRAM",) and not (model == "deepseek" and algorithm in ("EAGLE", "NEXTN")):
        args["speculative-draft-model-path"] = "DRAFT"
    roll = rng.random()
    steps, topk = rng.randint(1, 6), rng.choice((1, 1, 2, 2, 3, 4, 8))
    capacity = topk + (steps - 1) * topk * topk + 1
    draft = rng.randint(1, min(capacity, 64)) if rng.random() < 0.85 else rng.randint(1, 80)
    tree = dict(zip(TREE, (steps, topk, draft), strict=True))
    if roll < 0.75:
        args.update(tree)
    elif roll < 0.85:
        kept = rng.sample(TREE, rng.randint(1, 2))
        args.update({k: tree[k] for k in kept})
    if algorithm == "NGRAM" and rng.random() < 0.4:
        args["speculative-ngram-max-bfs-breadth"] = rng.choice((1, 2, 4, 8, 10, 16))
    if rng.random() < 0.6:
        args["page-size"] = rng.choice(PAGE_SIZES)
    if rng.random() < 0.55:
        args["attention-backend"] = rng.choice(BACKENDS)
    for phase in ("prefill-attention-backend", "decode-attention-backend"):
        if rng.random() < 0.12:
            args[phase] = rng.choice(BACKENDS)
    return Case(model, gpu, args)
