"""Fused greedy verification from logits (Triton): argmax of every row + ragged acceptance scan.

Layout and semantics: ``verispec.verify.reference`` (``reference_verify_greedy`` is the oracle).

Two launches, both CUDA-graph capturable (no host sync; grid sizes come from host ints only):

  1. ``_partial_argmax_kernel``  grid (R, S)
     Program (r, s) streams V-chunk s of row r once and writes its (max, lowest argmax) to a
     small [R, S] buffer. S > 1 only when R rows alone would leave the GPU idle (small B·K):
     e.g. R = 5, V = 128256 fp32 on 132 SMs -> S = 32 chunks of 4096 -> 160 programs instead of 5.
  2. ``_greedy_scan_kernel``  grid (B,)
     Program b reduces its k_b + 1 rows' partials (ties -> lowest split = lowest index),
     finds the first draft that differs from its row's argmax, and writes tokens /
     num_accepted / num_emitted. Reads R * S * 8 bytes: noise next to the logits.

The bound is the one read of target_logits (R * V * itemsize bytes); everything else is tiny.

Ties go to the lowest index exactly like ``torch.argmax``: each lane keeps the first index
at which it saw its maximum (strict ``>``), lanes and splits are merged by (max value, then
min index). A row that is all ``-inf`` returns index 0, as torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...device import sm_count
from ..reference import VerifyOutput

_INT32_MAX = tl.constexpr(2**31 - 1)


def device_programs(device: torch.device) -> int:
    """Programs that fill the device about eight times over (a small fixed number on CPU).

    NOTE: 4x left a half-empty last wave at mid sizes: B = 64, K = 8, bf16 V = 128256 (576
    row programs, ~3 resident per SM) measured 66 us against a 50 us floor (H100, 04:48 UTC,
    benchmarks/results/ablation.md); 8x splits those rows in two.
    """
    return 8 * sm_count(device) if device.type == "cuda" else 8  # interpreter: small, exercises the split path


def split_vocab(vocab: int, num_rows: int, block: int, target_programs: int, num_splits: int | None = None):
    """(chunk, num_splits): V cut into num_splits chunks of `chunk` (a multiple of block) elements.

    Every chunk starts inside the row (chunk * (num_splits - 1) < vocab), so every program
    sees at least one real element.
    """
    num_tiles = triton.cdiv(vocab, block)
    if num_splits is None:
        num_splits = triton.cdiv(target_programs, max(num_rows, 1))
    num_splits = max(1, min(num_splits, num_tiles))
    chunk = triton.cdiv(num_tiles, num_splits) * block
    return chunk, triton.cdiv(vocab, chunk)


def small_block(n: int) -> int:
    """A power of two >= n, at least 16: few compiled variants across K and split counts."""
    return max(16, triton.next_power_of_2(n))


def default_block(vocab: int, dtype: torch.dtype, device: torch.device) -> int:
    """Elements per tile: 16 KiB of logits per tile on the GPU (4 x 16-byte loads per thread
    at 8 warps); on the interpreter one tile per small row keeps loops short."""
    if device.type != "cuda":
        return min(triton.next_power_of_2(vocab), 1024)
    return 4096 if dtype == torch.float32 else 8192


@triton.jit
def _partial_argmax_kernel(
    logits_ptr,  # [R, V] float, row stride `stride_row`, unit stride along V
    part_val_ptr,  # [R, S] float32 out: max of chunk s
    part_idx_ptr,  # [R, S] int32 out: lowest index attaining it
    stride_row,
    vocab,
    chunk,
    num_splits,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    start = split * chunk
    offs = tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = start + offs  # an all -inf chunk reports its first index
    for t in range(0, chunk, BLOCK):
        idx = start + t + offs
        x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf"), eviction_policy="evict_first")
        x = x.to(tl.float32)
        better = x > best_val  # strict: a lane keeps the first index of its maximum
        best_val = tl.where(better, x, best_val)
        best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best_val, axis=0)
    top_idx = tl.min(tl.where(best_val == top, best_idx, _INT32_MAX), axis=0)
    tl.store(part_val_ptr + row * num_splits + split, top)
    tl.store(part_idx_ptr + row * num_splits + split, top_idx)


@triton.jit
def _greedy_scan_kernel(
    part_val_ptr,  # [R, S] float32
    part_idx_ptr,  # [R, S] int32
    draft_tokens_ptr,  # [N] int64
    num_draft_ptr,  # [B] int32
    cu_num_draft_ptr,  # [B + 1] int32
    tokens_ptr,  # [B, max_k + 1] int32 out
    num_accepted_ptr,  # [B] int32 out
    num_emitted_ptr,  # [B] int32 out
    num_splits,
    out_width,
    BLOCK_K: tl.constexpr,  # >= max_k + 1
    BLOCK_S: tl.constexpr,  # >= num_splits
):
    b = tl.program_id(0)
    k = tl.load(num_draft_ptr + b)
    draft0 = tl.load(cu_num_draft_ptr + b)
    row0 = draft0 + b  # sequence b's first target row (one bonus row per earlier sequence)
    pos = tl.arange(0, BLOCK_K)
    split = tl.arange(0, BLOCK_S)
    mask = (pos[:, None] <= k) & (split[None, :] < num_splits)
    offs = (row0 + pos)[:, None] * num_splits + split[None, :]
    val = tl.load(part_val_ptr + offs, mask=mask, other=float("-inf"))
    idx = tl.load(part_idx_ptr + offs, mask=mask, other=_INT32_MAX)
    top = tl.max(val, axis=1)
    target_argmax = tl.min(tl.where(val == top[:, None], idx, _INT32_MAX), axis=1)  # [BLOCK_K]
    draft = tl.load(draft_tokens_ptr + draft0 + pos, mask=pos < k, other=-1)
    rejected = (pos < k) & (draft != target_argmax)
    num_accepted = tl.min(tl.where(rejected, pos, k), axis=0)
    # accepted drafts equal their row's argmax, so the whole output is the argmax prefix
    tokens = tl.where(pos <= num_accepted, target_argmax, -1)
    tl.store(tokens_ptr + b * out_width + pos, tokens, mask=pos < out_width)
    tl.store(num_accepted_ptr + b, num_accepted)
    tl.store(num_emitted_ptr + b, num_accepted + 1)


def verify_greedy_triton(batch, *, block: int | None = None, num_splits: int | None = None) -> VerifyOutput:
    """Greedy verification of a validated ``verispec.verify.VerifyBatch`` (see module docstring).

    ``block`` / ``num_splits`` override the tiling (tests use them to force the split path).
    """
    logits = batch.target_logits  # [R, V]
    num_rows, vocab = logits.shape
    size = batch.batch_size
    device = logits.device
    block = block or default_block(vocab, logits.dtype, device)
    chunk, splits = split_vocab(vocab, num_rows, block, device_programs(device), num_splits)
    part_val = torch.empty((num_rows, splits), dtype=torch.float32, device=device)
    part_idx = torch.empty((num_rows, splits), dtype=torch.int32, device=device)
    width = batch.max_num_draft + 1
    tokens = torch.empty((size, width), dtype=torch.int32, device=device)
    num_accepted = torch.empty(size, dtype=torch.int32, device=device)
    num_emitted = torch.empty(size, dtype=torch.int32, device=device)
    if num_rows > 0:
        _partial_argmax_kernel[(num_rows, splits)](
            logits, part_val, part_idx, logits.stride(0), vocab, chunk, splits, BLOCK=block, num_warps=8
        )
    _greedy_scan_kernel[(size,)](
        part_val, part_idx, batch.draft_tokens, batch.num_draft, batch.cu_num_draft,
        tokens, num_accepted, num_emitted, splits, width,
        BLOCK_K=small_block(width), BLOCK_S=small_block(splits), num_warps=4,
    )
    return VerifyOutput(tokens, num_accepted, num_emitted)
