"""Run at the start of every python of the sglang-cpu venv (scripts/build-sglang-cpu.sh installs it with a .pth
file): in a process serving SGLang on the CPU (``SGLANG_USE_CPU_ENGINE=1`` when torch loads), the CPU is said to
have AMX tiles.

SGLang 0.5.23 takes its CPU kernel path (the intel_amx attention backend, the only CPU backend that verifies a
speculative batch, and the ``sgl_kernel`` ops for norms, rotary embedding, linear layers) only where
``torch.cpu._is_amx_tile_supported()``; elsewhere it falls back to torch_native attention, which cannot serve
speculative decoding. This project's ``sgl_kernel`` needs no AMX, so the path SGLang takes on an AMX Xeon is taken on
every x86 CPU, the same on the machines that run the tests whatever their make.

The environment is read when ``torch.cpu`` loads, not when python starts: a program that sets it before importing
SGLang (autotune's question to the host, targets/programs/engine_resolve.py) gets the server's answer.
"""
import importlib.abc
import os
import sys


class _ClaimAMX(importlib.abc.MetaPathFinder):
    """Finds ``torch.cpu`` through the finders after it, and has its loader claim AMX once the module has run."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
                        module._is_amx_tile_supported = lambda: True

                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, _ClaimAMX())
