"""The drafters' greedy choice on the GPU: ``greedy_tokens`` (``ops.argmax_rows``, one Triton program a row) vs
torch's ``argmax`` and vs the two-pass torch form it replaced (each row cut into equal pieces: max per piece, then
the first piece holding the row's maximum), at the vocabularies drafters choose over (a draft vocabulary of 8192 or
32000, SmolLM2's 49152, Llama-3's 128256) and 1 / 8 / 64 rows; the kernel at several block sizes.

    python benchmarks/greedy_choice.py --out DIR [--write]     # GPU only

Each cell: microseconds per call, the median of 20 replays of one CUDA graph of 50 calls back to back (launch gaps
inside a graph count, as in a captured draft loop); the floor is the row bytes / the measured copy bandwidth. Every
variant is checked equal to ``torch.argmax`` on the same rows first.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (copy_bandwidth, environment, environment_line, graph_us_per_call,  # noqa: E402
                               markdown_table)
from verispec.runtime import ops  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VOCABS = (8192, 32000, 49152, 128256)
ROWS = (1, 8, 64)
BLOCKS = (2048, 4096, 8192, 16384)


def two_pass(x: torch.Tensor) -> torch.Tensor:
    """The torch form ``greedy_tokens`` used before ``ops.argmax_rows``: P equal pieces (the largest divisor of V in
    [16, 512] with pieces >= 128 long), max per piece, the first piece holding the maximum."""
    V = x.shape[-1]
    parts = next((p for p in range(min(512, V // 128), 15, -1) if V % p == 0), 1)
    if parts == 1:
        return x.argmax(dim=-1)
    best, where = x.reshape(*x.shape[:-1], parts, V // parts).max(dim=-1)
    piece = best.argmax(dim=-1, keepdim=True)
    return (piece * (V // parts) + where.gather(-1, piece)).squeeze(-1)


def rows_of_cells(bandwidth: float) -> list[list]:
    default = ops.ARGMAX_BLOCK
    out = []
    for V in VOCABS:
        for R in ROWS:
            x = torch.randn(R, V, device="cuda").bfloat16()
            ref = x.argmax(dim=-1)
            assert torch.equal(two_pass(x), ref)
            cells = [graph_us_per_call(lambda i: x.argmax(dim=-1), 50, 20),
                     graph_us_per_call(lambda i: two_pass(x), 50, 20)]
            for block in BLOCKS:
                ops.ARGMAX_BLOCK = block
                try:
                    assert torch.equal(ops.argmax_rows(x), ref), (V, R, block)
                    cells.append(graph_us_per_call(lambda i: ops.argmax_rows(x), 50, 20))
                finally:
                    ops.ARGMAX_BLOCK = default
            floor = x.numel() * x.element_size() / bandwidth * 1e6
            out.append([V, R, f"{floor:.2f}", *(f"{c:.2f}" for c in cells)])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for greedy_choice.md")
    p.add_argument("--write", action="store_true", help="also write it to benchmarks/results/")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("greedy_choice.py: needs a CUDA GPU (it times the greedy choice's kernels)", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth()
    rows = rows_of_cells(bandwidth)
    lines = ["# The drafters' greedy choice: ops.argmax_rows vs torch", "",
             environment_line(environment(), bandwidth), "",
             f"Command: `python benchmarks/greedy_choice.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             "", "Microseconds per call (bf16 logits, median of 20 replays of a CUDA graph of 50 calls); every "
             "variant equals torch.argmax on these rows. The kernel ships with blocks of "
             f"{ops.ARGMAX_BLOCK} ids (`ops.ARGMAX_BLOCK`).", ""]
    lines += markdown_table(["V", "rows", "floor", "torch argmax", "two-pass torch",
                             *(f"argmax_rows, block {b}" for b in BLOCKS)], rows)
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    for target in [args.out] + ([RESULTS] if args.write else []):
        (target / "greedy_choice.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
