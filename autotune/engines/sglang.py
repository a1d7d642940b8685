"""SGLang (0.5.x): speculative-decoding rules, readiness, fatal log lines, /server_info and /generate streams.

The rules here predict what ``sglang.launch_server`` does with a config so that configs SGLang would reject are
never deployed and configs it would rewrite to the same thing are measured once. The server's own answer
(/server_info) stays the authority: a trial verifies it after every start.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from autotune.engines.base import (
    Args,
    ArgValue,
    Engine,
    GenerationRequest,
    Message,
    Platform,
    Sampling,
    ServerInfo,
    StreamUpdate,
    ValidRange,
)
from autotune.engines.sglang_adaptive_rules import ADAPTIVE, SGLangAdaptive
from autotune.engines.sglang_host import SGLangHost
from autotune.engines.secret_args import OffCommandLine, SecretFile, flags_with_values, without
from autotune.errors import InvalidConfig

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
#: algorithms that draft a token tree with steps / topk / draft tokens
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
TREE_ARGS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")
#: attention backends that support topk > 1 together with page_size > 1
PAGED_TOPK_BACKENDS = ("flashinfer", "fa3", "triton")

_FATAL: list[tuple[re.Pattern[str], str]] = [
    # torch's and CUDA's out-of-memory errors, SGLang's KV pool too small ("Not enough memory ...") and its
    # allocation failures; not any "out of memory" (DeepGEMM's warm-up WARNING "... reducing max_m to N to avoid out
    # of memory" is a healthy FP8 server adapting)
    (re.compile(r"Not enough memory|CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|"
                r"out of memory\. Try to lower your batch size|runs out of memory\. Please set|"
                r"no GPU memory for the KV cache|too small to serve any requests|increase --mem-fraction-static",
                re.IGNORECASE), "oom"),
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
#: a line SGLang's logger starts a record with: "[2026-12-02 10:00:00 TP0] msg"
_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ")
_TRACEBACK = "Traceback (most recent call last):"

DRAFT_TOKENS = TREE_ARGS[2]
NGRAM_BREADTH = "speculative-ngram-max-bfs-breadth"
#: the most wider trees among the starting points (a topk range may hold a billion widths: a few, spread evenly)
MAX_WIDER = 6


#: the first verify of a tree (topk > 1) with fewer draft tokens than steps + 1 crashes SGLang 0.5.23's scheduler
#: (speculative/eagle_worker_common.py, _compact_accept_to_front: the accepted path of steps + 1 tokens is copied to
#: the front of the request's block of draft tokens); seen on the real server (tests/sglang_cpu/test_failures.py)
VERIFY_CRASH = "_compact_accept_to_front: the expanded size of the tensor must match the existing size"


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
    fixed_flags: ClassVar[dict[str, str]] = {
        "host": "the address autotune reaches the server at",
        "model-path": "the model the study measures", "model": "the model the study measures",
    }
    host = SGLangHost()

    def resolve(self, args: Mapping[str, ArgValue], platform: Platform | None = None) -> Args:
        """SGLang 0.5.23's argument resolution (ServerArgs.resolve_once) for the flags the tuner sets, in its order:
        the attention backends and page size first (arg_groups/overrides.py), then the speculative algorithm's own
        handler (arg_groups/speculative_hook.py). docs/sglang-rules.md lists what is predicted and where the rules
        refuse at once what SGLang accepts and fails on at start.

        With ``platform`` None (or its GPU or model architecture unknown) nothing that depends on them is assumed:
        no default attention backend, no page size it would force, no automatic draft tree; a given backend's own
        rules still apply."""
        out: Args = dict(args)
        algo = out.get("speculative-algorithm")
        if algo is None:
            present = [a for a in TREE_ARGS if a in out]
            if present:
                raise InvalidConfig(f"{present[0]} needs --speculative-algorithm")
        else:
            algo = str(algo).upper()
            if algo not in ALGORITHMS:
                raise InvalidConfig(f"Unknown speculative algorithm name: {algo}")
            out["speculative-algorithm"] = algo = "EAGLE" if algo == "NEXTN" else algo
        attention = _attention(out, algo, platform)
        if algo in TREE_ALGORITHMS:
            _eagle_tree(out, algo, attention, platform)
        elif algo == "NGRAM":
            _ngram_tree(out, attention)
        elif algo in ("DFLASH", "DSPARK"):
            _block_draft(out, algo)
        return out

    def depends_on(self, name: str) -> tuple[str, ...]:
        return TREE_ARGS[:2] if name == DRAFT_TOKENS else ()

    def valid_range(self, name: str, args: Mapping[str, ArgValue]) -> ValidRange:
        """Draft tokens of an EAGLE tree: irrelevant with topk 1 (SGLang runs steps + 1), otherwise at least steps + 1
        (``VERIFY_CRASH``) and at most the tree's capacity (``tree_capacity``). Every other flag, and a tree that is
        not fully known yet: no bound."""
        algo = str(args.get("speculative-algorithm", "")).upper()
        if name != DRAFT_TOKENS or algo not in (*TREE_ALGORITHMS, "NEXTN"):
            return ValidRange()
        try:
            steps, topk = (_positive_int(args, a) for a in TREE_ARGS[:2])
        except (KeyError, InvalidConfig):
            return ValidRange()
        if topk == 1:
            return ValidRange(irrelevant=True)
        return ValidRange(low=steps + 1, high=tree_capacity(steps, topk))

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
        trees += [(middle, topk) for topk in _spread(widths[1:], MAX_WIDER)]
        points: list[Args] = []
        for s, topk in trees:
            fits = [s + 1] if topk == 1 else _between(drafts, s + 1, tree_capacity(s, topk))
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

    def fatal_lines(self, lines: Iterable[str]) -> list[tuple[str, str]]:
        """As ``fatal_reason`` line by line, except for the head of a traceback printed right under an ordinary log
        record: that is ``logger.warning(..., exc_info=True)`` (e.g. "post-warmup freeze_gc failed"), part of the
        record and not a crash by itself (its other lines are read as usual: a rejected argument's frame, an
        out-of-memory error). A traceback under anything else ("Process SpawnProcess-1:", a fatal record, the
        start of the log) is Python's report of an exception that ended something: a crash."""
        out: list[tuple[str, str]] = []
        lines = list(lines)
        previous = ""
        for i, line in enumerate(lines):
            reason = self.fatal_reason(line)
            if reason and line.startswith(_TRACEBACK) and _RECORD.match(previous) and not self.fatal_reason(previous):
                reason = None
            if reason:
                out.append((reason, _raised(lines, i) if _in_traceback(line) else line.strip()))
            previous = line
        return out

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

    def chat_request(self, messages: Sequence[Message], max_tokens: int, sampling: Sampling) -> GenerationRequest:
        """The OpenAI chat request, asking for the request's speculative figures: SGLang (0.5.23) sends them in an
        ``sglext`` event of their own after the finishing one (``spec_tokens_details``), as it never does
        unasked."""
        request = super().chat_request(messages, max_tokens, sampling)
        request.body["return_spec_tokens_details"] = True
        return request

    def parse_event(self, payload: dict[str, Any]) -> StreamUpdate:
        if "choices" in payload or "usage" in payload:
            update = self.parse_chat_event(payload)
            details = (payload.get("sglext") or {}).get("spec_tokens_details")
            if isinstance(details, dict):
                update.verify_steps, update.accept_length = _acceptance(details, update.tokens)
            return update
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
        update.verify_steps, update.accept_length = _acceptance(meta, update.tokens)
        return update

    def context_length(self, args: Mapping[str, ArgValue]) -> int | None:
        value = args.get("context-length")
        return int(value) if isinstance(value, (int, str)) and str(value).isdigit() else None

    def flush_cache(self, client: httpx.Client) -> bool:
        return client.post("/flush_cache").status_code == 200

    def most_accepted(self, args: Mapping[str, ArgValue]) -> int | None:
        # every verify step checks the draft tokens (the root among them) and keeps at most all of them; an adaptive
        # server's deeper tiers check more than its startup config says
        if not args.get("speculative-algorithm") or args.get(ADAPTIVE):
            return None
        return _int_or_none(args.get(DRAFT_TOKENS))

    def capacity_from_log(self, text: str) -> dict[str, int]:
        found = _CAPACITY.findall(text)
        if not found:
            return {}
        tokens, mrr, ctx = found[-1]
        out = {"max_total_num_tokens": int(tokens), "max_running_requests": int(mrr)}
        if ctx:
            out["context_len"] = int(ctx)
        return out


