"""Speculative decoding's bookkeeping on the CPU: KV-slot maps, draft trees, greedy verification.

SGLang's CPU path imports these by name from ``sgl_kernel`` (kernels/ops/speculative/*.py,
srt/mem_cache/allocation.py, the intel_amx attention backend). Each does what the op of the same name in SGLang's
C++ CPU sources does (their ``spec.cpp``), written here in torch: the arguments and in-place outputs are the call
sites', a batch is small (a few requests of a few draft tokens), so plain loops over Python lists are as fast as
anything else here and easy to check against the references in tests/sglang_cpu/test_kernels.py.
"""
from __future__ import annotations

import torch


def _spans(start: torch.Tensor, end: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, offset into the packed vector) of each request's slots."""
    out, offset = [], 0
    for s, e in zip(start.tolist(), end.tolist(), strict=True):
        out.append((s, e, offset))
        offset += e - s
    return out


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the next end[i] - start[i] of out_cache_loc."""
    spans = _spans(start_offset, end_offset)
    needed = spans[-1][2] + spans[-1][1] - spans[-1][0] if spans else 0
    if needed > out_cache_loc.numel():
        raise RuntimeError(f"assign_req_to_token_pool: out_cache_loc has {out_cache_loc.numel()} entries but "
                           f"offsets require {needed}")
    for row, (s, e, at) in zip(req_pool_indices.tolist(), spans, strict=True):
        req_to_token[row, s:e] = out_cache_loc[at:at + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """The inverse gather: out_cache_loc packs req_to_token[req_pool_indices[i], start[i]:end[i]] in order."""
    spans = _spans(start_offset, end_offset)
    needed = spans[-1][2] + spans[-1][1] - spans[-1][0] if spans else 0
    if needed > out_cache_loc.numel():
        raise RuntimeError(f"assign_extend_cache_locs: out_cache_loc has {out_cache_loc.numel()} entries but "
                           f"offsets require {needed}")
    for row, (s, e, at) in zip(req_pool_indices.tolist(), spans, strict=True):
        out_cache_loc[at:at + e - s] = req_to_token[row, s:e]


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                                           topk: int, num_steps: int) -> None:
    """Each request's topk x num_steps draft slots, reserved right after its committed tokens, read back."""
    width = topk * num_steps
    if out_cache_loc.numel() != req_pool_indices.numel() * width:
        raise RuntimeError("assign_draft_cache_locs_contiguous: out_cache_loc must hold bs * topk * num_steps")
    out = out_cache_loc.view(-1, width) if width else out_cache_loc
    for i, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out[i] = req_to_token[row, length:length + width]


