"""``kernels``: greedy verification latency vs batch size per acceptance rate, for every backend.

Workloads come from ``verispec.verify.workloads.greedy_workload`` (the target's vocabulary and dtype, the
largest swept K drafts per sequence); each backend's answer is checked against the workload's known one
before it is timed (a wrong kernel gets no timing row: it raises). Bytes moved = the target logits read once
(B (K + 1) V elements) + the drafts and outputs; the floor = bytes / the memory bandwidth measured in this
run by a large device copy (read + write). ``achieved_gbps`` = bytes / measured time (the roofline plot).
"""
from __future__ import annotations

import statistics
import time

import torch

from ...verify import verify_greedy
from ...verify.workloads import greedy_workload

STUDY = "kernels"


def backends(device_type: str) -> tuple[str, ...]:
    """Backends that run on this device type ("triton" on a CPU only runs in the slow interpreter)."""
    return ("torch", "triton", "cuda") if device_type == "cuda" else ("torch",)


def points(bench) -> list[dict]:
    o = bench.options
    return [{"backend": b, "batch": n, "alpha": a} for b in backends(bench.device_type) for n in o.batches
            for a in o.alphas]


def _sync(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _median_s(fn, device: torch.device, reps: int) -> float:
    sync = _sync(device)
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(bench) -> float:
    """Bytes/s (read + written) of a device copy far larger than the caches: the floor's rate."""
    if "bandwidth" not in bench.memo:
        device = bench.target.device
        nbytes = (1 << 30) if device.type == "cuda" else (128 << 20)
        src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        seconds = _median_s(lambda: dst.copy_(src), device, reps=10)
        del src, dst
        bench.memo["bandwidth"] = 2 * nbytes / seconds
    return bench.memo["bandwidth"]


def measure(bench, point: dict) -> list[dict]:
    target = bench.target
    device, dtype = target.device, target.dtype
    k, vocab = max(bench.options.ks), target.config.vocab_size
    w = greedy_workload(point["batch"], k, vocab, point["alpha"], dtype=dtype, device=device, seed=bench.options.seed)

    def call():
        return verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, backend=point["backend"])

    out = call()
    if not (torch.equal(out.tokens.cpu(), w.expected.tokens.cpu())
            and torch.equal(out.num_accepted.cpu(), w.expected.num_accepted.cpu())):
        raise RuntimeError(f"verify_greedy backend {point['backend']!r} disagrees with the known answer "
                           f"(batch {point['batch']}, alpha {point['alpha']})")
    reps = 30 if device.type == "cuda" else 10
    seconds = _median_s(call, device, reps)
    nbytes = (w.target_logits.numel() * w.target_logits.element_size() + w.draft_tokens.numel() * 8
              + out.tokens.numel() * 4 + 2 * point["batch"] * 4)
    bandwidth = copy_bandwidth(bench)
    return [{"k": k, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""), "us": 1e6 * seconds,
             "bytes": nbytes, "floor_us": 1e6 * nbytes / bandwidth, "achieved_gbps": nbytes / seconds / 1e9,
             "copy_gbps": bandwidth / 1e9}]
