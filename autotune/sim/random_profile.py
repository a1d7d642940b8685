"""Random emulator profiles: a physically plausible host, model and draft from one seed
(``autotune sim profile --random SEED``).

The five named profiles are hosts somebody calibrated by hand; this draws hosts nobody looked at, from real parts:

1. a model card (``catalog.CARDS``: dense and MoE, 8 B to 671 B parameters) and one of its checkpoints'
   quantizations (bf16, fp8, AWQ int4; gpt-oss's own MXFP4);
2. a GPU (``catalog.GPUS``: RTX 4090 24 GB to H200 141 GB) that runs that quantization and holds the model on at
   most 8 GPUs. tp is the fewest GPUs (a power of two) that hold the weights and the draft and still leave a KV pool
   of ``MIN_KV_TOKENS``, as the emulator's own memory plan (SGLang's sizing) works it out; a user pays for one more
   doubling with probability ``P_WIDER_TP``. So headroom varies the way it does on real hosts: a model that only
   just fits its GPUs leaves a small KV pool, and CUDA-graph memory outside the static pool is what wide draft
   trees run out of, more often on GPUs under 60 GB, where SGLang reserves less;
3. the step costs from bytes and FLOPs: ``base_ms`` = bytes every forward reads / achieved bandwidth + per-layer
   kernel gaps + all-reduce latency; ``expert_ms`` = one expert's bytes across the layers / bandwidth (memory-bound
   MoE reads), ``token_ms`` = FLOPs per token / achieved tensor throughput + all-reduce payload; the draft's from
   its own weights the same way;
4. the draft's acceptance: first-depth acceptance, how it decays with depth and what extra candidates per depth buy.

A host comes in one of three families (``FAMILIES``): its acceptance by the emulator's closed form, or by a Monte
Carlo of SGLang's tree (tree_acceptance.py), or that tree with its CUDA graphs given too little room for the widest
tree of any width (``TIGHT_HEADROOM``).

Every range below names its source: a datasheet or card (``catalog.py``), a paper, or one of the five calibrated
profiles (each of which cites its own measurements). The ranges were written before any study ran on these hosts;
the same seed gives the same profile.
"""
from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

from autotune.sim import model
from autotune.sim.catalog import CARD_BY_NAME, CARDS, GPU_BY_KEY, GPUS, QUANTS, Card, Gpu, Quant
from autotune.sim.profile import (
    Acceptance,
    Hardware,
    Memory,
    ModelInfo,
    Profile,
    Startup,
    Timing,
    Workload,
)

GIB = 1 << 30
MIB = 1 << 20
TP_SIZES = (1, 2, 4, 8)

# ------------------------------------------------------------------------------------------------- the ranges

#: the KV pool a host must keep: the surface's c32 workload (32 requests of 256 + 256 tokens) twice over. Nobody
#: serves 32 concurrent requests from a pool that cannot hold them; below this the next tp up is taken.
MIN_KV_TOKENS = 2 * 32 * (256 + 256)
#: a user who could fit the model on n GPUs runs it on 2n this often (more speed, more KV room).
P_WIDER_TP = 0.3
#: a host has exactly tp GPUs this often; otherwise it is an 8-GPU server running one tp group.
P_HOST_IS_TP = 0.5

