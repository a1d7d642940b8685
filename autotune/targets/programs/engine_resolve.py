"""Ask the target's own serving engine how it resolves a server command line, without starting a server.

Run with the engine's own python (the one its launcher runs), standard library plus the engine's own import. The
question is one JSON object on standard input (the engine's module says how to ask: engines/ builds it):

  {"op": "resolve" | "probe",
   "module": "sglang.srt.server_args", "factory": "prepare_server_args", "resolve": "resolve_once",
   "result": "resolved_dict",           # factory(args) -> object; object.resolve(); object.result() -> dict
   "args": [...],                       # the server's flags, after its launcher
   "env": {...},                        # the target's environment for the server (set before the import)
   "model_config": "path/config.json" | null,   # the served model's config (its architecture)
   "platform": [module, function] | null,   # who says the host's GPUs and the model's architecture (default:
                                            # nvidia-smi and model_config)
   "override": [module, function, {facts}] | null}   # a context the question runs in (a platform to answer as)

and the answer is one JSON object, the last line of standard output:

  {"answer": "resolved", "values": {...}}
  {"answer": "rejected", "message": "ValueError: ..."}   the engine refuses these arguments (its own words)
  {"answer": "unavailable", "reason": "..."}             the engine cannot be asked (not installed, too old...)

"probe" answers the same for the given args and adds "gpus" (names), "capability" ("9.0", "" unknown),
"architecture" ("" unknown), "model" (a digest of the model's config, "" unknown) and "version" (the engine's).
"""

import contextlib
import hashlib
import importlib
import io
import json
import os
import subprocess
import sys

#: seconds nvidia-smi may take
NVIDIA_SMI_TIMEOUT = 20
#: the most of a model's config.json read (a real one is a few kilobytes)
MODEL_CONFIG_BYTES = 1 << 20


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


def _nvidia_smi(fields):
    """nvidia-smi's rows of ``fields`` (None when it is missing or fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    lines = out.stdout.decode("utf-8", "replace").splitlines()
    return [[cell.strip() for cell in line.split(",")] for line in lines if line.strip()]


def host_platform(request):
    """The host's GPUs (nvidia-smi: names, the first one's compute capability; a driver too old for compute_cap
    gives names only) and the served model's architecture and a digest of its config (its config.json, when it is a
    local file): what a kept answer of this host is told apart by."""
    rows = _nvidia_smi("name,compute_cap") or _nvidia_smi("name") or []
    found = {"gpus": [row[0] for row in rows], "capability": rows[0][1] if rows and len(rows[0]) > 1 else "",
             "architecture": "", "model": ""}
    try:
        with open(request.get("model_config") or "", "rb") as f:
            data = f.read(MODEL_CONFIG_BYTES)
    except OSError:
        return found
    found["model"] = hashlib.sha256(data).hexdigest()[:16]
    with contextlib.suppress(ValueError, AttributeError, IndexError):  # no architecture named: unknown
        found["architecture"] = str((json.loads(data.decode("utf-8")).get("architectures") or [""])[0])
    return found


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
        how = request.get("platform")
        try:
            answer.update(_call(how)(request["args"]) if how else host_platform(request))
        except (Exception, SystemExit) as e:  # the engine's answer below says what is wrong with the args
            answer.update(gpus=[], platform_error="{}: {}".format(type(e).__name__, e))
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