#: model architectures whose attention SGLang 0.5.23 runs as MLA (configs/model_config.py), and the ones of them its
#: DeepSeek override moves to trtllm_mla on a B200 (arg_groups/model_overrides/deepseek_v2.py); the rules know the
#: default backend of these and of the MHA architectures below only (other models have overrides of their own)
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
TRTLLM_MLA_ON_SM100 = ("DeepseekV3ForCausalLM",)
MHA_ARCHITECTURES = ("LlamaForCausalLM",)
#: SGLang's automatic (steps, topk, draft tokens) by architecture (speculative_hook._auto_choose_speculative_params);
#: STANDALONE always gets (3, 1, 4)
AUTO_TREE = {"LlamaForCausalLM": (5, 4, 8), "DeepseekV2ForCausalLM": (3, 1, 4), "DeepseekV3ForCausalLM": (3, 1, 4)}
PREFILL, DECODE, ATTENTION = "prefill-attention-backend", "decode-attention-backend", "attention-backend"
PAGE = "page-size"


@dataclass(frozen=True)
class _Attention:
    """The attention backends as resolved (None: unknown)."""

    backend: str | None
    prefill: str | None
    decode: str | None

    @property
    def phases(self) -> tuple[str | None, str | None]:
        """(prefill, decode) backends, each falling back to the base one (overrides.attention_backends_of)."""
        return self.prefill or self.backend, self.decode or self.backend


