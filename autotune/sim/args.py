"""SGLang 0.5.23's command line and argument rules, plus the emulator's own --sim-* options.

Parsing errors exit 2 through argparse (prog "sglang serve", abbreviations allowed as in SGLang, so the removed
--cuda-graph-max-bs is an ambiguous prefix). Rule violations found while resolving the arguments raise
``ArgRuleError``; the emulator then prints Python's traceback and exits 1, as SGLang's launcher does.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from autotune.sim import adaptive_controller, model
from autotune.sim.faults import Faults, collect, parse_fault
from autotune.sim.flags_table import FLAGS
from autotune.sim.profile import DEFAULT_PROFILE, Profile

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
KNOWN_ALGORITHMS = (*EAGLE_FAMILY, "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP", "NEXTN")
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")


class ArgRuleError(Exception):
    """SGLang rejected the arguments while resolving them; ``str()`` is the exception line it prints.

    ``frames`` are the stack frames below SGLang's speculative hook, as (file under sglang/, line, function, code);
    None for the usual ones (the algorithm's own argument handler)."""

    def __init__(self, message: str, frames: list[tuple[str, int, str, str]] | None = None) -> None:
        super().__init__(message)
        self.frames = frames


@dataclasses.dataclass(frozen=True)
class SimOptions:
    profile: str
    time_scale: float
    speedup: float
    seed: int | None
    noise: float | None
    faults: Faults


@dataclasses.dataclass
class Resolved:
    """The launch after SGLang's rules: every server field, the model's view, and failures due later."""

    fields: dict[str, Any]
    config: model.Config
    algorithm: str | None
    launch_command: str
    # A failure SGLang only hits later: (phase, exception line); phase "graph" (capture), "running" (decode) or
    # "verify" (the first verify of a speculative batch).
    deferred_error: tuple[str, str] | None = None

    @property
    def served_model_name(self) -> str:
        return self.fields["served_model_name"]


def human_readable_int(value: str) -> int:
    """SGLang's integer type: plain, SI (k, M, G, T) or IEC (Ki, Mi, Gi, Ti) suffixes."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    return int(value)


def nullable_str(value: str) -> str | None:
    return None if value.lower() in ("none", "null", "") else value


def loads(value: str) -> Any:
    return json.loads(value)


_TYPES = {"int": int, "float": float, "str": str, "human_int": human_readable_int, "json": loads,
          "nullable_str": nullable_str}


class _Deprecated(argparse.Action):
    """SGLang's deprecated flags: store a value and print the (yellow) deprecation warning."""

    def __init__(self, option_strings, dest, new_flag: str = "", const_value: Any = True, **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stderr.write(
            f"\033[1;33m'{option_string}' is deprecated and will be removed in a future release. "
            f"Use '{self.new_flag}' instead.\033[0m\n"
        )
        setattr(namespace, self.dest, self.const_value)


def build_parser() -> argparse.ArgumentParser:
    """SGLang's parser (from the flag table) with the emulator's --sim-* options added."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    for entry in FLAGS:
        flags, kind = entry["flags"], entry["kind"]
        kwargs: dict[str, Any] = {"dest": entry["dest"]}
        if "default" in entry:
            kwargs["default"] = entry["default"]
        if entry.get("required"):
            kwargs["required"] = True
        if kind == "store_true" and "deprecated" in entry:
            parser.add_argument(*flags, action=_Deprecated, nargs=0, new_flag=entry["deprecated"], **kwargs)
        elif kind == "deprecated_const":
            parser.add_argument(*flags, action=_Deprecated, choices=entry.get("choices"),
                                new_flag=entry["deprecated"], const_value=entry["const"], **kwargs)
        elif kind == "store_true":
            parser.add_argument(*flags, action="store_true", **kwargs)
        elif kind == "bool_optional":
            positive = [f for f in flags if not f.startswith("--no-")]
            parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            if "nargs" in entry:
                kwargs["nargs"] = entry["nargs"]
            if "choices" in entry:
                kwargs["choices"] = entry["choices"]
            parser.add_argument(*flags, type=_TYPES[entry.get("type", "str")], **kwargs)
    sim = parser.add_argument_group("emulator (autotune.sim)")
    sim.add_argument("--sim-profile", default=DEFAULT_PROFILE,
                     help="profile name (autotune/sim/profiles/NAME.toml) or path to a profile file")
    sim.add_argument("--sim-time-scale", type=_non_negative, default=1.0,
                     help="multiply every startup phase duration by this factor")
    sim.add_argument("--sim-speedup", type=_positive, default=1.0,
                     help="generate K times faster; every reported rate is then K times higher")
    sim.add_argument("--sim-seed", type=int, default=None, help="seed of the per-request noise (default: random)")
    sim.add_argument("--sim-noise", type=_fraction, default=None,
                     help="relative per-request noise (default: the profile's, 0.02); 0 turns noise off")
    sim.add_argument("--sim-fault", type=parse_fault, action="append", default=[], metavar="SPEC",
                     help="inject a fault (repeatable); see autotune.sim for the specs")
    return parser


def merge_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """SGLang's ``--config FILE.yaml`` (prepare_server_args, ConfigArgumentMerger): when the word ``--config`` is
    in ``argv``, the file's keys become flags placed before the command line's own (which therefore win), and the
    two words are dropped. Raises ``ValueError`` with SGLang's messages; SGLang lets it end the launch."""
    if "--config" not in argv:
        return argv
    where = [i for i, arg in enumerate(argv) if arg == "--config"]
    if len(where) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if where[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[where[0] + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    with open(path) as f:
        data = yaml.safe_load(f)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    single = set()
    for a in parser._actions:
        if isinstance(a, argparse._StoreAction) and a.nargs is None:
            single.add(a.dest)
            single.update(o.lstrip("-").replace("-", "_") for o in a.option_strings)
    unsupported = {a.dest: a for a in parser._actions
                   if a.option_strings and not isinstance(a, argparse._StoreTrueAction | argparse._StoreAction)
                   and not {"--config", "--help", "-h"} & set(a.option_strings)}
    merged: list[str] = []
    for key, value in data.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported:
            raise ValueError(f"Unsupported config option '{norm}' with action "
                             f"'{unsupported[norm].__class__.__name__}'")
        if isinstance(value, bool):
            if norm in store_true:
                merged += [f"--{key}"] if value else []
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            if norm in single:
                merged += [f"--{key}", json.dumps(value)]
            elif value:
                merged += [f"--{key}", *(str(item) for item in value)]
        elif isinstance(value, dict):
            merged += [f"--{key}", json.dumps(value)]
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:where[0]] + argv[where[0] + 2:]


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value!r}")
    return number


def _non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value!r}")
    return number


def _fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number < 0.5:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 0.5), got {value!r}")
    return number


