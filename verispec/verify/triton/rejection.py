"""Fused rejection-sampling verification from logits (Triton).

Semantics: ``verispec.verify.reference.reference_verify_sample`` (the oracle) with the distributions of
``verispec.verify.sampling`` and the random stream of ``verispec.verify.rng``. Vocabulary: accepted drafts,
then one recovered (first rejection) or bonus (all accepted) token.

Per target row r of sequence b the kernels need only three numbers, never a materialized
softmax. They work in base 2, y = logits[r] * (log2(e) / T), so that every exponential is one
ex2 instruction (exp(z - M) = 2**(y - M2)):
    M_r    max_v y_v
    thr_r  the top-k / top-p cut as a value threshold on y (-inf when both are off)
    Z_r    sum_{y_v >= thr_r} 2**(y_v - M_r)            so p_v = [y_v >= thr_r] 2**(y_v - M_r) / Z_r
These equal the reference's float32 values up to rounding (a few ulps: y is a product, not the
reference's quotient z = l / T, and the GPU's ex2 / lg2 are approximate), so a token can differ
from the reference only where two candidates tie to within those ulps (see the tests).

Three launches (two when one program per sequence already fills the GPU), all CUDA-graph
capturable: seed / offset are read from device tensors, grids depend on host ints only.
Random numbers: sequence b's program reads its own seed[b] / offset[b] and draws at local rows
i in [0, k_b] (``verispec.verify.rng``), never at the global row index, so a sequence's tokens
do not depend on its batch neighbours.

  1. ``_row_stats_kernel``  grid (B, max_k + 1, S)
     Program (b, i, s) streams V-chunk s of row i of sequence b with an online max / sum-exp
     (the argmax instead, for T = 0 rows) and writes one partial to [R, S] buffers. The max is
     kept per group of G = 8 neighbouring elements, so there are 1 + 1/G exponentials per
     element instead of 2. Rows with
     top-k / top-p are done whole by split 0: the cut is found without sorting, by a 16-way
     bisection over the float32 order (8 passes of 4 bits each, re-reading the row from L2),
     counting (top-k) or summing exp (top-p) above 16 candidate thresholds per pass.
  2. ``_accept_race_kernel``  grid (B, S2)
     Each program merges its sequence's partials, runs every accept test
     ``u_r * q(x) < p(x)`` (one gathered logit, one gathered q, one Philox draw per draft),
     finds the first rejection, and races over V-chunk s of the one stop row:
         recovered: argmax_v max(0, p_v - q_v) / E_v        bonus: argmax_v p_v / E_v
     with E_v = -log(u_v) from the RACE stream (the race needs no normalizer or prefix sum).
     With S2 == 1 it also writes the outputs (no third launch).
  3. ``_finalize_kernel``  grid (B,)  merges the S2 race partials and writes the stop token.

Bytes read: all of target_logits once (pass 1), the stop row of each sequence again (pass 2,
often from L2), one draft_probs row per rejected sequence, and a few gathers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import rng, status
from ..reference import VerifyOutput
from ..sampling import MIN_TEMPERATURE
from .greedy import (DEAD_ROW, DRAFT_ID, NAN, NUM_DRAFT, POS_INF, default_block, device_programs, layout_status,
                     new_outputs, or_bits, small_block, split_vocab)

_INT32_MAX = tl.constexpr(2**31 - 1)
SCALED = tl.constexpr(status.SCALED)
SETTINGS = tl.constexpr(status.SETTINGS)
DRAFT_PROBS = tl.constexpr(status.DRAFT_PROBS)
_LIVE = tl.constexpr(1 << 30)  # a chunk flag, never in a status word: the chunk has an entry > -inf
_MIN_TEMPERATURE = tl.constexpr(MIN_TEMPERATURE)
_MAX_SCALED_Y = tl.constexpr(status.MAX_SCALED_LOGIT * 1.4426950408889634)  # the bound on |l / T| in base 2
_KEY_NEG_INF = tl.constexpr(-2139095041)  # order key of float32 -inf (see _key_to_float)
_KEY_POS_INF = tl.constexpr(2139095040)  # order key of float32 +inf
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _uniform(seed, offset, row, col, PURPOSE: tl.constexpr):
    """``verispec.verify.rng.uniform``: Philox-4x32-10 at counter (col, row, offset, purpose), word 0.

    ``seed`` / ``offset``: one sequence's int64 key and offset; ``row`` (local to the sequence) /
    ``col`` are int32 blocks of one shape; the result is float32 in (0, 1), exact.
    """
    c0 = col.to(tl.int32)
    c1 = row.to(tl.int32) + tl.zeros_like(c0)
    c0 = c0 + tl.zeros_like(c1)
    c2 = (offset & 0xFFFFFFFF).to(tl.uint32) + tl.zeros_like(c0).to(tl.uint32)
    c3 = tl.full(c0.shape, PURPOSE, tl.uint32)
    x, _, _, _ = tl.philox(seed, c0.to(tl.uint32, bitcast=True), c1.to(tl.uint32, bitcast=True), c2, c3)
    return ((x >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08  # 2**-24


@triton.jit
def _key_to_float(key):
    """Inverse of the order key k(f) = bits ^ ((bits >> 31) & 0x7FFFFFFF) (an involution):
    int32 keys sort exactly like the float32 values they encode."""
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _raw_flags(x):
    """Status bits of raw float32 logits, elementwise: NAN, POS_INF, and _LIVE for entries > -inf."""
    return tl.where(x != x, NAN, 0) | tl.where(x == float("inf"), POS_INF, 0) | tl.where(x > float("-inf"), _LIVE, 0)


@triton.jit
def _q_chunk(q_row_ptr, vocab, start, chunk, BLOCK: tl.constexpr):
    """(sum, NaN-or-negative seen) of one q row over V-chunk [start, start + chunk)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int1)
    for t in range(0, chunk, BLOCK):
        idx = start + t + offs
        q = tl.load(q_row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32)
        acc += q
        bad = bad | (q != q) | (q < 0)
    return tl.sum(acc, axis=0), tl.max(bad.to(tl.int32), axis=0) > 0


