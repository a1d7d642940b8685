"""What the tuner needs to know about a serving engine, behind one small interface.

An engine knows its own command-line rules (which configs it would reject and how it rewrites the rest), how it
says it is ready, which log lines mean it died, how to read back what it is really running, and how to stream one
generation and read per-request figures from the response. Everything engine-specific stays in its module.
"""
from __future__ import annotations

import functools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from autotune.engines.secret_args import OffCommandLine, flags_with_values

ArgValue = str | int | float | bool
Args = dict[str, ArgValue]


def config_key(args: Mapping[str, ArgValue]) -> str:
    """A canonical string for an effective config: equal configs give equal keys. The same text as
    ``json.dumps(args, sort_keys=True, separators=(",", ":"))``, each name and value encoded once per process (a
    space check builds thousands of keys around the same fixed args, which may hold a 100,000-character value)."""
    return "{" + ",".join(f"{_encoded(k)}:{_encoded(args[k])}" for k in sorted(args)) + "}"


@functools.lru_cache(maxsize=4096, typed=True)  # typed: true, 1 and 1.0 are equal keys but distinct values
def _encoded(value: ArgValue) -> str:
    return json.dumps(value)


#: compute capabilities of GPUs by name, as nvidia-smi names them (first match wins): what a rule needs when only the
#: name is known
_CAPABILITIES: tuple[tuple[str, tuple[int, int]], ...] = (
    (r"\bG?B[123]00\b", (10, 0)),                       # datacenter Blackwell: B100/B200/GB200, B300/GB300 (10.3)
    (r"RTX PRO \d+ Blackwell|RTX 50\d0|\bGB10\b", (12, 0)),  # RTX Blackwell
    (r"\bG?H(100|200|800|20)\b", (9, 0)),                # Hopper
    (r"\bL40|\bL4\b|RTX 40\d0|RTX (2000|4000|4500|5000|6000) Ada", (8, 9)),  # Ada
    (r"\bA100\b|\bA800\b|\bA30\b", (8, 0)),              # datacenter Ampere
    (r"\bA10G?\b|\bA40\b|RTX 30\d0|RTX A\d+", (8, 6)),   # other Ampere
)


@dataclass(frozen=True)
class Platform:
    """What a server runs on and what it serves, as far as an engine's argument rules depend on them (SGLang picks its
    attention backend, page size and speculative defaults by GPU generation and model architecture). Rules take
    ``Platform | None``; None, or an empty field, is unknown: the rules then predict only what holds everywhere.

    ``gpu`` is the name nvidia-smi prints ("NVIDIA H100 80GB HBM3"); ``compute_capability`` its compute_cap, (9, 0)
    for "9.0", or None to look it up by the name; ``architecture`` the model's, the first of its config.json's
    "architectures" ("LlamaForCausalLM")."""

    gpu: str = ""
    compute_capability: tuple[int, int] | None = None
    architecture: str = ""

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability, given or known from the name; None for a GPU this table does not know."""
        if self.compute_capability is not None:
            return self.compute_capability
        for pattern, capability in _CAPABILITIES:
            if re.search(pattern, self.gpu):
                return capability
        return None

    @property
    def major(self) -> int | None:
        """The compute capability's major number (9 Hopper, 10 datacenter Blackwell, 12 RTX Blackwell), or None."""
        capability = self.capability
        return capability[0] if capability else None


@dataclass(frozen=True)
class ServerInfo:
    """What the running server reports about itself."""

    applied: dict[str, ArgValue]            # flag name (as in the study, no dashes) -> value the server runs with
    max_running_requests: int | None        # effective, after the engine's memory reductions
    max_total_num_tokens: int | None        # KV cache capacity in tokens
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class StreamUpdate:
    """One parsed streaming event of a generation request."""

    tokens: int | None = None               # completion tokens so far (cumulative); None if this event has none
    finished: bool = False
    finish_reason: str | None = None
    accept_length: float | None = None      # accepted tokens per verify step for this request, from the response
    verify_steps: int | None = None         # number of verify (decode) steps for this request
    server_seconds: float | None = None     # the request's duration as the server timed it (on the last event)
    error: str | None = None                # the server reported an error for this request


@dataclass(frozen=True)
class ValidRange:
    """What an engine accepts for one flag once the flags it depends on are chosen (``Engine.valid_range``)."""

    low: float | None = None                # None: no lower bound of the engine's own
    high: float | None = None               # None: no upper bound of the engine's own
    irrelevant: bool = False                # the engine ignores or overrides the flag: every value runs the same


