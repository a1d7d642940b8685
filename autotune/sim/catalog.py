"""Real GPUs and real model cards: the facts random emulator profiles are drawn from (``random_profile.py``).

Every number here is a datasheet or a checkpoint's config.json, not a guess; what is drawn at random lives in
``random_profile.py``. ``Card.parameters`` rebuilds a model's parameter count from its dimensions, and
tests/sim/test_random_profile.py checks it against the count the model card states.
"""
from __future__ import annotations

import dataclasses

# --------------------------------------------------------------------------------------------------------- GPUs


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU model as a datasheet states it, and how its host links GPUs together."""

    key: str
    name: str              # what torch.cuda.get_device_name() prints
    memory_gib: float      # torch.cuda.get_device_properties().total_memory, in GiB
    bandwidth_gbs: float   # memory bandwidth, GB/s
    bf16_tflops: float     # dense bf16/fp16 tensor throughput with fp32 accumulation, TFLOP/s
    fp8_tflops: float      # dense fp8 tensor throughput, TFLOP/s; 0 when the GPU has no fp8 tensor cores
    link: str              # how tensor-parallel ranks reach each other: a key of random_profile.ALLREDUCE
    hopper: bool = False   # SGLang picks the fa3 attention backend on Hopper, flashinfer elsewhere


GPUS: tuple[Gpu, ...] = (
    # GeForce RTX 4090 (Ada whitepaper): 24 GB GDDR6X at 1008 GB/s; fp16 with fp32 accumulate 165.2 TFLOP/s dense
    # (GeForce runs it at half the fp16-accumulate rate), fp8 with fp32 accumulate 330.3; no NVLink, and
    # GeForce cards have peer-to-peer over PCIe disabled, so NCCL stages all-reduce through host memory.
    Gpu("rtx4090", "NVIDIA GeForce RTX 4090", 23.64, 1008, 165.2, 330.3, "pcie4-host"),
    # L40S datasheet: 48 GB GDDR6 at 864 GB/s; bf16 362 TFLOP/s dense (733 with sparsity), fp8 733 dense; PCIe Gen4.
    Gpu("l40s", "NVIDIA L40S", 44.52, 864, 362, 733, "pcie4"),
    # A100 SXM4 datasheet: 40 GB HBM2 at 1555 GB/s, 80 GB HBM2e at 2039 GB/s; bf16 312 TFLOP/s dense; no fp8;
    # NVLink 3 (600 GB/s).
    Gpu("a100-40", "NVIDIA A100-SXM4-40GB", 39.39, 1555, 312, 0, "nvlink3"),
    Gpu("a100-80", "NVIDIA A100-SXM4-80GB", 79.15, 2039, 312, 0, "nvlink3"),
    # H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s; bf16 989 TFLOP/s dense, fp8 1979 dense; NVLink 4 (900 GB/s).
    Gpu("h100", "NVIDIA H100 80GB HBM3", 79.19, 3350, 989, 1979, "nvlink4", hopper=True),
    # H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s; the H100's compute and NVLink.
    Gpu("h200", "NVIDIA H200", 139.81, 4800, 989, 1979, "nvlink4", hopper=True),
    # RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7 on a 512-bit bus at 28 Gbps = 1792 GB/s; 4000 FP4 AI TOPS
    # with sparsity, i.e. ~1000 fp8 and ~500 bf16 TFLOP/s dense; PCIe Gen5, no NVLink.
    Gpu("rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 95.59, 1792, 500, 1000, "pcie5"),
)

GPU_BY_KEY = {g.key: g for g in GPUS}

# ------------------------------------------------------------------------------------------------ quantizations


@dataclasses.dataclass(frozen=True)
class Quant:
    """How a checkpoint stores its linear layers. Embeddings and lm_head stay bf16 in every one of them."""

    key: str
    label: str             # SGLang's "quant=" in the weight-loading log ("" for none)
    linear_bytes: float    # bytes per parameter of attention and dense MLP weights
    expert_bytes: float    # bytes per parameter of MoE expert weights
    fp8_compute: bool      # runs its GEMMs on fp8 tensor cores (else bf16/fp16 ones)
    dtype: str             # the activations' torch dtype, shown as the KV cache dtype
    needs_fp8: bool = False


QUANTS: dict[str, Quant] = {
    "bf16": Quant("bf16", "", 2.0, 2.0, False, "torch.bfloat16"),
    # block-wise fp8 (128 x 128 scales, < 0.01 % overhead) as in Qwen3-*-FP8 and DeepSeek-V3's own checkpoint
    "fp8": Quant("fp8", "fp8", 1.0, 1.0, True, "torch.bfloat16", needs_fp8=True),
    # AWQ int4 with group size 128: 4 bits + an fp16 scale and a 4-bit zero per 128 weights = 4.16 bits; SGLang
    # runs it with Marlin kernels on fp16 tensor cores
    "int4": Quant("int4", "awq_marlin", 0.52, 0.52, False, "torch.float16"),
    # gpt-oss's own checkpoint: MXFP4 experts (4 bits + an 8-bit scale per 32 = 4.25 bits), everything else bf16
    "mxfp4": Quant("mxfp4", "mxfp4", 2.0, 0.531, False, "torch.bfloat16"),
}

# -------------------------------------------------------------------------------------------------- model cards


@dataclasses.dataclass(frozen=True)
class Card:
    """A released model as its config.json describes it (untied embeddings in every one of these)."""

    name: str
    architecture: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    eos: int
    ffn: int                        # dense MLP width (every layer of a dense model, the first layers of some MoEs)
    params_b: float                 # total parameters the card states, billions
    quants: tuple[str, ...]
    draft: str                      # "eagle3": a one-layer EAGLE-3 head; "eagle": an EAGLE-1/2 head; "mtp": built in
    experts: int = 0
    experts_per_token: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0           # a MoE's leading dense layers (DeepSeek-V3: 3, GLM-4.5: 1)
    mla: tuple[int, int, int, int, int] | None = None  # q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head dims
    active_b: float = 0.0           # a MoE's activated parameters the card states, billions

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    def attention_params(self) -> int:
        """One layer's attention projections (biases and norms left out: < 0.1 %)."""
        h = self.hidden
        if self.mla is not None:
            q_lora, kv_lora, nope, rope, v_head = self.mla
            return (h * q_lora + q_lora * self.heads * (nope + rope) + h * (kv_lora + rope)
                    + kv_lora * self.heads * (nope + v_head) + self.heads * v_head * h)
        q = self.heads * self.head_dim
        return h * q + 2 * h * self.kv_heads * self.head_dim + q * h

    def expert_params(self) -> int:
        """One expert of one layer (gate, up and down projections)."""
        return 3 * self.hidden * self.moe_ffn

    def parameters(self) -> dict[str, int]:
        """Parameters by role, whole model: what is always read, what only some tokens read, what is a lookup."""
        dense_mlp = 3 * self.hidden * self.ffn
        dense_layers = self.dense_layers if self.moe else self.layers
        always = self.layers * self.attention_params() + dense_layers * dense_mlp
        if self.moe:
            always += self.moe_layers * (self.shared_experts * self.expert_params() + self.hidden * self.experts)
        return {
            "always": always,                                              # read by every forward
            "experts": self.moe_layers * self.experts * self.expert_params(),
            "lm_head": self.vocab * self.hidden,                           # read by every forward (bf16)
            "embedding": self.vocab * self.hidden,                         # a row lookup: never read whole
        }

    def active_linear_params(self) -> int:
        """Parameters one token multiplies through, lm_head included, embedding excluded."""
        p = self.parameters()
        return p["always"] + self.moe_layers * self.experts_per_token * self.expert_params() + p["lm_head"]

    def kv_bytes_per_token(self, tp: int, layers: int | None = None) -> int:
        """bf16 K+V bytes per token on one GPU: GQA heads split over tp (replicated when tp exceeds them); MLA's
        compressed latent is replicated on every rank, as SGLang does without DP attention."""
        layers = self.layers if layers is None else layers
        if self.mla is not None:
            _, kv_lora, _, rope, _ = self.mla
            return layers * (kv_lora + rope) * 2
        heads = max(1, -(-self.kv_heads // tp))
        return layers * heads * self.head_dim * 2 * 2


# Dimensions from each checkpoint's config.json; params_b is the card's own total.
CARDS: tuple[Card, ...] = (
    Card("Llama-3.1-8B-Instruct", "LlamaForCausalLM", "llama", 32, 4096, 32, 8, 128, 128256, 131072, 128009,
         14336, 8.03, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Qwen3-8B", "Qwen3ForCausalLM", "qwen3", 36, 4096, 32, 8, 128, 151936, 40960, 151645,
         12288, 8.19, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Qwen3-14B", "Qwen3ForCausalLM", "qwen3", 40, 5120, 40, 8, 128, 151936, 40960, 151645,
         17408, 14.8, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Qwen3-32B", "Qwen3ForCausalLM", "qwen3", 64, 5120, 64, 8, 128, 151936, 40960, 151645,
         25600, 32.8, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Llama-3.3-70B-Instruct", "LlamaForCausalLM", "llama", 80, 8192, 64, 8, 128, 128256, 131072, 128009,
         28672, 70.6, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Llama-3.1-405B-Instruct", "LlamaForCausalLM", "llama", 126, 16384, 128, 8, 128, 128256, 131072, 128009,
         53248, 405.9, ("bf16", "fp8", "int4"), "eagle3"),
    Card("Qwen3-30B-A3B", "Qwen3MoeForCausalLM", "qwen3_moe", 48, 2048, 32, 4, 128, 151936, 40960, 151645,
         0, 30.5, ("bf16", "fp8", "int4"), "eagle3", experts=128, experts_per_token=8, moe_ffn=768, active_b=3.3),
    Card("gpt-oss-20b", "GptOssForCausalLM", "gpt_oss", 24, 2880, 64, 8, 64, 201088, 131072, 200002,
         0, 20.9, ("mxfp4",), "eagle3", experts=32, experts_per_token=4, moe_ffn=2880, active_b=3.6),
    Card("gpt-oss-120b", "GptOssForCausalLM", "gpt_oss", 36, 2880, 64, 8, 64, 201088, 131072, 200002,
         0, 116.8, ("mxfp4",), "eagle3", experts=128, experts_per_token=4, moe_ffn=2880, active_b=5.1),
    Card("Mixtral-8x7B-Instruct-v0.1", "MixtralForCausalLM", "mixtral", 32, 4096, 32, 8, 128, 32000, 32768, 2,
         0, 46.7, ("bf16", "fp8", "int4"), "eagle", experts=8, experts_per_token=2, moe_ffn=14336, active_b=12.9),
    Card("GLM-4.5-Air", "Glm4MoeForCausalLM", "glm4_moe", 46, 4096, 96, 8, 128, 151552, 131072, 151329,
         10944, 106.0, ("bf16", "fp8", "int4"), "mtp", experts=128, experts_per_token=8, moe_ffn=1408,
         shared_experts=1, dense_layers=1, active_b=12.0),
    Card("Qwen3-235B-A22B-Instruct-2507", "Qwen3MoeForCausalLM", "qwen3_moe", 94, 4096, 64, 4, 128, 151936,
         262144, 151645, 0, 235.0, ("bf16", "fp8", "int4"), "eagle3", experts=128, experts_per_token=8, moe_ffn=1536,
         active_b=22.0),
    Card("DeepSeek-V3", "DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 128, 128, 128, 129280, 163840, 1,
         18432, 671.0, ("fp8", "int4"), "mtp", experts=256, experts_per_token=8, moe_ffn=2048, shared_experts=1,
         dense_layers=3, mla=(1536, 512, 128, 64, 128), active_b=37.0),
)

CARD_BY_NAME = {c.name: c for c in CARDS}
