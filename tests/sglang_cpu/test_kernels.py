"""The project's CPU ``sgl_kernel`` (autotune/testing/sglang_cpu/sgl_kernel/) against plain references, on random
inputs drawn from a seed taken from the clock (printed; replay with AUTOTUNE_KERNEL_SEED=N).

Each reference is written from the op's meaning, not from its code: the bookkeeping ops as element-by-element
copies, the draft tree from parent links followed one node at a time (a dictionary of nodes, not the kernel's index
arithmetic), greedy verification as the longest root path whose every draft token is the target's choice at its
parent, attention as a softmax written out over gathered keys. Draft trees come from a simulated EAGLE expansion: top-k
beams of random scores, the best draft - 1 nodes of the whole tree kept, as SGLang's organize_draft_results keeps
them."""
from __future__ import annotations

import math
import os
import random
import time

import pytest
import torch

from autotune.testing.sglang_cpu import sgl_kernel as kernels
from autotune.testing.sglang_cpu.sgl_kernel import spec

SEED = int(os.environ.get("AUTOTUNE_KERNEL_SEED") or time.time_ns() % 2**32)
CASES = 40


@pytest.fixture(scope="module")
def rng() -> random.Random:
    print(f"kernel seed {SEED} (replay with AUTOTUNE_KERNEL_SEED={SEED})")
    torch.manual_seed(SEED)
    return random.Random(SEED)


def _table(rng: random.Random, rows: int, pool: int) -> torch.Tensor:
    return torch.tensor([[rng.randrange(10_000) for _ in range(pool)] for _ in range(rows)], dtype=torch.int32)


def test_req_to_token_scatter_and_gather_are_copies_of_each_requests_span(rng: random.Random) -> None:
    for _ in range(CASES):
        pool, rows = rng.randint(8, 40), rng.randint(2, 6)
        bs = rng.randint(1, rows)
        picked = rng.sample(range(rows), bs)
        spans = []
        for _ in range(bs):
            start = rng.randrange(pool)
            spans.append((start, rng.randint(start, pool)))
        index_type = rng.choice([torch.int32, torch.int64])
        starts = torch.tensor([s for s, _ in spans], dtype=index_type)
        ends = torch.tensor([e for _, e in spans], dtype=index_type)
        rows_t = torch.tensor(picked, dtype=rng.choice([torch.int32, torch.int64]))
        total = sum(e - s for s, e in spans)
        locs = torch.tensor([rng.randrange(10**6) for _ in range(total)], dtype=torch.int64)

        table = _table(rng, rows, pool)
        expected = table.clone()
        at = 0
        for row, (s, e) in zip(picked, spans, strict=True):
            for j in range(s, e):
                expected[row, j] = int(locs[at])
                at += 1
        spec.assign_req_to_token_pool_cpu(rows_t, table, starts, ends, locs, pool)
        assert torch.equal(table, expected)

        out = torch.full((total + rng.randint(0, 3),), -7, dtype=torch.int64)
        spec.assign_extend_cache_locs_cpu(rows_t, table, starts, ends, out, pool)
        assert out[:total].tolist() == locs.tolist()
        assert all(v == -7 for v in out[total:].tolist())


def test_an_overfull_scatter_is_refused() -> None:
    table = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="offsets require 5"):
        spec.assign_req_to_token_pool_cpu(torch.tensor([0]), table, torch.tensor([0]), torch.tensor([5]),
                                          torch.arange(4), 8)


def test_draft_slots_and_the_draft_decode_table(rng: random.Random) -> None:
    for _ in range(CASES):
        topk, steps = rng.randint(1, 4), rng.randint(1, 4)
        rows, bs = rng.randint(2, 5), rng.randint(1, 2)
        lens = [rng.randint(0, 10) for _ in range(bs)]
        pool = max(lens) + topk * steps + rng.randint(0, 4)
        picked = rng.sample(range(rows), bs)
        table = _table(rng, rows, pool)
        out = torch.empty(bs * topk * steps, dtype=torch.int64)
        spec.assign_draft_cache_locs_contiguous_cpu(torch.tensor(picked), table, torch.tensor(lens), out, pool, topk,
                                                    steps)
        expected = [int(table[row, n + j]) for row, n in zip(picked, lens, strict=True) for j in range(topk * steps)]
        assert out.tolist() == expected

        draft = spec.build_draft_decode_metadata_cpu(table, torch.tensor(picked), torch.tensor(lens), topk, steps,
                                                     pool)
        assert draft.shape == (bs * topk, pool) and draft.dtype == torch.int32
        for b, (row, n) in enumerate(zip(picked, lens, strict=True)):
            for k in range(topk):
                got = draft[b * topk + k].tolist()
                assert got[:n] == table[row, :n].tolist()
                assert got[n:n + steps] == [int(table[row, n + k * steps + s]) for s in range(steps)]