@dataclass(frozen=True)
class GenerationRequest:
    path: str
    body: dict[str, Any]
    #: the key of a stream event's cumulative completion-token count (None: the engine's ``stream_tokens_key``; "":
    #: the stream gives no count, each event carrying text is one token)
    tokens_key: str | None = None
    #: the stream's finishing event may be followed by others (an OpenAI usage chunk): the load generator keeps the
    #: last event naming a finish reason beside the last event
    finish_apart: bool = False


@dataclass(frozen=True)
class Sampling:
    """How a request samples and ends: ``ignore_eos`` makes it run to its size whatever the model would say."""

    temperature: float = 0.0
    top_p: float | None = None
    ignore_eos: bool = True


#: a chat message as sent: (role, text)
Message = tuple[str, str]


class AdaptiveRules(ABC):
    """How an engine runs an adaptive speculative schedule: a chain length per running batch size, from a file."""

    #: the name of the schedule file's format (`autotune best --format NAME`)
    format: str
    #: the flag that names the schedule file on the server's command line
    file_flag: str

    @abstractmethod
    def chain_steps(self, config: Mapping[str, ArgValue]) -> int | None:
        """The draft steps of ``config`` when it is a single-chain speculative config the engine's adaptive mode
        can switch between (None for any other config, or one whose settings make adaptive mode fall back)."""

    @abstractmethod
    def family(self, config: Mapping[str, ArgValue]) -> Args:
        """``config`` without the flags that set its chain: the configs a schedule switches between share it."""

    @abstractmethod
    def padded_batch(self, batch: int, limit: int | None) -> int:
        """The batch size a running batch of ``batch`` requests is routed by (the engine pads it to a captured
        CUDA-graph size); ``limit`` is the server's max_running_requests, when known."""

    @abstractmethod
    def document(self, slots: Mapping[int, Sequence[int]]) -> dict[str, Any]:
        """The schedule file for ``slots`` (smallest routed batch -> chain steps); ValueError, with the engine's
        own message, for a schedule the engine would refuse."""

    @abstractmethod
    def deploy_args(self, family: Mapping[str, ArgValue], slots: Mapping[int, Sequence[int]], path: str) -> Args:
        """The config that runs the schedule written to ``path`` on top of ``family``."""


@dataclass(frozen=True)
class HostQuestion:
    """How to ask the engine installed on a target to resolve a config itself (targets/programs/engine_resolve.py
    documents the request): run with the python of ``launcher``."""

    launcher: str
    request: dict[str, Any]


class HostResolution(ABC):
    """How an engine that can resolve its arguments without starting (SGLang's ``resolve_once``) is asked about a
    config on the target itself, with the target's own engine version, model and GPU."""

    @abstractmethod
    def question(self, command: Sequence[str], flags: Sequence[str]) -> HostQuestion | str:
        """The question for the server command ``command`` started with ``flags`` (rendered), or why a server
        started by ``command`` cannot be asked (not the engine's own launcher)."""

    @abstractmethod
    def effective(self, args: Mapping[str, ArgValue], values: Mapping[str, Any]) -> Args:
        """``args`` as the engine resolved them (``values``: its resolved fields): each flag of ``args`` with the
        value the server will run."""


