"""Emulator profiles: the data files that describe one model on one kind of host (format: see autotune.sim)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from autotune.sim.traffic import CATEGORIES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "qwen122b"


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    architecture: str
    model_type: str
    context_length: int
    vocab_size: int
    eos_token_id: int
    dtype: str = "torch.bfloat16"
    quantization: str = ""
    multimodal: bool = False
    hybrid_linear_attention: bool = False
    auto_speculative: tuple[int, int, int] = (3, 1, 4)
    draft_architecture: str = "LlamaForCausalLMEagle3"
    draft_model_path: str = ""
    attention_backend: str = "flashinfer"


@dataclasses.dataclass(frozen=True)
class Hardware:
    gpu_name: str
    gpu_memory_gb: float
    gpus: int = 1
    cuda_context_gb: float = 1.0


@dataclasses.dataclass(frozen=True)
class Memory:
    weights_gb: float
    kv_bytes_per_token: int
    draft_weights_gb: float = 0.0
    draft_kv_bytes_per_token: int = 0
    mamba_state_mb: float = 0.0
    mamba_ssm_dtype: str = "float32"
    mamba_full_memory_ratio: float = 0.9
    activation_gb: float = 4.0
    graph_base_gb: float = 0.5
    graph_verify_mb_per_token: float = 1.0
    graph_tree_mb_per_node: float = 0.25


@dataclasses.dataclass(frozen=True)
class Timing:
    reference_tp: int
    base_ms: float
    token_ms: float
    moe_experts: int = 0
    moe_topk: int = 0
    expert_ms: float = 0.0
    kv_ms_per_ktoken: float = 0.0
    draft_step_ms: float = 0.0
    draft_token_ms: float = 0.0
    draft_extend_ms: float = 0.0
    draft_extend_token_ms: float = 0.0
    sched_ms: float = 0.0
    sched_req_ms: float = 0.0
    eager_ms: float = 0.0
    prefill_base_ms: float = 0.0
    prefill_token_ms: float = 0.0
    prefill_attn_ms_per_mtoken2: float = 0.0


@dataclasses.dataclass(frozen=True)
class Acceptance:
    first: float
    decay: float
    decay_shape: float = 1.0
    topk_gain: float = 0.5
    temperature_penalty: float = 0.1
    mean_output_tokens: int = 600
    #: "closed" (model.py's closed form from first, decay, decay_shape, topk_gain) or "tree" (tree_acceptance.py:
    #: SGLang's tree built and verified by Monte Carlo from align, align_decay, confidence, confidence_spread)
    model: str = "closed"
    align: float = 0.9
    align_decay: float = 0.95
    confidence: float = 0.7
    confidence_spread: float = 4.0
    #: how much better a chat-templated request's drafts are accepted than a raw prompt's (a factor on each depth's
    #: acceptance; the other figures describe raw prompts)
    chat_factor: float = 1.0
    #: the factor on each depth's acceptance of the text generated past a request's natural end (ignore_eos)
    past_end_factor: float = 1.0
    #: category (sim/traffic.py) -> factor on each depth's acceptance, relative to chat (absent: 1)
    categories: dict[str, float] = dataclasses.field(default_factory=dict)

    def factor(self, category: str, chat: bool) -> float:
        """The factor on each depth's acceptance for a request of ``category``, chat-templated or raw."""
        return self.categories.get(category, 1.0) * (self.chat_factor if chat else 1.0)


@dataclasses.dataclass(frozen=True)
class Startup:
    init_s: float = 3.0
    load_gb_per_s: float = 2.0
    draft_load_s: float = 2.0
    kv_alloc_s: float = 1.0
    graph_capture_s_per_bs: float = 0.3
    draft_graph_capture_s_per_bs: float = 0.1
    server_start_s: float = 1.0


@dataclasses.dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 256
    output_tokens: int = 256


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: ModelInfo
    hardware: Hardware
    memory: Memory
    timing: Timing
    acceptance: Acceptance
    startup: Startup
    workload: Workload
    noise: float = 0.02
    path: str = ""


