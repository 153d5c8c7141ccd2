"""Static KV cache: one preallocated K and V buffer per layer, plus per-sequence lengths on the device.

Layout per layer: [B_max, KV, S_cap, D], every layer's K and V a view of ONE buffer [2, layers, B_max, KV, S_cap,
D] (so a copy of some rows' positions across all layers is one gather and one write: ``copy_positions``; each
layer's view is contiguous, as the kernels need). The active batch is the prefix [:B] (``keep`` compacts the kept
sequences into that prefix in place), so buffers never move and CUDA graphs captured against them stay
valid for the life of the cache. Slots at or past ``lengths[b]`` are dead: rollback only moves the length.

S_cap is ``max_seq_len`` + PAD_SLOTS rounded up to a multiple of 64 (aligned rows for the attention kernels);
the extra slots never hold live K/V, because writes of tokens past ``max_seq_len`` are refused on the host side.
They take the dead K/V of padding: a graphed prefill's padded tail (``Model.prefill_bucket`` caps it at S_cap)
and the padding tokens of a pass run in a wider graph (``Model.graph_width``: at most PAD_SLOTS of them).

Rows [B:B_max] are *padding rows*: a CUDA graph captured for a larger batch bucket (see ``Model.graph_rows`` in model.py) runs
them along with the live rows. Their length stays 0 (``live`` is 0 there, so a pass advances them by
nothing) and they only ever write slots [0, k) of their own dead row.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..device import to_device
from .config import ModelConfig


# Slots past max_seq_len for the padding tokens of a pass run in a wider CUDA graph (Model.graph_width: at most
# 7) and for a warm-up capture's dead writes (Model.warm_up: up to 17 tokens past a running sequence).
PAD_SLOTS = 32


def capacity(max_seq_len: int) -> int:
    """Slots per sequence for ``max_seq_len`` tokens: + PAD_SLOTS, rounded up to a multiple of 64."""
    return -(-(max_seq_len + PAD_SLOTS) // 64) * 64


class StaticKVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_seq_len: int, device, dtype):
        if batch_size < 1 or max_seq_len < 1:
            raise ValueError(f"batch_size and max_seq_len must be >= 1, got {batch_size}, {max_seq_len}")
        shape = (batch_size, cfg.num_kv_heads, capacity(max_seq_len), cfg.head_dim)
        self.kv = torch.zeros((2, cfg.num_layers, *shape), device=device, dtype=dtype)   # [2, layers, *shape]
        self.k, self.v = list(self.kv[0].unbind(0)), list(self.kv[1].unbind(0))           # per layer: views
        self.max_batch_size = batch_size
        self._lengths = torch.zeros(batch_size, device=device, dtype=torch.long)
        self.live = torch.zeros(batch_size, device=device, dtype=torch.long)   # 1 for rows < B, else 0
        self.reset(batch_size, max_seq_len)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def fits(self, batch_size: int, max_seq_len: int) -> bool:
        """Whether ``reset(batch_size, max_seq_len)`` can reuse these buffers without wasting much memory:
        enough rows, enough slots, and not more than twice (or 512 more than) the slots needed."""
        need = capacity(max_seq_len)
        return batch_size <= self.max_batch_size and need <= self.capacity <= max(2 * need, need + 512)

    def reset(self, batch_size: int, max_seq_len: int) -> None:
        """Start over with ``batch_size`` empty sequences of up to ``max_seq_len`` tokens (same buffers).
        ``batch_size`` 0: an empty batch that ``admit`` fills."""
        if not 0 <= batch_size <= self.max_batch_size or capacity(max_seq_len) > self.capacity:
            raise ValueError(f"reset({batch_size}, {max_seq_len}) does not fit a cache of {self.max_batch_size} x "
                             f"{self.capacity} slots")
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self._lengths.zero_()
        self.live.zero_()
        self.live[:batch_size] = 1
        # Host-side upper bound of max(lengths), kept without syncing: exact after prefill, +k after each
        # append, unchanged by rollback (which can only shorten). Used to refuse writes past max_seq_len.
        self.max_len_bound = 0

    @property
    def lengths(self) -> Tensor:
        return self._lengths[: self.batch_size]           # [B] view of a fixed buffer

    def lengths_for(self, rows: int) -> Tensor:
        """[rows] view of the lengths buffer (rows >= B includes padding rows, whose length is 0)."""
        return self._lengths[:rows]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def admit(self, lengths: list[int], *, allow_empty: bool = False) -> int:
        """Append ``len(lengths)`` sequences as rows [B, B + n) with those lengths (their K/V written by the
        caller's prefill); returns the first new row. Rows below B are untouched. ``allow_empty``: lengths of 0
        are accepted (rows whose prefill comes later: ``Model.admit_empty``)."""
        n, first = len(lengths), self.batch_size
        if first + n > self.max_batch_size:
            raise ValueError(f"admit: {first} + {n} sequences exceed the cache's {self.max_batch_size} rows")
        low = 0 if allow_empty else 1
        if any(not low <= x <= self.max_seq_len for x in lengths):
            raise ValueError(f"admit: lengths must be in [{low}, {self.max_seq_len}], got {lengths}")
        device = self._lengths.device
        self._lengths[first:first + n] = to_device(lengths, device, torch.long)
        self.live[first:first + n] = 1
        self.batch_size = first + n
        self.max_len_bound = max(self.max_len_bound, max(lengths))
        return first

    def keep(self, batch_indices, slots: int | None = None) -> None:
        """Move sequences ``batch_indices`` (in that order) to the prefix [:B'] and make B = B'.

        Only rows whose position changes are copied (every layer's K and V: 268 MB a row for the 8B shape in a
        2048-slot cache), so an order that leaves kept rows in place and fills the holes from the tail
        (``fill_order``) costs a few row copies. Host indices (a list or a CPU tensor) let that be decided without a
        device sync; indices on the device are copied in full. ``slots``: a moved row copies only its slots
        [0, slots) -- the caller's bound on every row's length (``Model.keep`` passes ``max_len_bound``; a few MB a
        row for the 8B shape at a few hundred tokens). None: every slot."""
        if slots is not None and slots < 0:
            raise ValueError(f"keep: slots must be >= 0 (the live slots a moved row copies), got {slots}")
        idx = torch.as_tensor(batch_indices, dtype=torch.long)
        n = idx.shape[0]
        if n > self.batch_size:
            raise ValueError(f"keep: need len(batch_indices) <= batch size {self.batch_size}, got {n}")
        device = self._lengths.device
        if idx.device.type == "cpu":
            src_host = idx.tolist()
            if len(set(src_host)) != n or not all(0 <= i < self.batch_size for i in src_host):
                raise ValueError(f"keep: batch_indices must be distinct rows in [0, {self.batch_size}), got {src_host}")
            moves = [(dst, src) for dst, src in enumerate(src_host) if dst != src]
            live = self.capacity if slots is None else min(int(slots), self.capacity)
            if moves and {m[0] for m in moves}.isdisjoint(m[1] for m in moves):
                # no row is both read and written (fill_order's moves: the tail fills the holes): one strided copy
                # of every layer's K and V ([2, layers, B, KV, S, D]) per moved row, no index kernels
                for d, s in moves:
                    self.kv[:, :, d, :, :live].copy_(self.kv[:, :, s, :, :live])
            elif moves:      # a permutation: gather first (a copy), then write
                dst = to_device([m[0] for m in moves], device, torch.long)
                src = to_device([m[1] for m in moves], device, torch.long)
                self.kv[:, :, dst, :, :live] = self.kv[:, :, src, :, :live]
        else:
            idx = idx.to(device=device, dtype=torch.long)
            for buf in self.k + self.v:
                buf[:n] = buf[idx]
        idx = to_device(idx, device, torch.long)
        self._lengths[:n] = self._lengths[idx]
        self._lengths[n:] = 0
        self.live[n:] = 0
        self.batch_size = n


    def copy_positions(self, rows: Tensor, source: "StaticKVCache", source_rows: Tensor, positions: Tensor) -> None:
        """Write into row rows[i] at positions[i] the K/V that row source_rows[i] of ``source`` holds at the same
        positions, in every layer (a cache of the same layers, heads and dtype; it may be this one: the read
        happens before the write). rows, source_rows [R] int64, positions [R, W] int64 (slots < capacity), all on
        this device. Lengths are unchanged (``Model.copy_kv`` sets them). Two device ops, no sync."""
        by_slot = (2, 4, 0, 1, 3, 5)          # [B, S, 2, layers, KV, D] views: rows and slots first
        self.kv.permute(by_slot)[rows[:, None], positions] = source.kv.permute(by_slot)[source_rows[:, None], positions]


def fill_order(batch_size: int, kept: list[int]) -> list[int]:
    """An order of the ``kept`` rows (of ``batch_size``) for ``keep`` that moves the fewest rows: kept rows
    below len(kept) stay where they are, rows from the tail fill the holes left by the others.
    e.g. batch_size=5, kept=[0, 2, 3, 4] -> [0, 4, 2, 3] (only row 4 moves, to row 1)."""
    n = len(kept)
    tail = iter(sorted(r for r in kept if r >= n))
    stay = set(r for r in kept if r < n)
    return [r if r in stay else next(tail) for r in range(n)]
