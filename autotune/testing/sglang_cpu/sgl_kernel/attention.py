"""Attention over SGLang's paged KV cache on the CPU: the two ops of its intel_amx attention backend
(srt/layers/attention/intel_amx_backend.py), the one CPU backend that can verify a speculative batch.

The KV cache is a pool of slots, ``k_buffer[slot, kv_head, dim]``; ``req_to_token[row, position]`` is the slot of a
request's token at that position, and ``req_pool_indices[i]`` the row of the batch's i-th request. Each op computes,
per request, scaled dot-product attention of its queries over its tokens' keys and values (grouped-query heads
shared), in float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .library import op


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None, sm_scale: float,
            logit_cap: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """q [n, heads, d], k and v [t, kv_heads, d] -> [n, heads, dv]; ``visible`` [n, t] (None: all)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    qh = q.float().transpose(0, 1)
    kh = k.float().transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    vh = v.float().transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    if logit_cap <= 0 and sinks is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=sm_scale)
        return out.transpose(0, 1)
    scores = (qh @ kh.transpose(1, 2)) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(heads, 1, 1).expand(heads, scores.shape[1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return (weights @ vh).transpose(0, 1)


def _window(visible: torch.Tensor, query_positions: torch.Tensor, window: int) -> torch.Tensor:
    """Only the last ``window`` positions up to each query's own stay visible (0: no sliding window)."""
    if window <= 0:
        return visible
    keys = torch.arange(visible.shape[1])
    return visible & (query_positions.view(-1, 1) - keys.view(1, -1) < window)


def _scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x if scale == 1.0 else x.float() * scale


@op("extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, "
    "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, "
    "Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()")
def extend_attention_cpu(q_extend: torch.Tensor, k_extend: torch.Tensor | None, v_extend: torch.Tensor | None,
                         o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: float,
                         value_scale: float, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
                         max_len_extend: int, sm_scale: float, logit_cap: float, is_cross_attention: bool,
                         sliding_window_size: int, encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None,
                         tree_mask: torch.Tensor | None, is_causal: bool) -> None:
    """Each request's new tokens (``extend_seq_lens[i]`` of them from ``extend_start_loc[i]``) attend to its cached
    prefix and to each other: causally, or as ``tree_mask`` says when a draft tree is verified (one draft x draft
    block per request, row = query, column = draft token)."""
    if is_cross_attention:
        raise NotImplementedError("extend_attention_cpu: cross-attention (encoder-decoder models)")
    blocks = None
    requests = zip(req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(),
                   extend_start_loc.tolist(), strict=True)
    for i, (row, total, extend, start) in enumerate(requests):
        if extend == 0:
            continue
        prefix = total - extend
        slots = req_to_token[row, :total].to(torch.int64)
        k, v = k_buffer[slots], v_buffer[slots]
        if k_extend is not None and v_extend is not None:
            k = torch.cat([k[:prefix], k_extend[start:start + extend].to(k.dtype)])
            v = torch.cat([v[:prefix], v_extend[start:start + extend].to(v.dtype)])
        visible = torch.ones(extend, total, dtype=torch.bool)
        if tree_mask is not None:
            if blocks is None:
                blocks = tree_mask.view(-1, extend, extend)
            visible[:, prefix:] = blocks[i]
        elif is_causal:
            visible[:, prefix:] = torch.ones(extend, extend, dtype=torch.bool).tril()
        visible = _window(visible, prefix + torch.arange(extend), sliding_window_size)
        out = _attend(q_extend[start:start + extend], _scaled(k, key_scale), _scaled(v, value_scale), visible,
                      sm_scale, logit_cap, sinks)
        o_extend[start:start + extend] = out.to(o_extend.dtype)


@op("decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, "
    "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()")
def decode_attention_cpu(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, key_scale: float,
                         value_scale: float, output: torch.Tensor, key: torch.Tensor | None,
                         value: torch.Tensor | None, loc: torch.Tensor, attn_logits: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         sm_scale: float, logit_cap: float, is_cross_attention: bool, sliding_window_size: int,
                         encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None) -> None:
    """One new token per request: its key and value written to the cache at ``loc`` (when given), then its query
    attends to all ``seq_lens[i]`` of the request's tokens. ``attn_logits`` is the C++ kernel's scratch space."""
    if is_cross_attention:
        raise NotImplementedError("decode_attention_cpu: cross-attention (encoder-decoder models)")
    if key is not None and value is not None:
        slots = loc.to(torch.int64)
        k_cache[slots] = key.view(-1, *k_cache.shape[1:]).to(k_cache.dtype)
        v_cache[slots] = value.view(-1, *v_cache.shape[1:]).to(v_cache.dtype)
    for i, (row, total) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        slots = req_to_token[row, :total].to(torch.int64)
        visible = _window(torch.ones(1, total, dtype=torch.bool), torch.tensor([total - 1]), sliding_window_size)
        out = _attend(query[i:i + 1], _scaled(k_cache[slots], key_scale), _scaled(v_cache[slots], value_scale),
                      None if bool(visible.all()) else visible, sm_scale, logit_cap, sinks)
        output[i] = out[0].to(output.dtype)
