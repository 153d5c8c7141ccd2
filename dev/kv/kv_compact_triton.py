"""KV compaction after verification (Triton): keep each sequence's first num_emitted rows.

Semantics: ``dev.kv.kv`` (``reference_compact_kv`` / ``reference_scatter_to_cache``).

One launch each, grid (B, C): program (b, c) copies column block c of the kept rows of
sequence b. Rows are treated as opaque bytes, viewed as the widest integer type that divides
the row size (e.g. a bf16 row of H=8 x D=128 is 2048 bytes = 256 int64), so any KV dtype is
copied bit-exactly with wide, coalesced loads. Each program recomputes the exclusive prefix
sums it needs with ``tl.cumsum`` over all B counts (B <= a few thousand: cheaper than a second
launch), e.g. num_rows=[3,1,4], num_emitted=[2,1,3] -> cu_num_rows=[0,3,4,8],
cu_num_emitted=[0,2,3,6]; program (0, 0) also writes cu_num_emitted.
No host sync: the packed output has capacity R, the loop over kept rows runs on the device.
Bound: bytes of the kept rows, read once and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _as_words(rows: torch.Tensor) -> torch.Tensor:
    """View rows [..., row] (row = the last dim, unit stride) as words of the widest integer
    type that divides the row's bytes, every stride and the start address."""
    as_bytes = rows.view(torch.uint8)
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dtype).element_size()
        strides_ok = all(st % size == 0 for st in as_bytes.stride()[:-1])
        if as_bytes.shape[-1] % size == 0 and strides_ok and as_bytes.data_ptr() % size == 0:
            return as_bytes.view(dtype)
    return as_bytes


@triton.jit
def _exclusive_cumsum_at(counts_ptr, num_seqs, b, BLOCK_B: tl.constexpr):
    """counts[0] + ... + counts[b - 1] (int32), from all B counts in one block."""
    seq = tl.arange(0, BLOCK_B)
    counts = tl.load(counts_ptr + seq, mask=seq < num_seqs, other=0).to(tl.int32)
    return tl.sum(tl.where(seq < b, counts, 0), axis=0)


@triton.jit
def _compact_kernel(
    src_ptr,  # [R, W] words
    dst_ptr,  # [R, W] words out
    num_rows_ptr,  # [B]
    num_emitted_ptr,  # [B]
    cu_num_emitted_ptr,  # [B + 1] int32 out
    num_seqs,
    row_words,
    BLOCK_B: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1)
    if (b == 0) & (c == 0):
        seq = tl.arange(0, BLOCK_B)
        counts = tl.load(num_emitted_ptr + seq, mask=seq < num_seqs, other=0).to(tl.int32)
        tl.store(cu_num_emitted_ptr + 1 + seq, tl.cumsum(counts, axis=0), mask=seq < num_seqs)
        tl.store(cu_num_emitted_ptr, 0)
    src_row0 = _exclusive_cumsum_at(num_rows_ptr, num_seqs, b, BLOCK_B)
    dst_row0 = _exclusive_cumsum_at(num_emitted_ptr, num_seqs, b, BLOCK_B)
    # NOTE: clamped to num_rows so a bad count cannot read past the sequence (no sync to raise)
    kept = tl.minimum(tl.load(num_emitted_ptr + b), tl.load(num_rows_ptr + b)).to(tl.int32)
    col = c * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = col < row_words
    for j in range(0, kept):
        words = tl.load(src_ptr + (src_row0 + j).to(tl.int64) * row_words + col, mask=mask)
        tl.store(dst_ptr + (dst_row0 + j).to(tl.int64) * row_words + col, words, mask=mask)


