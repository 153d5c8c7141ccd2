"""Host cost of one eager verification call: validation, layout, launches, the status read (no kernel time).

    python benchmarks/verify_host.py            # CPU: the Triton kernels stubbed out (the Python part alone)
    python benchmarks/verify_host.py --gpu      # GPU: real eager calls, V = 128256 fp32 (launch-bound at B=1)

CPU mode replaces the Triton kernels by no-ops and times ``verify_greedy`` / ``verify_sample`` on tiny CPU
tensors with one thread: what is left is the Python and torch-dispatch work a call does before and after its
launches (the number the public call adds to the kernels on any device). GPU mode times whole eager calls
(median of per-call wall time over many calls, each ending with its status read-back when checks are on):
the number to compare with vLLM's eager rejection sampler. Prints a table; writes nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from verispec import verify_greedy, verify_sample  # noqa: E402


class _NoLaunch:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kwargs)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_triton_kernels() -> None:
    """No-op kernels; the outputs come zeroed (a clean status) instead of written by the kernels."""
    from verispec.verify.triton import greedy, rejection

    for module in (greedy, rejection):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, _NoLaunch())
    new_outputs = greedy.new_outputs

    def zeroed_outputs(size, width, device):
        out = new_outputs(size, width, device)
        out.status.zero_()
        return out

    greedy.new_outputs = rejection.new_outputs = zeroed_outputs


def per_call_us(fn, iters: int, sync) -> float:
    """Median microseconds of one call (each call timed alone; ``sync`` after each when given)."""
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="real eager calls on the GPU (default: CPU, stubbed)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("-k", type=int, default=4, help="drafts per sequence")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.gpu:
        device, vocab, sync = "cuda", 128256, torch.cuda.synchronize
    else:
        stub_triton_kernels()
        device, vocab, sync = "cpu", 16, (lambda: None)
    k = args.k
    print(f"device {device}, V={vocab}, k={k}, torch {torch.__version__}, median us per call")
    print("| B | greedy checked | greedy unchecked | sample checked | sample unchecked |")
    print("|---|---|---|---|---|")
    for batch in (1, 8, 128):
        logits = torch.randn(batch * (k + 1), vocab, device=device)
        drafts = torch.randint(0, vocab, (batch * k,), device=device)
        num_draft = [k] * batch
        row = []
        for fn, extra in ((verify_greedy, {}), (verify_sample, dict(seed=1, temperature=1.0))):
            for check in (True, False):
                def call(fn=fn, extra=extra, check=check):
                    fn(logits, drafts, num_draft, backend="triton", max_num_draft=k, check_values=check, **extra)
                row.append(per_call_us(call, args.iters, sync))
        print(f"| {batch} | " + " | ".join(f"{t:.1f}" for t in row) + " |")


if __name__ == "__main__":
    main()
