"""Decode-step weight matmuls: cuBLAS (F.linear) vs verispec's CUDA GEMV (verispec/runtime/gemv/gemv.cu).

For every llama-3.1-8b / llama-3.2-1b weight shape W [N, K] (bf16) and M tokens in {1, 2, 4, 8}:
  1. builds the extension, then checks gemv_cuda against F.linear in fp32 (x.float() @ w.float()^T)
     on that shape and M, and checks that two calls are bit-identical;
  2. times F.linear and gemv_cuda: a CUDA graph of --calls back-to-back calls, each on a DIFFERENT
     copy of W (copies rotate; together they exceed the 50 MB L2, so every call reads W from HBM),
     replayed --reps times; time per call = median replay time (CUDA events) / --calls;
  3. the floor: W bytes / copy bandwidth (benchmarks/common.py);
  4. --sweep: the same timing for every (rows, split) configuration of the kernel, to check (and tune)
     the launcher's automatic choice.
  5. --fused (instead of 1-4): the fused prologues of dev/gemv_fused/gemv_fused.cu against the unfused composition, for the
     norm-fed matrices (qkv, gate/up, LM head: ops.add_rmsnorm + gemv_cuda vs gemv_rmsnorm_cuda, with
     the residual add) and the SwiGLU-fed one (down: ops.silu_mul + gemv_cuda vs gemv_swiglu_cuda),
     both timed the same way (a graph of --calls pairs / fused calls), at M in --fused-ms; plus the fused
     kernel at tiles = 1, 2, 4 row tiles per block (auto: one wave of blocks).
Prints a markdown table and writes it (with the device, versions, command and a short reading) to
benchmarks/results/gemv.md, or to --out.

  python benchmarks/gemv.py                   # GPU only
  python benchmarks/gemv.py --sweep --out $OUT/gemv.md
  python benchmarks/gemv.py --fused --out $OUT/gemv_fused.md   # the fused section of results/gemv.md
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import copy_bandwidth, environment, environment_line, floor_s, graph_us_per_call, \
    table_header, table_row  # noqa: E402
import verispec.runtime.gemv as vc  # noqa: E402
import dev.cuda_ext as dvc  # noqa: E402

# model -> [(matrix, N, K)]: W is [N, K] (out features, in features)
SHAPES = {
    "llama-3.1-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate/up", 28672, 4096), ("down", 4096, 14336),
                     ("lm_head", 128256, 4096)],
    "llama-3.2-1b": [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate/up", 16384, 2048), ("down", 2048, 8192),
                     ("lm_head", 128256, 2048)],
}
ROTATE_BYTES = 256 << 20  # copies of W per shape: enough to cover this, at least 2


def check_parity(x, w) -> tuple[float, bool]:
    """(max |gemv - ref| / max |ref|, bit-identical on a second call); ref = F.linear in fp32."""
    y = vc.gemv_cuda(x, w)
    ref = F.linear(x.float(), w.float())
    err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    same = torch.equal(y, vc.gemv_cuda(x, w))
    del ref
    return err, same


def bench_shape(model, name, N, K, args, bw, log) -> list[dict]:
    dtype = args.dtype
    elem = torch.empty((), dtype=dtype).element_size()
    w_bytes = N * K * elem
    copies = max(2, min(args.calls, math.ceil(ROTATE_BYTES / w_bytes)))
    ws = [torch.empty(N, K, dtype=dtype, device="cuda").normal_(0, K ** -0.5) for _ in range(copies)]
    floor_us = floor_s(w_bytes, bw) * 1e6
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}[dtype]
    rows = []
    for M in args.ms:
        x = torch.randn(M, K, dtype=dtype, device="cuda")
        err, same = check_parity(x, ws[0])
        ok = err <= tol and same
        out = torch.empty(M, N, dtype=dtype, device="cuda")
        cublas = graph_us_per_call(lambda i: F.linear(x, ws[i % copies]), args.calls, args.reps)
        ours = graph_us_per_call(lambda i: vc.gemv_cuda(x, ws[i % copies], out=out), args.calls, args.reps)
        cfg = vc.gemv_config(ws[0], M)
        row = dict(model=model, matrix=name, N=N, K=K, M=M, mb=w_bytes / 1e6, copies=copies, floor_us=floor_us,
                   cublas_us=cublas, gemv_us=ours, version=cfg[0], rows=cfg[1], split=cfg[2], max_rel_err=err,
                   deterministic=same, parity_ok=ok)
        if args.sweep:
            sweep = {}
            configs = [(1, r, s) for r in vc.GEMV_ROWS for s in vc.GEMV_SPLITS]
            if dtype != torch.float32:
                configs += [(2, 0, s) for s in vc.GEMV_SPLITS]
            for v, r, s in configs:
                if v == 2:  # parity of every tensor-core split too
                    y2 = vc.gemv_cuda(x, ws[0], version=2, split=s)
                    e2 = ((y2.float() - F.linear(x.float(), ws[0].float())).abs().max()).item()
                    row.setdefault("v2_abs_err", {})[s] = e2
                sweep[f"v{v} {r}x{s}" if v == 1 else f"v2 x{s}"] = graph_us_per_call(
                    lambda i, v=v, r=r, s=s: vc.gemv_cuda(x, ws[i % copies], out=out, version=v, rows=r, split=s),
                    args.calls, args.sweep_reps)
            row["sweep"] = sweep
            best = min(sweep, key=sweep.get)
            row["best_cfg"], row["best_us"] = best, sweep[best]
        rows.append(row)
        log(f"{model:13s} {name:8s} {N:6d}x{K:<5d} M={M}: floor {floor_us:7.2f} us | cuBLAS {cublas:7.2f} us "
            f"({floor_us / cublas:5.1%}) | gemv {ours:7.2f} us ({floor_us / ours:5.1%}) v{cfg[0]} {cfg[1]}x{cfg[2]}"
            f" | x{cublas / ours:.2f} | err {err:.1e}{'' if ok else ' PARITY FAIL'}"
            + (f" | best {row['best_cfg']} {row['best_us']:.2f} us" if args.sweep else ""))
    del ws
    torch.cuda.empty_cache()
    return rows


def reading(rows) -> list[str]:
    wins = [r for r in rows if r["gemv_us"] < r["cublas_us"]]
    speedups = [r["cublas_us"] / r["gemv_us"] for r in rows]
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    losses = [f"{r['model']} {r['matrix']} M={r['M']} ({r['cublas_us']:.1f} vs {r['gemv_us']:.1f} us)"
              for r in rows if r["gemv_us"] >= r["cublas_us"]]
    out = [f"- gemv is faster than cuBLAS in {len(wins)} of {len(rows)} (shape, M) cases; geometric-mean speed-up "
           f"x{geo:.2f} (range x{min(speedups):.2f} .. x{max(speedups):.2f})."]
    if losses:
        out.append("- cuBLAS is as fast or faster on: " + "; ".join(losses) + ".")
    for M in sorted({r["M"] for r in rows}):
        sel = [r for r in rows if r["M"] == M]
        out.append(f"- M={M}: gemv {statistics.median(r['floor_us'] / r['gemv_us'] for r in sel):.0%} of the floor "
                   f"(median over shapes), cuBLAS {statistics.median(r['floor_us'] / r['cublas_us'] for r in sel):.0%}.")
    bad = [r for r in rows if not r["parity_ok"]]
    out.append("- parity: " + ("every shape within tolerance and bit-identical run to run." if not bad else
                               "FAILED on " + ", ".join(f"{r['model']} {r['matrix']} M={r['M']}" for r in bad)))
    return out


def write_markdown(path: Path, rows, meta):
    out = ["# Decode GEMV: cuBLAS vs verispec/runtime/gemv/gemv.cu\n",
           f"{environment_line(meta, meta['bw_tb_s'] * 1e12)} dtype {meta['dtype']}. Command: `{meta['cmd']}`.\n",
           f"y[M, N] = x[M, K] @ W[N, K]^T. Time per call = median over {meta['reps']} replays of a CUDA graph of "
           f"{meta['calls']} back-to-back calls / {meta['calls']}; the calls rotate over copies of W that together "
           f"exceed {ROTATE_BYTES >> 20} MB (at least 2), so W comes from HBM. Floor = W bytes / copy bandwidth. "
           "gemv config = version (v1 fp32 FMA, v2 tensor-core MMA) rows x split (rows per warp group x warps per "
           "row group, i.e. split-K), chosen by the launcher.\n",
           *table_header(["model", "matrix", "N x K", "W MB", "M", "floor us", "cuBLAS us", "cuBLAS % floor", "gemv us",
                          "gemv % floor", "speed-up", "gemv config"])]
    for r in rows:
        out.append(table_row([r['model'], r['matrix'], f"{r['N']} x {r['K']}", f"{r['mb']:.1f}", r['M'],
                              f"{r['floor_us']:.2f}", f"{r['cublas_us']:.2f}", f"{r['floor_us'] / r['cublas_us']:.0%}",
                              f"{r['gemv_us']:.2f}", f"{r['floor_us'] / r['gemv_us']:.0%}",
                              f"x{r['cublas_us'] / r['gemv_us']:.2f}", f"v{r['version']} {r['rows']}x{r['split']}"]))
    out += ["\n## Reading\n", *reading(rows)]
    if any("sweep" in r for r in rows):
        cfgs = list(rows[0]["sweep"])
        out += ["\n## Sweep: us per call for every (rows x split)\n",
                *table_header(["model", "matrix", "M", "auto", *cfgs])]
        for r in rows:
            out.append(table_row([r['model'], r['matrix'], r['M'], f"v{r['version']} {r['rows']}x{r['split']} {r['gemv_us']:.2f}",
                                  *(f"**{v:.2f}**" if k == r["best_cfg"] else f"{v:.2f}" for k, v in r["sweep"].items())]))
    out.append("\nRaw rows (JSON):\n\n```json\n" + json.dumps(dict(meta=meta, rows=rows)) + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


FUSED_OPS = {"qkv": "norm", "gate/up": "norm", "lm_head": "norm", "down": "swiglu"}


def bench_fused(model, name, N, K, args, bw, log) -> list[dict]:
    from verispec.runtime import ops

    dtype, eps = args.dtype, 1e-5
    op = FUSED_OPS[name]
    w_bytes = N * K * torch.empty((), dtype=dtype).element_size()
    copies = max(2, min(args.calls, math.ceil(ROTATE_BYTES / w_bytes)))
    ws = [torch.empty(N, K, dtype=dtype, device="cuda").normal_(0, K ** -0.5) for _ in range(copies)]
    floor_us = floor_s(w_bytes, bw) * 1e6
    rows = []
    for M in args.fused_ms:
        if op == "norm":
            x = torch.randn(M, K, dtype=dtype, device="cuda")
            delta = torch.randn(M, K, dtype=dtype, device="cuda")
            g = 1 + 0.1 * torch.randn(K, dtype=dtype, device="cuda")

            def unfused(i):
                r, h = ops.add_rmsnorm(x, delta, g, eps)
                return vc.gemv_cuda(h, ws[i % copies]), r

            def fused(i, tiles=0):
                return dvc.gemv_rmsnorm_cuda(x, ws[i % copies], g, eps, delta, tiles=tiles)
        else:
            gu = torch.randn(M, 2 * K, dtype=dtype, device="cuda")

            def unfused(i):
                return vc.gemv_cuda(ops.silu_mul(gu), ws[i % copies]), None

            def fused(i, tiles=0):
                return dvc.gemv_swiglu_cuda(gu, ws[i % copies], tiles=tiles), None
        (yu, ru), (yf, rf) = unfused(0), fused(0)
        err = ((yf.float() - yu.float()).abs().max() / yu.float().abs().max().clamp_min(1e-30)).item()
        ok = err <= {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}[dtype] and (
            ru is None or torch.equal(ru, rf)) and torch.equal(yf, fused(0)[0])
        t_unf = graph_us_per_call(unfused, args.calls, args.reps)
        t_fus = graph_us_per_call(fused, args.calls, args.reps)
        sweep = {t: graph_us_per_call(lambda i, t=t: fused(i, t), args.calls, args.sweep_reps) for t in (1, 2, 4)}
        row = dict(model=model, matrix=name, op=op, N=N, K=K, M=M, floor_us=floor_us, unfused_us=t_unf, fused_us=t_fus,
                   tiles_sweep=sweep, max_rel_diff=err, parity_ok=ok)
        rows.append(row)
        log(f"{model:13s} {op:6s}+{name:8s} {N:6d}x{K:<5d} M={M}: floor {floor_us:7.2f} | unfused {t_unf:7.2f} us | "
            f"fused {t_fus:7.2f} us (saves {t_unf - t_fus:5.2f} us, {floor_us / t_fus:5.1%} of floor) | tiles 1/2/4 "
            + "/".join(f"{v:.2f}" for v in sweep.values()) + f" | diff {err:.1e}{'' if ok else ' PARITY FAIL'}")
    del ws
    torch.cuda.empty_cache()
    return rows


def write_fused_markdown(path: Path, rows, meta):
    out = ["## Fused prologues: add + RMSNorm / SwiGLU inside the GEMV\n",
           f"{environment_line(meta, meta['bw_tb_s'] * 1e12)} dtype {meta['dtype']}. Command: `{meta['cmd']}`. Unfused = ops.add_rmsnorm (with the residual "
           "add) + gemv_cuda, or ops.silu_mul + gemv_cuda; fused = gemv_rmsnorm_cuda / gemv_swiglu_cuda (one "
           "launch). Same timing as above (graph of back-to-back calls, W rotating through HBM).\n",
           *table_header(["model", "op", "N x K", "M", "floor us", "unfused us", "fused us", "saved us", "fused % floor",
                          "fused tiles=1 / 2 / 4 us", "max rel diff"])]
    for r in rows:
        out.append(table_row([r['model'], f"{r['op']} + {r['matrix']}", f"{r['N']} x {r['K']}", r['M'],
                              f"{r['floor_us']:.2f}", f"{r['unfused_us']:.2f}", f"{r['fused_us']:.2f}",
                              f"{r['unfused_us'] - r['fused_us']:.2f}", f"{r['floor_us'] / r['fused_us']:.0%}",
                              " / ".join(f"{v:.2f}" for v in r["tiles_sweep"].values()),
                              f"{r['max_rel_diff']:.1e}{'' if r['parity_ok'] else ' FAIL'}"]))
    out.append("\nRaw rows (JSON):\n\n```json\n" + json.dumps(dict(meta=meta, rows=rows)) + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--ms", default="1,2,4,8", help="tokens per call (rows of x), each <= 8")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (each on another copy of W)")
    p.add_argument("--reps", type=int, default=50, help="graph replays timed (median)")
    p.add_argument("--sweep", action="store_true", help="also time every (rows, split) configuration")
    p.add_argument("--sweep-reps", type=int, default=20)
    p.add_argument("--fused", action="store_true", help="time the fused prologues against the unfused composition")
    p.add_argument("--fused-ms", default="1,2", help="--fused: tokens per call, each <= 2")
    p.add_argument("--out", default=None, help="markdown output (default: results/gemv.md; --fused: print only)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gemv.py needs a CUDA GPU (it times cuBLAS against verispec/runtime/gemv/gemv.cu)")
        return []
    args.ms = [int(m) for m in args.ms.split(",")]
    args.fused_ms = [int(m) for m in args.fused_ms.split(",")]
    if args.out is None and not args.fused:
        args.out = str(Path(__file__).resolve().parent / "results" / "gemv.md")
    args.dtype = getattr(torch, args.dtype)
    log = lambda s: print(s, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    vc.load()
    log(f"extension built/loaded in {time.perf_counter() - t0:.0f} s")
    bw = copy_bandwidth()
    meta = dict(environment(), dtype=str(args.dtype).replace("torch.", ""), bw_tb_s=bw / 1e12,
        calls=args.calls, reps=args.reps, cmd="python benchmarks/gemv.py " + " ".join(argv or sys.argv[1:]))
    log(f"{meta['device']}: copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    if args.fused:
        for model in args.models.split(","):
            for name, N, K in SHAPES[model]:
                if name in FUSED_OPS:  # o has no prologue to fuse
                    rows += bench_fused(model, name, N, K, args, bw, log)
        if args.out:
            write_fused_markdown(Path(args.out), rows, meta)
            log(f"wrote {args.out}")
        return rows
    for model in args.models.split(","):
        for name, N, K in SHAPES[model]:
            rows += bench_shape(model, name, N, K, args, bw, log)
    write_markdown(Path(args.out), rows, meta)
    log("\n".join(reading(rows)))
    log(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
