"""Run at the start of every python of the sglang-cpu venv (scripts/build-sglang-cpu.sh installs it with a .pth
file): in a process serving SGLang on the CPU (``SGLANG_USE_CPU_ENGINE=1``), the CPU is said to have AMX tiles.

SGLang 0.5.23 takes its CPU kernel path (the intel_amx attention backend, the only CPU backend that verifies a
speculative batch, and the ``sgl_kernel`` ops for norms, rotary embedding, linear layers) only where
``torch.cpu._is_amx_tile_supported()``; elsewhere it falls back to torch_native attention, which cannot serve
speculative decoding. This project's ``sgl_kernel`` needs no AMX, so the path SGLang takes on an AMX Xeon is taken on
every x86 CPU, the same on the machines that run the tests whatever their make.
"""
import os

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    import torch.cpu

    torch.cpu._is_amx_tile_supported = lambda: True
