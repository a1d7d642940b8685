"""The emulator's performance and memory model: pure functions of a profile and a resolved config, no noise.

Shapes (the profile supplies the coefficients; autotune.sim documents each key):

* one decode iteration for B running requests = draft cost + target verify forward + scheduling overhead.
  The draft runs ``steps`` forwards of B*topk tokens, then a draft-extend over the B*width verified tokens.
  The verify forward reads the weights once (``base_ms``), pays ``token_ms`` per token of the B*width batch,
  reads every touched MoE expert once (E * (1 - (1 - k/E)^(B*width)) distinct experts) and the KV cache of
  every running request. Without speculative decoding width is 1 and there is no draft.
* acceptance (``[acceptance] model = "tree"``: tree_acceptance.py's Monte Carlo of SGLang's tree instead): the
  probability that the draft's path survives depth d given it reached d-1 is
  ``first * decay^((d-1)^decay_shape)`` for one candidate; m candidates at a depth cover the target token with
  probability 1 - (1 - q)^(m^topk_gain). The tree's draft-token budget (num_draft_tokens - 1 nodes) is spent
  greedily where it adds most expected length, at most ``topk`` candidates per depth.
  Expected accept length = 1 + sum over depths of the probability of reaching that depth.
* memory follows SGLang 0.5.23's sizing: mem_fraction_static default, static budget minus weights (target and
  draft), the hybrid (mamba) state pool solved jointly with its per-draft-token intermediate states, the KV pool
  (target + draft layers per token), max_running_requests = min(requested, tokens // 2, mamba slots // 3), and
  CUDA-graph memory (per captured batch slot: verify tokens and draft-tree nodes) against the headroom left
  outside the static pool.
"""
from __future__ import annotations

import dataclasses
import math

from autotune.sim import tree_acceptance
from autotune.sim.adaptive_controller import Schedule
from autotune.sim.profile import Profile

GIB = 1 << 30
# SGLang: each running request of a hybrid model needs this many mamba state slots (radix cache on).
MAMBA_SLOTS_PER_REQUEST = 3
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48


@dataclasses.dataclass(frozen=True)
class Spec:
    """Resolved speculative settings (EAGLE family). ``draft`` is the verify width (num_draft_tokens)."""

    steps: int
    topk: int
    draft: int
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    @property
    def tree_nodes(self) -> int:
        """Candidates the multi-step draft scores per request: topk + (steps - 1) * topk^2."""
        return self.topk + (self.steps - 1) * self.topk * self.topk


@dataclasses.dataclass(frozen=True)
class Config:
    """The server settings the model depends on, after SGLang's argument rules."""

    tp: int = 1
    dp: int = 1
    spec: Spec | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int = 1
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    context_length: int | None = None
    disable_radix_cache: bool = False
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    #: adaptive speculative decoding (``spec`` is then the step it starts on)
    adaptive: Schedule | None = None
    #: SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND: steps 0 skips the draft extend too (else it still runs)
    skip_zero_step_draft_extend: bool = False

    @property
    def width(self) -> int:
        return self.spec.draft if self.spec else 1

    @property
    def max_draft(self) -> int:
        """Draft tokens that buffers and state pools are sized for: the widest step an adaptive schedule may use."""
        return self.adaptive.max_draft_tokens if self.adaptive else self.width

    @property
    def kv_reserve_tokens(self) -> int:
        """KV tokens one decode iteration may need per request (SGLang reserves twice this in spec v2)."""
        if self.spec is None:
            return 1
        return max(self.spec.steps * self.spec.topk, self.max_draft)

    def at_steps(self, steps: int) -> Config:
        """This config running an adaptive schedule's chain of ``steps`` (0: a plain decode)."""
        spec = self.spec
        return dataclasses.replace(self, spec=Spec(steps, 1, steps + 1, spec.threshold_single, spec.threshold_acc))

    @property
    def kv_scale(self) -> float:
        """FP8 KV cache (--kv-cache-dtype fp8_*) halves the bytes per token of the bf16 profile figures."""
        return 0.5 if self.kv_cache_dtype.startswith("fp8") else 1.0


# ---------------------------------------------------------------------------------------------- acceptance


