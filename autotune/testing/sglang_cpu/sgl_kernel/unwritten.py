"""Ops SGLang's CPU path looks up when its modules load (``NAME = torch.ops.sgl_kernel.NAME``) but a dense Llama never
calls: registered so those modules import, each failing with its name if it is ever called."""
from __future__ import annotations

import torch

from .library import op

#: the module that looks each one up as it loads (SGLang 0.5.23)
LOOKED_UP_ON_LOAD = {
    "flash_attn_varlen_func": "srt/layers/attention/vision.py (vision encoders)",
    "conv3d_embed_cpu": "srt/layers/conv.py (video patch embedding)",
    "fused_gdn_gating_cpu": "srt/layers/attention/linear/gdn_backend.py (gated delta-net attention)",
    "fused_sigmoid_gating_delta_rule_update_cpu": "srt/layers/attention/linear/kernels/gdn_triton.py (gated delta-net)",
}


def _unwritten(name: str, where: str):
    def call(args: list[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError(f"sgl_kernel.{name} (looked up by {where}) is not written in this project's CPU "
                                  "sgl_kernel: a dense Llama never calls it")
    return call


for _name, _where in LOOKED_UP_ON_LOAD.items():
    op(f"{_name}(Tensor[] args) -> Tensor[]")(_unwritten(_name, _where))
