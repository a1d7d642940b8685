"""SGLang's adaptive speculative decoding (``--speculative-adaptive``): which configs are chains it can switch
between, how it routes a running batch, and the schedule file it reads (docs: sglang-adaptive.md).

The file is ``{"BATCH": {"candidate_steps": [STEPS, ...]}, ...}``: each key is the smallest running batch (after
padding to a captured CUDA-graph size) its slot serves; a batch takes the largest key at or below it, and the smallest
key serves everything below. With several candidates a slot's controller walks between them by acceptance.
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.engines.base import AdaptiveRules, Args, ArgValue

#: the algorithms adaptive mode runs (NEXTN is rewritten to EAGLE first)
ALGORITHMS = ("EAGLE", "EAGLE3")
STEPS, TOPK, DRAFT = "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"
ADAPTIVE, ADAPTIVE_CONFIG = "speculative-adaptive", "speculative-adaptive-config"
#: settings with which SGLang falls back to static speculative params ("speculative_adaptive disabled: ...")
FALLBACK_FLAGS = ("enable-dp-attention", "enable-multi-layer-eagle", "enable-two-batch-overlap", "enable-pdmux")
#: the decode batch sizes SGLang captures CUDA graphs for under speculative decoding (up to its max batch)
GRAPH_SIZES = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, 4097, 16)]


class SGLangAdaptive(AdaptiveRules):
    format = "sglang-adaptive"
    file_flag = ADAPTIVE_CONFIG

    def chain_steps(self, config: Mapping[str, ArgValue]) -> int | None:
        if str(config.get("speculative-algorithm", "")).upper() not in ALGORITHMS:
            return None
        if any(_on(config.get(flag)) for flag in FALLBACK_FLAGS) or _int(config.get("attn-dp-size"), 1) > 1:
            return None
        steps, topk = _int(config.get(STEPS), None), _int(config.get(TOPK), None)
        return steps if topk == 1 and steps is not None and steps >= 1 else None

    def family(self, config: Mapping[str, ArgValue]) -> Args:
        return {k: v for k, v in config.items() if k not in (STEPS, TOPK, DRAFT, ADAPTIVE, ADAPTIVE_CONFIG)}

    def padded_batch(self, batch: int, limit: int | None) -> int:
        i = bisect.bisect_left(GRAPH_SIZES, batch)
        padded = GRAPH_SIZES[i] if i < len(GRAPH_SIZES) else batch
        return min(padded, limit) if limit is not None and batch <= limit else padded

    def document(self, slots: Mapping[int, Sequence[int]]) -> dict[str, Any]:
        doc = {str(key): {"candidate_steps": sorted(set(steps))} for key, steps in sorted(slots.items())}
        for key, entry in doc.items():
            steps = entry["candidate_steps"]
            if not steps or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
                raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        if not doc:
            raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
                             '{"1": {"candidate_steps": [1,3,7]}}. Got keys: []')
        return doc

    def deploy_args(self, family: Mapping[str, ArgValue], slots: Mapping[int, Sequence[int]], path: str) -> Args:
        union = sorted({s for steps in slots.values() for s in steps})
        start = union[len(union) // 2]  # SGLang's own default start: the middle of the union
        return {**self.family(family), STEPS: start, TOPK: 1, DRAFT: start + 1, ADAPTIVE: True, ADAPTIVE_CONFIG: path}


def _on(value: ArgValue | None) -> bool:
    return value is True or str(value).lower() in ("true", "1")


def _int(value: ArgValue | None, default: int | None) -> int | None:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
