"""Point-to-point messages between two ranks with a bounded wait on every receive.

A message is a small picklable object (a dict of host lists and numbers): its bytes go as a uint8 tensor after
an int64 length. Large tensors (the drafts' q rows) go as tensors of a size both sides know. All of them are CPU
tensors, so they travel over gloo also when the ranks run on GPUs (``group.init_group`` joins NCCL runs as
"cpu:gloo,cuda:nccl"): a gloo receive can be bounded, a CUDA one cannot (NCCL's wait only orders streams). ``send_object(..., wait=False)`` returns at once;
the sends of a channel stay in order, and a channel waits for its earlier sends before it reuses them.

Every receive waits at most ``timeout_s``: a peer that died (gloo reports the closed connection at once) or
went silent becomes a ``DistributedError`` naming what was awaited, never a hang.
"""
from __future__ import annotations

import datetime
import pickle

import torch
import torch.distributed as dist
from torch import Tensor

from .group import DistributedError


class Channel:
    """Messages to and from one peer rank (CPU tensors: see the module docstring)."""

    def __init__(self, peer: int, timeout_s: float):
        self.peer, self.device = peer, torch.device("cpu")
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._pending: list = []              # (work, tensors kept alive until the send completes)

    def send_object(self, obj, *, wait: bool = True) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(self.device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=self.device)
        self._send([size, payload], wait)

    def send_tensor(self, tensor: Tensor, *, wait: bool = True) -> None:
        self._send([tensor.to(self.device).contiguous()], wait)

    def _send(self, tensors: list[Tensor], wait: bool) -> None:
        for t in tensors:
            try:
                self._pending.append((dist.isend(t, dst=self.peer), t))
            except RuntimeError as e:           # gloo raises at once when the peer's connection is closed
                raise DistributedError(f"sending to rank {self.peer}: the peer failed or closed the connection "
                                       f"({e})") from e
        if wait:
            self.flush()

    def flush(self) -> None:
        """Wait until every send so far has completed (bounded)."""
        pending, self._pending = self._pending, []
        for work, _ in pending:
            wait(work, self.timeout, f"sending to rank {self.peer}")

    def recv_object(self, what: str, timeout_s: float | None = None):
        timeout = self.timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        size = self._recv(torch.zeros(1, dtype=torch.int64, device=self.device), what, timeout)
        payload = self._recv(torch.empty(int(size), dtype=torch.uint8, device=self.device), what, timeout)
        return pickle.loads(payload.cpu().numpy().tobytes())

    def recv_tensor(self, shape, dtype: torch.dtype, what: str) -> Tensor:
        return self._recv(torch.empty(shape, dtype=dtype, device=self.device), what, self.timeout)

    def _recv(self, buffer: Tensor, what: str, timeout: datetime.timedelta) -> Tensor:
        try:
            work = dist.irecv(buffer, src=self.peer)
        except RuntimeError as e:
            raise DistributedError(f"{what}: the peer failed or closed the connection ({e})") from e
        wait(work, timeout, what)
        return buffer


def wait(work, timeout: datetime.timedelta, what: str) -> None:
    """work.wait with a bound; DistributedError naming ``what`` when the peer failed or nothing arrived."""
    try:
        ok = work.wait(timeout)
    except RuntimeError as e:
        raise DistributedError(f"{what}: the peer failed or closed the connection ({e})") from e
    if ok is False:
        raise DistributedError(f"{what}: nothing arrived within {timeout.total_seconds():.0f} s")


class NullChannel:
    """A ``Channel`` to no one: what it is sent is dropped. For running a draft rank's work alone in one process (its
    tests, and benchmarks/ssd_gpu_check.py timing it)."""

    peer = 0

    def send_object(self, obj, wait=True):
        pass

    def send_tensor(self, tensor, wait=True):
        pass

    def flush(self):
        pass
