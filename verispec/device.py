"""What every wing asks of the device: stall-free host -> device copies, capture detection, SM count,
dtype names. The bottom layer: it imports nothing of verispec, and every wing may import it.

Host -> device copies. A blocking ``.to("cuda")`` of a CPU tensor, and ``torch.tensor(values,
device="cuda")``, synchronize the host with the stream: the host waits for all queued GPU work (e.g. the
whole target pass), and then the GPU idles while the host prepares the next launches. ``to_device`` sends
the values through pinned memory (torch's caching host allocator: reused, and kept alive until the queued
copy has run) with ``non_blocking=True``, which CUDA queues in stream order without a sync, so the engine
keeps exactly one sync per round: reading how many tokens each sequence accepted.
"""
from __future__ import annotations

import torch
from torch import Tensor

# The names a user may give for a dtype (CLI flags, load_model(dtype="bf16")).
DTYPE_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
               "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}


def parse_dtype(dtype) -> torch.dtype:
    """A torch.dtype from a torch.dtype or one of ``DTYPE_NAMES`` (case-insensitive); ValueError otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_NAMES)} or a torch.dtype")


def to_device(values, device, dtype: torch.dtype | None = None) -> Tensor:
    """``values`` (a tensor, list or number) as a tensor on ``device`` (and ``dtype``), without a host sync."""
    t = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)                  # same device (no-op), device to device, or to the CPU: plain
    return t.pin_memory().to(device, non_blocking=True)


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (then no host sync, no value check may run)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_SM_COUNT: dict[int, int] = {}


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); 8 for a CPU device, where the Triton interpreter
    runs: small, but enough programs to exercise the split paths in tests."""
    device = torch.device(device)
    if device.type != "cuda":
        return 8
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SM_COUNT[key]