def test_bonus_tokens_and_accepted_slots(rng: random.Random) -> None:
    for _ in range(CASES):
        bs, stride = rng.randint(1, 5), rng.randint(1, 6)
        lens = [rng.randint(1, stride) for _ in range(bs)]
        tokens = torch.tensor([[rng.randrange(50_000) for _ in range(stride)] for _ in range(bs)], dtype=torch.int32)
        bonus = torch.zeros(bs, dtype=torch.int32)
        spec.fill_bonus_tokens_cpu(tokens, torch.tensor(lens, dtype=torch.int32), bonus, stride)
        assert bonus.tolist() == [int(tokens[b, n - 1]) for b, n in enumerate(lens)]

        nd = rng.randint(2, 6)
        locs = torch.tensor([rng.randrange(10**6) for _ in range(bs * nd)], dtype=torch.int64)
        index = torch.tensor([rng.choice([-1, rng.randrange(bs * nd)]) for _ in range(bs * stride)],
                             dtype=rng.choice([torch.int32, torch.int64]))
        packed = torch.full((bs * stride,), -5, dtype=torch.int64)
        spec.fill_accept_out_cache_loc_cpu(index, locs, packed)
        kept = [int(locs[i]) for i in index.tolist() if i != -1]
        assert packed[:len(kept)].tolist() == kept


def _draft_tree(rng: random.Random, bs: int, topk: int, depth: int, nd: int):
    """A simulated EAGLE expansion: (parent_list, selected_index, parent of each selected token index)."""
    first = topk
    per_step = topk * topk
    parent_lists, selected, parent_of = [], [], []
    for _ in range(bs):
        score = {}          # token index -> cumulative score
        parent = {}         # token index -> parent token index (-1: the root)
        for t in range(topk):
            score[t], parent[t] = rng.random(), -1
        beams = sorted(range(topk), key=lambda t: -score[t])
        plist = [-1]
        for step in range(1, depth):
            plist += beams
            base = first + (step - 1) * per_step
            for j, beam in enumerate(beams):
                for c in range(topk):
                    t = base + j * topk + c
                    score[t], parent[t] = score[beam] * rng.random(), beam
            layer = range(base, base + per_step)
            beams = sorted(layer, key=lambda t: -score[t])[:topk]
        keep = sorted(sorted(score, key=lambda t: -score[t])[:nd - 1])
        parent_lists.append(plist if depth > 1 else [])
        selected.append(keep)
        parent_of.append(parent)
    return parent_lists, selected, parent_of


def test_the_draft_tree_is_each_nodes_parent_chain(rng: random.Random) -> None:
    for _ in range(CASES):
        topk, depth = rng.randint(1, 4), rng.randint(1, 5)
        capacity = topk + (depth - 1) * topk * topk + 1
        nd = rng.randint(2, min(capacity, 12))
        bs = rng.randint(1, 3)
        parents, selected, parent_of = _draft_tree(rng, bs, topk, depth, nd)
        seq_lens = [rng.randint(1, 30) for _ in range(bs)]
        dtype = rng.choice([torch.int32, torch.int64])
        mode = rng.choice([0, 1])
        width = [nd if mode == 1 else n + nd for n in seq_lens]
        mask = torch.ones(sum(w * nd for w in width), dtype=torch.bool)
        positions = torch.zeros(bs * nd, dtype=dtype)
        index = torch.zeros(bs, nd, dtype=dtype)
        first, sibling = torch.full((bs, nd), -1, dtype=dtype), torch.full((bs, nd), -1, dtype=dtype)
        spec.build_tree_kernel_efficient_cpu(torch.tensor(parents, dtype=dtype).view(bs, -1),
                                             torch.tensor(selected, dtype=dtype), torch.tensor(seq_lens, dtype=dtype),
                                             mask, positions, index, first, sibling, topk, depth, nd, mode)
        at = 0
        for b in range(bs):
            node = {t: i + 1 for i, t in enumerate(selected[b])}       # token index -> node (0 is the root)
            up = {node[t]: node.get(parent_of[b][t], 0) for t in selected[b]}

            def ancestors(i: int, up: dict[int, int] = up) -> list[int]:
                chain = []
                while i:
                    i = up[i]
                    chain.append(i)
                return chain

            block = mask[at:at + width[b] * nd].view(nd, width[b])[:, width[b] - nd:]
            at += width[b] * nd
            for i in range(nd):
                seen = {i, *ancestors(i)} if i else {0}
                assert {j for j in range(nd) if block[i, j]} == seen, (b, i)
                assert int(positions[b * nd + i]) == seq_lens[b] + len(ancestors(i))
                assert int(index[b, i]) == b * nd + i
                children = sorted(j for j in range(1, nd) if up[j] == i)
                got, j = [], int(first[b, i])
                while j != -1:
                    got.append(j)
                    j = int(sibling[b, j])
                assert sorted(got) == children, (b, i)


