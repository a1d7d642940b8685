"""SGLang (0.5.x): speculative-decoding rules, readiness, fatal log lines, /server_info and /generate streams.

The rules here predict what ``sglang.launch_server`` does with a config so that configs SGLang would reject are
never deployed and configs it would rewrite to the same thing are measured once. The server's own answer
(/server_info) stays the authority: a trial verifies it after every start.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from autotune.engines.base import (
    Args,
    ArgValue,
    Engine,
    GenerationRequest,
    Sampling,
    ServerInfo,
    StreamUpdate,
    ValidRange,
)
from autotune.engines.sglang_adaptive import SGLangAdaptive
from autotune.engines.secret_args import OffCommandLine, SecretFile, flags_with_values, without
from autotune.errors import InvalidConfig

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
#: algorithms that draft a token tree with steps / topk / draft tokens
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
TREE_ARGS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")
#: attention backends that support topk > 1 together with page_size > 1
PAGED_TOPK_BACKENDS = ("flashinfer", "fa3", "triton")

_FATAL: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Not enough memory|out of memory|OutOfMemoryError|no GPU memory for the KV cache|"
                r"too small to serve any requests|increase --mem-fraction-static", re.IGNORECASE), "oom"),
    (re.compile(r"selected index k out of range"), "invalid_args"),
    (re.compile(r"error: (unrecognized arguments|argument --|ambiguous option)"), "invalid_args"),
    # a traceback through SGLang's argument resolution: the arguments were rejected
    (re.compile(r'File ".*/sglang/srt/(server_args\.py|arg_groups/)'), "invalid_args"),
    (re.compile(r"Capture cuda graph failed"), "crashed"),
    (re.compile(r"Scheduler hit an exception"), "crashed"),
    (re.compile(r"Received sigquit from a child process"), "crashed"),
    (re.compile(r"scheduler died during initialization"), "crashed"),
    (re.compile(r"Initialization failed\. warmup error"), "crashed"),
    (re.compile(r"^Traceback \(most recent call last\)"), "crashed"),
]

DRAFT_TOKENS = TREE_ARGS[2]


def tree_capacity(steps: int, topk: int) -> int:
    """The most draft tokens an EAGLE tree of ``steps`` x ``topk`` holds (the root included); more is rejected with
    "selected index k out of range"."""
    return topk + (steps - 1) * topk * topk + 1


_CAPACITY = re.compile(r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+)(?:.*?context_len=(\d+))?")


class SGLang(Engine):
    kind = "sglang"
    stream_tokens_key = "completion_tokens"
    stream_seconds_key = "e2e_latency"
    # /ready (0.5.23) answers at once; /health (older releases) is /health_generate, which holds every answer >= 1 s
    readiness_paths = ("/ready", "/health")
    short_prefixes = ("speculative-num-", "speculative-eagle-", "speculative-")
    plot_params = TREE_ARGS[:2]
    adaptive = SGLangAdaptive()

    def resolve(self, args: Mapping[str, ArgValue]) -> Args:
        out: Args = dict(args)
        algo = out.get("speculative-algorithm")
        if algo is None:
            present = [a for a in TREE_ARGS if a in out]
            if present:
                raise InvalidConfig(f"{present[0]} needs --speculative-algorithm")
            return out
        algo = str(algo).upper()
        if algo not in ALGORITHMS:
            raise InvalidConfig(f"Unknown speculative algorithm name: {algo}")
        if algo == "NEXTN":
            algo = "EAGLE"
        out["speculative-algorithm"] = algo
        if algo not in TREE_ALGORITHMS:
            return out
        given = [a for a in TREE_ARGS if a in out]
        if not given:
            return out  # SGLang picks its own (steps, topk, draft) for the model: /server_info says which
        if len(given) != len(TREE_ARGS):
            missing = ", ".join(f"--{a}" for a in TREE_ARGS if a not in out)
            raise InvalidConfig(f"speculative settings are partial (missing {missing}): pass all three or none")
        steps, topk, draft = (_positive_int(out, a) for a in TREE_ARGS)
        if topk == 1:
            draft = steps + 1  # SGLang overrides it with a warning
        elif draft > tree_capacity(steps, topk):
            raise InvalidConfig(
                f"selected index k out of range: {draft} draft tokens exceed the tree of "
                f"{steps} steps x topk {topk} (at most {tree_capacity(steps, topk)})"
            )
        if topk > 1 and int(out.get("page-size", 1)) > 1:
            backend = str(out.get("attention-backend", "flashinfer"))
            if backend not in PAGED_TOPK_BACKENDS:
                raise InvalidConfig(
                    f"topk > 1 with page_size > 1 needs attention backend flashinfer, fa3 or triton, not {backend}"
                )
        if topk > 1 and str(out.get("attention-backend", "")) == "trtllm_mha":
            raise InvalidConfig("attention backend trtllm_mha supports only speculative_eagle_topk = 1")
        out.update(zip(TREE_ARGS, (steps, topk, draft), strict=True))
        return out

    def depends_on(self, name: str) -> tuple[str, ...]:
        return TREE_ARGS[:2] if name == DRAFT_TOKENS else ()

    def valid_range(self, name: str, args: Mapping[str, ArgValue]) -> ValidRange:
        """Draft tokens of an EAGLE tree: irrelevant with topk 1 (SGLang runs steps + 1), at most the tree's capacity
        otherwise (``tree_capacity``). Every other flag, and a tree that is not fully known yet: no bound."""
        algo = str(args.get("speculative-algorithm", "")).upper()
        if name != DRAFT_TOKENS or algo not in (*TREE_ALGORITHMS, "NEXTN"):
            return ValidRange()
        try:
            steps, topk = (_positive_int(args, a) for a in TREE_ARGS[:2])
        except (KeyError, InvalidConfig):
            return ValidRange()
        if topk == 1:
            return ValidRange(irrelevant=True)
        return ValidRange(high=tree_capacity(steps, topk))

    def memory_flags(self, args: Mapping[str, ArgValue]) -> tuple[str, ...]:
        """An EAGLE tree's memory grows with each of its numbers: the CUDA graphs' verify buffers with batch x draft
        tokens, the draft tree's with topk x steps. After an out-of-memory failure the same tree is tried with fewer
        draft tokens first, then fewer steps; topk, the tree's width, last."""
        algo = str(args.get("speculative-algorithm", "")).upper()
        if algo not in (*TREE_ALGORITHMS, "NEXTN") or not all(a in args for a in TREE_ARGS):
            return ()
        return DRAFT_TOKENS, TREE_ARGS[0], TREE_ARGS[1]

    def draft_tree(self, args: Mapping[str, ArgValue]) -> tuple[int, int, int] | None:
        if not self.memory_flags(args):
            return None
        try:
            steps, topk, draft = (_positive_int(dict(args), a) for a in TREE_ARGS)
        except InvalidConfig:
            return None
        return steps, topk, steps + 1 if topk == 1 else draft

    def starting_points(self, values: Mapping[str, Sequence[ArgValue]], fixed: Mapping[str, ArgValue]) -> list[Args]:
        """An EAGLE tree is tuned by hand the same way each time: first deeper (more steps) on the narrowest tree,
        usually the chain (topk 1, SGLang's own choice for most models, at 3 steps), then wider. So: the narrowest topk
        at the quartiles of the steps range, then each wider topk at the median steps, every tree with its draft
        tokens halfway into what it holds (a chain's are steps + 1)."""
        steps_name, topk_name, draft_name = TREE_ARGS
        if str(fixed.get("speculative-algorithm", "")).upper() not in (*TREE_ALGORITHMS, "NEXTN"):
            return []
        if steps_name not in values and topk_name not in values:
            return []
        try:
            steps = _ints(values.get(steps_name) or [fixed[steps_name]])
            widths = _ints(values.get(topk_name) or [fixed[topk_name]])
            drafts = _ints(values.get(draft_name) or [fixed[draft_name]])
        except (KeyError, TypeError, ValueError):
            return []
        middle = _quantile(steps, 0.5)
        trees = [(s, widths[0]) for s in dict.fromkeys(_quantile(steps, q) for q in (0.25, 0.5, 0.75))]
        trees += [(middle, topk) for topk in widths[1:]]
        points: list[Args] = []
        for s, topk in trees:
            fits = [s + 1] if topk == 1 else _between(drafts, 2, tree_capacity(s, topk))
            if fits:
                points.append(dict(zip(TREE_ARGS, (s, topk, fits[len(fits) // 2]), strict=True)))
        return points

    def render(self, command: list[str], args: Mapping[str, ArgValue]) -> list[str]:
        argv = list(command)
        for name, value in args.items():
            if value is False:
                continue
            argv.append(f"--{name}")
            if value is not True:
                argv.append(str(value))
        return argv

    def hide_secrets(self, argv: list[str], secret: Callable[[str, str], bool]) -> OffCommandLine:
        """SGLang reads no flag from its environment, but any flag from a YAML file: ``--config FILE.yaml`` (the
        file's keys are flag names, merged under the command line's own flags). It takes one such file: a study that
        gives its own ``config`` keeps its secret flags on the command line."""
        found = flags_with_values(argv, secret)
        if not found:
            return OffCommandLine(list(argv))
        if "--config" in argv or any(w.startswith("--config=") for w in argv):
            return OffCommandLine(list(argv), kept=tuple(f.name for f in found))
        # JSON strings are YAML double-quoted scalars: every value stays a string (no yes/no/number reading)
        text = "".join(f"{json.dumps(f.name)}: {json.dumps(f.value)}\n" for f in found)
        return OffCommandLine(without(argv, found), file=SecretFile("--config", ".yaml", text))

    def fatal_reason(self, line: str) -> str | None:
        for pattern, reason in _FATAL:
            if pattern.search(_strip_prefix(line)):
                return reason
        return None

    def server_info(self, client: httpx.Client) -> ServerInfo:
        r = client.get("/server_info")
        if r.status_code == 404:
            r = client.get("/get_server_info")
        r.raise_for_status()
        data = r.json()
        applied = {k.replace("_", "-"): v for k, v in data.items() if isinstance(v, (str, int, float, bool))}
        if isinstance(applied.get("speculative-algorithm"), str):
            applied["speculative-algorithm"] = applied["speculative-algorithm"].upper()
        states = data.get("internal_states") or [{}]
        mrr = states[0].get("effective_max_running_requests_per_dp", data.get("max_running_requests"))
        return ServerInfo(applied=applied, max_running_requests=_int_or_none(mrr),
                          max_total_num_tokens=_int_or_none(data.get("max_total_num_tokens")), raw=data)

    def generation_request(self, prompt: str, max_tokens: int, temperature: float,
                           sampling: Sampling | None = None) -> GenerationRequest:
        sampling = sampling or Sampling(temperature)
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": sampling.temperature}
        if sampling.top_p is not None:
            params["top_p"] = sampling.top_p
        params["ignore_eos"] = sampling.ignore_eos
        return GenerationRequest("/generate", {"text": prompt, "sampling_params": params, "stream": True})

    def parse_event(self, payload: dict[str, Any]) -> StreamUpdate:
        # SGLang's OpenAI chat stream (0.5.23) carries no speculative figures of the request: only /generate's
        # meta_info gives spec_verify_ct
        if "choices" in payload or "usage" in payload:
            return self.parse_chat_event(payload)
        if "error" in payload:
            err = payload["error"]
            return StreamUpdate(finished=True, error=str(err.get("message", err) if isinstance(err, dict) else err))
        meta = payload.get("meta_info") or {}
        update = StreamUpdate(tokens=_int_or_none(meta.get("completion_tokens")))
        finish = meta.get("finish_reason")
        if finish is None:
            return update
        update.finished = True
        update.finish_reason = finish.get("type") if isinstance(finish, dict) else str(finish)
        latency = meta.get("e2e_latency")
        update.server_seconds = float(latency) if isinstance(latency, (int, float)) else None
        if update.finish_reason == "abort":
            update.error = str(finish.get("message", "aborted")) if isinstance(finish, dict) else "aborted"
        verify = _int_or_none(meta.get("spec_verify_ct"))
        if verify:
            update.verify_steps = verify
            length = meta.get("spec_accept_length")
            update.accept_length = float(length) if length is not None else (update.tokens or 0) / verify
        return update

    def context_length(self, args: Mapping[str, ArgValue]) -> int | None:
        value = args.get("context-length")
        return int(value) if isinstance(value, (int, str)) and str(value).isdigit() else None

    def flush_cache(self, client: httpx.Client) -> bool:
        return client.post("/flush_cache").status_code == 200

    def capacity_from_log(self, text: str) -> dict[str, int]:
        found = _CAPACITY.findall(text)
        if not found:
            return {}
        tokens, mrr, ctx = found[-1]
        out = {"max_total_num_tokens": int(tokens), "max_running_requests": int(mrr)}
        if ctx:
            out["context_len"] = int(ctx)
        return out


def _ints(values: Sequence[ArgValue]) -> list[int]:
    """Integer flag values in ascending order; ValueError for anything else."""
    if isinstance(values, range) and values.step > 0:
        return values  # type: ignore[return-value]  # already ascending ints, and never listed
    if any(isinstance(v, bool) or float(v) != int(float(v)) for v in values):
        raise ValueError("not integers")
    return sorted(int(float(v)) for v in values)


def _between(values: Sequence[int], low: int, high: int) -> Sequence[int]:
    """The ascending ``values`` from ``low`` to ``high``; a range is cut by arithmetic, never listed (a space may
    hold two billion draft-token counts)."""
    if isinstance(values, range):
        return values[max(0, math.ceil((low - values.start) / values.step)):
                      max(0, math.floor((high - values.start) / values.step) + 1)]
    return [v for v in values if low <= v <= high]


def _quantile(values: list[int], q: float) -> int:
    """The value at quantile ``q`` of sorted ``values``: the nearest rank, a half to the even one (so the quartiles of
    a short range spread evenly: 2, 3, 4 of 2-4)."""
    return values[round(q * (len(values) - 1))]


def _strip_prefix(line: str) -> str:
    """'[2026-12-02 10:00:00 TP0] msg' -> 'msg'."""
    if line.startswith("[") and "] " in line:
        return line.split("] ", 1)[1]
    return line


def _positive_int(args: Args, name: str) -> int:
    value = args[name]
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{name} must be a whole number, got {value!r}") from None
    if isinstance(value, bool) or number != float(value) or number < 1:
        raise InvalidConfig(f"{name} must be a whole number >= 1, got {value!r}")
    return number


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