def _int_or_given(args: Args, name: str) -> int | None:
    return _positive_int(args, name) if name in args else None


def _default_backend(algo: str | None, topk: int | None, page: int | None, platform: Platform | None,
                     phase_given: bool) -> str | None:
    """SGLang's attention backend when none is given (model_override_base.get_default_attn_backend, and the DeepSeek
    override when no phase's backend is given either); None when the GPU or the model is not one the rules know."""
    major = platform.major if platform else None
    arch = platform.architecture if platform else ""
    if major is None or arch not in (*MLA_ARCHITECTURES, *MHA_ARCHITECTURES):
        return None
    if arch in MLA_ARCHITECTURES:
        if major == 10 and arch in TRTLLM_MLA_ON_SM100 and not phase_given:
            return "trtllm_mla"
        return {9: "fa3", 10: "flashinfer"}.get(major, "triton")
    topk_one = topk is None or (topk == 1 and page in (None, 1))
    if major == 9 and topk_one:
        return "fa3"
    if major == 10 and topk_one and (algo is None or topk is not None or algo == "DFLASH"):
        return "trtllm_mha"
    return "flashinfer"


def _attention(out: Args, algo: str | None, platform: Platform | None) -> _Attention:
    """The attention backends and the page size (overrides.py: _attention_backend_default,
    _mla_backend_page_constraints, _mla_kv_cache_dtype_checks, _cutedsl_prefill_backend_fill, _fa4_page_constraint,
    _page_size_default); writes what it resolves into ``out``."""
    major = platform.major if platform else None
    backend, prefill, decode = (str(out[k]) if out.get(k) is not None else None for k in (ATTENTION, PREFILL, DECODE))
    page = _int_or_given(out, PAGE)
    topk = _int_or_given(out, TREE_ARGS[1])
    if prefill is not None and prefill == decode:
        backend = prefill
    elif backend is None:
        backend = _default_backend(algo, topk, page, platform, prefill is not None or decode is not None)
    every = (backend, prefill, decode)
    forced = page
    if "flashmla" in (backend, decode):
        forced = 64
    if "trtllm_mla" in (backend, decode) and forced not in (32, 64):
        forced = 64
    if "cutedsl_mla" in every and forced not in (32, 64):
        forced = 64
    if "trtllm_mha" in (*every, out.get("speculative-draft-attention-backend")) and forced not in (16, 32, 64, 128):
        forced = 64
    if "hpc_ops" in every and forced != 64:
        forced = 64
    if "trtllm_mla" in (backend, decode) and major is not None and major not in (10, 11, 12):
        raise InvalidConfig("TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)")
    if "cutedsl_mla" in every:
        if prefill == "cutedsl_mla":
            raise InvalidConfig("CuteDSL MLA only supports decoding (not --prefill-attention-backend cutedsl_mla)")
        if major is not None and major != 10:
            raise InvalidConfig("CuteDSL MLA backend is only supported on Blackwell GPUs (SM100)")
        prefill = prefill or "trtllm_mla"
    arch = platform.architecture if platform else ""
    if "fa4" in every and arch in MHA_ARCHITECTURES and major == 10 and (topk or 0) <= 1:
        forced = 128
    if forced is None and backend is not None:
        forced = 1
    if backend is not None:
        out[ATTENTION] = backend
    if prefill is not None:
        out[PREFILL] = prefill
    if forced is not None and (PAGE in out or forced != 1):
        out[PAGE] = forced
    return _Attention(backend, prefill, decode)


