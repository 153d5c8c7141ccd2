"""Step times the SSD simulator needs, measured at the 8B / 1B shapes (random bf16 weights, CUDA graphs on).

  * target pass: ``Model.append`` of [B, n] tokens, n = 1 (AR decode) and n = K + 1 for K = 2..8, B in {1, 8, 32};
  * draft step: one-token ``Model.decode`` of R rows for every R = B * F (B in {1, 8, 32}, F in {1, 2, 4, 8}):
    pre-speculating F branches of B sequences is one batched draft pass of B * F rows;
  * the tensor-parallel code path at TP = 1 (a world of one rank: NCCL on CUDA, gloo on the CPU) against the
    plain Model: one-token decode step at B in {1, 8}.
Each time is the median of ``--iters`` CUDA-event timings of the public call (graph replay + logits) after
the call that captures its graph, the context ``--prompt-len`` tokens deep (``benchmarks/common.time_calls``).

  python benchmarks/ssd_calibrate.py --out DIR [--write]   # GPU: -> DIR/ssd_calibration.md + .json
                                                          #   (--write: also the committed results/ files)
  python benchmarks/ssd_calibrate.py --quick --out /tmp/cal   # CPU: tiny random models, checks the script

The JSON is what ``benchmarks/ssd_sim.py --calibration PATH`` loads (``load_calibration`` there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import environment, environment_line, markdown_table, time_calls  # noqa: E402
from verispec.runtime import ModelConfig, load_model  # noqa: E402

QUICK_TARGET = ModelConfig(vocab_size=256, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                           intermediate_size=128)
QUICK_DRAFT = QUICK_TARGET.replace(num_layers=1)
BATCHES, KS, FANOUTS, TP_BATCHES = (1, 8, 32), tuple(range(2, 9)), (1, 2, 4, 8), (1, 8)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pass_seconds(model, B: int, ns, prompt_len: int, iters: int) -> dict[int, float]:
    """{n: median seconds of model.append([B, n])} with B sequences ``prompt_len`` tokens deep; the cache is
    rolled back after every timed call, so every call sees the same context."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(B)
    model.setup_cache(B, prompt_len + max(ns) + 1)
    model.prefill(torch.randint(0, vocab, (B, prompt_len), generator=g).tolist())
    base = model.lengths.clone()
    out = {}
    for n in ns:
        tokens = torch.randint(0, vocab, (B, n), generator=g).to(model.device)

        def call():
            model.append(tokens)
            model.rollback(base)
            model.cache.max_len_bound = prompt_len       # benchmark only: the true lengths are known

        call()                                           # captures this (rows, n) graph
        sync()
        out[n] = time_calls(call, iters=iters, warmup=2)
    return out


def measure_target(model, args, log) -> dict:
    cells = {}
    for B in args.batches:
        t = pass_seconds(model, B, (1, *(k + 1 for k in args.ks)), args.prompt_len, args.iters)
        cells[B] = {n: s for n, s in t.items()}
        log(f"target B={B:3d}: decode {t[1] * 1e3:.3f} ms; verify K+1=" +
            " ".join(f"{n}:{t[n] * 1e3:.3f}" for n in sorted(t) if n > 1))
    return cells


def measure_draft(model, args, log) -> dict:
    rows = sorted({B * f for B in args.batches for f in args.fanouts})
    cells = {}
    for R in rows:
        cells[R] = pass_seconds(model, R, (1,), args.prompt_len, args.iters)[1]
        log(f"draft  rows={R:4d}: step {cells[R] * 1e3:.3f} ms")
    return cells


def measure_tp1(model, args, log) -> dict:
    """Decode step of the plain Model vs the tensor-parallel Model at TP = 1 (same weights, copied)."""
    import torch.distributed as dist

    from verispec.distributed.group import free_port, init_group
    from verispec.distributed.tp import tensor_parallel_model

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_group(0, 1, backend, f"tcp://127.0.0.1:{free_port()}", 60.0)
    out = {"backend": backend, "plain": {}, "tp1": {}, "error": None}
    try:
        tp = tensor_parallel_model(model, use_graphs=model.use_graphs)
        out["tp1_uses_kernels"], out["tp1_uses_graphs"] = tp.net.use_kernels, tp.use_graphs
        for B in args.tp_batches:
            out["plain"][B] = pass_seconds(model, B, (1,), args.prompt_len, args.iters)[1]
            try:
                out["tp1"][B] = pass_seconds(tp, B, (1,), args.prompt_len, args.iters)[1]
            except Exception as e:                       # report, e.g. a graph capture NCCL refuses
                out["error"] = f"{type(e).__name__}: {e}"
                tp.use_graphs = False
                out["tp1_uses_graphs"] = False
                out["tp1"][B] = pass_seconds(tp, B, (1,), args.prompt_len, args.iters)[1]
            log(f"TP=1   B={B:3d}: plain {out['plain'][B] * 1e3:.3f} ms, tensor-parallel path "
                f"{out['tp1'][B] * 1e3:.3f} ms ({out['tp1'][B] / out['plain'][B]:.3f}x)")
        del tp
    finally:
        dist.destroy_process_group()
    return out


