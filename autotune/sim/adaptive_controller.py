"""SGLang's adaptive speculative decoding (``--speculative-adaptive``): the schedule file, its validation, the
batch-size routing and the per-slot controller that walks the chain length by acceptance.

The file is a JSON object. Keys made of digits are batch-size lower bounds ("slots"), each with a non-empty
``candidate_steps`` list of ints >= 0; every other top-level key is merged into every slot (``{**cfg, **entry}``),
so the controller's knobs (``ema_alpha`` 0.2, ``update_interval`` 5, ``warmup_batches`` 10, ``down_hysteresis``
-0.25, ``up_hysteresis`` 0.0, ``ceiling_coeff`` 0) may be global or per slot; unknown keys are ignored. Without a
file SGLang uses ``DEFAULT_ADAPTIVE_CONFIG``.

At run time a decode batch is padded up to the next captured CUDA-graph batch size, then routed to the largest
slot key <= it (floored to the smallest key). Each slot keeps its own EMA of accepted draft tokens per request
(the bonus token excluded) and its own current step; steps 0 is a plain decode (a one-node verify).
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}

#: the algorithms the controller runs on (NEXTN is rewritten to EAGLE before the check)
SUPPORTED_ALGORITHMS = ("EAGLE", "EAGLE3")


@dataclasses.dataclass(frozen=True, eq=False)
class SlotConfig:
    """One batch-size slot of a schedule: its lower bound, candidate steps (sorted, distinct) and knobs as given."""

    key: int
    candidate_steps: tuple[int, ...]
    ema_alpha: Any = 0.2
    update_interval: Any = 5
    warmup_batches: Any = 10
    down_hysteresis: Any = -0.25
    up_hysteresis: Any = 0.0
    ceiling_coeff: Any = 0


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """A validated adaptive schedule and the step the server starts on."""

    slots: tuple[SlotConfig, ...]
    initial_steps: int

    @property
    def candidate_steps(self) -> list[int]:
        """The union of every slot's candidates: one runtime state (and its CUDA graphs) per step."""
        return sorted({s for slot in self.slots for s in slot.candidate_steps})

    @property
    def max_draft_tokens(self) -> int:
        """What SGLang sizes buffers and the KV reservation with: max(candidate_steps) + 1."""
        return max(self.candidate_steps) + 1

    def key_for_batch(self, batch: int, graph_bs: list[int] | None) -> int:
        """The slot key a decode batch routes to: padded to the next captured graph size, then the largest key <=
        it, floored to the smallest key."""
        if graph_bs:
            i = bisect.bisect_left(graph_bs, batch)
            if i < len(graph_bs):
                batch = graph_bs[i]
        keys = [slot.key for slot in self.slots]
        return keys[max(0, bisect.bisect_right(keys, batch) - 1)]

    def slot(self, key: int) -> SlotConfig:
        return next(slot for slot in self.slots if slot.key == key)

    def graph_bs_for_step(self, step: int, graph_bs: list[int]) -> list[int]:
        """The captured batch sizes that can route to ``step``: the only ones its runtime state captures."""
        return [bs for bs in graph_bs if step in self.slot(self.key_for_batch(bs, graph_bs)).candidate_steps]


