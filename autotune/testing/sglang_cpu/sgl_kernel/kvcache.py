"""Moves in the KV cache: SGLang's CPU path writes and copies KV slots with these ops (srt/mem_cache/memory_pool.py,
kernels/ops/kvcache/cache_move.py)."""
from __future__ import annotations

import ctypes

import torch

from .library import op


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """In every KV buffer (given by its address and its bytes per slot), copy slot src_loc[i] to tgt_loc[i]."""
    if tgt_loc.numel() == 0:
        return
    targets, sources = tgt_loc.to(torch.int64), src_loc.to(torch.int64)
    rows = int(torch.maximum(targets.max(), sources.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        memory = (ctypes.c_char * (rows * stride)).from_address(address)
        slots = torch.frombuffer(memory, dtype=torch.uint8).view(rows, stride)
        slots[targets] = slots[sources]


@op("store_cache_cpu(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, "
    "int row_dim) -> ()")
def store_cache_cpu(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    indices: torch.Tensor, row_dim: int) -> None:
    """k_cache[indices] = key and v_cache[indices] = value, row by row."""
    index = indices.to(torch.int64)
    k_cache.view(-1, row_dim)[index] = key.reshape(-1, row_dim).to(k_cache.dtype)
    v_cache.view(-1, row_dim)[index] = value.reshape(-1, row_dim).to(v_cache.dtype)