def depth_acceptance(profile: Profile, depth: int, spec: Spec | None = None) -> float:
    """Single-candidate probability of surviving ``depth`` (1-based) given depth-1 was reached."""
    acc = profile.acceptance
    q = acc.first * acc.decay ** ((depth - 1) ** acc.decay_shape)
    if spec is not None and (spec.threshold_acc < 1.0 or spec.threshold_single < 1.0):
        q = min(0.995, q / max(min(spec.threshold_acc, spec.threshold_single), 0.05))
    return q


def _coverage(q: float, candidates: int, gain: float) -> float:
    return 0.0 if candidates <= 0 else 1.0 - (1.0 - q) ** (candidates**gain)


def tree_allocation(profile: Profile, spec: Spec) -> list[int]:
    """Candidates per depth along the accepted path, spending the draft-token budget greedily."""
    budget = spec.draft - 1
    depths = min(spec.steps, budget)
    alloc = [1] * depths
    budget -= depths
    qs = [depth_acceptance(profile, d + 1, spec) for d in range(depths)]
    gain = profile.acceptance.topk_gain
    while budget > 0:
        base = _expected_length(qs, alloc, gain)
        best, best_gain = -1, 0.0
        for d in range(depths):
            if alloc[d] >= spec.topk:
                continue
            alloc[d] += 1
            delta = _expected_length(qs, alloc, gain) - base
            alloc[d] -= 1
            if delta > best_gain + 1e-12:
                best, best_gain = d, delta
        if best < 0:
            break
        alloc[best] += 1
        budget -= 1
    return alloc


def _expected_length(qs: list[float], alloc: list[int], gain: float) -> float:
    length, reach = 1.0, 1.0
    for q, m in zip(qs, alloc, strict=False):
        reach *= _coverage(q, m, gain)
        length += reach
    return length


def reach_probabilities(profile: Profile, spec: Spec | None, temperature: float = 0.0,
                        factor: float = 1.0) -> list[float]:
    """P(the accepted path reaches depth d) for d = 1..steps (tokens accepted beyond the bonus token); ``factor``
    scales each depth's acceptance for what the request asks (``Acceptance.factor``, past its natural end)."""
    if spec is None:
        return []
    penalty = max(0.0, 1.0 - profile.acceptance.temperature_penalty * max(temperature, 0.0)) * factor
    if profile.acceptance.model == "tree":
        return tree_acceptance.reach_probabilities(tree_draft(profile, spec), spec.steps, spec.topk, spec.draft,
                                                   penalty)
    alloc = tree_allocation(profile, spec)
    reach, out = 1.0, []
    for depth, candidates in enumerate(alloc, start=1):
        q = min(0.995, depth_acceptance(profile, depth, spec) * penalty)
        reach *= _coverage(q, candidates, profile.acceptance.topk_gain)
        out.append(reach)
    return out


def tree_draft(profile: Profile, spec: Spec) -> tree_acceptance.TreeDraft:
    """The profile's draft for the Monte Carlo model (a relaxed acceptance threshold raises its alignment, as
    depth_acceptance does for the closed form)."""
    acc = profile.acceptance
    align = acc.align
    if spec.threshold_acc < 1.0 or spec.threshold_single < 1.0:
        align = min(0.995, align / max(min(spec.threshold_acc, spec.threshold_single), 0.05))
    return tree_acceptance.TreeDraft(align, acc.align_decay, acc.confidence, acc.confidence_spread)


def accept_length(profile: Profile, spec: Spec | None, temperature: float = 0.0, factor: float = 1.0) -> float:
    """Expected tokens per verify step (accepted drafts + the bonus token); 1 without speculation."""
    return 1.0 + sum(reach_probabilities(profile, spec, temperature, factor))


def accept_rate(length: float, spec: Spec | None) -> float:
    """SGLang's accept rate: correct drafts / proposed drafts (num_draft_tokens - 1 per step)."""
    if spec is None or spec.draft <= 1:
        return 0.0
    return (length - 1.0) / (spec.draft - 1)


# --------------------------------------------------------------------------------------------------- timing


def _scale(profile: Profile, cfg: Config) -> float:
    """Per-GPU work scales with 1/tp relative to the profile's reference tensor parallelism."""
    return profile.timing.reference_tp / max(cfg.tp, 1)