def _eagle_tree(out: Args, algo: str, attention: _Attention, platform: Platform | None) -> None:
    """speculative_hook._handle_eagle_family: all of steps/topk/draft or none (then SGLang's automatic tree), a chain's
    draft tokens set to steps + 1, the backends that cannot draft a tree."""
    given = [a for a in TREE_ARGS if a in out]
    if not given:
        arch = platform.architecture if platform else ""
        auto = (3, 1, 4) if algo == "STANDALONE" else AUTO_TREE.get(arch)
        if auto is None:
            return  # SGLang picks its own (steps, topk, draft) for the model: /server_info says which
        out.update(zip(TREE_ARGS, auto, strict=True))
    elif TREE_ARGS[0] not in out or TREE_ARGS[1] not in out:
        missing = ", ".join(f"--{a}" for a in TREE_ARGS if a not in out)
        raise InvalidConfig(f"speculative settings are partial (missing {missing}): pass all three or none")
    steps, topk = (_positive_int(out, a) for a in TREE_ARGS[:2])
    if topk > 1 and "trtllm_mha" in attention.phases:
        raise InvalidConfig("attention backend trtllm_mha supports only speculative_eagle_topk = 1")
    if topk == 1:
        draft = steps + 1  # SGLang overrides it with a warning
    elif DRAFT_TOKENS not in out:
        raise InvalidConfig(f"speculative settings are partial (missing --{DRAFT_TOKENS}): pass all three or none")
    else:
        draft = _positive_int(out, DRAFT_TOKENS)
        if draft > tree_capacity(steps, topk):
            raise InvalidConfig(
                f"selected index k out of range: {draft} draft tokens exceed the tree of "
                f"{steps} steps x topk {topk} (at most {tree_capacity(steps, topk)})"
            )
        if draft < steps + 1:
            raise InvalidConfig(
                f"too few draft tokens for the tree: {draft} draft tokens hold no path of all {steps} steps (at least "
                f"{steps + 1}); SGLang starts and then crashes at the first verify ({VERIFY_CRASH})"
            )
    page = int(out.get(PAGE, 1))
    if topk > 1 and page > 1 and attention.backend is not None and attention.backend not in PAGED_TOPK_BACKENDS:
        raise InvalidConfig(
            f"topk > 1 with page_size > 1 needs attention backend flashinfer, fa3 or triton, not {attention.backend}"
        )
    out.update(zip(TREE_ARGS, (steps, topk, draft), strict=True))


def _ngram_tree(out: Args, attention: _Attention) -> None:
    """speculative_hook._handle_ngram: topk is --speculative-ngram-max-bfs-breadth (10 by default), draft tokens 12
    unless given, steps draft // topk unless given; a tree (topk > 1) on pages > 1 only on flashinfer."""
    topk = _positive_int(out, NGRAM_BREADTH) if NGRAM_BREADTH in out else 10
    draft = _positive_int(out, DRAFT_TOKENS) if DRAFT_TOKENS in out else 12
    steps = _positive_int(out, TREE_ARGS[0]) if TREE_ARGS[0] in out else draft // topk
    page = int(out.get(PAGE, 1))
    if topk > 1 and page > 1 and attention.backend is not None and attention.backend != "flashinfer":
        raise InvalidConfig(
            f"NGRAM with topk (--{NGRAM_BREADTH}) {topk} > 1 and page_size {page} > 1 runs only on the flashinfer "
            f"attention backend, not {attention.backend}"
        )
    out.update(zip(TREE_ARGS, (steps, topk, draft), strict=True))