#: achieved fraction of datasheet memory bandwidth for the weight reads of a decode step. The calibrated profiles
#: sit at 0.79-0.81 (llama8b 2.68 of 3.35 TB/s; llama70b 2.7 TB/s, which matches SGLang PR 4716's 88.6 tok/s;
#: qwen14b 0.8 of 1.0 TB/s); memory-bound GEMV kernels reach 70-90 % of peak on HBM and GDDR alike.
BANDWIDTH_EFFICIENCY = (0.70, 0.85)
#: fused-MoE expert reads run at this fraction of the dense figure (qwen235b: 2.2 against 2.7 TB/s = 0.81; small
#: per-expert batches make the grouped GEMM less efficient than one dense GEMV).
MOE_BANDWIDTH_FACTOR = (0.75, 0.95)
#: kernel gaps, norms, rope and attention launch cost per layer under a CUDA graph, microseconds. Dense: llama70b
#: 1.8 ms / 80 layers = 22 us (fitted to PR 4716), qwen14b 0.5 ms / 40 = 12.5 us, llama8b ~0 (its step is its weight
#: read). MoE layers run ~20 kernels (router, top-k, align, two grouped GEMMs, activation quant) and measure far
#: more than their reads: DeepSeek-V3 on 8x H200 decoded 44 tok/s at batch 1 in SGLang (PR 3582: 77 tok/s with MTP,
#: a 1.76x speedup), ~300 us per layer beyond its ~3 ms of reads and all-reduces; the seed host's 13.4 ms step
#: (qwen122b, calibrated to its measured 123 tok/s at steps 1) leaves ~180 us per layer after its reads and PCIe
#: all-reduces; Qwen3-30B-A3B on one A100 decoded 104 tok/s (tt-inference-server issue 340), ~100 us; the qwen235b
#: profile's estimate (no measurement) 61 us.
LAYER_GAP_US = {"dense": (5.0, 25.0), "moe": (60.0, 300.0)}
#: achieved fraction of dense tensor throughput for the verify forward's tens to hundreds of tokens. llama8b and
#: llama70b on H100 bf16: 0.71; qwen14b (Marlin int4 on a 4090): 0.67; qwen235b (fp8 fused MoE on H100): 0.40.
MFU = {"dense": (0.45, 0.75), "moe": (0.35, 0.60)}
#: attention FLOPs of a prefill run at this fraction of bf16 peak (llama70b, llama8b, qwen235b: ~400 of 989 on H100).
ATTENTION_MFU = (0.30, 0.50)
#: all-reduce between tp ranks: small-message latency (us) and bus bandwidth (GB/s) for the per-token payload.
#: NVLink: SGLang's custom all-reduce, 8 us at tp 4 (qwen235b) to 15 us at tp 8 (llama70b, fitted to PR 4716); bus
#: bandwidth for MB-sized messages well below the links' 600 (A100) / 900 (H100) GB/s (llama70b: 350). PCIe: no
#: custom all-reduce, NCCL rings of tens of us; Gen4 x16 moves 32 GB/s a direction, Gen5 64; GeForce cards without
#: peer-to-peer go through host memory at about half that.
ALLREDUCE = {
    "nvlink3": {"latency_us": (6.0, 16.0), "bus_gbs": (100.0, 200.0)},
    "nvlink4": {"latency_us": (6.0, 16.0), "bus_gbs": (200.0, 350.0)},
    "pcie4": {"latency_us": (20.0, 45.0), "bus_gbs": (10.0, 20.0)},
    "pcie4-host": {"latency_us": (25.0, 50.0), "bus_gbs": (6.0, 12.0)},
    "pcie5": {"latency_us": (20.0, 45.0), "bus_gbs": (20.0, 40.0)},
}
#: a draft forward's fixed cost beyond its weight read, ms, plus a cost per extra tp rank (its collectives, tree
#: top-k and small kernels on every rank). llama8b (tp 1): 0.25 ms = its 0.7 GB read, so ~0; qwen14b (tp 1): 1.3 =
#: 1.06 GB at 0.85 TB/s + 0.05; llama70b (tp 8): 1.1 ms fitted to PR 4716's 25 ms per (8, 8, 64) iteration, i.e.
#: ~0.13 per extra rank; qwen235b (tp 4): 0.5, ~0.12 per extra rank.
DRAFT_STEP_FIXED_MS = (0.0, 0.10)
DRAFT_STEP_PER_RANK_MS = (0.06, 0.14)
#: the draft extend (one more draft forward, with the EAGLE-3 fc fusion layer) against one draft step: the
#: calibrated profiles hold 0.9-1.8 (qwen122b's MTP extend 1.8, the EAGLE-3 heads 0.9-1.2), plus the fc read.
DRAFT_EXTEND_RATIO = (0.9, 1.3)
#: the scheduler's own time per iteration, ms, growing with the TP workers it broadcasts to: 0.35 (llama8b, tp 1),
#: 0.4 (qwen14b, tp 1), 0.45-0.5 (tp 4), 0.5 (tp 8); per running request 0.01-0.02 ms.
SCHED_MS = (0.30, 0.42)
SCHED_MS_PER_DOUBLING = 0.03
SCHED_REQ_MS = (0.010, 0.020)
#: one kernel launch without a CUDA graph, us (llama70b: ~960 launches at ~6 us; qwen235b: ~1,900 at ~4 us), and
#: kernels per layer (dense ~12, MoE ~20).
LAUNCH_US = (4.0, 7.0)
KERNELS_PER_LAYER = {"dense": 12, "moe": 20}
#: a prefill token against a verify token (llama70b 0.04/0.038, llama8b 0.03/0.023, qwen14b 1.0, qwen235b 0.9).
PREFILL_TOKEN_RATIO = (0.9, 1.3)

#: memory outside the static pool that is not CUDA graphs, GiB: a fixed part (cuBLAS and NCCL workspaces,
#: allocator slack) plus the chunked prefill's widest activations and fused-MoE caches, worked out per model. The
#: calibrated profiles hold 2.5-4.5 GiB in all, of which the chunk's activations are 0.4-1.0 GiB.
ACTIVATION_FIXED_GIB = (2.0, 4.0)
#: CUDA-graph memory per verify token: the full-vocabulary fp32 logits (vocab x 4 B) times this factor for the
#: hidden buffers and the sampling copy. The calibrated profiles hold 1.29 (qwen14b) to 2.11 (qwen122b).
GRAPH_VERIFY_FACTOR = (1.3, 2.1)
#: per draft-tree candidate: fp32 logits over a 32k draft vocabulary + six hidden-size bf16 buffers, times this
#: factor. The calibrated profiles hold 1.66 (qwen14b) to 2.07 (llama8b); qwen122b's MTP draft fits the same (1.9).
GRAPH_TREE_FACTOR = (1.6, 2.1)
DRAFT_VOCAB = 32000
#: the graph pool's fixed part, GiB: 0.3 (tp 1, 4090) to 0.6 (tp 4 and 8: NCCL and custom all-reduce buffers).
GRAPH_BASE_GIB = (0.30, 0.40)
GRAPH_BASE_PER_DOUBLING_GIB = 0.07
#: CUDA context and communicator buffers before the weights, GiB: 0.6-0.8 at tp 1, 1.3 at tp 4, 1.4 at tp 8.
CUDA_CONTEXT_GIB = (0.55, 0.85)
CUDA_CONTEXT_PER_DOUBLING_GIB = 0.25