def verify_ms(profile: Profile, cfg: Config, batch: int, context_tokens: int) -> float:
    """One target forward over ``batch`` requests of ``cfg.width`` tokens each (decode or verify)."""
    t = profile.timing
    s = _scale(profile, cfg)
    tokens = batch * cfg.width
    ms = t.base_ms + s * t.token_ms * tokens + s * t.kv_ms_per_ktoken * context_tokens / 1000.0
    if t.moe_experts and t.moe_topk:
        touched = t.moe_experts * (1.0 - (1.0 - t.moe_topk / t.moe_experts) ** tokens)
        ms += s * t.expert_ms * touched
    return ms


def draft_ms(profile: Profile, cfg: Config, batch: int) -> float:
    """The draft side of one speculative iteration: ``steps`` draft forwards plus the draft extend."""
    if cfg.spec is None:
        return 0.0
    t = profile.timing
    sp = cfg.spec
    if sp.steps == 0 and cfg.skip_zero_step_draft_extend:
        return 0.0
    per_step = t.draft_step_ms + t.draft_token_ms * batch * sp.topk
    return sp.steps * per_step + t.draft_extend_ms + t.draft_extend_token_ms * batch * sp.draft


def step_ms(profile: Profile, cfg: Config, batch: int, context_tokens: int, graph: bool = True) -> float:
    """Wall time of one decode iteration for ``batch`` running requests holding ``context_tokens`` in KV."""
    t = profile.timing
    ms = verify_ms(profile, cfg, batch, context_tokens) + draft_ms(profile, cfg, batch)
    ms += t.sched_ms + t.sched_req_ms * batch
    if not graph:
        ms += t.eager_ms
    return ms


def prefill_ms(profile: Profile, cfg: Config, new_tokens: int, requests: int) -> float:
    """One prefill (extend) forward of ``new_tokens`` uncached prompt tokens over ``requests`` requests.

    Includes the draft model's prefill and the first sampled token, as SGLang's EAGLE prefill does."""
    t = profile.timing
    s = _scale(profile, cfg)
    ms = t.prefill_base_ms + t.sched_ms + t.sched_req_ms * requests
    ms += s * t.prefill_token_ms * new_tokens
    ms += s * t.prefill_attn_ms_per_mtoken2 * (new_tokens / 1000.0) ** 2 / max(requests, 1)
    if cfg.spec is not None:
        ms += t.draft_extend_ms + t.draft_extend_token_ms * new_tokens / 8.0
    return ms


# --------------------------------------------------------------------------------------------------- memory


@dataclasses.dataclass(frozen=True)
class AdaptiveState:
    """The runtime state of one adaptive step beyond the one the server starts on: the captured batch sizes that
    route to it (none: no graphs) and their CUDA-graph memory."""

    steps: int
    capture_bs: list[int]
    graph_gb: float


@dataclasses.dataclass
class MemoryPlan:
    """Per-GPU memory and capacity as SGLang would size them; ``error`` is set when startup must fail."""

    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    pre_load_gb: float
    weights_gb: float
    draft_weights_gb: float
    rest_gb: float = 0.0
    mamba_cache_size: int | None = None
    mamba_gb: float = 0.0
    intermediate_gb: float = 0.0
    max_total_num_tokens: int = 0
    kv_gb: float = 0.0
    draft_kv_gb: float = 0.0
    requested_max_running_requests: int | None = None
    max_running_requests: int = 0
    capped_by: str | None = None
    capture_bs: list[int] = dataclasses.field(default_factory=list)
    graph_gb: float = 0.0  # the startup capture's (adaptive states: in adaptive_states)
    headroom_gb: float = 0.0
    #: adaptive schedules: the runtime state built for each other candidate step, in build order
    adaptive_states: list[AdaptiveState] = dataclasses.field(default_factory=list)
    error_phase: str | None = None
    error: str | None = None
    #: the adaptive step whose runtime state fails to capture (None: the startup capture fails, if any)
    error_step: int | None = None

    @property
    def available_after_load_gb(self) -> float:
        return self.pre_load_gb - self.weights_gb - self.draft_weights_gb

    @property
    def available_gb(self) -> float:
        used = self.weights_gb + self.draft_weights_gb + self.mamba_gb + self.intermediate_gb
        used += self.kv_gb + self.draft_kv_gb + self.graph_gb
        return self.pre_load_gb - used


