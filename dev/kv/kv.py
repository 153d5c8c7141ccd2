"""KV-cache bookkeeping after verification: write offsets, compaction, rollback (reference).

A verify pass for B sequences scores ``num_rows[b] = k_b + 1`` positions per sequence: the
certain token from the previous round, then k_b drafts. It produces one new K/V entry per row,
in the same ragged layout as ``target_logits``:

    new_kv        [R, ...]   R = sum(num_rows); sequence b's rows at cu_num_rows[b] : cu_num_rows[b+1]

Of those, the entries to keep are the certain token's and the accepted drafts':
``num_emitted[b] = num_accepted[b] + 1`` entries (the emitted recovered/bonus token has no KV
yet: it is the next round's certain token). Two layouts consume them:

Packed (ragged, contiguous) — e.g. to append to a paged or packed cache:
    cu_num_emitted  [B + 1]   exclusive prefix sum of num_emitted: sequence b's kept entries go to
                              packed[cu_num_emitted[b] : cu_num_emitted[b+1]]
    e.g. num_emitted=[2,1,3] -> cu_num_emitted=[0,2,3,6]

Static (one row of a [B, S_max, ...] buffer per sequence) — the runtime's cache:
    the verify pass already wrote its entries in place at positions cache_lens[b] + i, so
    rollback is a length update and copies nothing:
        cache_lens_after = cache_lens_before + num_emitted
    and compaction into a static cache writes kept entry j of sequence b at position
        cache_lens[b] + j.
"""

from __future__ import annotations

import torch

from verispec.device import is_capturing
from verispec.verify.api import pick_backend


def exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    """[B] -> [B + 1] int32 with out[0] = 0 and out[b+1] = counts[0] + ... + counts[b]."""
    out = torch.zeros(counts.shape[0] + 1, dtype=torch.int32, device=counts.device)
    torch.cumsum(counts.to(torch.int32), 0, out=out[1:])
    return out


def reference_compact_kv(new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor) -> torch.Tensor:
    """Pack each sequence's first num_emitted[b] rows of ``new_kv`` [R, ...] into [sum(num_emitted), ...]."""
    if bool((num_emitted > num_rows).any()) or bool((num_emitted < 0).any()):
        raise ValueError("num_emitted must satisfy 0 <= num_emitted <= num_rows for every sequence")
    cu_rows = exclusive_cumsum(num_rows).tolist()
    pieces = [new_kv[cu_rows[b] : cu_rows[b] + int(n)] for b, n in enumerate(num_emitted.tolist())]
    return torch.cat(pieces, dim=0) if pieces else new_kv[:0]


def reference_scatter_to_cache(
    cache: torch.Tensor, cache_lens: torch.Tensor, packed: torch.Tensor, num_emitted: torch.Tensor
) -> torch.Tensor:
    """Write packed entries into a static cache [B, S_max, ...] after each sequence's length.

    Entry j of sequence b (packed[cu_num_emitted[b] + j]) goes to cache[b, cache_lens[b] + j].
    Returns the new lengths cache_lens + num_emitted; ``cache`` is modified in place.
    """
    new_lens = cache_lens + num_emitted
    if bool((new_lens > cache.shape[1]).any()):
        raise ValueError(f"cache overflow: lengths {new_lens.tolist()} exceed capacity {cache.shape[1]}")
    cu = exclusive_cumsum(num_emitted).tolist()
    for b, n in enumerate(num_emitted.tolist()):
        start = int(cache_lens[b])
        cache[b, start : start + n] = packed[cu[b] : cu[b] + n]
    return new_lens


def rollback_lengths(cache_lens_before: torch.Tensor, num_emitted: torch.Tensor) -> torch.Tensor:
    """Lengths after a verify pass wrote num_rows entries in place and num_emitted are kept."""
    return cache_lens_before + num_emitted.to(cache_lens_before.dtype)


def _check_counts(new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor) -> None:
    """Shape checks always; value checks (a host sync) only when no CUDA graph is being captured."""
    if new_kv.dim() < 1:
        raise ValueError("new_kv must have a leading [R] row dimension")
    if num_rows.dim() != 1 or num_emitted.shape != num_rows.shape:
        raise ValueError(f"num_rows and num_emitted must both be [B], got {tuple(num_rows.shape)} and {tuple(num_emitted.shape)}")
    if is_capturing():
        return
    if int(num_rows.sum()) != new_kv.shape[0]:
        raise ValueError(f"num_rows sums to {int(num_rows.sum())} but new_kv has {new_kv.shape[0]} rows")
    if bool(((num_emitted < 0) | (num_emitted > num_rows)).any()):
        raise ValueError("num_emitted must satisfy 0 <= num_emitted <= num_rows for every sequence")


def compact_kv(
    new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack the kept entries of a verify pass into a contiguous buffer.

    Args:
        new_kv: [R, ...] new K or V entries in the verify layout (R = sum(num_rows)).
        num_rows: [B] rows per sequence (k_b + 1).
        num_emitted: [B] entries to keep per sequence (num_accepted + 1), <= num_rows.

    Returns:
        (packed [R, ...], cu_num_emitted [B + 1] int32): rows packed[:cu_num_emitted[-1]] hold the
        kept entries in sequence order; rows past that are unspecified. The capacity is R so that
        no host sync is needed to size the output (CUDA-graph safe on the GPU backends).
    """
    _check_counts(new_kv, num_rows, num_emitted)
    chosen = pick_backend(backend, new_kv.device)
    if chosen == "torch":
        compacted = reference_compact_kv(new_kv, num_rows, num_emitted)
        packed = torch.empty_like(new_kv)
        packed[: compacted.shape[0]] = compacted
        return packed, exclusive_cumsum(num_emitted)
    if chosen == "triton":
        from dev.kv.kv_compact_triton import compact_kv_triton

        return compact_kv_triton(new_kv, num_rows, num_emitted)
    from dev.cuda_ext import compact_kv_cuda

    return compact_kv_cuda(new_kv, num_rows, num_emitted)


def scatter_to_cache(
    cache: torch.Tensor,
    cache_lens: torch.Tensor,
    new_kv: torch.Tensor,
    num_rows: torch.Tensor,
    num_emitted: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Append each sequence's kept verify entries to a static cache [B, S_max, ...] in place.

    Kept entry j of sequence b (new_kv[cu_num_rows[b] + j], j < num_emitted[b]) is written to
    cache[b, cache_lens[b] + j]. Returns the new lengths cache_lens + num_emitted.
    """
    _check_counts(new_kv, num_rows, num_emitted)
    if cache.dim() != new_kv.dim() + 1 or cache.shape[2:] != new_kv.shape[1:]:
        raise ValueError(f"cache {tuple(cache.shape)} must be [B, S_max, ...] with trailing dims of new_kv {tuple(new_kv.shape)}")
    if not is_capturing():
        if bool((cache_lens + num_emitted > cache.shape[1]).any()):
            raise ValueError(f"cache overflow: lengths {(cache_lens + num_emitted).tolist()} exceed capacity {cache.shape[1]}")
    chosen = pick_backend(backend, new_kv.device)
    if chosen == "torch":
        packed = reference_compact_kv(new_kv, num_rows, num_emitted)
        return reference_scatter_to_cache(cache, cache_lens, packed, num_emitted)
    if chosen == "triton":
        from dev.kv.kv_compact_triton import scatter_to_cache_triton

        return scatter_to_cache_triton(cache, cache_lens, new_kv, num_rows, num_emitted)
    from dev.cuda_ext import scatter_to_cache_cuda

    return scatter_to_cache_cuda(cache, cache_lens, new_kv, num_rows, num_emitted)