#: the draft's acceptance (see autotune.sim: depth d survives with first * decay^((d-1)^shape); m candidates at a
#: depth cover it with 1 - (1 - q)^(m^gain)).
#: - EAGLE-3 heads. first: 0.50 is what SpecForge-trained heads on Qwen3 MoE measure in SGLang (accept length 1.86
#:   at 3 steps, SpecForge issue 339, the qwen235b profile) and public 70B/235B heads at temperature 1 (tau 2.6-2.9
#:   at 7 steps, nebius model cards); 0.86 is the EAGLE-3 paper's heads at temperature 0 (tau 6.5 on GSM8K with
#:   LLaMA-3.1-8B). decay: the EAGLE-3 paper's acceptance stays nearly flat with position (training-time test), 0.99;
#:   weak heads fall off fast (qwen235b 0.82). The calibrated EAGLE-3 profiles: first 0.76-0.80, decay 0.82-0.95,
#:   shape 1.0-1.3.
#: - EAGLE-1/2 heads (feature-level autoregression, errors accumulate with depth): the EAGLE paper's per-position
#:   acceptance falls from ~0.8 to ~0.7 over four positions, less for MoE targets (Mixtral 8x7B ran ~1.5x).
#: - MTP layers trained with the model: DeepSeek-V3's report measures 85-90 % acceptance of the second token, vLLM
#:   81-82 % on R1 (PR 12755), SGLang accept length ~1.9 with one draft token (PR 3582); the seed host's Qwen3.5
#:   MTP layer calibrates to 0.95. They are trained for one step and reused deeper, so acceptance
#:   falls steeply past a few steps (qwen122b: shape 1.6; GLM-4.7 MTP measured slower at 7 steps than at 3).
#: - topk_gain: Medusa's first head is right ~60 % of the time at top-1 and 80-85 % at top-5, i.e. 5 candidates act
#:   like 5^0.35-5^0.45 independent ones; fitted to measured trees: 0.4 (llama70b, PR 4716's tau 5.88 at (8, 8,
#:   64)), 0.35 (qwen235b, SpecForge's (3,3,8) to (8,8,60)). Above 0.5 a topk-8 tree would cover nearly every depth
#:   and reach tau 8.5+ at (8, 8, 64), beyond the EAGLE-3 paper's best (~7 at depth 8, T = 0). Even so the corner
#:   of near-flat strong heads (first >= 0.8, decay >= 0.97) reaches tau ~8 there: the model's candidates cover a
#:   depth independently, where a real draft's top-k misses together.
ACCEPTANCE: dict[str, dict[str, tuple[float, float]]] = {
    "eagle3": {"first": (0.50, 0.86), "decay": (0.80, 0.99), "decay_shape": (1.0, 1.5), "topk_gain": (0.30, 0.50)},
    "eagle": {"first": (0.55, 0.80), "decay": (0.80, 0.92), "decay_shape": (1.0, 1.4), "topk_gain": (0.30, 0.50)},
    "mtp": {"first": (0.80, 0.95), "decay": (0.88, 0.98), "decay_shape": (1.2, 1.8), "topk_gain": (0.30, 0.50)},
}
#: the second family's draft (``family = "tree"``: tree_acceptance.py's Monte Carlo of SGLang's own tree):
#: - align (the share of depth-1 positions where the target's token is among the draft's ranks) and confidence (the
#:   mean probability of the draft's top token) give the chain's first acceptance, align x confidence: 0.45-0.85
#:   for EAGLE-3 heads (the closed family's first, above), and top-5 coverage align x (1 - (1 - p)^5) of 0.75-0.95
#:   (Medusa's first head: 60% at top-1, 80-85% at top-5);
#: - align_decay: EAGLE-3's training-time test keeps acceptance nearly flat with depth (0.99), EAGLE-1/2 heads
#:   lose ~4% a position (the EAGLE paper's 0.8 -> 0.7 over four), MTP layers trained for one step fall steeply;
#: - confidence_spread (the beta's a + b): 2 (a draft either sure or lost, as on code and lists) to 8 (even).
#: Over these ranges the accept length at (8, 8, 64) spans ~3 to ~6.5 (PR 4716's tau 5.88 for llama70b; the
#: EAGLE-3 paper's ~6.5 at T = 0 the top).
TREE_ACCEPTANCE: dict[str, dict[str, tuple[float, float]]] = {
    "eagle3": {"align": (0.85, 0.99), "align_decay": (0.90, 0.995), "confidence": (0.55, 0.85),
               "confidence_spread": (2.0, 8.0)},
    "eagle": {"align": (0.85, 0.97), "align_decay": (0.85, 0.96), "confidence": (0.6, 0.82),
              "confidence_spread": (2.0, 8.0)},
    "mtp": {"align": (0.92, 0.99), "align_decay": (0.80, 0.93), "confidence": (0.8, 0.95),
            "confidence_spread": (2.0, 8.0)},
}
#: the third family's memory (``family = "tight"``: the tree family's host and draft, its CUDA graphs given less
#: room): the headroom outside the static pool that the graphs may take, as a share of what the default space's
#: widest topk-2 tree (8 steps, 31 draft tokens) needs. Below 1 the widest tree of every width fails at graph
#: capture (wider widths need more: their draft trees hold topk + (steps - 1) x topk^2 candidates), while chains and
#: the narrower trees of each width start: what a host looks like when its owner raised --mem-fraction-static for a
#: larger KV cache, or shares the GPU with another process, so that SGLang's reserve is partly gone. The range is the
#: family's definition, not a measurement: below 1 every width loses its widest tree, and at 0.5 the engine's first
#: tree (5 steps, topk 2, 11 draft tokens) still starts on each host of seeds 0-199.
TIGHT_HEADROOM = (0.5, 0.95)
#: the widest topk-2 tree of the default space (steps, topk, draft tokens): TIGHT_HEADROOM's unit
WIDEST_TOPK2 = (8, 2, 31)
#: the families of hosts: the emulator's closed-form acceptance, the Monte Carlo of SGLang's tree, and that tree on
#: a host whose widest tree of every width runs out of memory
FAMILIES = ("closed", "tree", "tight")