def default_chunked_prefill_size(profile: Profile) -> int:
    """SGLang's GPU-memory-dependent default."""
    mb = profile.hardware.gpu_memory_gb * 1024
    if mb < 20 * 1024:
        return 2048
    if mb < 90 * 1024:
        return 4096 if mb < 60 * 1024 else 8192
    return 8192 if mb < 160 * 1024 else 16384


def default_cuda_graph_max_bs(profile: Profile, cfg: Config) -> int:
    """SGLang's decode CUDA-graph max batch size: by GPU memory and tp, capped by max_running_requests."""
    mb = profile.hardware.gpu_memory_gb * 1024
    if cfg.cuda_graph_max_bs is not None:
        return cfg.cuda_graph_max_bs
    if mb < 20 * 1024:
        bs = 8
    elif mb < 35 * 1024:
        bs = 48 if cfg.tp < 4 else 160
    elif mb < 60 * 1024:
        bs = 32 if cfg.tp < 4 else 160
    elif mb < 160 * 1024:
        bs = 256 if cfg.tp < 4 else 512
    else:
        bs = 512
    if cfg.max_running_requests is not None:
        bs = min(bs, cfg.max_running_requests)
    return bs


def default_mem_fraction_static(profile: Profile, cfg: Config, chunked: int, graph_max_bs: int) -> float:
    """SGLang's estimate: (GPU memory - activations - CUDA-graph buffers) / GPU memory, rounded to 3 places."""
    gpu_mb = profile.hardware.gpu_memory_gb * 1024
    reserved = 512 + max(chunked, 2048) * 1.5 + cfg.tp / 8 * 1024
    if not cfg.disable_cuda_graph:
        reserved += graph_max_bs * 2
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


def capture_batch_sizes(cfg: Config, max_bs: int, pool: int) -> list[int]:
    """SGLang's decode CUDA-graph batch sizes, clipped to the request pool."""
    if cfg.spec is None:
        sizes = [1, 2, 4, 8, 12, *list(range(16, 257, 8)), *list(range(272, 512, 16))]
        sizes += list(range(512, max_bs + 1, 32))
    else:
        sizes = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
        sizes += list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16))
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    if max(sizes) > pool:
        sizes.append(pool)
    return sorted({bs for bs in sizes if bs <= pool and bs > 0})


