"""Tree verification from logits (Triton): greedy walk and rejection-sampling walk over ragged draft trees.

Layout and semantics: ``verispec.verify.tree_reference`` (the oracle). A tree batch has exactly the rows of a
chain batch with num_draft = num_nodes (per sequence the root's row, then one row per node), so the row-wise
first pass of the chain kernels runs on it unchanged; only the per-sequence second pass knows the tree.

Greedy: ``verify_tree_greedy_triton``, 2 launches, both CUDA-graph capturable (grids from host ints only):

  1. ``greedy._partial_argmax_kernel``  grid (R, S): per (row, V-chunk) its max, lowest argmax, NaN seen
  2. ``_tree_greedy_kernel``  grid (B,)
     Program b merges the partials of its n_b + 1 rows into one argmax per row, holds its nodes' tokens and
     parents as [BLOCK_N] vectors, and walks D steps: at node c the next node is
         min{ j : parents[j] == c and tokens[j] == argmax(row of c) }      (the first match in index order)
     e.g. parents [-1, -1, 1], tokens [2, 1, 0], argmax per row [1, 0, 2, 0]: from the root (row 0, argmax 1)
     node 1 matches; at node 1 (row 2, argmax 2) its child node 2 has token 0: stop and emit 2.
     It writes tokens / path / counts and the status word (as the chain scan: NaN, +inf, all -inf rows over
     every row of the sequence, draft ids, the layout).

Sampling: ``verify_tree_sample_triton``, 2 launches:

  1. ``rejection._row_stats_kernel``  grid (B, max n_b + 1, S): per (row, V-chunk) the base-2 softmax partials
     (M, Z), the top-k / top-p cut, the argmax for T = 0 rows, the status flags, the q chunk sums
  2. ``_tree_sample_kernel``  grid (B,)
     Program b merges its rows' partials and walks the tree. At node c it tests c's children in index order
     against the residual r = w / norm, which starts as (p, 1) and is never materialized while no child was
     rejected: the first child's test is the chain's u * q(x) < p(x) (one gathered logit, one gathered q).
     A rejection costs two passes over V: the sum of max(r - q, 0), then (if it is > 0) the new weights
     written to a [B, V] float32 scratch row. The stop row's token is raced over the weights (p at a leaf) in
     one pass, E_v = -log(u_v) from the RACE stream at the stop row's local index.

Bound: the logits once (pass 1), plus per sequence the stop row again and, per rejected child with siblings
left or recovered, up to three V-passes of the scratch row and q. The race is not split over V here (one
program per sequence: slow for small B at large V; the chain sampler splits it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tree_reference import TreeVerifyOutput
from .greedy import (DRAFT_ID, NUM_DRAFT, argmax_partials, default_block, device_programs, layout_status,
                     merge_argmax_partials, new_outputs, small_block, split_vocab)
from .rejection import (_pick, _row_stats_kernel, _sequence_status, _uniform, merge_row_partials,
                        sequence_settings)

_INT32_MAX = tl.constexpr(2**31 - 1)


def _new_tree_outputs(size: int, max_depth: int, device: torch.device) -> TreeVerifyOutput:
    """Uninitialized outputs: tokens [B, D + 1], counts and status (one allocation), path [B, D]."""
    out = new_outputs(size, max_depth + 1, device)
    path = torch.empty(size, max_depth, dtype=torch.int32, device=device)
    return TreeVerifyOutput(out.tokens, out.num_accepted, out.num_emitted, path, out.status)


@triton.jit
def _pick_at(values, pos, at):
    """values[at] of a register vector (``pos`` = its indices): a masked sum, as Triton has no register gather."""
    return tl.sum(tl.where(pos == at, values, 0), axis=0)


@triton.jit
def _tree_greedy_kernel(
    part_ptr,  # [3, R, S] int32 (greedy._partial_argmax_kernel): max bits, lowest argmax, NaN seen
    draft_tokens_ptr,  # [N] int64
    parents_ptr,  # [N] int32, local to the sequence (-1 = the root)
    num_nodes_ptr,  # [B] int32
    cu_num_nodes_ptr,  # [B + 1] int32
    tokens_ptr,  # [B, D + 1] int32 out
    path_ptr,  # [B, D] int32 out
    num_accepted_ptr,  # [B] int32 out
    num_emitted_ptr,  # [B] int32 out
    status_ptr,  # [B] int32 out
    num_rows,  # R
    num_drafts,  # N
    vocab,
    num_splits,
    max_depth,  # D
    max_num_nodes,
    BLOCK_N: tl.constexpr,  # >= max n_b + 1: one lane per row of a sequence (row j + 1 = node j)
    BLOCK_S: tl.constexpr,  # >= num_splits
    BLOCK_D: tl.constexpr,  # >= D + 1
):
    b = tl.program_id(0)
    n, node0, layout_ok = layout_status(num_nodes_ptr, cu_num_nodes_ptr, b, num_rows, max_num_nodes)
    row0 = node0 + b
    pos = tl.arange(0, BLOCK_N)
    row_argmax, rows_word = merge_argmax_partials(part_ptr, row0, n, num_rows, num_splits, BLOCK_N, BLOCK_S)
    # lane j also holds node j (its token and parent)
    in_nodes = (pos < n) & (node0 + pos >= 0) & (node0 + pos < num_drafts)
    token = tl.load(draft_tokens_ptr + node0 + pos, mask=in_nodes, other=-1)
    parent = tl.load(parents_ptr + node0 + pos, mask=in_nodes, other=-2)

    depth = tl.arange(0, BLOCK_D)
    out_tokens = tl.full([BLOCK_D], -1, tl.int32)
    out_path = tl.full([BLOCK_D], -1, tl.int32)
    node = tl.full([], -1, tl.int32)  # the root
    num_accepted = tl.zeros([], tl.int32)
    done = tl.zeros([], tl.int1)
    for d in range(0, max_depth):
        argmax = _pick_at(row_argmax, pos, node + 1)
        match = in_nodes & (parent == node) & (token == argmax)
        child = tl.min(tl.where(match, pos, _INT32_MAX), axis=0)
        step = ~done & (child < _INT32_MAX)
        out_tokens = tl.where(step & (depth == d), argmax, out_tokens)
        out_path = tl.where(step & (depth == d), child, out_path)
        node = tl.where(step, child, node)
        num_accepted += step.to(tl.int32)
        done = ~step
    out_tokens = tl.where(depth == num_accepted, _pick_at(row_argmax, pos, node + 1), out_tokens)
    tl.store(tokens_ptr + b * (max_depth + 1) + depth, out_tokens, mask=depth <= max_depth)
    tl.store(path_ptr + b * max_depth + depth, out_path, mask=depth < max_depth)
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(num_emitted_ptr + b, num_accepted + 1)
    word = rows_word | tl.where(tl.max((in_nodes & ((token < 0) | (token >= vocab))).to(tl.int32), 0) > 0, DRAFT_ID, 0)
    tl.store(status_ptr + b, tl.where(layout_ok, word, NUM_DRAFT))


def verify_tree_greedy_triton(tree, *, block: int | None = None, num_splits: int | None = None) -> TreeVerifyOutput:
    """Greedy verification of a validated ``verispec.verify.tree_api.TreeBatch`` (module docstring), with the
    status word of every sequence; no host sync. ``block`` / ``num_splits`` override the first pass's tiling."""
    batch = tree.batch
    logits = batch.target_logits  # [R, V]
    num_rows, vocab = logits.shape
    size = batch.batch_size
    part, splits = argmax_partials(logits, block, num_splits)
    out = _new_tree_outputs(size, tree.max_depth, logits.device)
    _tree_greedy_kernel[(size,)](
        part, batch.draft_tokens, tree.parents, batch.num_draft, batch.cu_num_draft, out.tokens, out.path,
        out.num_accepted, out.num_emitted, out.status, num_rows, batch.draft_tokens.shape[0], vocab, splits,
        tree.max_depth, batch.max_num_draft, BLOCK_N=small_block(batch.max_num_draft + 1),
        BLOCK_S=small_block(splits), BLOCK_D=small_block(tree.max_depth + 1), num_warps=4,
    )
    return out