#: acceptance lost per unit of temperature: 70B EAGLE-3 heads keep ~93 % of (tau - 1) from T = 0 to 1 (0.03), the
#: profiles hold 0.03-0.15.
TEMPERATURE_PENALTY = (0.03, 0.15)
#: mean answer length without ignore_eos (the profiles: 500-700 tokens).
MEAN_OUTPUT_TOKENS = (400, 800)
#: per-request relative noise: run-to-run variation of 1-3 % on GPU servers (docs/peers.md).
NOISE = (0.01, 0.03)

DRAFT_NAMES = {"eagle3": "EAGLE-3 head", "eagle": "EAGLE head", "mtp": "built-in MTP layer"}
#: the draft's class in SGLang: the EAGLE heads' own, or the target's MTP ("NextN") variant
DRAFT_ARCHITECTURES = {"eagle3": "LlamaForCausalLMEagle3", "eagle": "LlamaForCausalLMEagle"}
MTP_ARCHITECTURES = {"DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
                     "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN"}


class RandomProfileError(ValueError):
    """A pinned choice (model, quantization, GPU, tp) that does not exist or cannot host the model."""


# ------------------------------------------------------------------------------------------------ the draw


@dataclasses.dataclass(frozen=True)
class RandomHost:
    """One drawn host: the discrete choices, the profile's tables, and the figures its header states."""

    seed: int
    card: Card
    quant: Quant
    gpu: Gpu
    tp: int
    sections: dict[str, dict[str, Any]]
    facts: dict[str, float]
    family: str = "closed"         # the draft's acceptance model and the memory it has (FAMILIES)

    @property
    def name(self) -> str:
        return f"random-{self.seed}" if self.family == "closed" else f"random-{self.family}-{self.seed}"

    def profile(self) -> Profile:
        """The profile as ``load_profile`` would return it from the file (``path`` aside)."""
        return _profile(self.sections)

    def toml(self) -> str:
        return render_toml(self)

    def describe(self) -> str:
        return self.sections["profile"]["description"]


def draw(seed: int, *, model_name: str | None = None, quant: str | None = None, gpu: str | None = None,
         tp: int | None = None, family: str = "closed") -> RandomHost:
    """The host of ``seed``; any of model, quantization, GPU and tp may be pinned (the rest is still drawn).
    ``family``: the draft's acceptance model, "closed" (the emulator's closed form) or "tree" (the Monte Carlo of
    SGLang's tree, its draft drawn from TREE_ACCEPTANCE by a generator of its own: the same seed's hardware, model
    and costs in both families), or "tight" (the tree family's host with less room for CUDA graphs:
    TIGHT_HEADROOM)."""
    if family not in FAMILIES:
        raise RandomProfileError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    rng = random.Random(seed)
    card = rng.choice(CARDS)
    if model_name is not None:
        card = _pick(CARD_BY_NAME, model_name, "model")
    q = QUANTS[rng.choice(card.quants)]
    if quant is not None:
        q = _pick(QUANTS, quant, "quantization")
        if q.key not in card.quants:
            raise RandomProfileError(f"{card.name} has no {q.key} checkpoint (it has {', '.join(card.quants)})")
    gpus = [g for g in GPUS if g.fp8_tflops or not q.needs_fp8]
    rng.shuffle(gpus)
    if gpu is not None:
        pinned = _pick(GPU_BY_KEY, gpu, "GPU")
        if q.needs_fp8 and not pinned.fp8_tflops:
            raise RandomProfileError(f"{pinned.name} has no fp8 tensor cores for a {q.key} checkpoint")
        gpus = [pinned]
    wider = rng.random() < P_WIDER_TP
    whole_host = rng.random() >= P_HOST_IS_TP
    factors = _draw_factors(rng, card)
    for g in gpus:
        sizes = TP_SIZES if tp is None else (tp,)
        for fewest in sizes:
            if not _fits(_profile(_derive(seed, card, q, g, fewest, factors, fewest)[0]), fewest):
                continue
            size = fewest * 2 if tp is None and wider and fewest * 2 in TP_SIZES else fewest
            sections, facts = _derive(seed, card, q, g, size, factors, 8 if whole_host else size)
            if family in ("tree", "tight"):
                _tree_family(seed, card, sections)
            if family == "tight":
                _tight_memory(seed, size, sections)
            return RandomHost(seed, card, q, g, size, sections, facts, family)
    where = f"{gpus[0].name} at tp {tp}" if gpu is not None and tp is not None else "any GPU of the catalog"
    raise RandomProfileError(f"{card.name} ({q.key}) does not fit {where} with a KV pool of {MIN_KV_TOKENS} tokens")