@triton.jit
def _bisect_cut(row_ptr, vocab, scale, z_max, z_floor, goal, USE_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """Largest float32 t with f(t) >= goal, where over the row's z = logits * scale
        f(t) = #{v : z_v >= t}                                   (USE_MASS False: top-k)
        f(t) = sum over {v : z_v >= t, z_v >= z_floor} of 2**(z_v - z_max)    (top-p)
    f falls as t rises, so the answer is a value of z (or -inf). Searched over the 2**32 float
    order keys, 4 bits per pass: pass j tests 16 candidates prefix + d * 2**(28 - 4j) at once.
    """
    probe = tl.arange(0, 16)
    offs = tl.arange(0, BLOCK)
    prefix = tl.zeros([], tl.int64)  # key + 2**31, so the search runs over [0, 2**32)
    for j in tl.static_range(8):
        cand = prefix + (probe.to(tl.int64) << (28 - 4 * j))
        key = tl.minimum(tl.maximum(cand - 2147483648, _KEY_NEG_INF), _KEY_POS_INF).to(tl.int32)
        cut = _key_to_float(key)  # [16]
        acc = tl.zeros([16], tl.float32)
        for start in range(0, vocab, BLOCK):
            idx = start + offs
            z = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * scale
            above = z[None, :] >= cut[:, None]  # [16, BLOCK]
            if USE_MASS:
                e = tl.where(z >= z_floor, tl.exp2(z - z_max), 0.0)
                acc += tl.sum(tl.where(above, e[None, :], 0.0), axis=1)
            else:
                acc += tl.sum(above.to(tl.float32), axis=1)
        ok = (acc >= goal) | (probe == 0)  # candidate 0 is the previous answer: true by induction
        prefix += tl.max(tl.where(ok, probe, 0), axis=0).to(tl.int64) << (28 - 4 * j)
    key = tl.minimum(tl.maximum(prefix - 2147483648, _KEY_NEG_INF), _KEY_POS_INF).to(tl.int32)
    return _key_to_float(key)


@triton.jit
def _sum_exp_above(row_ptr, vocab, scale, z_max, cut, BLOCK: tl.constexpr):
    """sum over {v : z_v >= cut} of 2**(z_v - z_max), z = logits * scale."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        z = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * scale
        acc += tl.where(z >= cut, tl.exp2(z - z_max), 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _row_stats_kernel(
    logits_ptr,  # [R, V] float
    draft_probs_ptr,  # [N, V] float (read only by the wave check)
    draft_tokens_ptr,  # [N] int64
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64
    num_draft_ptr,  # [B] int32
    cu_num_draft_ptr,  # [B + 1] int32
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32
    top_p_ptr,  # [B] float32
    part_max_ptr,  # [R, S] float32 out: max of z over chunk s
    part_sum_ptr,  # [R, S] float32 out: sum of exp(z - part_max) over kept entries of chunk s
    part_idx_ptr,  # [R, S] int32 out: lowest argmax in chunk s (used by T = 0 rows)
    part_flag_ptr,  # [R, S] int32 out: NAN / POS_INF / _LIVE of the logits chunk, DRAFT_PROBS of the q chunk
    part_qsum_ptr,  # [R, S] float32 out: sum of the q chunk (draft rows; with HAS_DRAFT_PROBS only)
    row_cut_ptr,  # [R] float32 out: thr_r
    stride_row,
    stride_q,
    num_rows,
    num_drafts,
    max_num_draft,
    vocab,
    chunk,
    num_splits,
    first_pos,  # this launch covers positions first_pos .. first_pos + grid[1] - 1
    HAS_DRAFT_PROBS: tl.constexpr,
    CHECK_PREFIX: tl.constexpr,  # wave mode: skip sequences that stopped before first_pos
    BLOCK: tl.constexpr,
    G: tl.constexpr,  # elements per group sharing one running max
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    pos = first_pos + tl.program_id(1)
    split = tl.program_id(2)
    # Triton treats ``_`` as a variable with one type per scope: every discarded value gets its own name
    k, draft0, _layout_word = layout_status(num_draft_ptr, cu_num_draft_ptr, b, num_rows, max_num_draft)
    temp = tl.load(temperature_ptr + b)
    sampled = temp > 0
    scale = _LOG2E / tl.where(sampled, temp, 1.0)
    row = draft0 + b + pos
    needed = (pos <= k) & (row >= 0) & (row < num_rows)
    if CHECK_PREFIX:
        # rows first_pos.. are needed only if drafts 0..first_pos-1 were all accepted; their
        # stats are complete (earlier waves), so re-run those accept tests here (cheap)
        if needed:
            num_accepted, _r1, _r2, _r3, _r4, _r5, _r6, _r7, _r8 = _first_rejection(
                logits_ptr, draft_probs_ptr, draft_tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                row_cut_ptr, stride_row, stride_q, num_rows, num_drafts, vocab, num_splits, draft0 + b, draft0, k,
                first_pos, scale, sampled, tl.load(seed_ptr + b), tl.load(offset_ptr + b), HAS_DRAFT_PROBS, BLOCK_K,
                BLOCK_S,
            )
            needed = num_accepted >= first_pos
    if needed:
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        top_k = tl.load(top_k_ptr + b)
        top_p = tl.load(top_p_ptr + b)
        use_top_k = sampled & (top_k > 0) & (top_k < vocab)
        use_top_p = sampled & (top_p < 1.0)
        out = row * num_splits + split
        flags = tl.zeros([], tl.int32)
        if use_top_k | use_top_p:
            # whole row in split 0; the other splits report an empty chunk
            if split == 0:
                # 16 candidate cuts x BLOCK / 16 elements per step keeps registers as in the fast path
                z_max, z_sum, cut, flags = _filtered_stats(
                    row_ptr, vocab, scale, top_k, top_p, use_top_k, use_top_p, max(BLOCK // 16, 16)
                )
                tl.store(part_max_ptr + out, z_max)
                tl.store(part_sum_ptr + out, z_sum)
                tl.store(part_idx_ptr + out, 0)
                tl.store(row_cut_ptr + row, cut)
            else:
                tl.store(part_max_ptr + out, -float("inf"))
                tl.store(part_sum_ptr + out, 0.0)
                tl.store(part_idx_ptr + out, _INT32_MAX)
        elif sampled:
            z_max, z_sum, flags = _online_stats(row_ptr, vocab, scale, split * chunk, chunk, BLOCK, G)
            tl.store(part_max_ptr + out, z_max)
            tl.store(part_sum_ptr + out, z_sum)
            tl.store(part_idx_ptr + out, 0)
            if split == 0:
                tl.store(row_cut_ptr + row, -float("inf"))
        else:
            x_max, x_idx, flags = _chunk_argmax(row_ptr, vocab, split * chunk, chunk, BLOCK)
            tl.store(part_max_ptr + out, x_max)
            tl.store(part_sum_ptr + out, 1.0)
            tl.store(part_idx_ptr + out, x_idx)
            if split == 0:
                tl.store(row_cut_ptr + row, -float("inf"))
        if HAS_DRAFT_PROBS:
            # NOTE: the q check reads every q row once, here, beside its logits row (same program, same
            # V-chunk): the race alone reads only the stop row's q, and q(x) is only a gather.
            q_row = draft0 + pos
            if (pos < k) & (q_row >= 0) & (q_row < num_drafts):
                q_sum, q_bad = _q_chunk(draft_probs_ptr + q_row.to(tl.int64) * stride_q, vocab, split * chunk,
                                        chunk, BLOCK)
                tl.store(part_qsum_ptr + out, q_sum)
                flags = flags | tl.where(q_bad, DRAFT_PROBS, 0)
        tl.store(part_flag_ptr + out, flags)


@triton.jit
def _filtered_stats(row_ptr, vocab, scale, top_k, top_p, use_top_k, use_top_p, BLOCK: tl.constexpr):
    """(M, Z, cut, status flags) of a whole row with top-k and/or top-p, y = logits * scale."""
    offs = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    flags = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        flags = flags | _raw_flags(x)
        run_max = tl.maximum(run_max, x * scale)
    z_max = tl.max(run_max, axis=0)
    cut = tl.full([], float("-inf"), tl.float32)
    if use_top_k:
        cut = _bisect_cut(row_ptr, vocab, scale, z_max, cut, top_k.to(tl.float32), False, BLOCK)
    if use_top_p:
        kept_sum = _sum_exp_above(row_ptr, vocab, scale, z_max, cut, BLOCK)
        cut = _bisect_cut(row_ptr, vocab, scale, z_max, cut, top_p * kept_sum, True, BLOCK)
    return z_max, _sum_exp_above(row_ptr, vocab, scale, z_max, cut, BLOCK), cut, or_bits(flags, 0)


@triton.jit
def _online_stats(row_ptr, vocab, scale, start, chunk, BLOCK: tl.constexpr, G: tl.constexpr):
    """(max, sum of 2**(y - max), status flags) over one chunk, y = logits * scale; one running max per
    group of G neighbours, so 1 + 1/G exponentials per element."""
    offs = tl.arange(0, BLOCK // G)[:, None] * G + tl.arange(0, G)[None, :]  # [BLOCK / G, G]
    run_max = tl.full([BLOCK // G], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK // G], tl.float32)
    flags = tl.zeros([BLOCK // G, G], tl.int32)
    for t in range(0, chunk, BLOCK):
        idx = start + t + offs
        x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        flags = flags | _raw_flags(x)
        y = x * scale
        new_max = tl.maximum(run_max, tl.max(y, axis=1))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # all -inf so far: keep 0
        run_sum = run_sum * tl.exp2(run_max - shift) + tl.sum(tl.exp2(y - shift[:, None]), axis=1)
        run_max = new_max
    z_max = tl.max(run_max, axis=0)
    shift = tl.where(z_max == -float("inf"), 0.0, z_max)
    return z_max, tl.sum(run_sum * tl.exp2(run_max - shift), axis=0), or_bits(or_bits(flags, 1), 0)


@triton.jit
def _chunk_argmax(row_ptr, vocab, start, chunk, BLOCK: tl.constexpr):
    """(max, lowest index attaining it, status flags) of the raw logits over one chunk (T = 0 rows)."""
    offs = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_idx = start + offs
    flags = tl.zeros([BLOCK], tl.int32)
    for t in range(0, chunk, BLOCK):
        idx = start + t + offs
        x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        flags = flags | _raw_flags(x)
        run_idx = tl.where(x > run_max, idx, run_idx)
        run_max = tl.where(x > run_max, x, run_max)  # NaN is never the max (as in the greedy kernel)
    x_max = tl.max(run_max, axis=0)
    return x_max, tl.min(tl.where(run_max == x_max, run_idx, _INT32_MAX), axis=0), or_bits(flags, 0)


@triton.jit
def _pick(key, idx, axis: tl.constexpr):
    """(max key, lowest idx attaining it) along ``axis``."""
    top = tl.max(key, axis=axis)
    return top, tl.min(tl.where(key == tl.expand_dims(top, axis), idx, _INT32_MAX), axis=axis)


@triton.jit
def sequence_settings(temperature_ptr, seed_ptr, offset_ptr, b):
    """Sequence b's (temperature T, sampled: T > 0, scale: log2(e) / T, the factor to base-2 logits (T taken as
    1 for a greedy sequence), seed, offset)."""
    temp = tl.load(temperature_ptr + b)
    sampled = temp > 0
    scale = _LOG2E / tl.where(sampled, temp, 1.0)
    return temp, sampled, scale, tl.load(seed_ptr + b), tl.load(offset_ptr + b)


@triton.jit
def merge_row_partials(part_max_ptr, part_sum_ptr, part_idx_ptr, row_cut_ptr, row0, last_pos, num_rows, num_splits,
                       BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge ``_row_stats_kernel``'s V-chunk partials of one sequence's local rows 0..last_pos (lane i = local
    row i): (rows, in_rows, M_i, Z_i, thr_i, argmax_i). Rows outside the tensor (a wrong layout) are never read."""
    pos = tl.arange(0, BLOCK_K)
    col = tl.arange(0, BLOCK_S)
    rows = row0 + pos
    in_rows = (pos <= last_pos) & (rows >= 0) & (rows < num_rows)
    mask = in_rows[:, None] & (col[None, :] < num_splits)
    offs = rows[:, None] * num_splits + col[None, :]
    pmax = tl.load(part_max_ptr + offs, mask=mask, other=-float("inf"))
    psum = tl.load(part_sum_ptr + offs, mask=mask, other=0.0)
    pidx = tl.load(part_idx_ptr + offs, mask=mask, other=_INT32_MAX)
    row_max, row_argmax = _pick(pmax, pidx, 1)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(psum * tl.exp2(pmax - shift[:, None]), axis=1)  # partials are base 2
    row_cut = tl.load(row_cut_ptr + rows, mask=in_rows, other=-float("inf"))
    return rows, in_rows, row_max, row_sum, row_cut, row_argmax