def _longest_accepted(children: dict[int, list[int]], candidates: list[int], target: list[int]) -> list[int]:
    """The longest root path whose every node's draft token is the target's choice at its parent (a child tried
    before its later siblings when two match)."""
    best: list[int] = [0]

    def walk(path: list[int]) -> None:
        nonlocal best
        if len(path) > len(best):
            best = path
        for child in children.get(path[-1], []):
            if candidates[child] == target[path[-1]]:
                walk([*path, child])
                return

    walk([0])
    return best


def test_greedy_verification_accepts_the_longest_matching_path(rng: random.Random) -> None:
    for _ in range(CASES):
        topk, depth = rng.randint(1, 3), rng.randint(1, 4)
        capacity = topk + (depth - 1) * topk * topk + 1
        nd = rng.randint(2, min(capacity, 10))
        bs = rng.randint(1, 3)
        parents, selected, _ = _draft_tree(rng, bs, topk, depth, nd)
        mask = torch.ones(bs * nd * nd, dtype=torch.bool)
        positions = torch.zeros(bs * nd, dtype=torch.int64)
        index = torch.zeros(bs, nd, dtype=torch.int64)
        first, sibling = torch.full((bs, nd), -1), torch.full((bs, nd), -1)
        spec.build_tree_kernel_efficient_cpu(torch.tensor(parents).view(bs, -1), torch.tensor(selected),
                                             torch.tensor([5] * bs), mask, positions, index, first, sibling, topk,
                                             depth, nd, 1)
        vocab = rng.randint(2, 4)                      # a small vocabulary: drafts often match
        candidates = torch.tensor([[rng.randrange(vocab) for _ in range(nd)] for _ in range(bs)])
        target = torch.tensor([[rng.randrange(vocab) for _ in range(nd)] for _ in range(bs)])
        steps = depth + 1
        predicts = torch.full((bs * nd,), -9, dtype=torch.int32)
        accept = torch.full((bs, steps), -1, dtype=torch.int32)
        accepted = torch.zeros(bs, dtype=torch.int32)
        spec.verify_tree_greedy_cpu(predicts, accept, accepted, candidates, index, first, sibling, target)
        for b in range(bs):
            children: dict[int, list[int]] = {}
            for i in range(nd):
                j = int(first[b, i])
                while j != -1:
                    children.setdefault(i, []).append(j)
                    j = int(sibling[b, j])
            path = _longest_accepted(children, candidates[b].tolist(), target[b].tolist())
            assert int(accepted[b]) == len(path) - 1
            assert accept[b].tolist() == [b * nd + i for i in path] + [-1] * (steps - len(path))
            for i in path:
                assert int(predicts[b * nd + i]) == int(target[b, i])


def test_the_ngram_trees_links_come_back_from_its_mask(rng: random.Random) -> None:
    for _ in range(CASES):
        n, bs = rng.randint(1, 9), rng.randint(1, 3)
        masks, parent_sets = [], []
        for _ in range(bs):
            up = {0: -1}
            for i in range(1, n):
                up[i] = rng.randrange(i)               # a tree in breadth order: every parent comes first
            m = torch.zeros(n, n, dtype=torch.bool)
            for i in range(n):
                j = i
                while j != -1:
                    m[i, j] = True
                    j = up[j]
            masks.append(m)
            parent_sets.append(up)
        lens = [rng.randint(0, 20) for _ in range(bs)]
        out = [torch.zeros(bs * n, dtype=torch.int64) for _ in range(4)]
        spec.reconstruct_indices_from_tree_mask(torch.stack(masks).view(-1), torch.tensor(lens), *out, bs, n)
        positions, index, first, sibling = (t.view(bs, n) for t in out)
        for b, up in enumerate(parent_sets):
            for i in range(n):
                depth, j = 0, i
                while up[j] != -1:
                    depth, j = depth + 1, up[j]
                assert int(positions[b, i]) == lens[b] + depth
                assert int(index[b, i]) == b * n + i
                kids = [k for k in range(n) if up.get(k) == i]
                assert int(first[b, i]) == (min(kids) if kids else -1)
                later = [k for k in range(i + 1, n) if up[i] != -1 and up[k] == up[i]]
                assert int(sibling[b, i]) == (min(later) if later else -1)