def _tree_family(seed: int, card: Card, sections: dict[str, dict[str, Any]]) -> None:
    """Give the host the Monte Carlo acceptance model, its draft drawn by a generator of its own."""
    rng = random.Random(f"tree-{seed}")
    acceptance = sections["acceptance"]
    acceptance["model"] = "tree"
    for key, bounds in TREE_ACCEPTANCE[card.draft].items():
        acceptance[key] = _sig(_u(rng, bounds))
    head = sections["profile"]
    head["name"] = f"random-tree-{seed}"
    head["description"] += ", acceptance by Monte Carlo of SGLang's tree"


def _tight_memory(seed: int, tp: int, sections: dict[str, dict[str, Any]]) -> None:
    """Leave the CUDA graphs a share of TIGHT_HEADROOM (drawn by a generator of its own) of what the widest topk-2
    tree needs: the memory outside the static pool that something else takes is added to the activations' (a host
    that already has less room keeps it)."""
    share = _u(random.Random(f"tight-{seed}"), TIGHT_HEADROOM)
    profile = _profile(sections)
    plan = model.memory_plan(profile, model.Config(tp=tp, spec=model.Spec(1, 1, 2),
                                                   max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS))
    mem = sections["memory"]
    steps, topk, draft = WIDEST_TOPK2
    slot_mb = share * (mem["graph_verify_mb_per_token"] * draft
                       + mem["graph_tree_mb_per_node"] * model.Spec(steps, topk, draft).tree_nodes)
    room = mem["graph_base_gb"] + plan.cuda_graph_max_bs * slot_mb / 1024
    taken = plan.headroom_gb - room
    if taken > 0:
        mem["activation_gb"] = _sig(mem["activation_gb"] + taken)
    head = sections["profile"]
    head["name"] = f"random-tight-{seed}"
    head["description"] += f", CUDA graphs given {share:.0%} of what the widest topk-2 tree needs"


def _pick(table: dict[str, Any], key: str, what: str) -> Any:
    if key not in table:
        raise RandomProfileError(f"unknown {what} {key!r} (known: {', '.join(table)})")
    return table[key]


def _fits(profile: Profile, tp: int) -> bool:
    """The emulator's own memory plan: weights, draft and a KV pool of MIN_KV_TOKENS at the baseline config."""
    baseline = model.Config(tp=tp, spec=model.Spec(1, 1, 2),
                            max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS)
    plain = model.Config(tp=tp)
    plan = model.memory_plan(profile, baseline)
    return (plan.error is None and plan.max_total_num_tokens >= MIN_KV_TOKENS
            and model.memory_plan(profile, plain).error is None)