def load_config(path: str | None) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Read and validate a schedule file as SGLang does (the built-in default without a path).

    Raises what SGLang raises: OSError for a missing file, json.JSONDecodeError, ValueError with SGLang's messages,
    and Python's own errors for shapes SGLang does not check (a list instead of an object, a slot that is not one).
    """
    if path is not None:
        with open(path) as f:
            cfg = json.load(f)
    else:
        cfg = DEFAULT_ADAPTIVE_CONFIG
    entries: dict[int, dict[str, Any]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        entries[int(key)] = entry
    if not entries:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg.keys())}'
        )
    return cfg, entries


def union_of_steps(entries: dict[int, dict[str, Any]]) -> list[int]:
    return sorted({s for entry in entries.values() for s in entry["candidate_steps"]})


def schedule(cfg: dict[str, Any], entries: dict[int, dict[str, Any]], initial_steps: int) -> Schedule:
    """The schedule the server runs: each slot's merged knobs (global keys overridden by the slot's own)."""
    slots = []
    for key, entry in sorted(entries.items()):
        merged = {**cfg, **entry}
        knobs = {f.name: merged[f.name] for f in dataclasses.fields(SlotConfig)
                 if f.name not in ("key", "candidate_steps") and f.name in merged}
        slots.append(SlotConfig(key=key, candidate_steps=tuple(sorted(set(merged["candidate_steps"]))), **knobs))
    return Schedule(slots=tuple(slots), initial_steps=initial_steps)


def unsupported_reason(fields: dict[str, Any], algorithm: str | None) -> str | None:
    """Why adaptive mode cannot run with these server args (SGLang then falls back to static params), or None."""
    if algorithm not in SUPPORTED_ALGORITHMS:
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    topk = fields["speculative_eagle_topk"]
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    if fields["enable_dp_attention"] or (fields["attn_dp_size"] or 1) > 1:
        return ("enable_dp_attention=True is not supported "
                "(adaptive tier decisions are not synchronized across DP ranks)")
    if fields["enable_multi_layer_eagle"]:
        return "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    if fields["enable_two_batch_overlap"]:
        return ("enable_two_batch_overlap=True is not supported "
                "(adaptive state swap would discard the TboAttnBackend wrapper)")
    if fields["enable_pdmux"]:
        return ("enable_pdmux=True is not supported "
                "(adaptive state swap does not update decode_attn_backend_group)")
    return None


class Slot:
    """One slot's controller: an EMA of accepted drafts per request and a walk over the candidate steps."""

    def __init__(self, config: SlotConfig, initial_steps: int, log: Callable[[str], None]) -> None:
        self.config = config
        self.candidates = list(config.candidate_steps)
        self.log = log
        if initial_steps in self.candidates:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidates[len(self.candidates) // 2]
        self.ema = float(self.current_steps - 1)
        self.batches = 0

    def update(self, accepted: list[int]) -> bool:
        """Feed one verify batch's accepted drafts per request; True when the step changed."""
        if not accepted:
            return False
        c = self.config
        if self.current_steps > 0:
            self.ema = (1 - c.ema_alpha) * self.ema + c.ema_alpha * (sum(accepted) / len(accepted))
        self.batches += 1
        if self.batches <= c.warmup_batches:
            return False
        if (self.batches - c.warmup_batches) % c.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        c, steps = self.config, self.candidates
        old = self.current_steps
        idx = old_idx = steps.index(old)
        if old == 0:
            idx = min(idx + 1, len(steps) - 1)
            target = steps[idx]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            return self._apply(old, target)
        while idx > 0:
            prev = steps[idx - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + c.down_hysteresis
            if self.ema > drop:
                break
            idx -= 1
        if idx == old_idx:
            while idx < len(steps) - 1 and self.ema > steps[idx] - 0.5 + c.up_hysteresis:
                idx += 1
        target = steps[idx]
        if c.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * c.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and steps[idx] > ceiling:
                    idx -= 1
                target = steps[idx]
        return self._apply(old, target)

    def _apply(self, old: int, target: int) -> bool:
        if target == old:
            return False
        self.current_steps = target
        self.log(f"Adaptive spec params updated: steps {old} -> {target} (ema_accept_len={self.ema:.2f})")
        return True


class Controller:
    """The running schedule: routes each decode batch to its slot and feeds that slot the verify results."""

    def __init__(self, sched: Schedule, graph_bs: list[int] | None, log: Callable[[str], None]) -> None:
        self.schedule = sched
        self.graph_bs = sorted(graph_bs) if graph_bs else None
        self.slots = {c.key: Slot(c, sched.initial_steps, log) for c in sched.slots}

    def route(self, batch: int) -> Slot:
        return self.slots[self.schedule.key_for_batch(batch, self.graph_bs)]

    def steps_for_batch(self, batch: int) -> int:
        return self.route(batch).current_steps

    def on_verify_complete(self, accepted: list[int], batch: int) -> int | None:
        """The new step when the batch's slot decided to move, else None."""
        slot = self.route(batch)
        return slot.current_steps if slot.update(accepted) else None


def initialized_line(sched: Schedule) -> str:
    """The startup line SGLang logs for the smallest slot."""
    first = Slot(sched.slots[0], sched.initial_steps, lambda message: None)
    return (f"AdaptiveSpeculativeParams initialized: steps={first.current_steps}, "
            f"candidate_steps={first.candidates}")