#: the fields of SGLang 0.5.23's ServerArgs that no flag sets, as /server_info lists them beside the flags' values
#: (``--config`` is the other way round: a flag argparse consumes, no field)
NON_FLAG_FIELDS: dict[str, Any] = {
    "_radix_eviction_policy_explicitly_set": False, "_speculative_draft_quantization_explicitly_set": False,
    "_swa_full_tokens_ratio_explicitly_set": False, "aux_hidden_state_capture": None, "custom_sigquit_handler": None,
    "enable_cp_tp_group_sharing": False, "grpc_worker_threads": 4, "stat_loggers": None,
    "uses_mamba_radix_cache": False, "watermark_context_window": 4, "watermark_default_enabled": False,
    "watermark_enforce_all": False, "watermark_key": "<redacted>", "watermark_key_b": "<redacted>",
    "watermark_max_probability": 1.0, "watermark_mixing_probability": 0.5,
}


def sim_options(ns: argparse.Namespace) -> SimOptions:
    return SimOptions(
        profile=ns.sim_profile,
        time_scale=ns.sim_time_scale,
        speedup=ns.sim_speedup,
        seed=ns.sim_seed,
        noise=ns.sim_noise,
        faults=collect(ns.sim_fault),
    )


def resolve(ns: argparse.Namespace, argv: list[str], profile: Profile, warn) -> Resolved:
    """Apply SGLang's argument rules; ``warn`` receives the warnings SGLang logs while resolving."""
    fields = {entry["dest"]: getattr(ns, entry["dest"]) for entry in FLAGS if entry["dest"] != "config"}
    fields.update(NON_FLAG_FIELDS, speculative_boundary_reduction=fields["boundary_reduction"])
    deferred: tuple[str, str] | None = None
    algorithm = fields["speculative_algorithm"]
    if fields["speculative_draft_model_path"] is not None and fields["speculative_draft_model_revision"] is None:
        fields["speculative_draft_model_revision"] = "main"
    if algorithm is not None:
        name = algorithm.upper()
        if name not in KNOWN_ALGORITHMS:
            raise ArgRuleError(f"ValueError: Unknown speculative algorithm name: {algorithm}")
        algorithm = "EAGLE" if name == "NEXTN" else name
        fields["speculative_algorithm"] = algorithm
    _resolve_attention(fields, algorithm, profile, warn)
    schedule = _resolve_adaptive(fields, algorithm, warn) if fields["speculative_adaptive"] else None
    if algorithm is not None:
        if algorithm in EAGLE_FAMILY:
            deferred = _resolve_eagle(fields, profile, warn, adaptive_steps=schedule is not None)
        elif algorithm == "NGRAM":
            _resolve_ngram(fields, warn)
        elif algorithm in ("DFLASH", "DSPARK"):
            _resolve_block_draft(fields, algorithm, warn)
        else:
            raise ArgRuleError(f"NotImplementedError: autotune.sim does not emulate speculative algorithm {algorithm}")
    fields["served_model_name"] = fields["served_model_name"] or fields["model_path"]
    _check_context_length(fields, profile)
    spec = None
    if algorithm is not None and fields["speculative_num_draft_tokens"] is not None:
        spec = model.Spec(
            steps=fields["speculative_num_steps"],
            topk=fields["speculative_eagle_topk"],
            draft=fields["speculative_num_draft_tokens"],
            threshold_single=fields["speculative_accept_threshold_single"],
            threshold_acc=fields["speculative_accept_threshold_acc"],
        )
    config = model.Config(
        tp=fields["tp_size"],
        dp=fields["dp_size"],
        spec=spec,
        mem_fraction_static=fields["mem_fraction_static"],
        max_running_requests=fields["max_running_requests"],
        max_total_tokens=fields["max_total_tokens"],
        chunked_prefill_size=fields["chunked_prefill_size"],
        page_size=fields["page_size"],
        cuda_graph_max_bs=fields["cuda_graph_max_bs_decode"],
        disable_cuda_graph=bool(fields["disable_cuda_graph"]),
        context_length=fields["context_length"],
        disable_radix_cache=bool(fields["disable_radix_cache"]),
        kv_cache_dtype=fields["kv_cache_dtype"],
        mamba_ssm_dtype=fields["mamba_ssm_dtype"],
        adaptive=schedule,
        skip_zero_step_draft_extend=os.environ.get("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "").lower()
        in ("1", "true", "yes"),
    )
    chunked = config.chunked_prefill_size or model.default_chunked_prefill_size(profile)
    graph_max_bs = model.default_cuda_graph_max_bs(profile, config)
    fields["chunked_prefill_size"] = chunked
    if fields["mem_fraction_static"] is None:
        fields["mem_fraction_static"] = model.default_mem_fraction_static(profile, config, chunked, graph_max_bs)
    config = dataclasses.replace(config, chunked_prefill_size=chunked,
                                 mem_fraction_static=fields["mem_fraction_static"])
    graphs = {"tc_compiler": "eager", "max_context_size": None, "full_prefill_max_req": None,
              "full_prefill_prefix_chunk_tokens": None, "max_seq_len": None}
    fields["cuda_graph_config"] = {
        "decode": {"backend": "disabled" if config.disable_cuda_graph else "full", "max_bs": graph_max_bs,
                   "bs": model.capture_batch_sizes(config, graph_max_bs, graph_max_bs), **graphs},
        "prefill": {"backend": "disabled", "max_bs": chunked, "bs": model.prefill_capture_sizes(chunked), **graphs},
    }
    return Resolved(fields=fields, config=config, algorithm=algorithm,
                    launch_command=" ".join(argv), deferred_error=deferred)


#: compute capability majors by GPU name (torch.cuda.get_device_name), first match wins
_GPU_MAJORS = (
    (r"\bG?B[123]00\b", 10),
    (r"RTX PRO \d+ Blackwell|RTX 50\d0|\bGB10\b", 12),
    (r"\bG?H(100|200|800|20)\b", 9),
    (r"\bL40|\bL4\b|RTX 40\d0|Ada\b|\bA100\b|\bA800\b|\bA30\b|\bA10G?\b|\bA40\b|RTX 30\d0", 8),
)
#: architectures whose default attention backend the emulator derives as SGLang 0.5.23 does
#: (model_override_base.get_default_attn_backend, model_overrides/deepseek_v2.py); for any other the profile's
#: attention_backend is the default
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
MHA_ARCHITECTURES = ("LlamaForCausalLM",)


def gpu_major(name: str) -> int | None:
    """The compute capability's major number of the GPU called ``name`` (9 Hopper, 10 B200, 12 RTX Blackwell)."""
    return next((major for pattern, major in _GPU_MAJORS if re.search(pattern, name)), None)


def _phase_backends(fields: dict[str, Any]) -> tuple[str | None, str | None]:
    """(prefill, decode) attention backends, each falling back to the base one."""
    base = fields["attention_backend"]
    return fields["prefill_attention_backend"] or base, fields["decode_attention_backend"] or base


def _default_backend(fields: dict[str, Any], algorithm: str | None, profile: Profile) -> str:
    arch, major = profile.model.architecture, gpu_major(profile.hardware.gpu_name)
    if arch not in (*MLA_ARCHITECTURES, *MHA_ARCHITECTURES) or major is None:
        return profile.model.attention_backend
    if arch in MLA_ARCHITECTURES:
        if major == 10 and arch == "DeepseekV3ForCausalLM" and fields["prefill_attention_backend"] is None \
                and fields["decode_attention_backend"] is None:
            return "trtllm_mla"
        return {9: "fa3", 10: "flashinfer"}.get(major, "triton")
    topk, page = fields["speculative_eagle_topk"], fields["page_size"]
    topk_one = topk is None or (topk == 1 and page in (None, 1))
    if major == 9 and topk_one:
        return "fa3"
    if major == 10 and topk_one and (algorithm is None or topk is not None or algorithm == "DFLASH"):
        return "trtllm_mha"
    return "flashinfer"


def _resolve_attention(fields: dict[str, Any], algorithm: str | None, profile: Profile, warn) -> None:
    """SGLang's attention backend and page size passes (arg_groups/overrides.py), in its order: the default backend,
    the page sizes some backends force, the Blackwell-only backends, FA4's page 128, then page 1 by default."""
    prefill, decode = fields["prefill_attention_backend"], fields["decode_attention_backend"]
    if prefill is not None and prefill == decode:
        fields["attention_backend"] = prefill
    elif fields["attention_backend"] is None:
        fields["attention_backend"] = _default_backend(fields, algorithm, profile)
    backend = fields["attention_backend"]
    every = (backend, prefill, decode)
    page = fields["page_size"]
    if "flashmla" in (backend, decode):
        warn("FlashMLA only supports a page_size of 64, change page_size to 64.")
        page = 64
    for name, label, where, sizes in (
            ("trtllm_mla", "TensorRT-LLM MLA", (backend, decode), (32, 64)),
            ("cutedsl_mla", "CuteDSL MLA", every, (32, 64)),
            ("trtllm_mha", "TensorRT-LLM MHA", (*every, fields["speculative_draft_attention_backend"]),
             (16, 32, 64, 128)),
            ("hpc_ops", "HPC-Ops attention", every, (64,))):
        if name in where and page not in sizes:
            warn(f"{label} only supports page_size of {', '.join(map(str, sizes))}, changing page_size from {page} "
                 "to 64.")
            page = 64
    major = gpu_major(profile.hardware.gpu_name)
    if "trtllm_mla" in (backend, decode) and major not in (10, 11, 12):
        raise ArgRuleError("ValueError: TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please "
                           "use a different backend.")
    if "cutedsl_mla" in every:
        if prefill == "cutedsl_mla":
            raise ArgRuleError("AssertionError: CuteDSL MLA only supports decoding for now")
        if major != 10:
            raise ArgRuleError("ValueError: CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). Please "
                               "use a different backend.")
        fields["prefill_attention_backend"] = prefill or "trtllm_mla"
    if ("fa4" in every and profile.model.architecture not in MLA_ARCHITECTURES and major == 10
            and (fields["speculative_eagle_topk"] or 0) <= 1):
        warn(f"FA4 backend only supports page size 128 for non-MLA model architectures, changing page_size from "
             f"{page} to 128.")
        page = 128
    fields["page_size"] = 1 if page is None else page


def _resolve_adaptive(fields: dict[str, Any], algorithm: str | None, warn) -> adaptive_controller.Schedule | None:
    """SGLang's adaptive hook, run before the algorithm's own handler: fall back (a warning) when the settings do
    not support it; else read the schedule file, default topk to 1 and the steps to the middle of the union of
    candidates (a given value must be in it), and force draft tokens to steps + 1."""
    reason = adaptive_controller.unsupported_reason(fields, algorithm)
    if reason is not None:
        warn(f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
        fields["speculative_adaptive"] = False
        return None
    try:
        cfg, entries = adaptive_controller.load_config(fields["speculative_adaptive_config"])
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise ArgRuleError(_exception_line(e), _adaptive_frames(_failing_line(e))) from None
    union = adaptive_controller.union_of_steps(entries)
    if fields["speculative_eagle_topk"] is None:
        fields["speculative_eagle_topk"] = 1
    if fields["speculative_num_steps"] is None:
        fields["speculative_num_steps"] = union[len(union) // 2]
    steps = fields["speculative_num_steps"]
    if steps not in union:
        raise ArgRuleError(
            f"ValueError: --speculative-num-steps={steps} is not in the adaptive config candidate_steps {union}. "
            "Pass one of those values.",
            [_ADAPTIVE_HOOK_FRAME, ("srt/arg_groups/speculative_hook.py", 1031, "_init_adaptive_speculative_params",
                                    "raise ValueError(")])
    fields["speculative_num_draft_tokens"] = steps + 1
    return adaptive_controller.schedule(cfg, entries, steps)


_ADAPTIVE_HOOK_FRAME = ("srt/arg_groups/speculative_hook.py", 280, "handle_speculative_decoding",
                        "_init_adaptive_speculative_params(server_args)")


def _adaptive_frames(code: str) -> list[tuple[str, int, str, str]]:
    return [
        _ADAPTIVE_HOOK_FRAME,
        ("srt/arg_groups/speculative_hook.py", 1020, "_init_adaptive_speculative_params",
         "candidate_steps = resolve_candidate_steps_from_config("),
        ("srt/speculative/adaptive_spec_params.py", 141, "resolve_candidate_steps_from_config",
         "_, bs_entries = _load_adaptive_config(cfg_path)"),
        ("srt/speculative/adaptive_spec_params.py", 104, "_load_adaptive_config", code),
    ]


def _failing_line(e: Exception) -> str:
    """The line of SGLang's _load_adaptive_config that raises ``e``."""
    if isinstance(e, OSError):
        return "with open(cfg_path) as f:"
    if isinstance(e, json.JSONDecodeError):
        return "cfg = json.load(f)"
    if isinstance(e, AttributeError):
        return "for key, entry in cfg.items():" if "'items'" in str(e) else 'steps = entry.get("candidate_steps")'
    return "raise ValueError("


def _exception_line(e: Exception) -> str:
    """The last line of Python's traceback for ``e`` (the class qualified by its module unless a builtin)."""
    cls = type(e)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{name}: {e}"


def _resolve_eagle(fields: dict[str, Any], profile: Profile, warn,
                   adaptive_steps: bool = False) -> tuple[str, str] | None:
    """SGLang's _handle_eagle_family: defaults, the all-or-none triple, topk rules; returns a deferred failure.

    With ``adaptive_steps`` the adaptive hook has set the triple already, and steps 0 (a plain decode) is allowed."""
    _spec_max_running_requests(fields, warn)
    if fields["speculative_draft_model_path"] is None:
        fields["speculative_draft_model_path"] = profile.model.draft_model_path or fields["model_path"]
        fields["speculative_draft_model_revision"] = fields["speculative_draft_model_revision"] or "main"
    steps, topk, draft = (fields["speculative_num_steps"], fields["speculative_eagle_topk"],
                          fields["speculative_num_draft_tokens"])
    if steps is None:
        if topk is not None or draft is not None:
            raise ArgRuleError("AssertionError")
        steps, topk, draft = (3, 1, 4) if fields["speculative_algorithm"] == "STANDALONE" \
            else profile.model.auto_speculative
    if "trtllm_mha" in _phase_backends(fields):
        _compare(topk)
        if topk > 1:
            raise ArgRuleError("ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if topk == 1 and draft != steps + 1:
        warn("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
        draft = steps + 1
    _compare(topk)
    backend = fields["attention_backend"]
    if topk > 1 and fields["page_size"] > 1 and backend not in PAGE_TREE_BACKENDS:
        raise ArgRuleError(
            f"ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on {PAGE_TREE_BACKENDS}; "
            f"got attention_backend={backend!r}. Use page_size == 1 or one of those backends."
        )
    fields["speculative_num_steps"], fields["speculative_eagle_topk"] = steps, topk
    fields["speculative_num_draft_tokens"] = draft
    if adaptive_steps and steps == 0:
        return None
    if steps < 1 or topk < 1 or (draft is not None and draft < 1):
        raise ArgRuleError("ValueError: autotune.sim needs speculative_num_steps >= 1, speculative_eagle_topk >= 1 "
                           "and speculative_num_draft_tokens >= 1")
    if draft is None:
        if profile.model.hybrid_linear_attention:
            return "kv", "AssertionError"
        phase = "running" if fields["disable_cuda_graph"] else "graph"
        return phase, "TypeError: unsupported operand type(s) for -: 'NoneType' and 'int'"
    if topk > 1 and draft - 1 > topk + (steps - 1) * topk * topk:
        if steps > 1 and not fields["disable_cuda_graph"]:
            return "graph", "RuntimeError: selected index k out of range"
        return "running", "RuntimeError: selected index k out of range"
    if topk > 1 and draft < steps + 1:
        return "verify", (f"RuntimeError: The expanded size of the tensor ({draft}) must match the existing size "
                          f"({steps + 1}) at non-singleton dimension 1.  Target sizes: [1, {draft}].  Tensor sizes: "
                          f"[{steps + 1}]")
    return None


def _spec_max_running_requests(fields: dict[str, Any], warn) -> None:
    if fields["max_running_requests"] is None:
        fields["max_running_requests"] = model.SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        warn("Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
             "setting --max-running-requests.")


def _resolve_ngram(fields: dict[str, Any], warn) -> None:
    """SGLang's _handle_ngram: topk becomes --speculative-ngram-max-bfs-breadth, draft tokens default to 12, steps to
    draft // topk; a tree on pages > 1 runs only on flashinfer."""
    _spec_max_running_requests(fields, warn)
    fields["enable_mixed_chunk"] = False
    topk = fields["speculative_eagle_topk"] = fields["speculative_ngram_max_bfs_breadth"]
    if fields["speculative_num_draft_tokens"] is None:
        fields["speculative_num_draft_tokens"] = 12
        warn("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. You can override "
             "this by explicitly setting --speculative-num-draft-tokens.")
    if fields["speculative_num_steps"] is None:
        fields["speculative_num_steps"] = fields["speculative_num_draft_tokens"] // topk
    warn("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    page, backend = fields["page_size"], fields["attention_backend"]
    if topk > 1 and page > 1 and backend != "flashinfer":
        raise ArgRuleError(
            f"ValueError: speculative_eagle_topk({topk}) > 1 with page_size({page}) > 1 is unstable and produces "
            "incorrect results for paged attention backends. This combination is only supported for the "
            "'flashinfer' backend.")


def _resolve_block_draft(fields: dict[str, Any], algorithm: str, warn) -> None:
    """SGLang's _handle_dflash / _handle_dspark: steps and topk forced to 1; the draft tokens (the verify block) as
    given, else the draft checkpoint's (the emulator's drafts carry none: DFLASH's fallback 16, DSPARK's gamma 7
    + 1)."""
    label = "DFLASH" if algorithm == "DFLASH" else "DSpark"
    if algorithm == "DFLASH" and fields["speculative_draft_model_path"] is None:
        raise ArgRuleError("ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    for name in ("speculative_num_steps", "speculative_eagle_topk"):
        if fields[name] is not None and int(fields[name]) != 1:
            warn(f"{label} only supports {name} == 1; overriding {name}={fields[name]} to 1.")
        fields[name] = 1
    draft = fields["speculative_num_draft_tokens"]
    if draft is None:
        draft = 16 if algorithm == "DFLASH" else 8
        warn(f"speculative_num_draft_tokens is not set; defaulting to {draft} for {label}.")
    elif algorithm == "DSPARK" and draft < 2:
        raise ArgRuleError(f"ValueError: DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got {draft}.")
    fields["speculative_num_draft_tokens"] = draft
    _spec_max_running_requests(fields, warn)


def _compare(topk: Any) -> None:
    """SGLang compares topk with an int; a missing topk fails there with Python's TypeError."""
    if topk is None:
        raise ArgRuleError("TypeError: '>' not supported between instances of 'NoneType' and 'int'")


def _check_context_length(fields: dict[str, Any], profile: Profile) -> None:
    wanted, derived = fields["context_length"], profile.model.context_length
    if wanted is not None and wanted > derived and os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1":
        raise ArgRuleError(
            f"ValueError: Warning: User-specified context_length ({wanted}) is greater than the derived "
            f"context_length ({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the "
            "derived context_length may differ from max_position_embeddings in the model's config. To allow "
            "overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
        )