def _u(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(*bounds)


def _draw_factors(rng: random.Random, card: Card) -> dict[str, float]:
    """Every continuous draw, in a fixed order, before the host is known (so a GPU's fit does not move them)."""
    kind = "moe" if card.moe else "dense"
    f = {
        "bandwidth_efficiency": _u(rng, BANDWIDTH_EFFICIENCY),
        "moe_bandwidth_factor": _u(rng, MOE_BANDWIDTH_FACTOR),
        "layer_gap_us": _u(rng, LAYER_GAP_US[kind]),
        "dense_gap_us": _u(rng, LAYER_GAP_US["dense"]),
        "mfu": _u(rng, MFU[kind]),
        "attention_mfu": _u(rng, ATTENTION_MFU),
        "allreduce_latency": rng.random(),
        "allreduce_bus": rng.random(),
        "draft_fixed_ms": _u(rng, DRAFT_STEP_FIXED_MS),
        "draft_per_rank_ms": _u(rng, DRAFT_STEP_PER_RANK_MS),
        "draft_extend_ratio": _u(rng, DRAFT_EXTEND_RATIO),
        "sched_ms": _u(rng, SCHED_MS),
        "sched_req_ms": _u(rng, SCHED_REQ_MS),
        "launch_us": _u(rng, LAUNCH_US),
        "prefill_token_ratio": _u(rng, PREFILL_TOKEN_RATIO),
        "activation_fixed_gib": _u(rng, ACTIVATION_FIXED_GIB),
        "graph_verify_factor": _u(rng, GRAPH_VERIFY_FACTOR),
        "graph_tree_factor": _u(rng, GRAPH_TREE_FACTOR),
        "graph_base_gib": _u(rng, GRAPH_BASE_GIB),
        "cuda_context_gib": _u(rng, CUDA_CONTEXT_GIB),
        "temperature_penalty": _u(rng, TEMPERATURE_PENALTY),
        "mean_output_tokens": float(rng.randint(*MEAN_OUTPUT_TOKENS)),
        "noise": _u(rng, NOISE),
        # startup seconds (no effect on throughput): the profiles' 90-120 s seed-host startup split by phase
        "init_s": rng.uniform(2.0, 3.0),
        "load_gb_per_s": rng.uniform(1.5, 4.0),
        "kv_alloc_s": rng.uniform(0.5, 2.5),
        "graph_capture_s_per_bs": rng.uniform(0.2, 0.5),
        "draft_graph_capture_s_per_bs": rng.uniform(0.08, 0.15),
        "server_start_s": rng.uniform(1.0, 1.5),
    }
    for key, bounds in ACCEPTANCE[card.draft].items():
        f[key] = _u(rng, bounds)
    return f


# ----------------------------------------------------------------------------------------- bytes and FLOPs


def _draft_params(card: Card) -> dict[str, int]:
    """The draft's parameters by role: read per draft step, the fc read once per extend, stored in total.

    EAGLE-3 head: one decoder layer whose q/k/v take the 2h-wide concatenation of embedding and fused feature, a
    dense MLP (the target's width; for MoE targets 3x hidden, assumed), the 3h -> h fc fusing three target layers'
    features, and an lm_head over a 32k draft vocabulary (the embedding is the target's). EAGLE-1/2 head: one decoder
    layer (MLP as wide as one expert) behind a 2h -> h fc, sharing the target's lm_head. MTP layer: one more
    target layer (every expert stored, top-k + shared read per token), a 2h -> h projection, and its own embedding
    and lm_head (DeepSeek-V3's card: 671 B + 14 B of MTP module)."""
    h = card.hidden
    if card.draft == "mtp":
        attention = card.attention_params()
        step = attention + (card.experts_per_token + card.shared_experts) * card.expert_params()
        fc = 2 * h * h
        stored_linear = attention + (card.experts + card.shared_experts) * card.expert_params() + fc
        return {"step_linear": step, "step_bf16": card.vocab * h, "fc": fc,
                "stored_linear": stored_linear, "stored_bf16": 2 * card.vocab * h}
    q, kv = card.heads * card.head_dim, card.kv_heads * card.head_dim
    width = card.ffn or (card.moe_ffn if card.draft == "eagle" else 3 * h)
    if card.draft == "eagle3":
        layer = 2 * h * q + 2 * 2 * h * kv + q * h + 3 * h * width
        fc, head = 3 * h * h, DRAFT_VOCAB * h
    else:
        layer = h * q + 2 * h * kv + q * h + 3 * h * width
        fc, head = 2 * h * h, card.vocab * h
    stored = layer + fc + (head if card.draft == "eagle3" else 0)
    return {"step_linear": 0, "step_bf16": layer + head, "fc": fc, "stored_linear": 0, "stored_bf16": stored}


def _derive(seed: int, card: Card, q: Quant, gpu: Gpu, tp: int, f: dict[str, float],
            host_gpus: int) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Profile tables for one host from the card, the GPU, tp and the drawn factors."""
    kind = "moe" if card.moe else "dense"
    p = card.parameters()
    doublings = math.log2(tp)
    bw = gpu.bandwidth_gbs * 1e6 * f["bandwidth_efficiency"]          # bytes per ms
    peak = (gpu.fp8_tflops if q.fp8_compute else gpu.bf16_tflops) * 1e9  # FLOP per ms
    link = ALLREDUCE[gpu.link]
    latency_ms = _lerp(link["latency_us"], f["allreduce_latency"]) / 1000.0
    bus = _lerp(link["bus_gbs"], f["allreduce_bus"]) * 1e6           # bytes per ms
    reductions = 2 * card.layers if tp > 1 else 0                        # after attention and after the MLP

    # the target: bytes every forward reads, one expert's bytes, FLOPs and all-reduce payload per token
    always_bytes = p["always"] * q.linear_bytes + p["lm_head"] * 2
    expert_bytes = card.moe_layers * card.expert_params() * q.expert_bytes
    gaps_ms = (card.moe_layers * f["layer_gap_us"] + (card.layers - card.moe_layers) * f["dense_gap_us"]) / 1000
    base_ms = always_bytes / tp / bw + gaps_ms + reductions * latency_ms
    expert_ms = expert_bytes / tp / (bw * f["moe_bandwidth_factor"]) if card.moe else 0.0
    flops = 2 * card.active_linear_params() / tp
    payload = reductions * card.hidden * 2 * (2 * (tp - 1) / tp) if tp > 1 else 0.0
    token_ms = flops / (peak * f["mfu"]) + payload / bus
    kv_bytes = card.kv_bytes_per_token(tp)
    read_ms_no_spec = base_ms + card.experts_per_token * expert_ms  # batch 1, width 1: top-k experts touched

    # the draft
    d = _draft_params(card)
    draft_step_bytes = d["step_linear"] * q.linear_bytes + d["step_bf16"] * 2
    draft_step_ms = (draft_step_bytes / tp / bw + f["draft_fixed_ms"] + (tp - 1) * f["draft_per_rank_ms"])
    if card.draft == "mtp":  # the MTP layer is one more target layer, with its kernel gaps
        draft_step_ms += f["layer_gap_us"] / 1000
    draft_token_ms = 2 * (d["step_linear"] + d["step_bf16"]) / tp / (gpu.bf16_tflops * 1e9 * f["mfu"])
    fc_ms = d["fc"] * (q.linear_bytes if card.draft == "mtp" else 2) / tp / bw
    draft_extend_ms = draft_step_ms * f["draft_extend_ratio"] + fc_ms
    draft_extend_token_ms = draft_token_ms + 2 * d["fc"] / tp / (gpu.bf16_tflops * 1e9 * f["mfu"])
    draft_weights_gb = (d["stored_linear"] * q.linear_bytes + d["stored_bf16"] * 2) / GIB
    weights_gb = (p["always"] * q.linear_bytes + p["experts"] * q.expert_bytes
                  + (p["lm_head"] + p["embedding"]) * 2) / GIB

    # prefill: a few hundred tokens touch every expert; attention is 4 FLOP per head dim per causal token pair
    qk_dim = (card.mla[2] + card.mla[3]) if card.mla else card.head_dim
    heads_per_gpu = card.heads / tp
    attn_flops = heads_per_gpu * qk_dim * card.layers * 4 * 1e6 / 2
    prefill_attn = attn_flops / (gpu.bf16_tflops * 1e9 * f["attention_mfu"])
    prefill_base_ms = base_ms + card.experts * expert_ms

    # memory outside the static pool: the chunk's activations and fused-MoE caches (per GPU), graph coefficients
    ffn_per_gpu = (card.ffn if not card.moe or card.dense_layers else 0) / tp
    per_token_act = 2 * (2 * ffn_per_gpu + 4 * card.hidden)
    if card.moe:
        per_token_act += 2 * card.experts_per_token * (3 * card.moe_ffn / tp + card.hidden)
    verify_mb = card.vocab * 4 / MIB * f["graph_verify_factor"]
    tree_mb = (DRAFT_VOCAB * 4 + card.hidden * 2 * 6) / MIB * f["graph_tree_factor"]

    quant_text = {"bf16": "bf16", "fp8": "FP8", "int4": "AWQ int4", "mxfp4": "MXFP4"}[q.key]
    kind_text = (f"MoE {card.params_b:g} B total, {card.active_b:g} B active, {card.experts} experts top "
                 f"{card.experts_per_token}" if card.moe else f"dense {card.params_b:g} B")
    host_text = f"{tp}x {gpu.name}" if host_gpus == tp else f"an {host_gpus}x {gpu.name} host"
    description = f"{card.name} {quant_text} ({kind_text}), tp {tp} on {host_text}, {DRAFT_NAMES[card.draft]}, greedy"
    sections: dict[str, dict[str, Any]] = {
        "profile": {"name": f"random-{seed}", "description": description, "noise": _sig(f["noise"])},
        "model": {
            "architecture": card.architecture,
            "model_type": card.model_type,
            "draft_architecture": (MTP_ARCHITECTURES[card.architecture] if card.draft == "mtp"
                                   else DRAFT_ARCHITECTURES[card.draft]),
            "draft_model_path": "" if card.draft == "mtp" else f"/models/{card.name}-{card.draft.upper()}",
            "context_length": card.context,
            "vocab_size": card.vocab,
            "eos_token_id": card.eos,
            "dtype": q.dtype,
            "quantization": q.label,
            "multimodal": False,
            "hybrid_linear_attention": False,
            # SGLang 0.5.23's automatic (steps, topk, draft): (5, 4, 8) for Llama, (3, 1, 4) for the rest
            "auto_speculative": [5, 4, 8] if card.architecture == "LlamaForCausalLM" else [3, 1, 4],
            "attention_backend": "fa3" if gpu.hopper else "flashinfer",
        },
        "hardware": {
            "gpu_name": gpu.name,
            "gpu_memory_gb": gpu.memory_gib,
            "gpus": host_gpus,
            "cuda_context_gb": _sig(f["cuda_context_gib"] + CUDA_CONTEXT_PER_DOUBLING_GIB * doublings),
        },
        "memory": {
            "weights_gb": _sig(weights_gb),
            "draft_weights_gb": _sig(draft_weights_gb),
            "kv_bytes_per_token": kv_bytes,
            "draft_kv_bytes_per_token": card.kv_bytes_per_token(tp, layers=1),
            "activation_gb": 0.0,  # set below, once SGLang's chunked prefill size for this GPU is known
            "graph_base_gb": _sig(f["graph_base_gib"] + GRAPH_BASE_PER_DOUBLING_GIB * doublings),
            "graph_verify_mb_per_token": _sig(verify_mb),
            "graph_tree_mb_per_node": _sig(tree_mb),
        },
        "timing": {
            "reference_tp": tp,
            "base_ms": _sig(base_ms),
            "token_ms": _sig(token_ms),
            "moe_experts": card.experts,
            "moe_topk": card.experts_per_token,
            "expert_ms": _sig(expert_ms),
            "kv_ms_per_ktoken": _sig(kv_bytes * 1000 / bw),
            "draft_step_ms": _sig(draft_step_ms),
            "draft_token_ms": _sig(draft_token_ms),
            "draft_extend_ms": _sig(draft_extend_ms),
            "draft_extend_token_ms": _sig(draft_extend_token_ms),
            "sched_ms": _sig(f["sched_ms"] + SCHED_MS_PER_DOUBLING * doublings),
            "sched_req_ms": _sig(f["sched_req_ms"]),
            "eager_ms": _sig(KERNELS_PER_LAYER[kind] * card.layers * f["launch_us"] / 1000),
            "prefill_base_ms": _sig(prefill_base_ms),
            "prefill_token_ms": _sig(token_ms * f["prefill_token_ratio"]),
            "prefill_attn_ms_per_mtoken2": _sig(prefill_attn),
        },
        "acceptance": {
            "first": _sig(f["first"]),
            "decay": _sig(f["decay"]),
            "decay_shape": _sig(f["decay_shape"]),
            "topk_gain": _sig(f["topk_gain"]),
            "temperature_penalty": _sig(f["temperature_penalty"]),
            "mean_output_tokens": int(f["mean_output_tokens"]),
        },
        "startup": {
            "init_s": _sig(f["init_s"] + 1.8 * doublings),
            "load_gb_per_s": _sig(f["load_gb_per_s"]),
            "draft_load_s": _sig(0.5 + draft_weights_gb / f["load_gb_per_s"]),
            "kv_alloc_s": _sig(f["kv_alloc_s"]),
            "graph_capture_s_per_bs": _sig(f["graph_capture_s_per_bs"]),
            "draft_graph_capture_s_per_bs": _sig(f["draft_graph_capture_s_per_bs"]),
            "server_start_s": _sig(f["server_start_s"]),
        },
        "workload": {"prompt_tokens": 256, "output_tokens": 256},
    }
    chunk = model.default_chunked_prefill_size(_profile(sections))
    sections["memory"]["activation_gb"] = _sig(f["activation_fixed_gib"] + chunk * per_token_act / GIB)
    facts = {
        "bandwidth_gbs": gpu.bandwidth_gbs,
        "bandwidth_efficiency": f["bandwidth_efficiency"],
        "read_bytes_per_gpu": (always_bytes + card.experts_per_token * expert_bytes) / tp,
        "read_ms": read_ms_no_spec,
        "weights_per_gpu_gib": (weights_gb + draft_weights_gb) / tp,
        "compute_bound_tokens": base_ms / token_ms,
    }
    return sections, facts


def _lerp(bounds: tuple[float, float], x: float) -> float:
    return bounds[0] + (bounds[1] - bounds[0]) * x


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _profile(sections: dict[str, dict[str, Any]]) -> Profile:
    head = sections["profile"]
    m = dict(sections["model"])
    m["auto_speculative"] = tuple(m["auto_speculative"])
    return Profile(
        name=head["name"], description=head["description"], noise=head["noise"],
        model=ModelInfo(**m), hardware=Hardware(**sections["hardware"]), memory=Memory(**sections["memory"]),
        timing=Timing(**sections["timing"]), acceptance=Acceptance(**sections["acceptance"]),
        startup=Startup(**sections["startup"]), workload=Workload(**sections["workload"]),
    )


# ------------------------------------------------------------------------------------------------ the file


def render_toml(host: RandomHost) -> str:
    """The profile file: a header saying what was drawn, then the tables (format: autotune.sim)."""
    plan = model.memory_plan(host.profile(), model.Config(
        tp=host.tp, spec=model.Spec(1, 1, 2), max_running_requests=model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS))
    facts = host.facts
    lines = [
        f"# Random host {host.seed} (autotune sim profile --random {host.seed}"
        + (f" --family {host.family}" if host.family != "closed" else "") + "), drawn by",
        "# autotune/sim/random_profile.py from real GPUs and model cards (autotune/sim/catalog.py); every range and",
        "# its source is there. Format: see autotune/sim/__init__.py.",
        f"# {host.describe()}.",
        f"# Weights and draft: {facts['weights_per_gpu_gib']:.1f} GiB per GPU of {host.gpu.memory_gib:g}; KV pool at "
        f"the baseline: {plan.max_total_num_tokens} tokens.",
        f"# A decode step reads {facts['read_bytes_per_gpu'] / 1e9:.2f} GB per GPU at {host.gpu.bandwidth_gbs:g} GB/s "
        f"x {facts['bandwidth_efficiency']:.2f}: {facts['read_ms']:.2f} ms with its fixed costs; the verify "
        f"tokens' compute",
        f"# equals that at {facts['compute_bound_tokens']:.0f} tokens.",
        "",
    ]
    for table, values in host.sections.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def write_profile(seed: int, out: Path, family: str = "closed") -> RandomHost:
    """Draw the host of ``seed`` (of ``family``) and write its profile file to ``out``."""
    host = draw(seed, family=family)
    out.write_text(host.toml())
    return host
