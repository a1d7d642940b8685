"""The dense layers' ops SGLang's CPU path calls where its AMX kernels would run (srt/layers/layernorm.py,
activation.py, rotary_embedding/, quantization/unquant.py, logits_processor.py). On a CPU without AMX tiles SGLang
runs torch's own code for these; they are here for CPUs with them, and for SGLang's check that the kernels exist.

Weights are not repacked: ``convert_weight_packed`` keeps a weight as it is, and ``weight_packed_linear`` is a plain
linear layer over it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .library import op


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (h * weight.float()).to(x.dtype)


@op("rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor")
def rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms(input, weight, eps)


@op("fused_add_rmsnorm_cpu(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()")
def fused_add_rmsnorm_cpu(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """residual += input, then input = rmsnorm(residual), both in place."""
    residual.copy_((residual.float() + input.float()).to(residual.dtype))
    input.copy_(_rms(residual, weight, eps).to(input.dtype))


@op("silu_and_mul_cpu(Tensor input) -> Tensor")
def silu_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    half = input.shape[-1] // 2
    return F.silu(input[..., :half]) * input[..., half:]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [..., rotary dims] by the angles cos, sin [..., rotary dims / 2] (broadcast): neox rotates the two halves,
    GPT-J style the even and odd dims."""
    if neox:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, neox: bool) -> torch.Tensor:
    shape = x.shape
    h = x.reshape(shape[0], -1, head_size).float()
    dims = cos.shape[-1] * 2
    rotated = _rotate(h[..., :dims], cos.unsqueeze(1), sin.unsqueeze(1), neox)
    return torch.cat([rotated, h[..., dims:]], dim=-1).to(x.dtype).reshape(shape)


@op("rotary_embedding_cpu(Tensor positions, Tensor query, Tensor key, int head_size, Tensor cos_sin_cache, "
    "bool is_neox) -> (Tensor, Tensor)")
def rotary_embedding_cpu(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                         cos_sin_cache: torch.Tensor, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of query and key ([tokens, heads * head_size] or [tokens, heads, head_size]):
    cos_sin_cache[position] holds the rotary dims' cosines, then their sines."""
    cos, sin = cos_sin_cache[positions.view(-1).to(torch.int64)].float().chunk(2, dim=-1)
    return _rope(query, cos, sin, head_size, is_neox), _rope(key, cos, sin, head_size, is_neox)


@op("apply_rotary_pos_emb_cpu(Tensor query, Tensor key, Tensor cos, Tensor sin) -> (Tensor, Tensor)")
def apply_rotary_pos_emb_cpu(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """query, key [tokens, heads, dim] by full-width cos, sin [tokens, dim] (each half repeated, neox style)."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half].float().unsqueeze(1), sin[..., :half].float().unsqueeze(1)
    return (_rotate(query.float(), c, s, True).to(query.dtype), _rotate(key.float(), c, s, True).to(key.dtype))


@op("convert_weight_packed(Tensor weight) -> Tensor")
def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous()


@op("weight_packed_linear(Tensor mat1, Tensor mat2, Tensor? bias, bool is_vnni) -> Tensor")
def weight_packed_linear(mat1: torch.Tensor, mat2: torch.Tensor, bias: torch.Tensor | None,
                         is_vnni: bool) -> torch.Tensor:
    return F.linear(mat1, mat2.to(mat1.dtype), None if bias is None else bias.to(mat1.dtype))
