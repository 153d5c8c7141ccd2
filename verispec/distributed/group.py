"""Process groups with bounded waits: start N local ranks, run a function on each, collect the results.

Every collective of a group made here carries ``collective_timeout_s`` (gloo and NCCL both honour the
process group's timeout), so a rank that dies or never arrives turns into an error on its peers instead of
a hang; ``run_local`` adds a wall-clock deadline over the whole run and reports which rank failed and why.
"""
from __future__ import annotations

import datetime
import os
import queue as queue_mod
import socket
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class DistributedError(RuntimeError):
    """A rank failed, timed out, or the ranks disagree on the configuration."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_backend(backend: str) -> None:
    """Raise a clear error when ``backend`` cannot run here (NCCL without CUDA GPUs or without NCCL)."""
    if backend not in ("gloo", "nccl"):
        raise DistributedError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedError("backend 'nccl' needs CUDA GPUs and none is visible; use --backend gloo (CPU)")
        if not dist.is_nccl_available():
            raise DistributedError("this torch build has no NCCL; use --backend gloo or a CUDA build of torch")


def init_group(rank: int, world_size: int, backend: str, init_method: str, collective_timeout_s: float) -> None:
    """Join the default process group. "nccl" joins as "cpu:gloo,cuda:nccl": CUDA tensors (the tensor-parallel
    all-reduces) go over NCCL, CPU tensors (SSD's messages, ``channel.py``) over gloo, whose receives can be
    bounded and which lets two ranks share one GPU (NCCL refuses two ranks on one device)."""
    check_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout_s))


def _entry(rank, fn, world_size, backend, init_method, collective_timeout_s, results, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        init_group(rank, world_size, backend, init_method, collective_timeout_s)
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", out))
    except BaseException:                                   # noqa: BLE001 - reported to the parent verbatim
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local(fn: Callable[..., Any], world_size: int, *args, backend: str = "gloo", timeout_s: float = 60.0,
              collective_timeout_s: float = 20.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes joined in one process group;
    return the per-rank results (picklable). ``fn`` must be importable (a module-level function).

    Raises DistributedError naming the first rank that failed (with its traceback), or when the run passes
    ``timeout_s`` (every process is then killed)."""
    if world_size < 1:
        raise DistributedError(f"world_size must be >= 1, got {world_size}")
    check_backend(backend)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_entry, args=(r, fn, world_size, backend, init_method, collective_timeout_s,
                                              results, args), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    outs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        while len(outs) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(outs) - set(errors))
                raise DistributedError(f"run_local: ranks {missing} did not finish within {timeout_s:.0f} s"
                                       + _first_error(errors))
            try:
                rank, status, value = results.get(timeout=min(left, 0.5))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in outs and r not in errors]
                for r in dead:
                    errors[r] = f"process exited with code {procs[r].exitcode} without a result"
                continue
            (outs if status == "ok" else errors)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise DistributedError(_first_error(errors).strip())
    return [outs[r] for r in range(world_size)]


def _first_error(errors: dict[int, str]) -> str:
    if not errors:
        return ""
    rank = min(errors)
    return f"\nrank {rank} failed:\n{errors[rank]}"