@triton.jit
def _target_p(row_ptr, idx, in_row, scale, row_max, inv_sum, cut):
    """p_v of one row at ids ``idx`` from its merged statistics (base 2: y = logits * scale)."""
    y = tl.load(row_ptr + idx, mask=in_row, other=-float("inf")).to(tl.float32) * scale
    return tl.where(y >= cut, tl.exp2(y - row_max) * inv_sum, 0.0)


@triton.jit
def _residual_pass(row_ptr, q_row_ptr, scratch_ptr, vocab, scale, row_max, inv_sum, cut, norm, from_scratch, x,
                   HAS_DRAFT_PROBS: tl.constexpr, WRITE: tl.constexpr, BLOCK: tl.constexpr):
    """sum_v max(w_v / norm - q_v, 0), with w = the scratch row (``from_scratch``) or p, and q the rejected child's
    row (or the point mass at x); WRITE also stores the terms into the scratch row (the next residual's weights).
    Each lane reads and writes only its own ids, so reading and writing one scratch row in place is safe."""
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + lane
        in_row = idx < vocab
        p = _target_p(row_ptr, idx, in_row & (from_scratch == 0), scale, row_max, inv_sum, cut)
        w = tl.where(from_scratch != 0, tl.load(scratch_ptr + idx, mask=in_row & (from_scratch != 0), other=0.0), p)
        if HAS_DRAFT_PROBS:
            q = tl.load(q_row_ptr + idx, mask=in_row, other=0.0).to(tl.float32)
        else:
            q = tl.where(idx == x, 1.0, 0.0)
        d = tl.where(in_row, tl.maximum(w / norm - q, 0.0), 0.0)
        acc += d
        if WRITE:
            tl.store(scratch_ptr + idx, d, mask=in_row)
    return tl.sum(acc, axis=0)


