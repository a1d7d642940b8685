"""Ask the target's own serving engine how it resolves a server command line, without starting a server.

Run with the engine's own python (the one its launcher runs), standard library plus the engine's own import. The
question is one JSON object on standard input (the engine's module says how to ask: engines/ builds it):

  {"op": "resolve" | "probe",
   "module": "sglang.srt.server_args", "factory": "prepare_server_args", "resolve": "resolve_once",
   "result": "resolved_dict",           # factory(args) -> object; object.resolve(); object.result() -> dict
   "args": [...],                       # the server's flags, after its launcher
   "env": {...},                        # the target's environment for the server (set before the import)
   "gpus": [module, function] | null,   # who names the host's GPUs (default: nvidia-smi)
   "override": [module, function, {facts}] | null}   # a context the question runs in (a platform to answer as)

and the answer is one JSON object, the last line of standard output:

  {"answer": "resolved", "values": {...}, "gpus": [...], "version": "..."}
  {"answer": "rejected", "message": "ValueError: ..."}   the engine refuses these arguments (its own words)
  {"answer": "unavailable", "reason": "..."}             the engine cannot be asked (not installed, too old...)

"probe" answers the same for the given args and adds the host's GPUs and the engine's version.
"""

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys

#: seconds nvidia-smi may take
NVIDIA_SMI_TIMEOUT = 20


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _call(spec):
    module, function = spec[0], spec[1]
    return getattr(importlib.import_module(module), function)


def nvidia_gpus():
    """The GPUs' names as nvidia-smi lists them ([] when it is missing or fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.decode("utf-8", "replace").splitlines() if line.strip()]


def _version(module):
    top = module.split(".")[0]
    try:
        return str(getattr(importlib.import_module(top), "__version__", "") or "")
    except Exception:  # a version is a nicety
        return ""


def _rejection(error, stderr):
    """The engine's own words for a refusal: argparse's error line, or the exception's last traceback line."""
    if isinstance(error, SystemExit):
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else "the engine's argument parser exited with status {}".format(error.code)
    return "{}: {}".format(type(error).__name__, error).rstrip(": ")


def ask(request):
    """The answer to one question (see the module's docstring)."""
    for name, value in (request.get("env") or {}).items():
        os.environ[name] = value
        if name == "PYTHONPATH":
            sys.path[:0] = [p for p in value.split(os.pathsep) if p and p not in sys.path]
    answer = {}
    if request.get("op") == "probe":
        gpus = request.get("gpus")
        try:
            answer["gpus"] = [str(g) for g in _call(gpus)(request["args"])] if gpus else nvidia_gpus()
        except (Exception, SystemExit) as e:  # the engine's answer below says what is wrong with the args
            answer["gpus"] = []
            answer["gpus_error"] = "{}: {}".format(type(e).__name__, e)
        answer["version"] = _version(request["module"])
    try:
        factory = getattr(importlib.import_module(request["module"]), request["factory"])
    except Exception as e:  # whatever stops the import, the engine cannot be asked here
        return dict(answer, answer="unavailable", reason="cannot import {}.{}: {}: {}".format(
            request["module"], request["factory"], type(e).__name__, e))
    stderr = io.StringIO()
    override = request.get("override")
    try:
        with contextlib.ExitStack() as stack:
            if override:
                stack.enter_context(_call(override)(**override[2]))
            with contextlib.redirect_stderr(stderr):
                server_args = factory(list(request["args"]))
            method = getattr(server_args, request["resolve"], None)
            if method is None:
                version = answer.get("version") or _version(request["module"])
                return dict(answer, answer="unavailable", reason="{}.{} has no {}() ({}a release older than the one "
                            "that added it)".format(request["module"], type(server_args).__name__, request["resolve"],
                                                    "version {}: ".format(version) if version else ""))
            method()
            values = getattr(server_args, request["result"])()
    except ImportError as e:
        return dict(answer, answer="unavailable", reason="{}: {}".format(type(e).__name__, e))
    except (Exception, SystemExit) as e:  # the engine's refusal, in its own words
        return dict(answer, answer="rejected", message=_rejection(e, stderr))
    return dict(answer, answer="resolved", values=_jsonable(values))


def main():
    request = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # whatever the engine prints stays off the answer's line
        answer = ask(request)
    real_stdout.write(json.dumps(answer) + "\n")
    real_stdout.flush()


if __name__ == "__main__":
    main()
