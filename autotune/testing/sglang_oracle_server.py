"""The SGLang oracle's process: run by the sglang-cpu venv's python (scripts/build-sglang-cpu.sh), never imported.

It answers "what does SGLang make of these flags on this GPU" with SGLang's own resolution: one JSON request per line
on standard input, ``{"argv": [...], "capability": [major, minor]}``, one JSON answer per line on the original
standard output, ``{"ok": true, "resolved": {...}, "log": [...]}`` or ``{"ok": false, "error": "ValueError: ...",
"log": [...]}``; ``log`` holds what SGLang logged at INFO and above while resolving. The first line it writes is
``{"ready": true, "version": "0.5.23"}``. Anything SGLang prints goes to standard error.

``--device cuda`` is added to every argv and the platform's facts are overridden (``runtime_context.override_platform``)
to answer as a GPU of that compute capability would, on this CPU-only machine. Standard library and SGLang only.
"""
import argparse
import io
import json
import logging
import os
import sys
from contextlib import redirect_stderr
from importlib.metadata import version


def platform_facts(capability):
    """SGLang's platform facts (runtime_context._PLATFORM_PROBES) for a CUDA GPU of compute ``capability``."""
    major, minor = capability
    return {
        "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
        "has_amx": False, "has_flashinfer": True,
        "is_sm90": major == 9, "is_hopper_with_cuda_12_3": major == 9,
        "is_sm100": major == 10, "is_sm100_or_sm110": major in (10, 11), "is_sm110": major == 11,
        "is_sm120": major == 12, "is_blackwell": major in (10, 11, 12),
        "device_sm": major * 10 + minor, "device_capability": (major, minor),
    }


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        try:
            self.messages.append(f"{record.levelname}: {record.getMessage()}")
        except Exception:  # a malformed log call is SGLang's, not an answer
            self.messages.append(f"{record.levelname}: {record.msg}")


def answer(request, prepare_server_args, override_platform, collect):
    collect.messages = []
    errors = io.StringIO()
    try:
        with override_platform(**platform_facts(request["capability"])), redirect_stderr(errors):
            args = prepare_server_args([*request["argv"], "--device", "cuda"])
            root = logging.getLogger()
            if collect not in root.handlers:   # prepare_server_args's logging.basicConfig(force=True) drops it
                root.addHandler(collect)
            args.resolve_once()
            resolved = args.resolved_dict()
        return {"ok": True, "resolved": resolved, "log": collect.messages}
    except SystemExit as e:  # argparse: its message went to stderr
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        return {"ok": False, "error": lines[-1] if lines else f"SystemExit: {e.code}", "log": collect.messages}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}".rstrip(": "), "log": collect.messages}
    finally:
        sys.stderr.write(errors.getvalue())


def build_parser_once(server_args):
    """prepare_server_args builds SGLang's parser afresh on every call (thousands of arguments, their type hints
    evaluated: two thirds of an answer's time); build it once and copy its actions into each new parser, as argparse's
    own ``parents=`` does. ``--fresh-parser`` turns this off (the answers are the same; see docs/sglang-rules.md)."""
    template = argparse.ArgumentParser(prog="sglang serve", add_help=False)
    server_args.add_cli_args(template)

    def add_cli_args(parser):
        parser._add_container_actions(template)
        parser._defaults.update(template._defaults)

    server_args.add_cli_args = staticmethod(add_cli_args)


def main():
    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--fresh-parser", action="store_true", help="let SGLang build its parser for every answer")
    fresh = options.parse_args().fresh_parser
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    if not fresh:
        build_parser_once(ServerArgs)

    collect = _Collect()
    logging.getLogger().addHandler(collect)
    logging.getLogger().setLevel(logging.INFO)
    out.write(json.dumps({"ready": True, "version": version("sglang")}) + "\n")
    for line in sys.stdin:
        if line.strip():
            reply = answer(json.loads(line), prepare_server_args, override_platform, collect)
            out.write(json.dumps(reply, default=str) + "\n")


if __name__ == "__main__":
    main()