@triton.jit
def _tree_sample_kernel(
    logits_ptr,  # [R, V] float
    draft_probs_ptr,  # [N, V] float (unused without HAS_DRAFT_PROBS)
    draft_tokens_ptr,  # [N] int64
    parents_ptr,  # [N] int32, local to the sequence (-1 = the root)
    num_nodes_ptr,  # [B] int32
    cu_num_nodes_ptr,  # [B + 1] int32
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32
    top_p_ptr,  # [B] float32
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64
    part_max_ptr,  # [R, S] float32 (rejection._row_stats_kernel)
    part_sum_ptr,  # [R, S] float32
    part_idx_ptr,  # [R, S] int32
    part_flag_ptr,  # [R, S] int32
    part_qsum_ptr,  # [R, S] float32
    row_cut_ptr,  # [R] float32
    scratch_ptr,  # [B, V] float32 scratch: the current residual's weights of sequence b
    tokens_ptr,  # [B, D + 1] int32 out
    path_ptr,  # [B, D] int32 out
    num_accepted_ptr,  # [B] int32 out
    num_emitted_ptr,  # [B] int32 out
    status_ptr,  # [B] int32 out
    stride_row,
    stride_q,
    num_rows,
    num_drafts,
    num_splits,
    vocab,
    max_depth,  # D
    max_num_nodes,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= max n_b + 1: one lane per row of a sequence (row j + 1 = node j)
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,  # >= D + 1
    BLOCK: tl.constexpr,  # V tile of the residual and race passes
):
    b = tl.program_id(0)
    n, node0, layout_ok = layout_status(num_nodes_ptr, cu_num_nodes_ptr, b, num_rows, max_num_nodes)
    row0 = node0 + b
    temp, sampled, scale, seed, offset = sequence_settings(temperature_ptr, seed_ptr, offset_ptr, b)

    # merge every row's partials (as the chain's _first_rejection): lane i = local row i
    pos = tl.arange(0, BLOCK_N)
    _rows, _in_rows, row_max, row_sum, row_cut, row_argmax = merge_row_partials(
        part_max_ptr, part_sum_ptr, part_idx_ptr, row_cut_ptr, row0, n, num_rows, num_splits, BLOCK_N, BLOCK_S,
    )
    # lane j also holds node j: its token (as given, and clamped into [0, V) to index rows), parent, q(token)
    has_draft = (pos < n) & (node0 + pos >= 0) & (node0 + pos < num_drafts)
    given = tl.load(draft_tokens_ptr + node0 + pos, mask=has_draft, other=0)
    draft = tl.minimum(tl.maximum(given, 0), vocab - 1).to(tl.int32)
    parent = tl.load(parents_ptr + node0 + pos, mask=has_draft, other=-2)
    if HAS_DRAFT_PROBS:
        q_x = tl.load(draft_probs_ptr + (node0 + pos).to(tl.int64) * stride_q + draft, mask=has_draft,
                      other=1.0).to(tl.float32)
    else:
        q_x = tl.full([BLOCK_N], 1.0, tl.float32)
    word = _sequence_status(part_flag_ptr, part_qsum_ptr, row0, n, num_rows, vocab, num_splits, row_max, given,
                            has_draft, q_x, temp, tl.load(top_k_ptr + b), tl.load(top_p_ptr + b), HAS_DRAFT_PROBS,
                            BLOCK_N, BLOCK_S)
    tl.store(status_ptr + b, tl.where(layout_ok, word, NUM_DRAFT))

    # the walk: each step tests one child of `node` (after `last` in index order) or stops; a node is tested at
    # most once, so n + 1 steps always reach the stop
    scratch_row = scratch_ptr + b.to(tl.int64) * vocab
    depth = tl.arange(0, BLOCK_D)
    out_tokens = tl.full([BLOCK_D], -1, tl.int32)
    out_path = tl.full([BLOCK_D], -1, tl.int32)
    node = tl.full([], -1, tl.int32)
    last = tl.full([], -1, tl.int32)
    num_accepted = tl.zeros([], tl.int32)
    done = tl.zeros([], tl.int32)
    from_scratch = tl.zeros([], tl.int32)  # the residual's weights: 0 = p of the node's row, 1 = the scratch row
    norm = tl.full([], 1.0, tl.float32)
    for step in range(0, max_num_nodes + 1):
        if done == 0:
            child = tl.min(tl.where(has_draft & (parent == node) & (pos > last), pos, _INT32_MAX), axis=0)
            if child == _INT32_MAX:
                done = 1
            else:
                x = _pick_at(draft, pos, child)
                row_max_c = _pick_at(row_max, pos, node + 1)
                row_sum_c = _pick_at(row_sum, pos, node + 1)
                cut_c = tl.max(tl.where(pos == node + 1, row_cut, -float("inf")), axis=0)
                row_ptr = logits_ptr + (row0 + node + 1).to(tl.int64) * stride_row
                if sampled:
                    if from_scratch != 0:
                        r_x = tl.load(scratch_row + x) / norm
                    else:
                        y_x = tl.load(row_ptr + x).to(tl.float32) * scale
                        r_x = tl.where(y_x >= cut_c, tl.exp2(y_x - row_max_c) / row_sum_c, 0.0)
                    u = _uniform(seed, offset, child, tl.zeros_like(child), 0)  # rng.ACCEPT at the node's index
                    # u * q(x) formed exactly in float64, as the reference does (two 24-bit mantissas)
                    accept = u.to(tl.float64) * _pick_at(q_x, pos, child).to(tl.float64) < r_x.to(tl.float64)
                else:
                    accept = x == _pick_at(row_argmax, pos, node + 1)
                if accept:
                    out_tokens = tl.where(depth == num_accepted, x, out_tokens)
                    out_path = tl.where(depth == num_accepted, child, out_path)
                    num_accepted += 1
                    node = child
                    last = -1
                    from_scratch = 0
                    norm = 1.0
                else:
                    last = child
                    if sampled:
                        q_row_ptr = draft_probs_ptr + (node0 + child).to(tl.int64) * stride_q
                        inv_sum = 1.0 / row_sum_c
                        total = _residual_pass(row_ptr, q_row_ptr, scratch_row, vocab, scale, row_max_c, inv_sum,
                                               cut_c, norm, from_scratch, x, HAS_DRAFT_PROBS, False, BLOCK)
                        if total > 0:  # else rounding emptied the residual: keep the current one (the reference)
                            _residual_pass(row_ptr, q_row_ptr, scratch_row, vocab, scale, row_max_c, inv_sum, cut_c,
                                           norm, from_scratch, x, HAS_DRAFT_PROBS, True, BLOCK)
                            tl.debug_barrier()  # the scratch row is read back by other lanes (gather, race)
                            from_scratch = 1
                            norm = total

    # the stop row (local row node + 1): race over the residual's weights, E_v from rng.RACE at that row
    stop = node + 1
    stop_ptr = logits_ptr + (row0 + stop).to(tl.int64) * stride_row
    stop_max = _pick_at(row_max, pos, stop)
    inv_sum = 1.0 / _pick_at(row_sum, pos, stop)
    stop_cut = tl.max(tl.where(pos == stop, row_cut, -float("inf")), axis=0)
    emitted = _pick_at(row_argmax, pos, stop)
    if sampled:
        lane = tl.arange(0, BLOCK)
        best_key = tl.full([BLOCK], -1.0, tl.float32)
        best_idx = lane
        for start in range(0, vocab, BLOCK):
            idx = start + lane
            in_row = idx < vocab
            p = _target_p(stop_ptr, idx, in_row & (from_scratch == 0), scale, stop_max, inv_sum, stop_cut)
            w = tl.where(from_scratch != 0, tl.load(scratch_row + idx, mask=in_row & (from_scratch != 0), other=0.0), p)
            exponential = -tl.log(_uniform(seed, offset, stop + tl.zeros_like(idx), idx, 1))  # rng.RACE
            key = tl.where(in_row, tl.fdiv(w, exponential), -1.0)
            better = key > best_key
            best_key = tl.where(better, key, best_key)
            best_idx = tl.where(better, idx, best_idx)
        _best, emitted = _pick(best_key, best_idx, 0)
    out_tokens = tl.where(depth == num_accepted, emitted, out_tokens)
    tl.store(tokens_ptr + b * (max_depth + 1) + depth, out_tokens, mask=depth <= max_depth)
    tl.store(path_ptr + b * max_depth + depth, out_path, mask=depth < max_depth)
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(num_emitted_ptr + b, num_accepted + 1)