@triton.jit
def _first_rejection(
    logits_ptr, draft_probs_ptr, draft_tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, row_cut_ptr,
    stride_row, stride_q, num_rows, num_drafts, vocab, num_splits, row0, draft0, k, limit, scale, sampled, seed,
    offset, HAS_DRAFT_PROBS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Merge the row partials of one sequence and run its accept tests at positions < limit.

    ``seed`` / ``offset``: this sequence's; the accept uniform of position i is drawn at local row i.
    Returns num_accepted (the first rejected position, or limit) and, per position i, the
    merged (M_i, Z_i, thr_i, argmax_i), the draft token (clamped into [0, V): it indexes rows), the
    draft as given, whether position i has a draft in the tensor, and q(draft). Partials of rows past
    the first rejection may be unwritten (wave mode): they can only produce more rejections after it,
    which the min ignores. Rows and drafts outside the tensors (a wrong layout) are never read.
    """
    pos = tl.arange(0, BLOCK_K)
    rows, in_seq, row_max, row_sum, row_cut, row_argmax = merge_row_partials(
        part_max_ptr, part_sum_ptr, part_idx_ptr, row_cut_ptr, row0, tl.minimum(k, limit), num_rows, num_splits,
        BLOCK_K, BLOCK_S,
    )

    is_draft = (pos < k) & (pos < limit)
    has_draft = is_draft & (draft0 + pos >= 0) & (draft0 + pos < num_drafts)
    given = tl.load(draft_tokens_ptr + draft0 + pos, mask=has_draft, other=0)
    draft = tl.minimum(tl.maximum(given, 0), vocab - 1).to(tl.int32)
    y_x = tl.load(logits_ptr + rows.to(tl.int64) * stride_row + draft, mask=is_draft & in_seq, other=0.0)
    y_x = y_x.to(tl.float32) * scale
    p_x = tl.where(y_x >= row_cut, tl.exp2(y_x - row_max) / row_sum, 0.0)
    if HAS_DRAFT_PROBS:
        q_ptrs = draft_probs_ptr + (draft0 + pos).to(tl.int64) * stride_q + draft
        q_x = tl.load(q_ptrs, mask=has_draft, other=1.0).to(tl.float32)
    else:
        q_x = tl.full([BLOCK_K], 1.0, tl.float32)
    u = _uniform(seed, offset, pos, tl.zeros_like(pos), 0)  # rng.ACCEPT, local row i
    # u * q(x) formed exactly in float64, as the reference does (two 24-bit mantissas)
    exact_uq = u.to(tl.float64) * q_x.to(tl.float64)
    accepted = tl.where(sampled, exact_uq < p_x.to(tl.float64), draft == row_argmax)
    num_accepted = tl.min(tl.where(is_draft & ~accepted, pos, tl.minimum(k, limit)), axis=0)
    return num_accepted, row_max, row_sum, row_cut, row_argmax, draft, given, has_draft, q_x


@triton.jit
def _sequence_status(
    part_flag_ptr, part_qsum_ptr, row0, last_pos, num_rows, vocab, num_splits, row_max, given, has_draft, q_x,
    temp, top_k, top_p, HAS_DRAFT_PROBS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """The status word of one sequence (``verispec.verify.status``) from its rows' chunk flags (written by
    ``_row_stats_kernel`` in its one read of each row), its merged row maxima, drafts and settings. Positions
    0..last_pos are judged: all of them (last_pos = k) unless wave mode left later rows unread."""
    pos = tl.arange(0, BLOCK_K)
    col = tl.arange(0, BLOCK_S)
    rows = row0 + pos
    judged = (pos <= last_pos) & (rows >= 0) & (rows < num_rows)
    mask = judged[:, None] & (col[None, :] < num_splits)
    offs = rows[:, None] * num_splits + col[None, :]
    flags = or_bits(tl.load(part_flag_ptr + offs, mask=mask, other=0), 1)  # [BLOCK_K]
    dead = (flags & (_LIVE | NAN)) == 0  # every entry -inf
    temperature_ok = (temp == 0) | ((temp >= _MIN_TEMPERATURE) & (temp < float("inf")))  # False for NaN
    clean = ((flags & (NAN | POS_INF)) == 0) & ~dead
    scaled = tl.where((temp > 0) & temperature_ok, clean & (tl.abs(row_max) > _MAX_SCALED_Y), False)
    row_bits = (flags & (NAN | POS_INF | DRAFT_PROBS)) | tl.where(dead, DEAD_ROW, 0) | tl.where(scaled, SCALED, 0)
    word = or_bits(tl.where(judged, row_bits, 0), 0)
    draft_judged = has_draft & (pos <= last_pos)
    bad_id = draft_judged & ((given < 0) | (given >= vocab))
    word = word | tl.where(tl.max(bad_id.to(tl.int32), axis=0) > 0, DRAFT_ID, 0)
    if HAS_DRAFT_PROBS:
        q_sum = tl.sum(tl.load(part_qsum_ptr + offs, mask=mask & draft_judged[:, None], other=0.0), axis=1)
        q_bad = draft_judged & (~(tl.abs(q_sum - 1.0) <= 0.01) | (~bad_id & ~(q_x > 0)))
        word = word | tl.where(tl.max(q_bad.to(tl.int32), axis=0) > 0, DRAFT_PROBS, 0)
    settings_ok = temperature_ok & (top_k >= 0) & (top_p > 0) & (top_p <= 1.0)
    return word | tl.where(settings_ok, 0, SETTINGS)


@triton.jit
def _accept_race_kernel(
    logits_ptr,  # [R, V] float
    draft_probs_ptr,  # [N, V] float (unused without HAS_DRAFT_PROBS)
    draft_tokens_ptr,  # [N] int64
    num_draft_ptr,  # [B] int32
    cu_num_draft_ptr,  # [B + 1] int32
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32
    top_p_ptr,  # [B] float32
    seed_ptr,  # [B] int64
    offset_ptr,  # [B] int64
    part_max_ptr,  # [R, S] float32
    part_sum_ptr,  # [R, S] float32
    part_idx_ptr,  # [R, S] int32
    part_flag_ptr,  # [R, S] int32
    part_qsum_ptr,  # [R, S] float32
    row_cut_ptr,  # [R] float32
    race_key_ptr,  # [B, S2, 2] float32 out: best residual key, best fallback (p) key
    race_idx_ptr,  # [B, S2, 2] int32 out: their indices
    tokens_ptr,  # [B, max_k + 1] int32 out
    num_accepted_ptr,  # [B] int32 out
    num_emitted_ptr,  # [B] int32 out
    status_ptr,  # [B] int32 out: the status word (verispec.verify.status)
    stride_row,
    stride_q,
    num_rows,
    num_drafts,
    num_splits,
    vocab,
    chunk,
    num_race_splits,
    out_width,
    HAS_DRAFT_PROBS: tl.constexpr,
    FUSED: tl.constexpr,  # num_race_splits == 1: write the stop token here
    ALL_ROWS_READ: tl.constexpr,  # False in wave mode: rows after the first rejection were never read
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    k, draft0, layout_ok = layout_status(num_draft_ptr, cu_num_draft_ptr, b, num_rows, out_width - 1)
    row0 = draft0 + b
    temp, sampled, scale, seed, offset = sequence_settings(temperature_ptr, seed_ptr, offset_ptr, b)

    pos = tl.arange(0, BLOCK_K)
    is_draft = pos < k
    num_accepted, row_max, row_sum, row_cut, row_argmax, draft, given, has_draft, q_x = _first_rejection(
        logits_ptr, draft_probs_ptr, draft_tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, row_cut_ptr,
        stride_row, stride_q, num_rows, num_drafts, vocab, num_splits, row0, draft0, k, k, scale, sampled, seed,
        offset, HAS_DRAFT_PROBS, BLOCK_K, BLOCK_S,
    )
    if split == 0:
        last_pos = k
        if not ALL_ROWS_READ:
            last_pos = num_accepted
        word = _sequence_status(
            part_flag_ptr, part_qsum_ptr, row0, last_pos, num_rows, vocab, num_splits,
            row_max, given, has_draft, q_x, temp, tl.load(top_k_ptr + b), tl.load(top_p_ptr + b), HAS_DRAFT_PROBS,
            BLOCK_K, BLOCK_S,
        )
        tl.store(status_ptr + b, tl.where(layout_ok, word, NUM_DRAFT))
    stop = pos == num_accepted
    stop_row = row0 + num_accepted
    stop_row = tl.where((stop_row >= 0) & (stop_row < num_rows), stop_row, 0)  # a wrong layout reads row 0
    stop_max = tl.max(tl.where(stop, row_max, -float("inf")), axis=0)
    stop_sum = tl.sum(tl.where(stop, row_sum, 0.0), axis=0)
    stop_cut = tl.max(tl.where(stop, row_cut, -float("inf")), axis=0)
    stop_argmax = tl.sum(tl.where(stop, row_argmax, 0), axis=0)
    is_recovery = num_accepted < k
    stop_draft = tl.sum(tl.where(stop & is_draft, draft, 0), axis=0)

    # race over V-chunk `split` of the stop row (sampled sequences only)
    lane = tl.arange(0, BLOCK)
    start = split * chunk
    best_key = tl.full([BLOCK], -1.0, tl.float32)
    best_idx = start + lane
    fall_key = tl.full([BLOCK], -1.0, tl.float32)
    fall_idx = start + lane
    stop_ptr = logits_ptr + stop_row.to(tl.int64) * stride_row
    inv_sum = 1.0 / stop_sum
    if sampled:
        q_row = draft0 + num_accepted
        is_recovery = is_recovery & (q_row >= 0) & (q_row < num_drafts)
        q_row_ptr = draft_probs_ptr + tl.where(is_recovery, q_row, 0).to(tl.int64) * stride_q
        for t in range(0, chunk, BLOCK):
            idx = start + t + lane
            in_row = idx < vocab
            y = tl.load(stop_ptr + idx, mask=in_row, other=-float("inf")).to(tl.float32) * scale
            p = tl.where(y >= stop_cut, tl.exp2(y - stop_max) * inv_sum, 0.0)
            if HAS_DRAFT_PROBS:
                q = tl.load(q_row_ptr + idx, mask=in_row & is_recovery, other=0.0).to(tl.float32)
            else:
                q = tl.where((idx == stop_draft) & is_recovery, 1.0, 0.0)
            # rng.RACE at the stop row's local index, num_accepted
            exponential = -tl.log(_uniform(seed, offset, num_accepted + tl.zeros_like(idx), idx, 1))
            key = tl.where(in_row, tl.fdiv(tl.maximum(p - q, 0.0), exponential), -1.0)
            better = key > best_key
            best_key = tl.where(better, key, best_key)
            best_idx = tl.where(better, idx, best_idx)
    res_key, res_idx = _pick(best_key, best_idx, 0)
    p_key = tl.full([], -1.0, tl.float32)
    p_idx = tl.full([], _INT32_MAX, tl.int32)
    if sampled & (res_key <= 0):
        # rounding emptied the residual in this chunk: also race over p here (the reference
        # falls back to p when the whole residual is empty; finalize decides)
        for t in range(0, chunk, BLOCK):
            idx = start + t + lane
            in_row = idx < vocab
            y = tl.load(stop_ptr + idx, mask=in_row, other=-float("inf")).to(tl.float32) * scale
            p = tl.where(y >= stop_cut, tl.exp2(y - stop_max) * inv_sum, 0.0)
            exponential = -tl.log(_uniform(seed, offset, num_accepted + tl.zeros_like(idx), idx, 1))
            key = tl.where(in_row, tl.fdiv(p, exponential), -1.0)
            better = key > fall_key
            fall_key = tl.where(better, key, fall_key)
            fall_idx = tl.where(better, idx, fall_idx)
        p_key, p_idx = _pick(fall_key, fall_idx, 0)
    if FUSED:
        # p != q leaves mass in the residual; if rounding emptied it, sample p (as the reference)
        emitted = tl.where(sampled, tl.where(res_key > 0, res_idx, p_idx), stop_argmax)
    else:
        emitted = tl.where(sampled, -1, stop_argmax)  # finalize writes the sampled token
        tl.store(race_key_ptr + (b * num_race_splits + split) * 2, res_key)
        tl.store(race_key_ptr + (b * num_race_splits + split) * 2 + 1, p_key)
        tl.store(race_idx_ptr + (b * num_race_splits + split) * 2, res_idx)
        tl.store(race_idx_ptr + (b * num_race_splits + split) * 2 + 1, p_idx)
    if split == 0:
        tokens = tl.where(pos < num_accepted, draft, tl.where(stop, emitted, -1))
        tl.store(tokens_ptr + b * out_width + pos, tokens, mask=pos < out_width)
        tl.store(num_accepted_ptr + b, num_accepted)
        tl.store(num_emitted_ptr + b, num_accepted + 1)


@triton.jit
def _finalize_kernel(
    race_key_ptr,  # [B, S2, 2] float32
    race_idx_ptr,  # [B, S2, 2] int32
    temperature_ptr,  # [B] float32
    num_accepted_ptr,  # [B] int32
    tokens_ptr,  # [B, max_k + 1] int32 in/out
    num_race_splits,
    out_width,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    if tl.load(temperature_ptr + b) > 0:
        col = tl.arange(0, BLOCK_S)
        mask = col < num_race_splits
        base = (b * num_race_splits + col) * 2
        res_key, res_idx = _pick(
            tl.load(race_key_ptr + base, mask=mask, other=-1.0), tl.load(race_idx_ptr + base, mask=mask, other=_INT32_MAX), 0
        )
        p_key, p_idx = _pick(
            tl.load(race_key_ptr + base + 1, mask=mask, other=-1.0),
            tl.load(race_idx_ptr + base + 1, mask=mask, other=_INT32_MAX),
            0,
        )
        num_accepted = tl.load(num_accepted_ptr + b)
        tl.store(tokens_ptr + b * out_width + num_accepted, tl.where(res_key > 0, res_idx, p_idx))


def _waves(max_num_draft: int, waves: bool) -> list[tuple[int, int]]:
    """(first position, count) of each stats launch: one launch for all positions, or waves
    that double, e.g. K = 8 -> [(0, 1), (1, 1), (2, 2), (4, 4), (8, 1)]."""
    if not waves:
        return [(0, max_num_draft + 1)]
    out, first = [(0, 1)], 1
    while first <= max_num_draft:
        count = min(first, max_num_draft + 1 - first)
        out.append((first, count))
        first += count
    return out


# Waves cost a few extra launches (~2-3 us each); they pay off once the logits are large.
WAVE_MIN_BYTES = 64 << 20


def verify_sample_triton(
    batch,
    *,
    block: int | None = None,
    num_splits: int | None = None,
    num_race_splits: int | None = None,
    waves: bool | None = None,
) -> VerifyOutput:
    """Rejection-sampling verification of a validated ``verispec.verify.VerifyBatch``.

    ``batch.temperature`` / ``top_k`` / ``top_p`` are [B] device tensors, ``batch.seed`` /
    ``batch.offset`` [B] int64 device tensors (each sequence's key and offset). ``block`` / ``num_splits`` / ``num_race_splits``
    override the tiling (tests use them to force the split paths).

    ``waves``: compute the row statistics position by position in doubling waves, each skipping
    the sequences that already stopped, so rows after a sequence's first rejection are mostly
    never read -- nor checked: the status then covers rows up to each sequence's stop row only
    (``verispec.verify.status``), which is why the public call uses waves only with ``check_values=False``.
    None = on when target_logits holds at least WAVE_MIN_BYTES.

    Returns the outputs with ``status`` [B] int32 written by ``_accept_race_kernel`` from the chunk flags of
    pass 1 (NaN / +inf / all -inf rows, q rows), the merged row maxima (SCALED), drafts and settings.
    """
    assert rng.ACCEPT == 0 and rng.RACE == 1  # hard-coded in the kernels
    logits = batch.target_logits  # [R, V]
    num_rows, vocab = logits.shape
    size = batch.batch_size
    device = logits.device
    width = batch.max_num_draft + 1
    # NOTE: 4096 / 2048 elements per tile keep both kernels near 100 registers with no spills
    # (ptxas, sm_90): two 8-warp programs per SM. The race tile is smaller because every
    # element carries a Philox-4x32 state.
    on_gpu = device.type == "cuda"
    race_block = block or (2048 if on_gpu else default_block(vocab, logits.dtype, device))
    block = block or (4096 if on_gpu else default_block(vocab, logits.dtype, device))
    programs = device_programs(device)
    if waves is None:
        waves = logits.numel() * logits.element_size() >= WAVE_MIN_BYTES
    # waves launch B x (positions in the wave) x S programs: size S for the smallest wave (B rows)
    chunk, splits = split_vocab(vocab, size if waves else num_rows, block, programs, num_splits)
    race_chunk, race_splits = split_vocab(vocab, size, race_block, programs, num_race_splits)
    # scratch in two allocations: float32 [part_max, part_sum, part_qsum (R x S each), row_cut (R),
    # race_key (B x S2 x 2)] and int32 [part_idx, part_flag (R x S each), race_idx (B x S2 x 2)]
    part, race = num_rows * splits, size * race_splits * 2
    f32 = torch.empty(3 * part + num_rows + race, dtype=torch.float32, device=device)
    i32 = torch.empty(2 * part + race, dtype=torch.int32, device=device)
    part_max, part_sum, part_qsum = f32[:part], f32[part:2 * part], f32[2 * part:3 * part]
    row_cut, race_key = f32[3 * part:3 * part + num_rows], f32[3 * part + num_rows:]
    part_idx, part_flag, race_idx = i32[:part], i32[part:2 * part], i32[2 * part:]
    out = new_outputs(size, width, device)
    draft_probs = batch.draft_probs
    has_q = draft_probs is not None
    q = draft_probs if has_q else logits  # any valid pointer; never read without HAS_DRAFT_PROBS
    num_drafts = batch.draft_tokens.shape[0]

    common = dict(HAS_DRAFT_PROBS=has_q, BLOCK_K=small_block(width), BLOCK_S=small_block(splits))
    for first, count in _waves(batch.max_num_draft, waves):
        _row_stats_kernel[(size, count, splits)](
            logits, q, batch.draft_tokens, batch.seed, batch.offset, batch.num_draft, batch.cu_num_draft,
            batch.temperature, batch.top_k, batch.top_p, part_max, part_sum, part_idx, part_flag, part_qsum, row_cut,
            logits.stride(0), q.stride(0), num_rows, num_drafts, batch.max_num_draft, vocab, chunk, splits, first,
            CHECK_PREFIX=first > 0, BLOCK=block, G=min(8, block), num_warps=8, **common,
        )
    _accept_race_kernel[(size, race_splits)](
        logits, q, batch.draft_tokens, batch.num_draft, batch.cu_num_draft, batch.temperature, batch.top_k,
        batch.top_p, batch.seed, batch.offset, part_max, part_sum, part_idx, part_flag, part_qsum, row_cut, race_key,
        race_idx, out.tokens, out.num_accepted, out.num_emitted, out.status, logits.stride(0), q.stride(0), num_rows,
        num_drafts, splits, vocab, race_chunk, race_splits, width,
        FUSED=race_splits == 1, ALL_ROWS_READ=not waves, BLOCK=race_block, num_warps=8, **common,
    )
    if race_splits > 1:
        _finalize_kernel[(size,)](
            race_key, race_idx, batch.temperature, out.num_accepted, out.tokens, race_splits, width,
            BLOCK_S=small_block(race_splits), num_warps=1,
        )
    return out
