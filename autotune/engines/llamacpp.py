"""llama.cpp's llama-server (the build vendored by llama-cpp-python 0.3.36, server 0.5.0-dev, commit 0c1e570).

The rules below follow that server's own source (common/arg.cpp, common/speculative.cpp, tools/server/*):

* ``--spec-type`` takes a comma-separated list of ``none``, ``draft-simple``, ``draft-eagle3``, ``draft-mtp``,
  ``draft-dflash``, ``draft-dspark``, ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``,
  ``ngram-cache``; ``none`` anywhere in the list means no speculation, the order of the others does not matter
  (the server tries the ngram types first, then the draft types, in a fixed order).
* ``--spec-draft-n-max`` (default 3), ``--spec-draft-n-min`` (0), ``--spec-draft-p-min``/``--draft-p-min`` (0.0)
  and ``--spec-draft-p-split`` are read only by the draft-model types. The ngram types draft up to their own m-gram
  size (``--spec-ngram-simple-size-m``, default 48, ...), so for them the draft knobs drop out of the effective config.
* ``--spec-type draft-simple`` without ``-md``: the server logs "failed to initialize speculative decoding
  context: draft-simple requires a draft context" and serves *without* speculation. That silent fallback is never
  what a study means, so it is rejected here.
* ``-md`` without a draft type: the server loads the draft model, finds no type to use it for and frees it: no
  speculation. The draft model drops out of the effective config.
* ``--spec-draft-n-min`` > ``--spec-draft-n-max``: the server accepts it but discards every draft (a draft is cut to
  n-max tokens, then dropped when shorter than n-min): rejected. ``--spec-draft-n-max 0`` is accepted at
  start, then the first request aborts the server (``GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)
  failed``): rejected. ``--spec-draft-p-min`` outside [0, 1]: below 0 is the same as 0, above 1 never drafts:
  rejected.
* A bad flag or value makes the server print ``error while handling argument "--x": ...`` or
  ``error: invalid argument: --x`` and exit with status 1 (not 2).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
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
)
from autotune.engines.secret_args import OffCommandLine, flags_with_values, without
from autotune.errors import InvalidConfig

# ---------------------------------------------------------------------------------------------------------------
# flag spelling

#: every single-dash spelling llama.cpp's common/arg.cpp defines (others are written with two dashes)
SHORT_FLAGS = frozenset((
    "C", "Cb", "Cbd", "Cd", "Cr", "Crb", "Crbd", "Crd", "a", "ag", "b", "bf", "bs", "c", "cb", "cl", "cmoe",
    "cmoed", "cms", "cnv", "co", "cram", "ctk", "ctkd", "ctv", "ctvd", "ctxcp", "decay-epochs", "dev", "devd", "dr",
    "dt", "e", "epochs", "f", "fa", "fit", "fitc", "fitp", "fitt", "gan", "gaw", "h", "hf", "hfd", "hff", "hfr",
    "hfrd", "hft", "i", "if", "j", "jf", "kvo", "kvu", "l", "lcd", "lcs", "lm", "lr", "lr-min", "lv", "lzm", "m",
    "md", "mg", "mli", "mm", "mmdev", "mmu", "mu", "n", "ncffn", "ncmoe", "ncmoed", "ngl", "ngld", "nkvo", "no-ag",
    "no-cnv", "no-kvu", "nocb", "np", "npl", "npp", "nr", "ns", "ntg", "o", "ofreq", "opt", "ot", "otd", "p", "pps",
    "ptc", "r", "rea", "s", "sm", "sp", "sps", "st", "sys", "sysf", "t", "tb", "tbd", "td", "tgs", "to", "ts", "ub",
    "v", "val-split", "wd"
))

#: spellings of the same llama-server option (first = the name resolve() uses when it adds a default; the draft
#: knobs are always written under it)
_ALIASES: dict[str, tuple[str, ...]] = {
    "spec-type": ("spec-type",),
    "n-max": ("spec-draft-n-max",),
    "n-min": ("spec-draft-n-min",),
    "p-min": ("spec-draft-p-min", "draft-p-min"),
    "p-split": ("spec-draft-p-split", "draft-p-split"),
    "draft-model": ("md", "spec-draft-model", "model-draft"),
    "model": ("m", "model"),
    "parallel": ("np", "parallel"),
    "ctx": ("c", "ctx-size"),
    "threads": ("t", "threads"),
    "ngram-simple-size-n": ("spec-ngram-simple-size-n",),
    "ngram-simple-size-m": ("spec-ngram-simple-size-m",),
    "ngram-simple-min-hits": ("spec-ngram-simple-min-hits",),
    "ngram-map-k-size-n": ("spec-ngram-map-k-size-n",),
    "ngram-map-k-size-m": ("spec-ngram-map-k-size-m",),
    "ngram-map-k-min-hits": ("spec-ngram-map-k-min-hits",),
    "ngram-map-k4v-size-n": ("spec-ngram-map-k4v-size-n",),
    "ngram-map-k4v-size-m": ("spec-ngram-map-k4v-size-m",),
    "ngram-map-k4v-min-hits": ("spec-ngram-map-k4v-min-hits",),
    "ngram-mod-n-match": ("spec-ngram-mod-n-match",),
    "ngram-mod-n-max": ("spec-ngram-mod-n-max",),
    "ngram-mod-n-min": ("spec-ngram-mod-n-min",),
}

#: flags this server version removed (it exits at start with "the argument has been removed")
_REMOVED = {
    "draft": "spec-draft-n-max", "draft-n": "spec-draft-n-max", "draft-max": "spec-draft-n-max",
    "draft-min": "spec-draft-n-min", "draft-n-min": "spec-draft-n-min",
    "spec-ngram-size-n": "spec-ngram-<type>-size-n", "spec-ngram-size-m": "spec-ngram-<type>-size-m",
    "spec-ngram-min-hits": "spec-ngram-<type>-min-hits",
}

# speculative types, in the server's order of preference (common_speculative_init)
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
              "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
_DRAFT_TYPES = frozenset(t for t in SPEC_TYPES if t.startswith("draft-"))
_NEEDS_DRAFT_MODEL = _DRAFT_TYPES - {"draft-mtp"}   # MTP can use the target's own next-token head
# per-type knobs: option key -> (the type that reads it, server default)
_TYPE_KNOBS: dict[str, tuple[str, int]] = {
    "ngram-simple-size-n": ("ngram-simple", 12), "ngram-simple-size-m": ("ngram-simple", 48),
    "ngram-simple-min-hits": ("ngram-simple", 1),
    "ngram-map-k-size-n": ("ngram-map-k", 12), "ngram-map-k-size-m": ("ngram-map-k", 48),
    "ngram-map-k-min-hits": ("ngram-map-k", 1),
    "ngram-map-k4v-size-n": ("ngram-map-k4v", 12), "ngram-map-k4v-size-m": ("ngram-map-k4v", 48),
    "ngram-map-k4v-min-hits": ("ngram-map-k4v", 1),
    "ngram-mod-n-match": ("ngram-mod", 24), "ngram-mod-n-max": ("ngram-mod", 64), "ngram-mod-n-min": ("ngram-mod", 48),
}
_DRAFT_KNOBS = ("n-max", "n-min", "p-min", "p-split")
_DRAFT_DEFAULTS: dict[str, ArgValue] = {"n-max": 3, "n-min": 0, "p-min": 0.0}


def _find(args: Mapping[str, ArgValue], key: str) -> tuple[str | None, ArgValue | None]:
    """The (name, value) under which ``args`` spells option ``key``; raises if it is spelled twice."""
    hits = [(n, args[n]) for n in _ALIASES[key] if n in args]
    if len(hits) > 1:
        names = " and ".join(f"'{n}'" for n, _ in hits)
        raise InvalidConfig(f"{names} are the same llama-server option; give it once")
    return hits[0] if hits else (None, None)


def _int(name: str, value: ArgValue) -> int:
    if isinstance(value, bool):
        raise InvalidConfig(f"{name}: expected an integer, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{name}: expected an integer, got {value!r}") from None
    if f != int(f):
        raise InvalidConfig(f"{name}: expected an integer, got {value!r}")
    return int(f)


def _float(name: str, value: ArgValue) -> float:
    if isinstance(value, bool):
        raise InvalidConfig(f"{name}: expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{name}: expected a number, got {value!r}") from None


def spec_types(value: ArgValue | None, reported: bool = False) -> tuple[str, ...]:
    """The speculative types a ``--spec-type`` value enables, in the server's order; () for none.

    In a flag value ``none`` anywhere disables speculation (common_speculative_types_from_names). The server's own
    report (``speculative.types`` in /slots) lists its default ``none`` first and then the enabled types
    ("none,ngram-simple"), so with ``reported`` a ``none`` is ignored.
    """
    if value is None:
        return ()
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    for n in names:
        if n != "none" and n not in SPEC_TYPES and not reported:
            raise InvalidConfig(f"spec-type: unknown speculative type {n!r}; allowed: none, {', '.join(SPEC_TYPES)}")
    if not reported and "none" in names:
        return ()
    return tuple(t for t in SPEC_TYPES if t in names)


def _spec_type_str(types: tuple[str, ...]) -> str:
    return ",".join(types) if types else "none"


class LlamaCpp(Engine):
    kind = "llamacpp"
    stream_tokens_key = "tokens_predicted"
    #: 503 {"error": {"message": "Loading model", ...}} while loading, 200 {"status": "ok"} once it serves
    readiness_paths = ("/health",)
    port_flag = "port"
    #: "port_busy" first: a port taken by another process is nobody's config's fault (health.py maps a kind it
    #: does not know to "crashed"; see the note in fatal_reason)
    fatal_kinds = ("port_busy", "oom", "invalid_args", "crashed")
    short_prefixes = ("spec-",)
    fixed_flags: ClassVar[dict[str, str]] = {
        "host": "the address autotune reaches the server at",
        **dict.fromkeys(_ALIASES["model"], "the model the study measures"),
        "api-key-file": "the API keys autotune sends with every request",
    }

    # -- config rules --------------------------------------------------------------------------------------------

    def resolve(self, args: Mapping[str, ArgValue], platform: Platform | None = None) -> Args:
        """The effective config: removed flags refused, the speculative types normalised, the knobs only those types
        read kept (under one spelling, with the server's defaults made explicit), the server's own checks applied.
        llama-server's rules do not depend on the ``platform``."""
        _refuse_removed(args)
        out: Args = dict(args)
        st_name, st_value = _find(args, "spec-type")
        types = spec_types(st_value)
        out[st_name or "spec-type"] = _spec_type_str(types)
        _resolve_draft_knobs(args, out, types)
        _resolve_ngram_knobs(args, out, types)
        _check_server_knobs(args)
        return out

    def render(self, command: list[str], args: Mapping[str, ArgValue]) -> list[str]:
        argv = list(command)
        for name, value in args.items():
            if value is False or value is None:
                continue        # llama-server has no "--flag false"; an absent flag keeps the default
            flag = ("-" if name in SHORT_FLAGS or len(name) == 1 else "--") + name
            if value is True:
                argv.append(flag)
            else:
                argv += [flag, _fmt(value)]
        return argv

    #: secret flags llama-server also reads from an environment variable (its --help: "(env: ...)")
    SECRET_ENV: ClassVar[dict[str, str]] = {"api-key": "LLAMA_API_KEY", "hf-token": "HF_TOKEN", "hft": "HF_TOKEN"}

    def hide_secrets(self, argv: list[str], secret: Callable[[str, str], bool]) -> OffCommandLine:
        """llama-server reads its API key (and Hugging Face token) from its environment when the flag is absent."""
        found = flags_with_values(argv, secret)
        moved = [f for f in found if f.name in self.SECRET_ENV]
        return OffCommandLine(without(argv, moved), env={self.SECRET_ENV[f.name]: f.value for f in moved},
                              kept=tuple(f.name for f in found if f not in moved))

    # -- failures ------------------------------------------------------------------------------------------------

    #: llama-server's fatal log lines (all seen from this build), first match wins; the generic
    #: "exiting due to model loading error" that ends both a missing model and an out-of-memory start is left out
    #: on purpose: the specific line before it names the cause
    _FATAL: tuple[tuple[re.Pattern[str], str], ...] = tuple(
        (re.compile(p), reason)
        for p, reason in (
            # "E srv start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 18092": not the config's fault
            (r"couldn't bind HTTP server socket|couldn't start HTTP listener|Address already in use", "port_busy"),
            # "E ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)",
            # "E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size ...",
            # "E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
            # "E srv load_model: failed to create_context with model '...'"
            (r"insufficient memory|failed to allocate|unable to allocate|cannot allocate memory|std::bad_alloc"
             r"|out of memory|failed to create_context|failed to create context"
             r"|failed to initialize the context", "oom"),
            # argument parsing, exit status 1: 'error while handling argument "--spec-draft-n-max": invalid value',
            # "error: invalid argument: --no-such-flag", '... "--draft-max": the argument has been removed. ...'
            (r"error while handling argument|error: invalid argument|the argument has been removed"
             r"|unknown speculative type|expected value for argument|error: --model is required"
             r"|error while handling environment variable", "invalid_args"),
            # a model or draft model that cannot be read: "E gguf_init_from_file: failed to open GGUF file
            # '/tmp/nope.gguf' (No such file or directory)", "E llama_model_load: error loading model: ...",
            # "E srv load_model: failed to load model, '/tmp/nope.gguf'"
            (r"failed to open GGUF file|gguf_init_from_file\w*: failed|error loading model|failed to load model"
             r"|failed to load draft model", "invalid_args"),
            # the server keeps running but without the requested speculation ("E srv load_model: failed to
            # initialize speculative decoding context: draft-simple requires a draft context"): not what was asked
            (r"failed to initialize speculative decoding context|draft model vocab type must match", "invalid_args"),
            # a crash: ggml assertion/abort (prints a backtrace), uncaught exception, fatal signal as a shell reports it
            (r"GGML_ASSERT\(|GGML_ABORT|ggml_abort|terminate called after throwing|Segmentation fault"
             r"|SIGSEGV|SIGABRT|core dumped|Illegal instruction", "crashed"),
        )
    )

    def fatal_reason(self, line: str) -> str | None:
        """One of ``fatal_kinds`` for a fatal llama-server log line, else None."""
        for pattern, reason in self._FATAL:
            if pattern.search(line):
                return reason
        return None

    def exit_reason(self, returncode: int) -> str:
        # llama-server exits with 1 for every startup failure (bad flags included) and never uses 2; the log
        # (fatal_reason) tells them apart. Signals (SIGSEGV, SIGABRT, SIGILL) are crashes.
        return "crashed"

    # -- the running server --------------------------------------------------------------------------------------

    def server_info(self, client: httpx.Client) -> ServerInfo:
        props = _get_json(client, "/props")
        slots = _get_json(client, "/slots", missing_ok=True)
        if isinstance(slots, list) and slots and _slot_types(slots) is None and any(
            s.get("speculative") for s in slots
        ):
            # the speculative types show only in a slot's last task params: run one token to fill them in
            _one_token(client)
            slots = _get_json(client, "/slots", missing_ok=True)

        applied: dict[str, ArgValue] = {}
        n_slots = props.get("total_slots")
        if isinstance(slots, list) and slots:
            n_slots = len(slots)
        if isinstance(n_slots, int):
            for n in _ALIASES["parallel"]:
                applied[n] = n_slots
        if props.get("model_path"):
            for n in _ALIASES["model"]:
                applied[n] = str(props["model_path"])

        slot_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        if isinstance(slots, list) and slots and isinstance(slots[0].get("n_ctx"), int):
            slot_ctx = slots[0]["n_ctx"]

        if isinstance(slots, list) and slots:
            if not any(s.get("speculative") for s in slots):
                applied["spec-type"] = "none"
            else:
                types = _slot_types(slots)
                if types is not None:
                    applied["spec-type"] = _spec_type_str(spec_types(types, reported=True))

        return ServerInfo(
            applied=applied,
            max_running_requests=n_slots if isinstance(n_slots, int) else None,
            # the KV cells of all slots: llama-server splits -c evenly over -np slots (kv_unified 'false', the
            # default with an explicit -np), so the total is slots x per-slot context. With --kv-unified (or -np
            # auto) every slot reports the whole pool and this overcounts; the log (capacity_from_log) is exact.
            max_total_num_tokens=slot_ctx * n_slots
            if isinstance(slot_ctx, int) and isinstance(n_slots, int) else None,
            raw={"props": props, "slots": slots},
        )

    def generation_request(self, prompt: str, max_tokens: int, temperature: float,
                           sampling: Sampling | None = None) -> GenerationRequest:
        # llama-server's own /completion: its stream carries cumulative tokens_predicted on every event and the
        # request's timings (with draft_n / draft_n_accepted) on the last one
        sampling = sampling or Sampling(temperature)
        body: dict[str, Any] = {"prompt": prompt, "n_predict": int(max_tokens), "ignore_eos": sampling.ignore_eos,
                                "temperature": float(sampling.temperature)}
        if sampling.top_p is not None:
            body["top_p"] = float(sampling.top_p)
        # never reuse a cached prefix: every request pays its full prompt
        body.update(stream=True, cache_prompt=False)
        return GenerationRequest(path="/completion", body=body)

    def chat_request(self, messages: Sequence[Message], max_tokens: int, sampling: Sampling) -> GenerationRequest:
        # the OpenAI chat stream has no cumulative count: one event a token (llama-server sends each token as it
        # comes), the exact count and the timings on the last chunk
        req = super().chat_request(messages, max_tokens, sampling)
        body = dict(req.body)
        body.pop("stream_options")
        body.update(ignore_eos=sampling.ignore_eos, cache_prompt=False, stream_options={"include_usage": True})
        return GenerationRequest(req.path, body, tokens_key="", finish_apart=True)

    def parse_event(self, payload: dict[str, Any]) -> StreamUpdate:
        if "choices" in payload or "usage" in payload:
            update = self.parse_chat_event(payload)
            timings = payload.get("timings")
            if isinstance(timings, dict):
                n = timings.get("predicted_n")
                if isinstance(n, int):
                    update.tokens = max(update.tokens or 0, n)
                _with_timings(update, timings, update.tokens)
            return update
        if "error" in payload:
            err = payload["error"]
            msg = err.get("message") if isinstance(err, dict) else str(err)
            return StreamUpdate(finished=True, error=str(msg or err))
        tokens = payload.get("tokens_predicted")
        tokens = int(tokens) if isinstance(tokens, (int, float)) else None
        if not payload.get("stop"):
            return StreamUpdate(tokens=tokens)

        timings = payload.get("timings") or {}
        n = timings.get("predicted_n", tokens)
        n = int(n) if isinstance(n, (int, float)) else tokens
        stop_type = payload.get("stop_type")
        finish = {"limit": "length", "eos": "stop", "word": "stop"}.get(str(stop_type), stop_type)
        update = StreamUpdate(tokens=tokens if tokens is not None else n, finished=True, finish_reason=finish)
        _with_timings(update, timings, n)
        return update

    def context_length(self, args: Mapping[str, ArgValue]) -> int | None:
        # --ctx-size is shared by the slots (--parallel): each request gets its share (0: the model's own)
        _, ctx = _find(args, "ctx")
        _, slots = _find(args, "parallel")
        if ctx is None or not str(ctx).isdigit() or int(ctx) == 0:
            return None
        unified = args.get("kv-unified", args.get("kvu")) is True
        share = int(slots) if slots is not None and str(slots).isdigit() and int(slots) > 0 and not unified else 1
        return int(ctx) // share

    def capacity_from_log(self, text: str) -> dict[str, int]:
        # "I srv load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = 'false'"
        found = re.findall(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)(?:, kv_unified = '(\w+)')?", text)
        if not found:
            return {}
        slots, per_slot, unified = found[-1]
        total = int(per_slot) if unified == "true" else int(per_slot) * int(slots)
        return {"max_running_requests": int(slots), "max_total_num_tokens": total, "n_ctx_slot": int(per_slot)}


# ---------------------------------------------------------------------------------------------------------------


def _with_timings(update: StreamUpdate, timings: dict[str, Any], n: int | None) -> None:
    """The request's verify steps, accept length and server time from llama-server's timings."""
    if n:
        # the first token comes from the prompt pass; every later target decode step yields one token plus
        # the draft tokens it accepted, so decode steps = n - 1 - accepted. As SGLang's spec_accept_length
        # (completion_tokens / spec_verify_ct): accept_length = n / decode steps. The server leaves draft_n
        # out when nothing was drafted (speculation off, or no n-gram match): accept_length is then None,
        # but verify_steps still counts the request's decode steps, so a level's tokens / verify steps stays
        # exact for an n-gram type that drafted for some requests only (and is n / (n - 1) without speculation).
        # (The server's own log line "mean len" is 1 + accepted / steps-with-a-draft: a different figure.)
        accepted = timings.get("draft_n_accepted")
        acc = int(accepted) if isinstance(accepted, (int, float)) else 0
        update.verify_steps = max(n - 1 - acc, 0)
        if "draft_n" in timings and update.verify_steps > 0:
            update.accept_length = n / update.verify_steps
    spent = [timings.get(k) for k in ("prompt_ms", "predicted_ms")]
    if all(isinstance(x, (int, float)) for x in spent):
        update.server_seconds = sum(spent) / 1000  # type: ignore[arg-type]


def _refuse_removed(args: Mapping[str, ArgValue]) -> None:
    for name in args:
        if name in _REMOVED:
            raise InvalidConfig(f"{name}: llama-server removed this flag; use {_REMOVED[name]}")


def _resolve_draft_knobs(args: Mapping[str, ArgValue], out: Args, types: tuple[str, ...]) -> None:
    """The draft-model knobs: dropped (with the draft model) unless a draft-* type reads them, else checked as the
    server checks them and written under its primary spelling with its defaults made explicit, so "draft-p-min 0.0"
    and the default are one key."""
    md_name, md_value = _find(args, "draft-model")
    needs_md = [t for t in types if t in _NEEDS_DRAFT_MODEL]
    if needs_md and (md_name is None or md_value in (None, "", False)):
        raise InvalidConfig(f"spec-type {needs_md[0]} needs a draft model (-md); "
                            "without one llama-server serves without speculation")
    found = {key: _find(args, key) for key in _DRAFT_KNOBS}
    for name, _ in found.values():
        if name is not None:
            out.pop(name, None)
    if not any(t in _DRAFT_TYPES for t in types):
        if md_name is not None:
            del out[md_name]
        return
    vals = {key: value for key, (name, value) in found.items() if name is not None}
    vals = {**_DRAFT_DEFAULTS, **vals}
    n_max = _int("spec-draft-n-max", vals["n-max"])
    n_min = _int("spec-draft-n-min", vals["n-min"])
    p_min = _float("spec-draft-p-min", vals["p-min"])
    if n_max < 0:
        raise InvalidConfig(f"spec-draft-n-max must be >= 1, got {n_max} (llama-server: invalid value)")
    if n_max == 0:
        # accepted at start, then the first drafted request aborts the server:
        # "llama-context.cpp:2273: GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) failed"
        raise InvalidConfig("spec-draft-n-max must be >= 1, got 0 (llama-server aborts at its first request)")
    if n_min < 0:
        raise InvalidConfig(f"spec-draft-n-min must be >= 0, got {n_min}")
    if n_min > n_max:
        raise InvalidConfig(
            f"spec-draft-n-min ({n_min}) > spec-draft-n-max ({n_max}): llama-server would discard every draft"
        )
    if not 0.0 <= p_min <= 1.0:
        raise InvalidConfig(f"spec-draft-p-min must be within [0, 1], got {p_min}")
    out["spec-draft-n-max"] = n_max
    out["spec-draft-n-min"] = n_min
    out["spec-draft-p-min"] = p_min
    if "p-split" in vals:
        out["spec-draft-p-split"] = _float("spec-draft-p-split", vals["p-split"])


def _resolve_ngram_knobs(args: Mapping[str, ArgValue], out: Args, types: tuple[str, ...]) -> None:
    """Each n-gram type's knobs: dropped unless their own type runs, else checked and made explicit."""
    for key, (owner, default) in _TYPE_KNOBS.items():
        name, value = _find(args, key)
        if owner not in types:
            if name is not None:
                del out[name]
            continue
        v = default if name is None else _int(_ALIASES[key][0], value)
        low = 0 if key in ("ngram-mod-n-max", "ngram-mod-n-min") else 1
        high = None if key.endswith("min-hits") else 1024
        if v < low or (high is not None and v > high):
            bounds = f"within [{low}, {high}]" if high is not None else f">= {low}"
            raise InvalidConfig(f"{_ALIASES[key][0]} must be {bounds}, got {v} (llama-server: invalid value)")
        out[name or _ALIASES[key][0]] = v
    if "ngram-mod" in types:
        lo = out[_find(out, "ngram-mod-n-min")[0] or _ALIASES["ngram-mod-n-min"][0]]
        hi = out[_find(out, "ngram-mod-n-max")[0] or _ALIASES["ngram-mod-n-max"][0]]
        if int(lo) > int(hi):
            raise InvalidConfig(f"spec-ngram-mod-n-min ({lo}) > spec-ngram-mod-n-max ({hi})")


def _check_server_knobs(args: Mapping[str, ArgValue]) -> None:
    """The usual server knobs, checked as llama-server checks them."""
    name, value = _find(args, "parallel")
    if name is not None and _int(name, value) == 0:
        raise InvalidConfig(f"{name}: 0 slots is invalid (llama-server: invalid value for n_parallel)")
    for key in ("ctx", "threads"):
        name, value = _find(args, key)
        if name is not None:
            _int(name, value)


def _fmt(value: ArgValue) -> str:
    return str(value)               # floats print their shortest exact form: 0.8 -> "0.8", 1.0 -> "1.0"


def _get_json(client: httpx.Client, path: str, missing_ok: bool = False) -> Any:
    r = client.get(path)
    if missing_ok and r.status_code in (404, 501):
        return None
    r.raise_for_status()
    return r.json()


def _slot_types(slots: list[dict[str, Any]]) -> str | None:
    for s in slots:
        t = (s.get("params") or {}).get("speculative.types")
        if t is not None:
            return str(t)
    return None


def _one_token(client: httpx.Client) -> None:
    with contextlib.suppress(httpx.HTTPError):
        client.post("/completion", json={"prompt": "Hi", "n_predict": 1, "cache_prompt": False}, timeout=60)