def build_draft_decode_metadata_cpu(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                    seq_lens: torch.Tensor, topk: int, num_steps: int,
                                    pool_len: int) -> torch.Tensor:
    """One req_to_token row per draft candidate (request b's candidate k at row b * topk + k): the request's committed
    prefix, then that candidate's own num_steps draft slots (laid out after the prefix at k * num_steps)."""
    rows = req_pool_indices.numel()
    out = torch.zeros((rows * topk, pool_len), dtype=req_to_token.dtype)
    for b, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        source = req_to_token[row]
        for k in range(topk):
            dest = out[b * topk + k]
            dest[:length] = source[:length]
            dest[length:length + num_steps] = source[length + k * num_steps:length + (k + 1) * num_steps]
    return out


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                          accept_stride: int) -> None:
    """The last accepted token of each request (accept_lens counts the bonus token)."""
    bs = accept_lens.numel()
    index = torch.arange(bs, dtype=torch.int64) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[index])


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """The KV slots of the accepted tokens, packed in order (-1 in accept_index: rejected, skipped)."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat > -1]
    if kept.numel() and int(kept.max()) >= out_cache_loc.numel():
        raise RuntimeError(f"fill_accept_out_cache_loc: accept_index {int(kept.max())} out of range")
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept]


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                           candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """Greedy verification of each request's draft tree: from the root, follow the child (first child, then its
    siblings) whose draft token is the target's argmax at its parent, as deep as matches go. Writes the accepted
    nodes' flat indices into accept_index (the caller pre-fills -1), the accepted drafts per request (the bonus
    token not counted) and, at every accepted node, the target's token."""
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    cand, index = candidates.tolist(), retrive_index.tolist()
    first, sibling = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = index[b][0]
        accept_index[b, 0] = last
        correct, cur = 0, 0
        for _ in range(1, steps):
            cur = first[b][cur]
            while cur != -1:
                if cand[b][cur] == target[last]:
                    predicts[last] = target[last]
                    correct += 1
                    accept_index[b, correct] = index[b][cur]
                    last = index[b][cur]
                    break
                cur = sibling[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = correct
        predicts[last] = target[last]


def build_tree_kernel_efficient_cpu(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                    verified_seq_len: torch.Tensor, tree_mask: torch.Tensor, positions: torch.Tensor,
                                    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                                    retrive_next_sibling: torch.Tensor, topk: int, depth: int, draft_token_num: int,
                                    tree_mask_mode: int) -> None:
    """The draft tree the target verifies, from the draft's top-k expansion: each node's parent (via parent_list and
    selected_index), the attention mask over the tree, each node's position, and the retrieval links (first child,
    next sibling) verify_tree_greedy_cpu walks. tree_mask_mode 1 (QLEN_ONLY, the CPU's): a draft x draft mask per
    request; 0 (FULL_MASK): rows of seq_len + draft columns, the prefix columns left as the caller filled them."""
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise RuntimeError(f"build_tree_kernel_efficient_cpu: only FULL_MASK (0) and QLEN_ONLY (1) are supported, "
                           f"got {mode}")
    nd = draft_token_num
    parents = parent_list.tolist()
    selected = selected_index.tolist()
    seq_lens = verified_seq_len.tolist()
    stride_parent = topk * (depth - 1) + 1
    mask = tree_mask.view(-1)
    flat_positions = positions.view(-1)
    first, sibling = retrive_next_token.view(-1), retrive_next_sibling.view(-1)
    index = retrive_index.view(-1)
    mask_at = 0
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]
        off = b * nd
        flat_positions[off] = seq_len
        index[off] = off
        for i in range(nd - 1, 0, -1):
            index[off + i] = off + i
            parent_tb = sel[i - 1] // topk
            parent_pos = 0
            if parent_tb > 0:
                found = _node_of(sel, par[parent_tb]) if stride_parent > 1 else -1
                if found < 0:
                    continue
                parent_pos = found + 1
            head = int(first[off + parent_pos])
            first[off + parent_pos] = i
            if head != -1:
                sibling[off + i] = head
        width = nd if mode == 1 else seq_len + nd
        row0 = b * nd * nd if mode == 1 else mask_at + seq_len
        for tid in range(nd):
            start = row0 + width * tid
            mask[start] = True
            mask[start + 1:start + nd] = False
            if tid == 0:
                continue
            position, cur = 0, tid - 1
            while position < depth:
                position += 1
                mask[start + cur + 1] = True
                parent_tb = sel[cur] // topk
                if parent_tb == 0:
                    break
                cur = _node_of(sel, par[parent_tb])
                if cur < 0:
                    break
            flat_positions[off + tid] = position + seq_len
        mask_at += (seq_len + nd) * nd


def _node_of(selected: list[int], token: int) -> int:
    """The tree node (0-based among the selected, the root not counted) holding draft token index ``token``; -1
    when the tree does not hold it (a malformed tree: the walk stops there, as SGLang's kernel warns and stops)."""
    return selected.index(token) if token in selected else -1


def reconstruct_indices_from_tree_mask(tree_mask: torch.Tensor, verified_seq_len: torch.Tensor,
                                       positions: torch.Tensor, retrive_index: torch.Tensor,
                                       retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                                       batch_size: int, draft_token_num: int) -> None:
    """An NGRAM draft tree's links from its (QLEN_ONLY) mask, where mask[b, i, j] marks node j an ancestor of i:
    each node's depth (its position past the committed tokens), its first child and its next sibling."""
    n = draft_token_num
    masks = tree_mask.view(batch_size, n, n)
    lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
    for b, seq_len in enumerate(verified_seq_len.tolist()):
        ancestors = masks[b] & lower
        depth = ancestors.sum(dim=1).tolist()
        rows = ancestors.tolist()
        parent = [max((j for j in range(i) if rows[i][j]), default=-1) for i in range(n)]
        for tid in range(n):
            at = b * n + tid
            positions.view(-1)[at] = depth[tid] + seq_len
            retrive_index.view(-1)[at] = at
            retrive_next_token.view(-1)[at] = next((k for k in range(tid + 1, n) if rows[k][tid]), -1)
            retrive_next_sibling.view(-1)[at] = next(
                (k for k in range(tid + 1, n) if parent[tid] >= 0 and parent[k] == parent[tid]), -1)


def rotate_input_ids_cpu(input_ids: torch.Tensor, extend_start_loc: torch.Tensor, extend_seq_lens: torch.Tensor,
                         topk_index: torch.Tensor, select_index: torch.Tensor | None = None) -> None:
    """Shift each request's extend segment left by one token and put its new draft token last (or at
    select_index)."""
    selects = select_index.tolist() if select_index is not None else None
    for i, (start, length, token) in enumerate(zip(extend_start_loc.tolist(), extend_seq_lens.tolist(),
                                                   topk_index.tolist(), strict=True)):
        if length > 1:
            input_ids[start:start + length - 1] = input_ids[start + 1:start + length].clone()
        if length > 0:
            input_ids[selects[i] if selects is not None else start + length - 1] = token
