"""Fused greedy verification from logits (Triton): argmax of every row + ragged acceptance scan.

Layout and semantics: ``verispec.verify.reference`` (``reference_verify_greedy`` is the oracle).

Two launches, both CUDA-graph capturable (no host sync; grid sizes come from host ints only):

  1. ``_partial_argmax_kernel``  grid (R, S)
     Program (r, s) streams V-chunk s of row r once and writes its (max, lowest argmax, NaN seen)
     to a small [3, R, S] buffer. S > 1 only when R rows alone would leave the GPU idle (small B·K):
     e.g. R = 5, V = 128256 fp32 on 132 SMs -> S = 32 chunks of 4096 -> 160 programs instead of 5.
  2. ``_greedy_scan_kernel``  grid (B,)
     Program b reduces its k_b + 1 rows' partials (ties -> lowest split = lowest index),
     finds the first draft that differs from its row's argmax, and writes tokens /
     num_accepted / num_emitted, and the status word of the sequence (``verispec.verify.status``)
     from what pass 1 saw of every one of its rows: NaN, +inf (the max), all -inf (max -inf without
     NaN), plus its draft ids and the layout (k_b, cu_num_draft[B]). Reads R * S * 12 bytes: noise
     next to the logits. Indices formed from num_draft are clamped / masked: a wrong layout gives
     NUM_DRAFT, never a read out of bounds.

The bound is the one read of target_logits (R * V * itemsize bytes); everything else is tiny.

Ties go to the lowest index exactly like ``torch.argmax``: each lane keeps the first index
at which it saw its maximum (strict ``>``), lanes and splits are merged by (max value, then
min index). A row that is all ``-inf`` returns index 0, as torch does.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...device import sm_count
from ..reference import VerifyOutput
from .. import status

_INT32_MAX = tl.constexpr(2**31 - 1)
# the status bits (verispec.verify.status) as compile-time constants
NAN = tl.constexpr(status.NAN)
POS_INF = tl.constexpr(status.POS_INF)
DEAD_ROW = tl.constexpr(status.DEAD_ROW)
DRAFT_ID = tl.constexpr(status.DRAFT_ID)
NUM_DRAFT = tl.constexpr(status.NUM_DRAFT)


@functools.lru_cache(maxsize=None)
def device_programs(device: torch.device) -> int:
    """Programs that fill the device about eight times over (a small fixed number on CPU).

    NOTE: 4x left a half-empty last wave at mid sizes: B = 64, K = 8, bf16 V = 128256 (576
    row programs, ~3 resident per SM) measured 66 us against a 50 us floor (H100, 04:48 UTC,
    benchmarks/results/ablation.md); 8x splits those rows in two.
    """
    return 8 * sm_count(device) if device.type == "cuda" else 8  # interpreter: small, exercises the split path


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.lru_cache(maxsize=4096)
def split_vocab(vocab: int, num_rows: int, block: int, target_programs: int, num_splits: int | None = None):
    """(chunk, num_splits): V cut into num_splits chunks of `chunk` (a multiple of block) elements.

    Every chunk starts inside the row (chunk * (num_splits - 1) < vocab), so every program
    sees at least one real element. Cached: it depends on shapes only, and an eager call pays for
    every microsecond of host work.
    """
    num_tiles = _cdiv(vocab, block)
    if num_splits is None:
        num_splits = _cdiv(target_programs, max(num_rows, 1))
    num_splits = max(1, min(num_splits, num_tiles))
    chunk = _cdiv(num_tiles, num_splits) * block
    return chunk, _cdiv(vocab, chunk)


def small_block(n: int) -> int:
    """A power of two >= n, at least 16: few compiled variants across K and split counts."""
    return max(16, _next_power_of_2(n))


def default_block(vocab: int, dtype: torch.dtype, device: torch.device) -> int:
    """Elements per tile: 16 KiB of logits per tile on the GPU (4 x 16-byte loads per thread
    at 8 warps); on the interpreter one tile per small row keeps loops short."""
    if device.type != "cuda":
        return min(_next_power_of_2(vocab), 1024)
    return 4096 if dtype == torch.float32 else 8192


def new_outputs(size: int, width: int, device: torch.device) -> VerifyOutput:
    """Uninitialized outputs in ONE int32 allocation [B * (width + 3)] (one allocator call and one split instead
    of four allocations): num_accepted, num_emitted, status, then tokens [B, width]; each a contiguous view."""
    buf = torch.empty(size * (width + 3), dtype=torch.int32, device=device)
    num_accepted, num_emitted, status, tokens = buf.split_with_sizes((size, size, size, size * width))
    return VerifyOutput(tokens.view(size, width), num_accepted, num_emitted, status)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def or_bits(x, axis: tl.constexpr):
    """Bitwise OR of integer flags along ``axis``."""
    return tl.reduce(x, axis, _or)


@triton.jit
def layout_status(num_draft_ptr, cu_num_draft_ptr, b, num_rows, max_num_draft):
    """(k, draft0, layout_ok) of sequence b, read as every kernel reads them: k_b clamped into
    [0, max_num_draft] and the first draft cu_num_draft[b]; layout_ok is False when k_b is out of range or
    sum(num_draft) + B != R (cu_num_draft[B] read on the device: no host sync), i.e. when the status word
    must be NUM_DRAFT. Every index formed from them is also masked to the tensors, so a wrong layout
    reads nothing out of bounds."""
    k = tl.load(num_draft_ptr + b)
    num_seqs = tl.num_programs(0)
    layout_ok = (k >= 0) & (k <= max_num_draft) & (tl.load(cu_num_draft_ptr + num_seqs) + num_seqs == num_rows)
    return tl.minimum(tl.maximum(k, 0), max_num_draft), tl.load(cu_num_draft_ptr + b), layout_ok


@triton.jit
def _partial_argmax_kernel(
    logits_ptr,  # [R, V] float, row stride `stride_row`, unit stride along V
    part_ptr,  # [3, R, S] int32 out: max of chunk s (float32 bits), lowest index attaining it, NaN seen (0/1)
    stride_row,
    vocab,
    chunk,
    num_splits,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    part_size = tl.num_programs(0) * num_splits
    start = split * chunk
    offs = tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = start + offs  # an all -inf chunk reports its first index
    seen_nan = tl.zeros([BLOCK], tl.int1)
    for t in range(0, chunk, BLOCK):
        idx = start + t + offs
        x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf"), eviction_policy="evict_first")
        x = x.to(tl.float32)
        better = x > best_val  # strict: a lane keeps the first index of its maximum; NaN is never better
        best_val = tl.where(better, x, best_val)
        best_idx = tl.where(better, idx, best_idx)
        seen_nan = seen_nan | (x != x)
    top = tl.max(best_val, axis=0)
    top_idx = tl.min(tl.where(best_val == top, best_idx, _INT32_MAX), axis=0)
    out = part_ptr + row * num_splits + split
    tl.store(out, top.to(tl.int32, bitcast=True))
    tl.store(out + part_size, top_idx)
    tl.store(out + 2 * part_size, tl.max(seen_nan.to(tl.int32), axis=0))


@triton.jit
def merge_argmax_partials(part_ptr, row0, last_pos, num_rows, num_splits, BLOCK_K: tl.constexpr,
                          BLOCK_S: tl.constexpr):
    """Merge ``_partial_argmax_kernel``'s partials of one sequence's local rows 0..last_pos (lane i = local row i,
    ties -> lowest split = lowest index): (argmax per row [BLOCK_K], the status bits of those rows: NaN, +inf
    (the max), all -inf (max -inf without NaN)). Rows outside the tensor (a wrong layout) are never read."""
    pos = tl.arange(0, BLOCK_K)
    split = tl.arange(0, BLOCK_S)
    row = row0 + pos
    in_rows = (pos <= last_pos) & (row >= 0) & (row < num_rows)
    mask = in_rows[:, None] & (split[None, :] < num_splits)
    offs = row[:, None] * num_splits + split[None, :]
    part_size = num_rows * num_splits
    val = tl.load(part_ptr + offs, mask=mask, other=-8388608).to(tl.float32, bitcast=True)  # -inf
    idx = tl.load(part_ptr + part_size + offs, mask=mask, other=_INT32_MAX)
    row_nan = tl.max(tl.load(part_ptr + 2 * part_size + offs, mask=mask, other=0), axis=1)  # [BLOCK_K]
    top = tl.max(val, axis=1)
    row_argmax = tl.min(tl.where(val == top[:, None], idx, _INT32_MAX), axis=1)  # [BLOCK_K]
    row_bits = tl.where(row_nan > 0, NAN, 0) | tl.where(top == float("inf"), POS_INF, 0)
    row_bits = row_bits | tl.where((top == float("-inf")) & (row_nan == 0), DEAD_ROW, 0)  # every entry -inf
    return row_argmax, or_bits(tl.where(in_rows, row_bits, 0), 0)


def argmax_partials(logits: torch.Tensor, block: int | None, num_splits: int | None) -> tuple[torch.Tensor, int]:
    """Launch pass 1 (``_partial_argmax_kernel``) over every row of ``logits`` [R, V]: its [3, R, S] buffer and S.
    ``block`` / ``num_splits`` override the tiling."""
    num_rows, vocab = logits.shape
    device = logits.device
    block = block or default_block(vocab, logits.dtype, device)
    chunk, splits = split_vocab(vocab, num_rows, block, device_programs(device), num_splits)
    part = torch.empty(3 * num_rows * splits, dtype=torch.int32, device=device)
    _partial_argmax_kernel[(num_rows, splits)](
        logits, part, logits.stride(0), vocab, chunk, splits, BLOCK=block, num_warps=8
    )
    return part, splits


@triton.jit
def _greedy_scan_kernel(
    part_ptr,  # [3, R, S] int32 (see _partial_argmax_kernel)
    draft_tokens_ptr,  # [N] int64
    num_draft_ptr,  # [B] int32
    cu_num_draft_ptr,  # [B + 1] int32
    tokens_ptr,  # [B, max_k + 1] int32 out
    num_accepted_ptr,  # [B] int32 out
    num_emitted_ptr,  # [B] int32 out
    status_ptr,  # [B] int32 out: the status word (verispec.verify.status)
    num_rows,  # R
    num_drafts,  # N
    vocab,
    num_splits,
    out_width,
    BLOCK_K: tl.constexpr,  # >= max_k + 1
    BLOCK_S: tl.constexpr,  # >= num_splits
):
    b = tl.program_id(0)
    k, draft0, layout_ok = layout_status(num_draft_ptr, cu_num_draft_ptr, b, num_rows, out_width - 1)
    row0 = draft0 + b  # sequence b's first target row (one bonus row per earlier sequence)
    pos = tl.arange(0, BLOCK_K)
    target_argmax, rows_word = merge_argmax_partials(part_ptr, row0, k, num_rows, num_splits, BLOCK_K, BLOCK_S)
    in_drafts = (pos < k) & (draft0 + pos >= 0) & (draft0 + pos < num_drafts)
    draft = tl.load(draft_tokens_ptr + draft0 + pos, mask=in_drafts, other=-1)
    rejected = (pos < k) & (draft != target_argmax)
    num_accepted = tl.min(tl.where(rejected, pos, k), axis=0)
    # accepted drafts equal their row's argmax, so the whole output is the argmax prefix
    tokens = tl.where(pos <= num_accepted, target_argmax, -1)
    tl.store(tokens_ptr + b * out_width + pos, tokens, mask=pos < out_width)
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(num_emitted_ptr + b, num_accepted + 1)
    # the status of every row of the sequence (also those after the first rejection) and of every draft
    word = rows_word | tl.where(tl.max((in_drafts & ((draft < 0) | (draft >= vocab))).to(tl.int32), 0) > 0, DRAFT_ID, 0)
    tl.store(status_ptr + b, tl.where(layout_ok, word, NUM_DRAFT))


def verify_greedy_triton(batch, *, block: int | None = None, num_splits: int | None = None) -> VerifyOutput:
    """Greedy verification of a validated ``verispec.verify.VerifyBatch`` (see module docstring), with the
    status word of every sequence (``verispec.verify.status``: NaN / +inf / all -inf rows from pass 1's read,
    draft ids and the layout from the scan; nothing is read twice and nothing is read back).

    ``block`` / ``num_splits`` override the tiling (tests use them to force the split path).
    """
    logits = batch.target_logits  # [R, V]
    num_rows, vocab = logits.shape
    size = batch.batch_size
    part, splits = argmax_partials(logits, block, num_splits)
    width = batch.max_num_draft + 1
    out = new_outputs(size, width, logits.device)
    _greedy_scan_kernel[(size,)](
        part, batch.draft_tokens, batch.num_draft, batch.cu_num_draft,
        out.tokens, out.num_accepted, out.num_emitted, out.status, num_rows, batch.draft_tokens.shape[0], vocab,
        splits, width, BLOCK_K=small_block(width), BLOCK_S=small_block(splits), num_warps=4,
    )
    return out