def write_markdown(path: Path, res: dict) -> None:
    env, a = res["env"], res["args"]
    lines = ["# SSD simulator calibration (benchmarks/ssd_calibrate.py)", "",
             environment_line(env), "",
             f"Command: `{res['command']}`. Target `{a['target']}`, draft `{a['draft']}` (random weights, "
             f"{res['dtype']}, CUDA graphs {'on' if res['graphs'] else 'off'}); context {a['prompt_len']} tokens; "
             f"medians of {a['iters']} timed calls (ms). Raw numbers: `{res['json_name']}` "
             "(`python benchmarks/ssd_sim.py --calibration` loads it).", "",
             "## Target pass: [B, n] tokens (n = 1: AR decode, n = K + 1: verify K drafts)", ""]
    ns = sorted({n for row in res["target"].values() for n in row})
    lines += markdown_table(["B", *[("decode" if n == 1 else f"K={n - 1}") for n in ns]],
                            [[B, *[f"{row[n] * 1e3:.3f}" for n in ns]] for B, row in res["target"].items()])
    lines += ["", "## Draft step and pre-speculation: one batched pass of B * F rows", "",
              "F branches per sequence cost one pass of B * F rows (vs F passes of B rows: the last column).", ""]
    draft = res["draft"]
    rows = []
    for B in a["batches"]:
        for f in a["fanouts"]:
            one, fan = draft[B], draft[B * f]
            rows.append([B, f, B * f, f"{fan * 1e3:.3f}", f"{fan / one:.2f}x", f"{f * one * 1e3:.3f}"])
    lines += markdown_table(["B", "F", "rows", "ms", "vs B rows", "F separate passes, ms"], rows)
    tp = res["tp1"]
    lines += ["", f"## Tensor-parallel code path at TP = 1 ({tp['backend']}, one rank): decode step", "",
              f"Sharded net on the Triton kernels: {tp.get('tp1_uses_kernels')}; CUDA graphs: "
              f"{tp.get('tp1_uses_graphs')}." + (f" Graph capture failed, timed eagerly: `{tp['error']}`."
                                                  if tp["error"] else ""), ""]
    lines += markdown_table(["B", "plain Model ms", "TP=1 ms", "overhead"],
                            [[B, f"{tp['plain'][B] * 1e3:.3f}", f"{tp['tp1'][B] * 1e3:.3f}",
                              f"{tp['tp1'][B] / tp['plain'][B]:.3f}x"] for B in tp["plain"]])
    path.write_text("\n".join(lines) + "\n")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny random models (CPU check of the script)")
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument("--draft", default="llama-3.2-1b")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--out", default=None, help="folder for ssd_calibration.md + .json (default: write nothing)")
    p.add_argument("--write", action="store_true",
                   help="also replace the committed benchmarks/results/ssd_calibration.md + .json (not with --quick)")
    args = p.parse_args(argv)
    args.batches, args.ks, args.fanouts, args.tp_batches = BATCHES, KS, FANOUTS, TP_BATCHES
    if args.quick:
        args.batches, args.ks, args.fanouts, args.tp_batches = (1, 2), (2, 3), (1, 2), (1,)
        args.prompt_len, args.iters = 8, 3
        args.target, args.draft = "tiny random target (--quick)", "tiny random draft (--quick)"
    elif not torch.cuda.is_available():
        p.error("the full calibration needs a CUDA GPU; use --quick on the CPU")
    committed = Path(__file__).resolve().parent / "results"
    if args.write and args.quick:
        p.error("--write keeps a GPU calibration; --quick measures tiny CPU models")
    if args.out is not None and Path(args.out).resolve() == committed and not args.write:
        p.error(f"--out {args.out} is the committed results folder: add --write to replace its files")
    args.outs = [Path(args.out)] if args.out else []
    if args.write and committed not in [o.resolve() for o in args.outs]:
        args.outs.append(committed)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if args.quick:
        target = load_model(QUICK_TARGET, device="cpu", dtype=torch.float32, seed=1)
        draft = load_model(QUICK_DRAFT, device="cpu", dtype=torch.float32, seed=2)
    else:
        target, draft = load_model(args.target), load_model(args.draft)
    log(f"loaded {target} and {draft} in {time.perf_counter() - t0:.1f} s")
    res = {"env": environment(), "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
           "args": {k: v for k, v in vars(args).items() if k not in ("out", "outs")}, "dtype": str(target.dtype),
           "graphs": target.use_graphs, "json_name": "ssd_calibration.json"}
    res["target"] = measure_target(target, args, log)
    res["tp1"] = measure_tp1(target, args, log)
    del target                                           # frees the 8B weights and graphs before the draft's
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    res["draft"] = measure_draft(draft, args, log)
    res["seconds"] = time.perf_counter() - t0
    log(f"total {res['seconds']:.1f} s")
    for out in args.outs:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ssd_calibration.json").write_text(json.dumps(res, indent=1))
        write_markdown(out / "ssd_calibration.md", res)
        log(f"wrote {out / 'ssd_calibration.md'} and {out / 'ssd_calibration.json'}")
    return res


if __name__ == "__main__":
    main()
