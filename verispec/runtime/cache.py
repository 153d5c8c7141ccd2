"""Static KV cache: one preallocated K and V buffer per layer, plus per-sequence lengths on the device.

Layout per layer: [B_max, KV, S_cap, D]. The active batch is the prefix [:B] (``keep`` compacts the kept
sequences into that prefix in place), so buffers never move and CUDA graphs captured against them stay
valid for the life of the cache. Slots at or past ``lengths[b]`` are dead: rollback only moves the length.

S_cap is ``max_seq_len`` rounded up to a multiple of 64 (aligned rows for the attention kernels); the
extra slots are never written, because writes past ``max_seq_len`` are refused on the host side.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .config import ModelConfig


class StaticKVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_seq_len: int, device, dtype):
        if batch_size < 1 or max_seq_len < 1:
            raise ValueError(f"batch_size and max_seq_len must be >= 1, got {batch_size}, {max_seq_len}")
        cap = -(-max_seq_len // 64) * 64
        shape = (batch_size, cfg.num_kv_heads, cap, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.max_batch_size = batch_size
        self.max_seq_len = max_seq_len
        self._lengths = torch.zeros(batch_size, device=device, dtype=torch.long)
        self.batch_size = batch_size
        # Host-side upper bound of max(lengths), kept without syncing: exact after prefill, +k after each
        # append, unchanged by rollback (which can only shorten). Used to refuse writes past max_seq_len.
        self.max_len_bound = 0

    @property
    def lengths(self) -> Tensor:
        return self._lengths[: self.batch_size]           # [B] view of a fixed buffer

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def keep(self, batch_indices: Tensor) -> None:
        """Move sequences ``batch_indices`` (in that order) to the prefix [:B'] and make B = B'."""
        idx = batch_indices.to(device=self._lengths.device, dtype=torch.long)
        n = idx.shape[0]
        if n < 1 or n > self.batch_size:
            raise ValueError(f"keep: need 1 <= len(batch_indices) <= batch size {self.batch_size}, got {n}")
        for buf in self.k + self.v:
            buf[:n] = buf[idx]                                # gather first (a copy), then write the prefix
        self._lengths[:n] = self._lengths[idx]
        self.batch_size = n