def row_statistics(batch, block: int, num_splits: int | None = None) -> dict:
    """Launch the chain sampler's first pass (``rejection._row_stats_kernel``, every row, no waves) on the chain
    view of a tree batch; returns its buffers (the same launch as ``verify_sample_triton``'s)."""
    logits = batch.target_logits
    num_rows, vocab = logits.shape
    chunk, splits = split_vocab(vocab, num_rows, block, device_programs(logits.device), num_splits)
    part = num_rows * splits
    f32 = torch.empty(3 * part + num_rows, dtype=torch.float32, device=logits.device)
    i32 = torch.empty(2 * part, dtype=torch.int32, device=logits.device)
    stats = dict(part_max=f32[:part], part_sum=f32[part:2 * part], part_qsum=f32[2 * part:3 * part],
                 row_cut=f32[3 * part:], part_idx=i32[:part], part_flag=i32[part:], splits=splits)
    q = batch.draft_probs if batch.draft_probs is not None else logits  # never read without HAS_DRAFT_PROBS
    _row_stats_kernel[(batch.batch_size, batch.max_num_draft + 1, splits)](
        logits, q, batch.draft_tokens, batch.seed, batch.offset, batch.num_draft, batch.cu_num_draft,
        batch.temperature, batch.top_k, batch.top_p, stats["part_max"], stats["part_sum"], stats["part_idx"],
        stats["part_flag"], stats["part_qsum"], stats["row_cut"], logits.stride(0), q.stride(0), num_rows,
        batch.draft_tokens.shape[0], batch.max_num_draft, vocab, chunk, splits, 0,
        HAS_DRAFT_PROBS=batch.draft_probs is not None, CHECK_PREFIX=False, BLOCK=block, G=min(8, block),
        BLOCK_K=small_block(batch.max_num_draft + 1), BLOCK_S=small_block(splits), num_warps=8,
    )
    return stats