def test_rotating_the_extend_ids(rng: random.Random) -> None:
    for _ in range(CASES):
        lens = [rng.randint(0, 5) for _ in range(rng.randint(1, 4))]
        starts = [sum(lens[:i]) for i in range(len(lens))]
        ids = torch.tensor([rng.randrange(1000) for _ in range(sum(lens))], dtype=torch.int64)
        new = torch.tensor([rng.randrange(1000, 2000) for _ in lens], dtype=torch.int64)
        expected = ids.tolist()
        for s, n, t in zip(starts, lens, new.tolist(), strict=True):
            if n:
                expected[s:s + n] = [*expected[s + 1:s + n], t]
        spec.rotate_input_ids_cpu(ids, torch.tensor(starts), torch.tensor(lens), new)
        assert ids.tolist() == expected


def test_kv_slot_copies_and_stores(rng: random.Random) -> None:
    buffers = [torch.randn(12, 3, 4) for _ in range(3)]
    before = [b.clone() for b in buffers]
    pairs = [(rng.randrange(12), rng.randrange(12)) for _ in range(4)]
    targets = list(dict.fromkeys(t for t, _ in pairs))
    sources = [dict(pairs)[t] for t in targets]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers], dtype=torch.int64)
    kernels.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor(targets), torch.tensor(sources))
    for after, old in zip(buffers, before, strict=True):
        for slot in range(12):
            want = old[sources[targets.index(slot)]] if slot in targets else old[slot]
            assert torch.equal(after[slot], want)

    k_cache, v_cache = torch.zeros(10, 2, 4), torch.zeros(10, 2, 4)
    key, value = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    slots = torch.tensor([7, 1, 4])
    torch.ops.sgl_kernel.store_cache_cpu(key, value, k_cache, v_cache, slots, 8)
    assert torch.equal(k_cache[slots], key) and torch.equal(v_cache[slots], value)
    assert float(k_cache[[0, 2, 3, 5, 6, 8, 9]].abs().sum()) == 0.0