_SECTIONS: dict[str, type] = {
    "model": ModelInfo,
    "hardware": Hardware,
    "memory": Memory,
    "timing": Timing,
    "acceptance": Acceptance,
    "startup": Startup,
    "workload": Workload,
}


def resolve_profile_path(name_or_path: str) -> Path:
    """A bare name is a file in autotune/sim/profiles; anything else is a path."""
    candidate = PROFILE_DIR / f"{name_or_path}.toml"
    if "/" not in name_or_path and not name_or_path.endswith(".toml") and candidate.exists():
        return candidate
    path = Path(name_or_path)
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))
        raise ProfileError(f"no profile {name_or_path!r} (known names: {known}; or give a path to a .toml)")
    return path


def _build(cls: type, table: Any, where: str) -> Any:
    if not isinstance(table, dict):
        raise ProfileError(f"{where}: expected a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = sorted(
        name for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in table
    )
    if missing:
        raise ProfileError(f"{where}: missing key(s) {', '.join(missing)}")
    values = dict(table)
    for name, value in values.items():
        expected = fields[name].type
        if expected in ("float", float) and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
        elif expected in ("int", int) and not isinstance(value, int):
            raise ProfileError(f"{where}.{name}: expected an integer, got {value!r}")
        elif expected in ("float", float) and not isinstance(values[name], float):
            raise ProfileError(f"{where}.{name}: expected a number, got {value!r}")
        elif expected in ("str", str) and not isinstance(value, str):
            raise ProfileError(f"{where}.{name}: expected a string, got {value!r}")
        elif expected in ("bool", bool) and not isinstance(value, bool):
            raise ProfileError(f"{where}.{name}: expected true or false, got {value!r}")
    if "auto_speculative" in values:
        triple = values["auto_speculative"]
        if not (isinstance(triple, list) and len(triple) == 3 and all(isinstance(x, int) for x in triple)):
            raise ProfileError(f"{where}.auto_speculative: expected [steps, topk, draft_tokens]")
        values["auto_speculative"] = tuple(triple)
    return cls(**values)


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """Read and validate a profile; raises ProfileError naming the file and key on any problem."""
    path = resolve_profile_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"{path}: {e}") from e
    head = data.pop("profile", {})
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ProfileError(f"{path}: unknown table(s) {', '.join(unknown)}")
    sections = {}
    for key, cls in _SECTIONS.items():
        if key not in data and key not in ("startup", "workload"):
            raise ProfileError(f"{path}: missing table [{key}]")
        sections[key] = _build(cls, data.get(key, {}), f"{path}: [{key}]")
    noise = head.get("noise", 0.02)
    if not isinstance(noise, (int, float)) or not 0 <= noise < 0.5:
        raise ProfileError(f"{path}: [profile].noise: expected a fraction in [0, 0.5)")
    acc = sections["acceptance"]
    if not (0 < acc.first < 1 and 0 < acc.decay <= 1):
        raise ProfileError(f"{path}: [acceptance]: first must be in (0, 1) and decay in (0, 1]")
    if acc.model not in ("closed", "tree"):
        raise ProfileError(f"{path}: [acceptance].model: expected \"closed\" or \"tree\", got {acc.model!r}")
    if not (0 < acc.align <= 1 and 0 < acc.align_decay <= 1 and 0 < acc.confidence < 1
            and acc.confidence_spread > 0):
        raise ProfileError(f"{path}: [acceptance]: align and align_decay must be in (0, 1], confidence in (0, 1) "
                           "and confidence_spread above 0")
    for name, value in (("chat_factor", acc.chat_factor), ("past_end_factor", acc.past_end_factor),
                        *((f"categories.{k}", v) for k, v in acc.categories.items())):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3:
            raise ProfileError(f"{path}: [acceptance] {name}: expected a factor above 0 and at most 3, got {value!r}")
    unknown = sorted(set(acc.categories) - set(CATEGORIES))
    if unknown:
        raise ProfileError(f"{path}: [acceptance.categories]: unknown {', '.join(unknown)}; known: "
                           f"{', '.join(CATEGORIES)}")
    return Profile(
        name=str(head.get("name", path.stem)),
        description=str(head.get("description", "")),
        noise=float(noise),
        path=str(path),
        **sections,
    )