def _block_draft(out: Args, algo: str) -> None:
    """speculative_hook._handle_dflash / _handle_dspark: steps and topk forced to 1; the draft tokens (the block)
    kept when given, else read from the draft model's config (unknown here)."""
    if algo == "DFLASH" and "speculative-draft-model-path" not in out:
        raise InvalidConfig("DFLASH speculative decoding requires setting --speculative-draft-model-path")
    out[TREE_ARGS[0]] = out[TREE_ARGS[1]] = 1
    if DRAFT_TOKENS in out:
        draft = _positive_int(out, DRAFT_TOKENS)
        if algo == "DSPARK" and draft < 2:
            raise InvalidConfig(f"DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got {draft}")
        out[DRAFT_TOKENS] = draft


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


def _spread(values: Sequence[int], most: int) -> Sequence[int]:
    """At most ``most`` of the ascending ``values``, spread evenly from the first to the last, by index (a range is
    never listed)."""
    if len(values) <= most:
        return values
    return list(dict.fromkeys(values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)))


def _quantile(values: list[int], q: float) -> int:
    """The value at quantile ``q`` of sorted ``values``: the nearest rank, a half to the even one (so the quartiles of
    a short range spread evenly: 2, 3, 4 of 2-4)."""
    return values[round(q * (len(values) - 1))]


def _in_traceback(line: str) -> bool:
    """A traceback's head or one of its frames ("  File ..."), rather than a line that says what went wrong."""
    text = _strip_prefix(line)
    return text.startswith((_TRACEBACK, "Scheduler hit an exception: " + _TRACEBACK)) or line.startswith("  File ")


def _raised(lines: Sequence[str], at: int) -> str:
    """What the traceback through line ``at`` raised: its first line after ``at`` that is neither a frame nor a
    frame's code ("ValueError: speculative_eagle_topk > 1 ..."), SGLang's own words for the failure; the line at
    ``at`` itself while the traceback is not written out yet."""
    for line in lines[at + 1:]:
        if line.strip() and not line[:1].isspace() and not line.startswith(_TRACEBACK):
            return line.strip()
    return lines[at].strip()


def _strip_prefix(line: str) -> str:
    """'[2026-12-02 10:00:00 TP0] msg' -> 'msg'."""
    if line.startswith("[") and "] " in line:
        return line.split("] ", 1)[1]
    return line


_WHOLE = re.compile(r"[+-]?[0-9]+")


def _whole(args: Args, name: str, default: int) -> int:
    """A whole-number flag's value (``default`` when absent); ``InvalidConfig`` for anything else."""
    value = args.get(name, default)
    whole = ((isinstance(value, int) and not isinstance(value, bool))
             or (isinstance(value, float) and value.is_integer())
             or (isinstance(value, str) and _WHOLE.fullmatch(value.strip()) is not None))
    if not whole:
        raise InvalidConfig(f"{name} must be a whole number, got {value!r}")
    return int(value)


def _positive_int(args: Args, name: str) -> int:
    number = _whole(args, name, 0) if name in args else 0
    if number < 1:
        raise InvalidConfig(f"{name} must be a whole number >= 1, got {args.get(name)!r}")
    return number


def _acceptance(figures: dict[str, Any], tokens: int | None) -> tuple[int | None, float | None]:
    """(verify steps, accepted tokens per step) of one request, from its ``meta_info`` or its chat stream's
    ``spec_tokens_details``; (None, None) for a request that was not verified."""
    verify = _int_or_none(figures.get("spec_verify_ct"))
    if not verify:
        return None, None
    length = figures.get("spec_accept_length")
    return verify, float(length) if isinstance(length, (int, float)) else (tokens or 0) / verify


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # an infinite count is no count
        return None