@triton.jit
def _scatter_kernel(
    src_ptr,  # [R, W] words
    cache_ptr,  # [B, S_max, W] words (rows may be strided)
    cache_lens_ptr,  # [B]
    num_rows_ptr,  # [B]
    num_emitted_ptr,  # [B]
    num_seqs,
    row_words,
    cache_stride_b,
    cache_stride_s,
    max_len,
    BLOCK_B: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1)
    src_row0 = _exclusive_cumsum_at(num_rows_ptr, num_seqs, b, BLOCK_B)
    kept = tl.minimum(tl.load(num_emitted_ptr + b), tl.load(num_rows_ptr + b)).to(tl.int32)
    start = tl.load(cache_lens_ptr + b).to(tl.int64)
    col = c * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = col < row_words
    dst_seq = cache_ptr + b.to(tl.int64) * cache_stride_b
    for j in range(0, kept):
        words = tl.load(src_ptr + (src_row0 + j).to(tl.int64) * row_words + col, mask=mask)
        # NOTE: a write past S_max is dropped (no host sync to raise); the returned length shows it
        tl.store(dst_seq + (start + j) * cache_stride_s + col, words, mask=mask & (start + j < max_len))


def _block_w(row_words: int) -> int:
    return min(triton.next_power_of_2(max(row_words, 1)), 2048)


def compact_kv_triton(new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor):
    """Pack the kept rows of ``new_kv`` [R, ...]; see ``dev.kv.kv.compact_kv``.

    Returns (packed [R, ...] with rows past cu_num_emitted[-1] unspecified, cu_num_emitted [B + 1] int32).
    """
    new_kv = new_kv.contiguous()
    num_seqs = num_rows.shape[0]
    packed = torch.empty_like(new_kv)
    cu_num_emitted = torch.empty(num_seqs + 1, dtype=torch.int32, device=new_kv.device)
    src = _as_words(new_kv.reshape(new_kv.shape[0], -1))  # [R, W]
    row_words = src.shape[1]
    block_w = _block_w(row_words)
    _compact_kernel[(num_seqs, triton.cdiv(row_words, block_w))](
        src, _as_words(packed.reshape(packed.shape[0], -1)), num_rows, num_emitted, cu_num_emitted, num_seqs, row_words,
        BLOCK_B=triton.next_power_of_2(num_seqs), BLOCK_W=block_w, num_warps=4,
    )
    return packed, cu_num_emitted


def scatter_to_cache_triton(
    cache: torch.Tensor, cache_lens: torch.Tensor, new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor
) -> torch.Tensor:
    """Append kept rows to a static cache [B, S_max, ...] in place; see ``dev.kv.kv.scatter_to_cache``.

    Returns cache_lens + num_emitted. Entries that would land past S_max are dropped (no host
    sync is allowed here to raise); callers check ``new_lens <= S_max`` off the hot path.
    """
    if cache.dtype != new_kv.dtype:
        raise ValueError(f"cache dtype {cache.dtype} != new_kv dtype {new_kv.dtype}")
    row_elems = new_kv[0].numel() if new_kv.shape[0] else 1
    if cache.stride(-1) != 1 or cache[0, 0].numel() != row_elems or not cache[0, 0].is_contiguous():
        raise ValueError("cache rows (the trailing dims of [B, S_max, ...]) must be contiguous")
    new_kv = new_kv.contiguous()
    num_seqs, max_len = cache.shape[0], cache.shape[1]
    cache_words = _as_words(cache.view(num_seqs, max_len, row_elems))  # [B, S_max, W], shares storage
    src = new_kv.reshape(new_kv.shape[0], -1).view(torch.uint8).view(cache_words.dtype)  # [R, W]
    row_words = src.shape[1]
    block_w = _block_w(row_words)
    _scatter_kernel[(num_seqs, triton.cdiv(row_words, block_w))](
        src, cache_words, cache_lens, num_rows, num_emitted, num_seqs, row_words,
        cache_words.stride(0), cache_words.stride(1), max_len,
        BLOCK_B=triton.next_power_of_2(num_seqs), BLOCK_W=block_w, num_warps=4,
    )
    return cache_lens + num_emitted.to(cache_lens.dtype)

