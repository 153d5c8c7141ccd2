"""The ablation behind packed.cu's v5 (v3's bits; loads and arithmetic in different warps, the TMA's bulk copies into a
ring of shared-memory slots) on the 8B matmul shapes: v3, v4, v5 in four configurations (ring slots, register budget),
and two experimental kernels that compute v3's bits too, walk (v4's staging, a grid that holds the GPU, shared Q4_K
scales) and walk_reg (the walker with v3's register loads), with walk_reg's loads alone and arithmetic alone.

    python benchmarks/packed_v5.py [--lib build/libpackedv5.so] [--out DIR] [--write]

The kernels come from ``packed_v5.cu`` (beside this file, which includes packed.cu) built into a shared library by nvcc alone (no torch
extension, so the whole of packed.cu builds once, here or on the GPU machine: ``--lib`` names a library built before,
else it is built into ``build/``) and called through ctypes on torch's tensors and stream. Every configuration's
output is compared with v3's bit for bit (both compute v3's order) at every M, and row 0 alone with row 0 in the pass.
Timing: a CUDA graph of back-to-back calls on rotating weight copies (benchmarks/common.graph_us_per_call). Writes
``<out>/quant_v5_ablation.md`` (and, with ``--write``, ``benchmarks/results/quant_v5_ablation.md``).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import copy_bandwidth, environment, environment_line, graph_us_per_call, markdown_table  # noqa: E402
from benchmarks.quant import matmul_shapes, random_blocks  # noqa: E402

# ab_walk's configurations (packed_v5.cu): (stages a warp, blocks an SM for the register budget, shared Q4_K scales);
# 0 stages: walk_reg, the walker with v3's register loads (Q4_K and Q6_K only), the last two with L2 prefetches 2 and
# 4 items ahead
WALKS = ((3, 2, True), (3, 2, False), (2, 3, True), (2, 4, True), (4, 2, True), (2, 2, True),
         (0, 2, True), (0, 2, False), (0, 2, True), (0, 2, True))
PREFETCH = {8: 2, 9: 4}
# ab_v5's configurations of packed.cu's v5 kernel: (ring slots, blocks an SM for the register budget); packed.cu's is 2
V5 = ((4, 2), (6, 1), (3, 2), (2, 3))
GGML = {"Q4_K": 12, "Q6_K": 14, "Q8_0": 8}
VS_BF16 = 1


def build(lib: Path) -> Path:
    """nvcc packed_v5.cu -> lib (sm_90, static CUDA runtime)."""
    lib.parent.mkdir(parents=True, exist_ok=True)
    gemv = ROOT / "verispec" / "runtime" / "gemv"
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90,code=sm_90", "-O3", "-std=c++17",
           f"-I{ROOT / 'verispec'}", f"-I{gemv}", str(Path(__file__).with_name("packed_v5.cu")), "-o", str(lib)]
    print("building", lib, flush=True)
    subprocess.run(cmd, check=True)
    return lib


class Kernels:
    """The library's launchers on torch tensors (bf16 x [M, K], uint8 blocks [N, row bytes]) -> bf16 y [M, N]."""

    def __init__(self, lib: Path):
        self.lib = ctypes.CDLL(str(lib))
        vp, i = ctypes.c_void_p, ctypes.c_int
        self.lib.vs_packed_matmul.argtypes = [vp, vp, vp, vp, i, i, i, i, i, i, vp, i]
        self.lib.vs_packed_matmul.restype = i
        for fn in (self.lib.ab_walk, self.lib.ab_walk_reg_part, self.lib.ab_v5):
            fn.argtypes = [i, i, vp, vp, vp, i, i, i, vp, i]
            fn.restype = i
        if self.lib.ab_num_configs() != len(WALKS):
            raise SystemExit(f"{lib}: {self.lib.ab_num_configs()} configurations, WALKS has {len(WALKS)}: rebuild")

    @staticmethod
    def _out(x, blocks):
        return torch.empty(x.shape[0], blocks.shape[0], dtype=torch.bfloat16, device=x.device)

    def variant(self, x, blocks, qtype: int, K: int, variant: int, pdl: bool, out=None):
        y = self._out(x, blocks) if out is None else out
        err = self.lib.vs_packed_matmul(x.data_ptr(), blocks.data_ptr(), None, y.data_ptr(), VS_BF16, qtype,
                                        x.shape[0], blocks.shape[0], K, variant,
                                        torch.cuda.current_stream().cuda_stream, int(pdl))
        if err:
            raise RuntimeError(f"vs_packed_matmul variant {variant}: CUDA error {err}")
        return y

    def call(self, fn: str, x, blocks, qtype: int, K: int, config: int, out=None):
        """``fn`` (ab_walk, ab_walk_reg_part or ab_v5) in configuration ``config``, with PDL."""
        y = self._out(x, blocks) if out is None else out
        err = getattr(self.lib, fn)(config, qtype, x.data_ptr(), blocks.data_ptr(), y.data_ptr(), x.shape[0],
                                    blocks.shape[0], K, torch.cuda.current_stream().cuda_stream, 1)
        if err:
            raise RuntimeError(f"{fn} config {config}: CUDA error {err}")
        return y


