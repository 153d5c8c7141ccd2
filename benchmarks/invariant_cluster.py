"""invariant.cu's cluster kernel past 32 rows: what it buys the batch-invariant matmul and the pass (issue 22's flat
pass), measured against the slice-warp variants it replaces and cuBLAS, in one device call:

    python benchmarks/invariant_cluster.py --out DIR [--write]

1. The kernel sweep (benchmarks/exact.py's ``kernel`` part, 8B and 1B shapes, M = 32..256): every variant timed
   (CUDA graphs of 20 calls, weights rotated beyond L2), the bit checks of every variant against the 512-row product.
2. The 8B pass (exact.py's ``pass`` part) twice in the same process: with the product's rule (``invariant_variant``:
   the cluster variant where ``CLUSTER_RULE`` picks it) and without it (``CLUSTER_MIN_K`` out of reach: the
   slice-warp rule alone, the code before the cluster kernel), cuBLAS beside both.

Writes DIR/invariant_cluster.md (and benchmarks/results/invariant_cluster.md with ``--write``); ``report DIR``
rewrites the page from the JSON files a run left in DIR.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import bit_check_table, environment_line, markdown_table, write_page  # noqa: E402
from verispec.runtime.gemv import CLUSTER_VARIANT, CLUSTER_VARIANTS  # noqa: E402

NAME = "invariant_cluster.md"


def run(out: Path, ms: str, sweep_ms: str, tokens: str) -> None:
    """Both parts on the GPU, their JSON files into ``out``."""
    from benchmarks import exact
    from verispec.runtime import gemv

    kernel_args = argparse.Namespace(ms=ms, models="llama-3.1-8b,llama-3.2-1b", sweep=True, sweep_ms=sweep_ms,
                                     sweep_models="llama-3.1-8b,llama-3.2-1b")
    (out / "kernel.json").write_text(json.dumps(exact.kernel_part(kernel_args)))
    pass_args = argparse.Namespace(pass_models="llama-3.1-8b", tokens=tokens, max_rows=512)
    (out / "pass_cluster.json").write_text(json.dumps(exact.pass_part(pass_args)))
    min_k = gemv.CLUSTER_MIN_K
    gemv.CLUSTER_MIN_K = 1 << 62
    try:
        (out / "pass_slice_warp.json").write_text(json.dumps(exact.pass_part(pass_args)))
    finally:
        gemv.CLUSTER_MIN_K = min_k


def weights_floor_ms(model: str, bandwidth: float) -> float:
    """ms to read ``model``'s bf16 matrices once (exact.py's SHAPES: each layer's, then the LM head) at
    ``bandwidth`` bytes/s."""
    from benchmarks.exact import SHAPES
    from verispec.runtime.config import NAMED_SHAPES

    layers = NAMED_SHAPES[model].num_layers
    elements = sum(N * K * (1 if matrix == "lm_head" else layers) for name, matrix, N, K in SHAPES if name == model)
    return 2 * elements / bandwidth * 1e3


def page(out: Path, command: str) -> str:
    kernel = json.loads((out / "kernel.json").read_text())
    new = json.loads((out / "pass_cluster.json").read_text())
    old = json.loads((out / "pass_slice_warp.json").read_text())
    lines = ["# The batch-invariant matmul's cluster kernel (past 32 rows)", "",
             f"Written by `{command}`.", "",
             environment_line(kernel["env"], kernel["bandwidth"]), "",
             "invariant.cu's order (8 slices of interleaved 32-column steps, each a chain of mma.sync, summed in "
             "slice order) is computed two ways. The slice-warp kernel (variants 1-12): a block is 8 warps, warp p = "
             "slice p, all on one small tile (16-32 rows of W x 8-64 tokens), each warp loading its own x. The "
             "cluster kernel (variants 13-16, sm_90): a cluster of 8 blocks on one tile of 128-256 rows of W x 64 "
             "tokens, block p computing slice p for the whole tile from a cp.async ring (each W element and x token "
             "of its steps read once by the block), the 8 partials summed in slice order through distributed shared "
             "memory. Same bits (checked below).", "",
             "## Bit checks", "",
             "Rows of the product for M in 1..512 equal the 512-row product's, under a permutation, alone, and in "
             "every variant (M = 1, 9, 40, 130); `slices=1` (another order) differs (the check has teeth):", ""]
    rows = [(c["model"], c["matrix"], f"{c['N']}x{c['K']}", "yes" if not c["bad_m"] else f"NO {c['bad_m']}",
             "yes" if c["permuted_equal"] and c["alone_equal"] else "NO",
             "yes" if not c["bad_variants"] else f"NO {c['bad_variants'][:4]}",
             "yes" if c["other_order_differs"] else "NO") for c in kernel["checks"]]
    lines += markdown_table(["model", "matrix", "N x K", "every M", "permuted, alone", "every variant",
                             "slices=1 differs"], rows)
    lines += ["", "## The kernels", "",
              "us per call (median, CUDA graph of 20 calls, weights rotated beyond L2); floor = W bytes / copy "
              f"bandwidth; `slice-warp best` = the fastest slice-warp variant swept; `cluster` = "
              f"variant {CLUSTER_VARIANT}; `rule` = what `invariant_variant` runs now.", ""]
    rows = []
    for r in kernel["shapes"]:
        v = {int(k): t for k, t in r.get("variants", {}).items()}
        if not v:
            continue
        old_v, old_us = min(((k, t) for k, t in v.items() if k not in CLUSTER_VARIANTS), key=lambda kt: kt[1])
        rows.append((r["model"], r["matrix"], r["M"], f"{r['floor_us']:.1f}", f"{r['cublas_us']:.1f}",
                     f"v{old_v} {old_us:.1f}", f"{v.get(CLUSTER_VARIANT, float('nan')):.1f}",
                     f"v{r['auto']['variant']}",
                     f"{r['invariant_us']:.1f}", f"{old_us / r['invariant_us']:.2f}",
                     f"{r['invariant_us'] / r['cublas_us']:.2f}"))
    lines += markdown_table(["model", "matrix", "M", "floor", "cuBLAS", "slice-warp best", "cluster", "rule",
                             "rule us", "speed-up", "rule / cuBLAS"], rows)
    lines += ["", "## The 8B pass", "", environment_line(new["env"]), "",
              "ms per `Transformer.append` of T tokens for each of B sequences (llama-3.1-8b shape, random bf16 "
              "weights, context 512; one CUDA graph, median of 20 replays), in one process: `with cluster` = the "
              "product's rule, `without` = the slice-warp rule alone (the code before), cuBLAS (not batch-invariant) "
              "the peer. `vs 1 token` = the pass over the 1-token pass at the same B (issue 22's flat-pass goal: "
              "<= 1.2x up to 64 tokens at B = 1, <= 1.3x up to 32 tokens a sequence at B = 8).", ""]
    floor = weights_floor_ms("llama-3.1-8b", kernel["bandwidth"])
    lines[-2] += (f" Floor: the weights' bytes (every layer's matrices and the LM head) / the copy bandwidth = "
                  f"{floor:.2f} ms, the least any pass can take.")
    before = {(c["B"], c["T"]): c for c in old["models"][0]["cells"]}
    one = {c["B"]: c["invariant"] for c in new["models"][0]["cells"] if c["T"] == 1}
    rows = []
    for c in new["models"][0]["cells"]:
        b = before[(c["B"], c["T"])]
        rows.append((c["B"], c["T"], c["B"] * c["T"], f"{c['invariant']:.2f}", f"{b['invariant']:.2f}",
                     f"{c['cublas']:.2f}", f"{b['invariant'] / c['invariant']:.2f}",
                     f"{c['invariant'] / c['cublas']:.2f}", f"{c['invariant'] / one[c['B']]:.2f}"))
    lines += markdown_table(["B", "T", "rows", "with cluster ms", "without ms", "cuBLAS ms", "speed-up",
                             "with / cuBLAS", "vs 1 token"], rows)
    lines += ["", "Bit checks of the pass with the cluster kernel (a k-token pass vs k single-token passes; a "
              "sequence's rows in a ragged batch of 3 vs alone):", ""]
    lines += bit_check_table(new["models"][0]["bit_checks"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=("run", "report"), default="run")
    ap.add_argument("dir", nargs="?", help="report: the folder a run wrote")
    ap.add_argument("--out", default=None, help="folder for the JSON files and the page (default: $OUT or /tmp)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/" + NAME)
    ap.add_argument("--ms", default="32,48,64,128,256", help="kernel: rows M to time")
    ap.add_argument("--sweep-ms", default="64,128,256", help="kernel: the rows M of the variant sweep")
    ap.add_argument("--tokens", default="1,16,32,48,64", help="pass: tokens per sequence")
    args = ap.parse_args(argv)
    command = "python benchmarks/invariant_cluster.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.mode == "report":
        out = Path(args.dir or args.out or ".")
        missing = [n for n in ("kernel.json", "pass_cluster.json", "pass_slice_warp.json") if not (out / n).is_file()]
        if missing:
            ap.error(f"report: {out} lacks {', '.join(missing)} (the files a run writes there)")
    else:
        if not torch.cuda.is_available():
            sys.exit("benchmarks/invariant_cluster.py measures a GPU: no CUDA device is available")
        out = Path(args.out or os.environ.get("OUT") or "/tmp")
        out.mkdir(parents=True, exist_ok=True)
        run(out, args.ms, args.sweep_ms, args.tokens)
    write_page(page(out, command), out, NAME, args.write)


if __name__ == "__main__":
    main()