def verify_tree_sample_triton(tree, *, block: int | None = None, num_splits: int | None = None) -> TreeVerifyOutput:
    """Tree rejection sampling of a validated ``verispec.verify.tree_api.TreeBatch`` (module docstring): the
    settings and seed / offset are [B] device tensors in ``tree.batch``; no host sync. ``block`` / ``num_splits``
    override the tiling of the first pass (tests use them to force the split path)."""
    batch = tree.batch
    logits = batch.target_logits
    num_rows, vocab = logits.shape
    size, device = batch.batch_size, logits.device
    # NOTE: the chain sampler's tiles (4096 / 2048 elements on a GPU; the walk's V passes carry a Philox state
    # only in the race, so they use the race's smaller tile)
    walk_block = block or (2048 if device.type == "cuda" else default_block(vocab, logits.dtype, device))
    stats = row_statistics(batch, block or (4096 if device.type == "cuda" else walk_block), num_splits)
    scratch = torch.empty(size * vocab, dtype=torch.float32, device=device)
    out = _new_tree_outputs(size, tree.max_depth, device)
    q = batch.draft_probs if batch.draft_probs is not None else logits
    _tree_sample_kernel[(size,)](
        logits, q, batch.draft_tokens, tree.parents, batch.num_draft, batch.cu_num_draft, batch.temperature,
        batch.top_k, batch.top_p, batch.seed, batch.offset, stats["part_max"], stats["part_sum"], stats["part_idx"],
        stats["part_flag"], stats["part_qsum"], stats["row_cut"], scratch, out.tokens, out.path, out.num_accepted,
        out.num_emitted, out.status, logits.stride(0), q.stride(0), num_rows, batch.draft_tokens.shape[0],
        stats["splits"], vocab, tree.max_depth, batch.max_num_draft, HAS_DRAFT_PROBS=batch.draft_probs is not None,
        BLOCK_N=small_block(batch.max_num_draft + 1), BLOCK_S=small_block(stats["splits"]),
        BLOCK_D=small_block(tree.max_depth + 1), BLOCK=walk_block, num_warps=8,
    )
    return out