def run(args) -> dict:
    ks = Kernels(Path(args.lib) if args.lib and Path(args.lib).exists() else build(Path(args.lib or ROOT / "build" /
                                                                                       "libpackedv5.so")))
    bw = copy_bandwidth()
    out = dict(env=environment(), bandwidth=bw, rows=[])
    ms = [int(m) for m in args.ms.split(",")]
    for shape, N, K in matmul_shapes(args.shape):
        for name in args.types.split(","):
            qtype = GGML[name]
            blocks = random_blocks(name, N, K, seed=N + K)
            nbytes = blocks.numel()
            copies = max(2, -(-args.rotate_mb * 2**20 // nbytes))
            bs = [blocks] + [blocks.clone() for _ in range(copies - 1)]
            calls = args.calls if nbytes < 2**28 else max(2, args.calls // 3)
            configs = [c for c, (st, _, _) in enumerate(WALKS) if st or name != "Q8_0"]
            x = torch.randn(max(ms), K, device="cuda", dtype=torch.bfloat16)
            want = ks.variant(x, blocks, qtype, K, 3, False)
            for M in ms:
                xm = x[:M].contiguous()
                row = dict(shape=shape, type=name, N=N, K=K, M=M, packed_mb=nbytes / 1e6, floor_us=nbytes / bw * 1e6)
                same = {}
                for c in configs:
                    y = ks.call("ab_walk", xm, blocks, qtype, K, c)
                    same[f"walk{c}"] = torch.equal(y, want[:M]) and torch.equal(
                        ks.call("ab_walk", xm[:1], blocks, qtype, K, c), want[:1])
                for c in range(len(V5)):
                    y = ks.call("ab_v5", xm, blocks, qtype, K, c)
                    same[f"v5_{c}"] = torch.equal(y, want[:M]) and torch.equal(
                        ks.call("ab_v5", xm[:1], blocks, qtype, K, c), want[:1])
                same["v5_default"] = torch.equal(ks.variant(xm, blocks, qtype, K, 5, True), want[:M])
                row["equals_v3"] = all(same.values())
                row["same"] = {str(k): v for k, v in same.items()}
                ys = [ks._out(xm, blocks) for _ in range(copies)]
                row["v3_us"] = graph_us_per_call(lambda i: ks.variant(xm, bs[i % copies], qtype, K, 3, True, ys[i % copies]),
                                                 calls, args.reps)
                row["v4_us"] = graph_us_per_call(lambda i: ks.variant(xm, bs[i % copies], qtype, K, 4, True, ys[i % copies]),
                                                 calls, args.reps)
                row["v5_us"] = graph_us_per_call(lambda i: ks.variant(xm, bs[i % copies], qtype, K, 5, True, ys[i % copies]),
                                                 calls, args.reps)
                for c in configs:
                    row[f"walk{c}_us"] = graph_us_per_call(
                        lambda i: ks.call("ab_walk", xm, bs[i % copies], qtype, K, c, ys[i % copies]), calls, args.reps)
                for c in range(len(V5)):
                    row[f"v5c{c}_us"] = graph_us_per_call(
                        lambda i: ks.call("ab_v5", xm, bs[i % copies], qtype, K, c, ys[i % copies]), calls, args.reps)
                if name != "Q8_0":          # where walk_reg's time goes: its loads alone, its arithmetic alone
                    for mode, key in ((1, "loads_us"), (2, "math_us"), (3, "loads_pf_us")):
                        row[key] = graph_us_per_call(
                            lambda i: ks.call("ab_walk_reg_part", xm, bs[i % copies], qtype, K, mode, ys[i % copies]),
                            calls, args.reps)
                out["rows"].append(row)
                print("time", json.dumps(row), flush=True)
            del bs, blocks
            torch.cuda.empty_cache()
    return out


def markdown(res: dict, cmd: str) -> list[str]:
    v5 = [f"v5 {sl}sl/{mb}b" for sl, mb in V5]
    walks = [(f"walk {st}st" if st else "walk_reg") + f"/{mb}b{'/share' if sh else ''}" +
             (f"/pf{PREFETCH[c]}" if c in PREFETCH else "") for c, (st, mb, sh) in enumerate(WALKS)]
    lines = ["# packed.cu v5: the ablation", "",
             environment_line(res["env"], res["bandwidth"]), "", f"Command: `{cmd}`.", "",
             "us per call (a CUDA graph of back-to-back calls on rotating weight copies, every launch with PDL); floor = "
             "packed bytes / copy bandwidth. v5 = packed.cu's variant 5 as dispatched (its kernel for Q4_K, Q6_K and "
             "Q8_0 at one row, v4 otherwise); `v5 Ssl/Bb`: its kernel alone with S ring slots and registers for B "
             "blocks an SM (packed.cu's: 3sl/2b). walk: stages a warp / blocks an SM / shared Q4_K scales; walk_reg: "
             "the walker with v3's register loads (Q4_K, Q6_K), pf = L2 prefetches that many items ahead. `== v3`: "
             "every kernel's output equals v3's bit for bit at that M, and row 0 alone.", ""]
    rows = []
    for r in res["rows"]:
        ts = [r["v3_us"], r["v4_us"], r["v5_us"]] + [r.get(f"v5c{c}_us") for c in range(len(V5))] + \
            [r.get(f"walk{c}_us") for c in range(len(WALKS))]
        rows.append([r["shape"], r["type"], r["M"], f"{r['floor_us']:.1f}", *["-" if t is None else f"{t:.1f}" for t in ts],
                     f"{r['floor_us'] / r['v5_us']:.0%}", f"{min(r['v3_us'], r['v4_us']) / r['v5_us']:.2f}x",
                     "yes" if r["equals_v3"] else "NO"])
    lines += markdown_table(["shape", "type", "M", "floor", "v3", "v4", "**v5**", *v5, *walks, "v5 % floor",
                             "v5 speedup over min(v3, v4)", "== v3"], rows)
    parts = [r for r in res["rows"] if "loads_us" in r]
    if parts:
        lines += ["", "Where walk_reg/2b/share's time goes: the same kernel with its loads only (each unit's bytes folded "
                  "into one word, no arithmetic), with L2 prefetches 4 items ahead, and with its arithmetic only (one "
                  "unit loaded, computed for every item: the compiler may hoist work that does not change, so a lower "
                  "bound); us. Whole vs loads + arithmetic: how little the two overlap in one warp.", ""]
        lines += markdown_table(["shape", "type", "M", "floor", "whole", "loads only", "loads % floor",
                                 "loads only, L2 prefetch 4 ahead", "arithmetic only"],
                                [[r["shape"], r["type"], r["M"], f"{r['floor_us']:.1f}", f"{r['walk6_us']:.1f}",
                                  f"{r['loads_us']:.1f}", f"{r['floor_us'] / r['loads_us']:.0%}",
                                  f"{r['loads_pf_us']:.1f}", f"{r['math_us']:.1f}"] for r in parts])
    lines += ["", "## What it shows", ""] + findings(res["rows"])
    return lines


def findings(rows: list[dict]) -> list[str]:
    """The ablation's reading, computed from its rows (one line each)."""
    out = []
    for typ in ("Q4_K", "Q6_K", "Q8_0"):
        one = [r for r in rows if r["type"] == typ and r["M"] == 1 and r["shape"] != "k/v"]
        if one:
            gains = [min(r["v3_us"], r["v4_us"]) / r["v5_us"] for r in one]
            out.append(f"- {typ}, one row of x, the q/o, gate+up, down and LM head shapes: v5 {min(gains):.2f}-"
                       f"{max(gains):.2f}x the faster of v3 and v4.")
    split = [r for r in rows if "loads_us" in r and r["M"] == 1 and r["shape"] == "gate+up"]
    for r in split:
        out.append(f"- {r['type']} gate+up, one warp doing both (walk_reg): loads alone {r['loads_us']:.1f} us, "
                   f"arithmetic alone {r['math_us']:.1f}, the whole {r['walk6_us']:.1f} (loads + arithmetic "
                   f"{r['loads_us'] + r['math_us']:.1f}): they barely overlap; v5 (other warps load) {r['v5_us']:.1f}.")
    walks = [r for r in rows if r["M"] == 1 and r["type"] == "Q4_K"]
    if walks:
        best = [min(r[k] for k in r if k.startswith("walk") and k.endswith("_us")) / min(r["v3_us"], r["v4_us"])
                for r in walks]
        out.append(f"- Q4_K, one row: the best walk / walk_reg configuration {min(best):.2f}-{max(best):.2f}x the time "
                   "of the faster of v3 and v4 (a grid that holds the GPU, deeper stages, shared scales, more blocks an "
                   "SM, L2 prefetches: no configuration of one warp that both loads and computes gained much).")
    out.append(f"- every kernel's output == v3's bit for bit: {'yes' if all(r['equals_v3'] for r in rows) else 'NO'}.")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None, help="the built library (default: build it into build/libpackedv5.so)")
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    ap.add_argument("--ms", default="1,5")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rotate-mb", type=int, default=400, help="weight copies a graph rotates over (past L2)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    bad = [t for t in args.types.split(",") if t not in GGML]
    if bad:
        ap.error(f"--types: {bad} not among {list(GGML)}")
    try:
        if min(int(m) for m in args.ms.split(",")) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--ms: comma-separated row counts >= 1, got {args.ms!r}")
    if args.calls < 1 or args.reps < 1 or args.rotate_mb < 1:
        ap.error("--calls, --reps and --rotate-mb must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("packed_v5.py times CUDA kernels: no GPU here")
    res = run(args)
    cmd = "python benchmarks/packed_v5.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(markdown(res, cmd)) + "\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "quant_v5_ablation.json").write_text(json.dumps(res, indent=1))
    (Path(args.out) / "quant_v5_ablation.md").write_text(text)
    if args.write:
        (ROOT / "benchmarks" / "results" / "quant_v5_ablation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
