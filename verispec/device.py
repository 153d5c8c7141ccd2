"""What every wing asks of the device: stall-free host -> device copies, capture detection, SM count,
dtype names, the CPU thread-count policy. The bottom layer: it imports nothing of verispec, and every wing may import it.

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


def parse_device(device) -> torch.device:
    """A usable torch.device from a name or a torch.device: ValueError for unknown names ("tpu") and for
    CUDA devices that this machine does not have (no CUDA, or an index past the last GPU)."""
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda' / 'cuda:i'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(dev)!r} was asked for but CUDA is not available here; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(dev)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device {str(dev)!r} is not supported: use 'cpu' or 'cuda' / 'cuda:i'")
    return dev


def to_device(values, device, dtype: torch.dtype | None = None) -> Tensor:
    """``values`` (a tensor, list or number) as a tensor on ``device`` (and ``dtype``), without a host sync.

    Inside a CUDA graph capture the values are written by fill kernels instead of a copy: a captured copy
    would keep reading the transient pinned buffer at its address on every replay, after the allocator has
    handed it to someone else; a fill kernel carries its value in the graph itself."""
    t = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)                  # same device (no-op), device to device, or to the CPU: plain
    if torch.cuda.is_current_stream_capturing():
        return _filled(t, device)
    return t.contiguous().pin_memory().to(device, non_blocking=True)   # an expanded view cannot be pinned


def _filled(host: Tensor, device) -> Tensor:
    """A device copy of a small host tensor made of kernels that carry their values (so that a CUDA graph captures
    the values themselves): one per run of equal values (a fill), and for integers one per arithmetic run (an
    arange), so that a tree's parents or a row's positions cost a few kernels, not one per entry.
    e.g. [2, 2, 5] -> fill [0:2] with 2, [2:3] with 5; [-1, 0, 1, 2, 7] -> arange(-1, 3) into [0:4], fill [4:5]."""
    flat = host.reshape(-1).tolist()
    out = torch.empty(len(flat), dtype=host.dtype, device=device)
    integer = not (host.dtype.is_floating_point or host.dtype.is_complex or host.dtype == torch.bool)
    start = 0
    while start < len(flat):
        step = flat[start + 1] - flat[start] if integer and start + 1 < len(flat) else 0
        end = start + 1
        while end < len(flat) and (flat[end] - flat[end - 1] == step if integer else flat[end] == flat[start]):
            end += 1
        if end - start == 1 or step == 0:
            out[start:end].fill_(flat[start])
        else:
            torch.arange(flat[start], flat[start] + step * (end - start), step, dtype=host.dtype, device=device,
                         out=out[start:end])
        start = end
    return out.view(host.shape)


def copy_into(buffer: Tensor, values: Tensor) -> None:
    """Write ``values`` (same shape, any device) into the leading rows of ``buffer`` without a host sync:
    one copy, through pinned memory when it crosses from the host to a GPU."""
    if values.device.type == "cpu" and buffer.device.type == "cuda":
        values = values.pin_memory()
    buffer[: values.shape[0]].copy_(values, non_blocking=True)


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


# ------------------------------------------------------------------------------------------ CPU threads
# Why a policy: torch's OpenMP kernels split every op across all cores and then wait at a barrier for the
# slowest thread. When another process occupies a core, one of our threads is preempted for whole
# scheduler slices and every op waits for it: decoding a small model on a busy 2-core machine ran 12-40x
# slower with torch's default (one thread per core) than with one thread fewer. So on CPU we use the
# cores that are free *now* (never fewer than 1), unless the user chose a thread count themselves.
_TORCH_DEFAULT_THREADS = torch.get_num_threads()   # what torch picked at start-up (before any policy)
_applied_threads: int | None = None                # what apply_cpu_thread_policy last set
_pinned_by_user = False                            # apply_cpu_thread_policy(n) was called with a count


def physical_cores() -> int:
    """Cores this process may run on, counting SMT siblings once (affinity / cpusets respected)."""
    import os

    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        try:
            base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
            with open(base + "physical_package_id") as f, open(base + "core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def _cpu_jiffies() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)      # idle + iowait
    return sum(values[:8]), idle


def busy_cpus(window_s: float = 0.1) -> float:
    """CPUs' worth of work other processes do right now: /proc/stat sampled ``window_s`` apart while this
    thread sleeps (so our own threads count only if they are running). 0.0 where /proc/stat is absent."""
    import os
    import time

    first = _cpu_jiffies()
    if first is None:
        return 0.0
    time.sleep(window_s)
    second = _cpu_jiffies()
    total, idle = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return 0.0
    return (os.cpu_count() or 1) * (total - idle) / total


def threads_chosen_by_user() -> bool:
    """Whether the user picked the CPU thread count (OMP_NUM_THREADS / MKL_NUM_THREADS, or a
    torch.set_num_threads call that this module did not make): then no policy overrides it."""
    import os

    if _pinned_by_user or os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return True
    return torch.get_num_threads() not in (_TORCH_DEFAULT_THREADS, _applied_threads)


def pick_cpu_threads(cores: int | None = None, busy: float | None = None) -> int:
    """Threads for torch's CPU kernels: the physical cores that other processes leave free, at least 1.

    A core counts as free when less than ~0.75 of it is busy: a competitor that takes a quarter of a core
    already preempts a thread that shares it often enough to stall every barrier."""
    cores = physical_cores() if cores is None else cores
    busy = busy_cpus() if busy is None else busy
    return max(1, min(cores, int(cores - busy + 0.25)))


def apply_cpu_thread_policy(threads: int | None = None) -> int:
    """Set torch's CPU thread count: ``threads`` if given (the user's choice, e.g. ``--threads``), else
    ``pick_cpu_threads()`` unless ``threads_chosen_by_user()``. Returns the count in effect."""
    global _applied_threads, _pinned_by_user
    if threads is not None:
        _pinned_by_user = True
    elif threads_chosen_by_user():
        return torch.get_num_threads()
    else:
        threads = pick_cpu_threads()
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    _applied_threads = threads
    return threads
