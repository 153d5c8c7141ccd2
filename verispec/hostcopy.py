"""Host -> device copies that do not stall the CUDA stream.

A blocking ``.to("cuda")`` of a CPU tensor, and ``torch.tensor(values, device="cuda")``, synchronize the host
with the stream: the host waits for all queued GPU work (e.g. the whole target pass), and then the GPU idles
while the host prepares the next launches. On an H100 (2026-11-23) such hidden syncs were where the host
waited in every speculative round. Here the values go through pinned memory (torch's caching host
allocator: reused, and kept alive until the queued copy has run) with ``non_blocking=True``, which CUDA
queues in stream order without a sync, so the engine keeps exactly one sync per round: reading how many
tokens each sequence accepted.
"""
from __future__ import annotations

import torch
from torch import Tensor


def to_device(values, device, dtype: torch.dtype | None = None) -> Tensor:
    """``values`` (a tensor, list or number) as a tensor on ``device`` (and ``dtype``), without a host sync."""
    t = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)                  # same device (no-op), device to device, or to the CPU: plain
    return t.pin_memory().to(device, non_blocking=True)