class Engine(ABC):
    """One serving engine's rules, endpoints and formats."""

    kind: str
    #: paths that answer 200 only once the server can serve generations, preferred first; a path the server
    #: does not have (404) is skipped for the next
    readiness_paths: tuple[str, ...]
    #: the flag that sets the server's HTTP port
    port_flag: str = "port"
    #: the kinds of fatal log line; when one failure prints several, the kind that explains it best comes first
    fatal_kinds: tuple[str, ...] = ("oom", "invalid_args", "crashed")
    #: the flag whose value the server wants as a bearer token on every request (None: the engine has none)
    api_key_flag: str | None = "api-key"
    #: prefixes dropped from flag names in short descriptions of a config ("steps=3 topk=1 draft=4")
    short_prefixes: tuple[str, ...] = ()
    #: the two tuned flags a contour plot is drawn over when both are tuned (() lets the report pick)
    plot_params: tuple[str, ...] = ()
    #: how the engine runs an adaptive speculative schedule (None: it has no such mode)
    adaptive: AdaptiveRules | None = None
    #: flags set once for the whole study, never tuned (beyond the port, the API key and the schedule file): each
    #: with why, as `autotune validate` says it
    fixed_flags: ClassVar[dict[str, str]] = {}
    #: how the engine on a target is asked to resolve a config before a launch (None: it cannot be asked)
    host: HostResolution | None = None
    #: the key of a stream event's cumulative completion-token count (the load generator reads it by position)
    stream_tokens_key: str = ""
    #: the key of a stream's last event that holds the server's own timing of the request in seconds ("": none)
    stream_seconds_key: str = ""

    @abstractmethod
    def resolve(self, args: Mapping[str, ArgValue], platform: Platform | None = None) -> Args:
        """The config the engine would really run for ``args`` on ``platform`` (None: an unknown GPU): its rewrites
        applied, its defaults made explicit where they matter for comparing configs. Raises ``InvalidConfig`` for a
        config the engine rejects."""

    def depends_on(self, name: str) -> tuple[str, ...]:
        """The flags that decide which values of ``name`` the engine accepts (``valid_range``); () for a flag whose
        values are independent of the others."""
        return ()

    def valid_range(self, name: str, args: Mapping[str, ArgValue]) -> ValidRange:
        """The values of ``name`` the engine accepts given ``args`` (the fixed flags and the ``depends_on`` flags
        chosen so far), so a search space can draw only those; ``ValidRange()`` when the engine sets no bound."""
        return ValidRange()

    def starting_points(self, values: Mapping[str, Sequence[ArgValue]], fixed: Mapping[str, ArgValue]) -> list[Args]:
        """Configs worth measuring first, best bets first: what this engine's users try before anything else, so a
        model-based sampler starts from informed configs rather than random ones. ``values`` holds the tuned flags'
        values (in order), ``fixed`` the study's fixed args. A point may set flags that are not tuned or values the
        space does not hold: the search space keeps only what it can run. [] when the engine has no such knowledge."""
        return []

    def memory_flags(self, args: Mapping[str, ArgValue]) -> tuple[str, ...]:
        """The flags of ``args`` whose values the server's memory need grows with, everything else being equal, in
        the order to shrink them after an out-of-memory failure; () when the engine knows of none. The search keeps
        a boundary with it: a config at least as large as one that ran out of memory in every one of these flags
        (and equal in the rest) runs out too, and one at most as large as a config that fitted fits."""
        return ()

    def cost(self, args: Mapping[str, ArgValue]) -> tuple[float, ...] | None:
        """What a config costs to run, to compare configs by (smaller first): its values of ``memory_flags``, in
        their order (SGLang: draft tokens, then steps, then topk). The pick settles a tie between configs its
        measurements cannot tell apart by it (results.tally.settle). None: the engine names no such flags."""
        flags = self.memory_flags(args)
        try:
            return tuple(float(args[f]) for f in flags) if flags else None  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return None

    def owner_of(self, flag: str) -> str | None:
        """Why ``flag`` is no flag to tune: what the target or autotune sets through it (None: it can be tuned)."""
        if flag == self.port_flag:
            return "the server's port, which the target's server_port sets"
        if flag == self.api_key_flag:
            return "the API key autotune sends with every request"
        if self.adaptive is not None and flag == self.adaptive.file_flag:
            return "the adaptive server's schedule file, which autotune writes"
        return self.fixed_flags.get(flag)

    def draft_tree(self, args: Mapping[str, ArgValue]) -> tuple[int, int, int] | None:
        """A speculative config's draft tree as the server runs it, (steps, topk, draft tokens), for the search's
        model of what those numbers do (search/physics.py); None when ``args`` draft no tree."""
        return None

    def auth_headers(self, args: Mapping[str, ArgValue]) -> dict[str, str]:
        """The headers every request to a server started with ``args`` needs (its API key, if it has one)."""
        key = args.get(self.api_key_flag) if self.api_key_flag else None
        return {"Authorization": f"Bearer {key}"} if isinstance(key, str) else {}

    def hide_secrets(self, argv: list[str], secret: Callable[[str, str], bool]) -> OffCommandLine:
        """``argv`` with the flags ``secret(name, value)`` picks taken off the command line, to be given to the
        server another way it reads them (an environment variable, a file); a flag the engine reads from its command
        line only stays there and is named in ``kept``. An engine that knows no other way keeps them all."""
        return OffCommandLine(list(argv), kept=tuple(f.name for f in flags_with_values(argv, secret)))

    def short_name(self, flag: str) -> str:
        for prefix in self.short_prefixes:
            if flag.startswith(prefix):
                return flag[len(prefix):]
        return flag

    def describe(self, params: Mapping[str, ArgValue]) -> str:
        """A config's tuned flags in short, for log lines: 'steps=3 topk=1 draft=4' ('(fixed args)' for none)."""
        return " ".join(f"{self.short_name(k)}={v}" for k, v in params.items()) or "(fixed args)"

    @abstractmethod
    def render(self, command: list[str], args: Mapping[str, ArgValue]) -> list[str]:
        """The server's full argv for ``args`` (names without dashes; ``True`` is a bare flag)."""

    @abstractmethod
    def fatal_reason(self, line: str) -> str | None:
        """The kind of failure a server log line proves (one of ``fatal_kinds``), or None for an ordinary line."""

    def fatal_lines(self, lines: Iterable[str]) -> list[tuple[str, str]]:
        """The fatal lines of a server log in order, as (kind, line): ``fatal_reason`` of each line, unless the
        engine knows a line's meaning depends on the lines before it."""
        return [(reason, line.strip()) for line in lines if (reason := self.fatal_reason(line))]

    def exit_reason(self, returncode: int) -> str:
        """The failure reason for a server that exited with ``returncode`` before it was ready."""
        return "invalid_args" if returncode == 2 else "crashed"

    @abstractmethod
    def server_info(self, client: httpx.Client) -> ServerInfo:
        """Read back what the running server is configured with (``client`` has the server's base URL)."""

    def mismatches(self, requested: Mapping[str, ArgValue], info: ServerInfo) -> list[str]:
        """Requested args the server does not run with, as 'name: requested X, running Y' lines."""
        out = []
        for name, want in requested.items():
            if name not in info.applied:
                continue
            have = info.applied[name]
            if not same_value(want, have):
                out.append(f"{name}: requested {want!r}, running {have!r}")
        return out

    @abstractmethod
    def generation_request(self, prompt: str, max_tokens: int, temperature: float,
                           sampling: Sampling | None = None) -> GenerationRequest:
        """A streaming generation request for a raw prompt of at most ``max_tokens`` tokens; without ``sampling``
        it always produces ``max_tokens`` tokens (end-of-sequence ignored) at ``temperature``."""

    def chat_request(self, messages: Sequence[Message], max_tokens: int, sampling: Sampling) -> GenerationRequest:
        """A streaming request through the engine's OpenAI chat endpoint (the server applies its chat template), of
        at most ``max_tokens`` tokens, with a cumulative token count on its events where the engine gives one."""
        body: dict[str, Any] = {"messages": [{"role": r, "content": t} for r, t in messages],
                                "max_tokens": int(max_tokens), "temperature": float(sampling.temperature)}
        if sampling.top_p is not None:
            body["top_p"] = float(sampling.top_p)
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        body.update(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        return GenerationRequest("/v1/chat/completions", body, tokens_key="completion_tokens", finish_apart=True)

    @abstractmethod
    def parse_event(self, payload: dict[str, Any]) -> StreamUpdate:
        """Parse one server-sent event of a generation stream (the JSON after ``data:``)."""

    def parse_chat_event(self, payload: dict[str, Any]) -> StreamUpdate:
        """Parse one event of an OpenAI chat stream: a chunk (its finish reason), or the usage chunk."""
        if "error" in payload:
            err = payload["error"]
            return StreamUpdate(finished=True, error=str(err.get("message", err) if isinstance(err, dict) else err))
        usage = payload.get("usage") or {}
        tokens = usage.get("completion_tokens")
        update = StreamUpdate(tokens=int(tokens) if isinstance(tokens, int) else None)
        choices = payload.get("choices") or []
        finish = choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
        if finish is not None:
            update.finished, update.finish_reason = True, str(finish)
            if finish == "abort":
                update.error = "aborted"
        return update

    def context_length(self, args: Mapping[str, ArgValue]) -> int | None:
        """The tokens one request may hold (prompt and output), as ``args`` set it; None when they leave it to the
        model (known only once the server runs)."""
        return None

    def flush_cache(self, client: httpx.Client) -> bool:
        """Empty the server's prefix cache if the engine can; True if it did."""
        return False

    def most_accepted(self, args: Mapping[str, ArgValue]) -> int | None:
        """The most tokens one verify step of speculative decoding can yield under the server args ``args`` (None:
        not known, or no speculative decoding); a request reported above it is refused (bench/plausible.py)."""
        return None

    def capacity_from_log(self, text: str) -> dict[str, int]:
        """Capacity figures the server's log states (cross-check for ``server_info``); empty if none."""
        return {}


def same_value(a: ArgValue, b: Any) -> bool:
    """Whether a flag's value ``a`` and ``b`` as a server reports it are the same (1 and 1.0, True and "true")."""
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)