def prefill_capture_sizes(max_tokens: int) -> list[int]:
    """SGLang's prefill CUDA-graph token counts up to ``max_tokens`` (its cuda_graph_config lists them even when
    prefill graphs are off)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, max(max_tokens, 1280) + 1, 256)]
    return [n for n in sizes if n <= max_tokens]


def memory_plan(profile: Profile, cfg: Config) -> MemoryPlan:
    """Size weights, state pools, KV cache, request slots and CUDA graphs for one GPU of ``cfg``."""
    mem, hw = profile.memory, profile.hardware
    chunked = cfg.chunked_prefill_size or default_chunked_prefill_size(profile)
    graph_max_bs = default_cuda_graph_max_bs(profile, cfg)
    frac = cfg.mem_fraction_static
    if frac is None:
        frac = default_mem_fraction_static(profile, cfg, chunked, graph_max_bs)
    pre_load = hw.gpu_memory_gb - hw.cuda_context_gb
    plan = MemoryPlan(
        mem_fraction_static=frac,
        chunked_prefill_size=chunked,
        cuda_graph_max_bs=graph_max_bs,
        pre_load_gb=pre_load,
        weights_gb=mem.weights_gb / cfg.tp,
        draft_weights_gb=(mem.draft_weights_gb / cfg.tp) if cfg.spec else 0.0,
        requested_max_running_requests=cfg.max_running_requests,
    )
    if plan.weights_gb + plan.draft_weights_gb > pre_load:
        plan.error_phase = "load"
        plan.error = _torch_oom(plan.weights_gb + plan.draft_weights_gb - pre_load + 0.5, hw.gpu_memory_gb, 0.3)
        return plan
    rest = plan.available_after_load_gb - pre_load * (1 - frac)
    plan.rest_gb = rest
    if rest <= 0:
        minimum = 1 - plan.available_after_load_gb / pre_load
        plan.error_phase = "kv"
        plan.error = (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={frac}. Raise --mem-fraction-static above "
            f"{math.ceil(minimum * 1000) / 1000:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). "
            "If using speculative decoding, draft weights are now counted."
        )
        return plan
    requested = cfg.max_running_requests
    rest_bytes = rest * GIB
    mamba_cap = None
    if profile.model.hybrid_linear_attention and mem.mamba_state_mb > 0:
        rest_bytes, mamba_cap, err = _size_mamba(profile, cfg, plan, rest_bytes)
        if err:
            plan.error_phase, plan.error = "kv", err
            return plan
    cell = (mem.kv_bytes_per_token + (mem.draft_kv_bytes_per_token if cfg.spec else 0)) * cfg.kv_scale
    tokens = int(rest_bytes // cell)
    if cfg.max_total_tokens is not None:
        tokens = min(tokens, cfg.max_total_tokens)
    tokens = tokens // cfg.page_size * cfg.page_size
    plan.max_total_num_tokens = tokens
    if tokens <= 0:
        plan.error_phase = "kv"
        plan.error = (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={frac}"
        )
        return plan
    plan.kv_gb = tokens * mem.kv_bytes_per_token * cfg.kv_scale / GIB
    plan.draft_kv_gb = tokens * (mem.draft_kv_bytes_per_token if cfg.spec else 0) * cfg.kv_scale / GIB
    context = cfg.context_length or profile.model.context_length
    if requested is not None:
        per_worker = max(1, requested // cfg.dp)
        mrr = min(per_worker, tokens // 2)
        if mrr < per_worker:
            plan.capped_by = "kv"
    else:
        estimated = max(min(int(tokens / context * 512), 4096), 2048)
        mrr = min(estimated, tokens // 2)
    if mamba_cap is not None and mamba_cap < mrr:
        mrr, plan.capped_by = mamba_cap, "mamba"
    plan.max_running_requests = mrr
    if cfg.disable_cuda_graph:
        if cfg.adaptive is not None:
            _plan_adaptive_states(profile, cfg, plan, 0)
        return plan
    plan.capture_bs = capture_batch_sizes(cfg, graph_max_bs, mrr)
    # Static graph buffers are sized for the configured max batch; only batches that fit the pool are captured.
    plan.graph_gb = mem.graph_base_gb + graph_max_bs * _graph_slot_mb(profile, cfg) / 1024
    plan.headroom_gb = pre_load * (1 - frac) - mem.activation_gb
    if plan.graph_gb > plan.headroom_gb:
        plan.error_phase = "graph"
        free = max(plan.headroom_gb - mem.graph_base_gb, 0.01)
        plan.error = _torch_oom(plan.graph_gb - plan.headroom_gb + 0.25, hw.gpu_memory_gb, free)
        return plan
    if cfg.adaptive is not None:
        _plan_adaptive_states(profile, cfg, plan, graph_max_bs)
    return plan


def _graph_slot_mb(profile: Profile, cfg: Config) -> float:
    """CUDA-graph MiB per captured batch slot: verify tokens and draft-tree nodes."""
    mem = profile.memory
    per_slot_mb = mem.graph_verify_mb_per_token * cfg.width
    if cfg.spec is not None:
        per_slot_mb += mem.graph_tree_mb_per_node * cfg.spec.tree_nodes
    return per_slot_mb


def _plan_adaptive_states(profile: Profile, cfg: Config, plan: MemoryPlan, graph_max_bs: int) -> None:
    """One runtime state per other candidate step, each capturing only the graph batch sizes that route to it;
    the first that does not fit the headroom fails its capture."""
    top = max(plan.capture_bs, default=0)
    used = plan.graph_gb
    for steps in cfg.adaptive.candidate_steps:
        if steps == cfg.spec.steps:
            continue
        sizes = cfg.adaptive.graph_bs_for_step(steps, plan.capture_bs)
        slots = graph_max_bs if top in sizes else max(sizes, default=0)
        gb = slots * _graph_slot_mb(profile, cfg.at_steps(steps)) / 1024
        if used + gb > plan.headroom_gb:
            plan.error_phase, plan.error_step = "graph", steps
            free = max(plan.headroom_gb - used, 0.01)
            plan.error = _torch_oom(used + gb - plan.headroom_gb + 0.25, profile.hardware.gpu_memory_gb, free)
            return
        plan.adaptive_states.append(AdaptiveState(steps, sizes, gb))
        used += gb


def _size_mamba(profile: Profile, cfg: Config, plan: MemoryPlan, rest_bytes: float) -> tuple[float, int, str]:
    """SGLang's joint solve of the mamba state pool; returns (bytes left for KV, request cap, error)."""
    mem = profile.memory
    per_req = mem.mamba_state_mb * (1 << 20) * profile.timing.reference_tp / cfg.tp
    if mem.mamba_ssm_dtype == "float32" and cfg.mamba_ssm_dtype in ("bfloat16", "float16"):
        per_req /= 2  # SGLang's own advice: "halve the state size with --mamba-ssm-dtype bfloat16"
    ratio = 1 if cfg.disable_radix_cache else MAMBA_SLOTS_PER_REQUEST
    budget = rest_bytes * mem.mamba_full_memory_ratio / (1 + mem.mamba_full_memory_ratio)
    if cfg.spec is not None:
        d = cfg.max_draft
        size = int((budget - per_req * (1 + d)) // (per_req * (1 + d / ratio)))
        requested = cfg.max_running_requests or SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        capped = min(max(1, requested // cfg.dp), size // ratio)
        intermediate = per_req * (capped + 1) * d
    else:
        size = int((budget - per_req) // per_req)
        intermediate = 0.0
    plan.mamba_cache_size = size
    if size <= 0:
        return rest_bytes, 0, (
            "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
            f"Computed max_mamba_cache_size={size} (total_rest_memory={rest_bytes / GIB:.2f} GB, "
            f"mamba_cache_per_req={per_req / (1 << 20):.2f} MB). Try: (1) reduce --max-running-requests, "
            "(2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or "
            "(4) use GPUs with more memory."
        )
    cap = size // ratio
    if cap <= 0:
        return rest_bytes, 0, (
            "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            f"max_mamba_cache_size={size}, mamba_ratio={ratio}, resulting max_num_reqs={cap}. "
            "Try: (1) reduce --max-running-requests, (2) increase --mem-fraction-static, or "
            "(3) use GPUs with more memory."
        )
    plan.mamba_gb = (size + 1) * per_req / GIB
    plan.intermediate_gb = intermediate / GIB
    return rest_bytes - intermediate - (size + 1) * per_req, cap, ""


def _torch_oom(need_gb: float, total_gb: float, free_gb: float) -> str:
    in_use = total_gb - free_gb
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gb:.2f} GiB. GPU 0 has a total "
        f"capacity of {total_gb:.2f} GiB of which {free_gb * 1024:.2f} MiB is free. Including non-PyTorch memory, "
        f"this process has {in_use:.2f} GiB memory in use. Of the allocated memory {in_use * 0.93:.2f} GiB is "
        f"allocated by PyTorch, and {in_use * 0.02:.2f} GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def oom_message(need_gb: float, profile: Profile, free_gb: float) -> str:
    """A torch CUDA OOM message as PyTorch prints it, for failures under load."""
    return _torch_oom(need_gb, profile.hardware.gpu_memory_gb, free_gb)


def startup_seconds(profile: Profile, cfg: Config, plan: MemoryPlan) -> dict[str, float]:
    """Model seconds of each startup phase at --sim-time-scale 1 (warm-up includes SGLang's 1 s wait)."""
    st = profile.startup
    graphs = 0 if cfg.disable_cuda_graph else len(plan.capture_bs)
    draft_graphs = 0 if cfg.spec is None else (2 if cfg.spec.steps > 1 else 1)
    adaptive = sum(len(state.capture_bs) * (st.graph_capture_s_per_bs + st.draft_graph_capture_s_per_bs
                                            * (2 if state.steps > 1 else 1)) for state in plan.adaptive_states)
    return {
        "init": st.init_s,
        "load_weight": profile.memory.weights_gb / st.load_gb_per_s,
        "draft_load_weight": st.draft_load_s if cfg.spec else 0.0,
        "kv_cache_allocation": st.kv_alloc_s,
        "target_graph": st.graph_capture_s_per_bs * graphs,
        "draft_graph": st.draft_graph_capture_s_per_bs * graphs,
        "draft_graphs": float(draft_graphs),
        "adaptive_graphs": adaptive,
        "server_start": st.server_start_s,
        "warmup": 1.0,
    }


def startup_total(profile: Profile, cfg: Config, plan: MemoryPlan) -> float:
    """Seconds from launch to "fired up" at --sim-time-scale 1 (before generation of the warm-up request)."""
    s = startup_seconds(profile, cfg, plan)
    return (s["init"] + s["load_weight"] + s["draft_load_weight"] + s["kv_cache_allocation"] + s["target_graph"]
            + s["draft_graph"] * s["draft_graphs"] + s["adaptive_graphs"] + s["server_start"] + s["warmup"])


# ------------------------------------------------------------------------------------------------ throughput


@dataclasses.dataclass(frozen=True)
class Figures:
    """Noise-free steady-state figures of one config (speedup 1)."""

    single_tok_s: float
    concurrent_tok_s: float
    accept_length: float
    max_running_requests: int
    fits: bool
    error: str | None = None


def graph_ok(plan: MemoryPlan, cfg: Config, batch: int) -> bool:
    """Whether a decode batch of this size replays a captured CUDA graph."""
    return not cfg.disable_cuda_graph and bool(plan.capture_bs) and batch <= max(plan.capture_bs)


def single_stream_tok_s(profile: Profile, cfg: Config, plan: MemoryPlan, prompt: int, output: int) -> float:
    """Decode tokens per second of one request alone (tokens after the first / time after the first)."""
    length = accept_length(profile, cfg.spec)
    ms = step_ms(profile, cfg, 1, prompt + output // 2, graph_ok(plan, cfg, 1))
    return 1000.0 * length / ms


def concurrent_tok_s(
    profile: Profile, cfg: Config, plan: MemoryPlan, concurrency: int, prompt: int, output: int
) -> float:
    """Output tokens per second with ``concurrency`` requests kept in flight (closed loop).

    Up to max_running_requests per DP worker decode together and the rest queue. A completion frees a slot that
    the next request takes after a prefill forward, which pauses decoding as in SGLang; completions are taken as
    randomly spread over decode steps, so one prefill serves every request that completed in the same step."""
    length = accept_length(profile, cfg.spec)
    running = min(concurrency, plan.max_running_requests * cfg.dp)
    per_worker = max(1, math.ceil(running / cfg.dp))
    decode_steps = (output - 1) / length + 0.5
    step = step_ms(profile, cfg, per_worker, per_worker * (prompt + output // 2), graph_ok(plan, cfg, per_worker))
    completions = per_worker / decode_steps  # per decode step
    prefills = 1.0 - math.exp(-completions)  # chance that a step is followed by a prefill
    batch = completions / prefills
    per_step = step + prefills * prefill_ms(profile, cfg, round(batch * prompt), max(1, round(batch)))
    return 1000.0 * running * output / (decode_steps * per_step)


def figures(profile: Profile, cfg: Config, concurrency: int, prompt: int | None = None,
            output: int | None = None) -> Figures:
    """Single-stream and concurrent throughput, accept length and capacity of one config."""
    prompt = prompt or profile.workload.prompt_tokens
    output = output or profile.workload.output_tokens
    plan = memory_plan(profile, cfg)
    length = accept_length(profile, cfg.spec)
    if plan.error is not None:
        return Figures(0.0, 0.0, length, plan.max_running_requests, False, plan.error)
    return Figures(
        single_tok_s=single_stream_tok_s(profile, cfg, plan, prompt, output),
        concurrent_tok_s=concurrent_tok_s(profile, cfg, plan, concurrency, prompt, output),
        accept_length=length,
        max_running_requests=plan.max_running_requests,
        fits=True,
    )