def _naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: list[list[bool]],
                     scale: float) -> torch.Tensor:
    """Query by query, head by head: softmax over the visible keys of the query head's kv head."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], heads, v.shape[2])
    for i in range(q.shape[0]):
        for h in range(heads):
            g = h // (heads // kv_heads)
            keys = [j for j in range(k.shape[0]) if visible[i][j]]
            logits = [float(q[i, h] @ k[j, g]) * scale for j in keys]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            out[i, h] = sum(w / total * v[j, g] for w, j in zip(weights, keys, strict=True))
    return out


def test_extend_attention_sees_the_prefix_and_causal_or_tree_visibility(rng: random.Random) -> None:
    heads, kv_heads, dim = 4, 2, 8
    for _ in range(8):
        slots, rows = 64, 4
        bs = rng.randint(1, 3)
        prefix = [rng.randint(0, 6) for _ in range(bs)]
        tree = rng.random() < 0.5
        extend = [rng.randint(1, 5)] * bs if tree else [rng.randint(1, 5) for _ in range(bs)]
        table = torch.tensor([rng.sample(range(slots), 16) for _ in range(rows)], dtype=torch.int32)
        k_buffer, v_buffer = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
        starts = [sum(extend[:i]) for i in range(bs)]
        q = torch.randn(sum(extend), heads, dim)
        k_new, v_new = torch.randn(sum(extend), kv_heads, dim), torch.randn(sum(extend), kv_heads, dim)
        masks = [[[j <= i or rng.random() < 0.0 for j in range(n)] for i in range(n)] for n in extend]
        if tree:
            for m in masks:
                for i in range(1, len(m)):
                    parent = rng.randrange(i)
                    m[i] = [j == i or m[parent][j] for j in range(len(m))]
        picked = rng.sample(range(rows), bs)
        out = torch.zeros(sum(extend), heads, dim)
        torch.ops.sgl_kernel.extend_attention_cpu(
            q, k_new, v_new, out, k_buffer, v_buffer, 1.0, 1.0, table, torch.tensor(picked),
            torch.tensor([p + e for p, e in zip(prefix, extend, strict=True)]),
            torch.tensor(extend, dtype=torch.int32),
            torch.tensor(starts, dtype=torch.int32), max(extend), 0.3, 0.0, False, 0, None, None,
            torch.tensor(masks).view(-1) if tree else None, True)
        for b in range(bs):
            s, n, p = starts[b], extend[b], prefix[b]
            idx = table[picked[b], :p].long()
            k = torch.cat([k_buffer[idx], k_new[s:s + n]])
            v = torch.cat([v_buffer[idx], v_new[s:s + n]])
            visible = [[True] * p + masks[b][i] for i in range(n)]
            want = _naive_attention(q[s:s + n], k, v, visible, 0.3)
            assert torch.allclose(out[s:s + n], want, atol=1e-5), (b, tree)


def test_decode_attention_writes_the_new_token_and_attends_to_all(rng: random.Random) -> None:
    heads, kv_heads, dim, slots = 6, 3, 8, 48
    for _ in range(8):
        bs = rng.randint(1, 4)
        # each request's tokens in slots of its own (two requests never share a KV slot)
        table = torch.tensor(rng.sample(range(slots), bs * 12), dtype=torch.int32).view(bs, 12)
        lens = [rng.randint(1, 12) for _ in range(bs)]
        k_cache, v_cache = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
        key, value = torch.randn(bs, kv_heads, dim), torch.randn(bs, kv_heads, dim)
        loc = torch.tensor([int(table[b, n - 1]) for b, n in enumerate(lens)])
        q = torch.randn(bs, heads, dim)
        out = torch.zeros(bs, heads, dim)
        torch.ops.sgl_kernel.decode_attention_cpu(
            q, k_cache, v_cache, 1.0, 1.0, out, key, value, loc, torch.zeros(bs, heads, 8, dim + 1), table,
            torch.arange(bs), torch.tensor(lens), 0.25, 0.0, False, 0, None, None)
        for b in range(bs):
            assert torch.equal(k_cache[loc[b]], key[b]) and torch.equal(v_cache[loc[b]], value[b])
            idx = table[b, :lens[b]].long()
            want = _naive_attention(q[b:b + 1], k_cache[idx], v_cache[idx], [[True] * lens[b]], 0.25)
            assert torch.allclose(out[b:b + 1], want, atol=1e-5)


def test_the_dense_layer_ops_match_torchs_own() -> None:
    x, w = torch.randn(5, 16), torch.randn(16)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(torch.ops.sgl_kernel.rmsnorm_cpu(x, w, 1e-6), want, atol=1e-5)
    residual = torch.randn(5, 16)
    summed = residual + x
    inp = x.clone()
    torch.ops.sgl_kernel.fused_add_rmsnorm_cpu(inp, residual, w, 1e-6)
    assert torch.allclose(residual, summed)
    assert torch.allclose(inp, summed / torch.sqrt((summed * summed).mean(-1, keepdim=True) + 1e-6) * w, atol=1e-5)
    gate_up = torch.randn(3, 10)
    assert torch.allclose(torch.ops.sgl_kernel.silu_and_mul_cpu(gate_up),
                          torch.nn.functional.silu(gate_up[:, :5]) * gate_up[:, 5:])
    weight, bias = torch.randn(7, 16), torch.randn(7)
    packed = torch.ops.sgl_kernel.convert_weight_packed(weight)
    assert torch.allclose(torch.ops.sgl_kernel.weight_packed_linear(x, packed, bias, True), x @ weight.T + bias,
                          atol=1e-5)


def test_rotary_embedding_rotates_each_pair_by_its_positions_angle() -> None:
    dim, heads, tokens = 8, 2, 5
    positions = torch.tensor([0, 3, 1, 7, 2])
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(16).float()[:, None] * inv[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    q, k = torch.randn(tokens, heads * dim), torch.randn(tokens, heads * dim)
    for neox in (True, False):
        rq, rk = torch.ops.sgl_kernel.rotary_embedding_cpu(positions, q, k, dim, cache, neox)
        for t in range(tokens):
            for h in range(heads):
                for i in range(dim // 2):
                    a, b = (i, i + dim // 2) if neox else (2 * i, 2 * i + 1)
                    theta = float(positions[t]) * float(inv[i])
                    x, y = float(q[t, h * dim + a]), float(q[t, h * dim + b])
                    assert math.isclose(float(rq[t, h * dim + a]), x * math.cos(theta) - y * math.sin(theta),
                                        abs_tol=1e-5)
                    assert math.isclose(float(rq[t, h * dim + b]), y * math.cos(theta) + x * math.sin(theta),
                                        abs_tol=1e-5)
        assert rk.shape == k.shape
