"""Asking the SGLang installed on a target how it resolves a config, before launching it.

SGLang 0.5.23 resolves its arguments apart from starting: ``prepare_server_args(argv)`` then ``resolve_once()``
(every rule, rejection and rewrite of the launch, with the real model's config and the real GPU) and
``resolved_dict()``. Its own python answers in seconds what a launch would answer in minutes. The emulator answers
the same question through ``autotune.sim.hostargs``, with the rules it starts with.
"""
from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.engines.base import Args, ArgValue, HostQuestion, HostResolution, same_value

#: SGLang's argument resolution, as the question program calls it
SGLANG = {"module": "sglang.srt.server_args", "factory": "prepare_server_args", "resolve": "resolve_once",
          "result": "resolved_dict"}
#: the emulator's: the same calls, and the GPU its profile has
EMULATOR = {**SGLANG, "module": "autotune.sim.hostargs", "platform": ["autotune.sim.hostargs", "platform"]}


def _launcher(command: Sequence[str]) -> tuple[dict[str, Any], int] | None:
    """Which resolution answers for a server started by ``command``, and how many of its words are the launcher
    (the rest are flags); None for a command that is not SGLang's launcher nor the emulator."""
    words = list(command)
    if not words:
        return None
    exe = posixpath.basename(words[0])
    if exe == "autotune-sim":
        return EMULATOR, 1
    if exe == "sglang" and words[1:2] == ["serve"]:
        return SGLANG, 2
    if exe.startswith("python") and words[1:2] == ["-m"]:
        module = words[2] if len(words) > 2 else ""
        if module == "autotune.sim":
            return EMULATOR, 3
        if module in ("sglang.launch_server", "sglang"):
            return SGLANG, 4 if module == "sglang" and words[3:4] == ["serve"] else 3
    return None


class SGLangHost(HostResolution):
    def question(self, command: Sequence[str], flags: Sequence[str]) -> HostQuestion | str:
        found = _launcher(command)
        if found is None:
            return (f"the server command {' '.join(command[:3])} is not SGLang's launcher (python -m "
                    "sglang.launch_server, sglang serve)")
        how, length = found
        args = [*command[length:], *flags]
        model = next((args[i + 1] for i, word in enumerate(args[:-1]) if word in ("--model-path", "--model")), None)
        return HostQuestion(command[0], {**how, "args": args,
                                         "model_config": posixpath.join(model, "config.json") if model else None})

    def effective(self, args: Mapping[str, ArgValue], values: Mapping[str, Any]) -> Args:
        out: Args = dict(args)
        for name, asked in args.items():
            runs = values.get(name.replace("-", "_"))
            if name == "speculative-algorithm" and isinstance(runs, str):
                runs = runs.upper()  # SGLang keeps the spelling it was given
            if runs is None or isinstance(runs, (list, dict)) or same_value(asked, runs):
                continue
            out[name] = runs
        return out

