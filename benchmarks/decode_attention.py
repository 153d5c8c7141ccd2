"""The decode / verify attention (``ops.decode_attention``) against the cache's capacity: a split-KV kernel whose
grid had one program per 256-slot split of the *capacity* paid for every dead split at a large batch; this measures
the kernel alone at the 8B shape (8 KV heads of 128, G = 4) and the whole 8B decode step of 32 rows under caches
of 160, 2048 (``verispec serve``'s default --max-seq-len) and 4096 slots.

    python benchmarks/decode_attention.py --out DIR [--compare-root OLD_CHECKOUT] [--write]     # GPU only

``--compare-root`` times another checkout's verispec in the same run (a subprocess importing it first), e.g. a
``git worktree`` of an earlier commit: the "before" column. Kernel cells: microseconds per call, the median of 15
replays of a CUDA graph of 20 calls; the floor is the K/V bytes of the live slots / the measured copy bandwidth;
the peer is torch's SDPA over the live slots only (no cache capacity at all: its best case). Step cells: the median
wall time of ``Scheduler.step`` over the steps that ran all 32 rows (200 requests of 94 random tokens, 64 new
tokens each, all submitted at once; random weights, bf16, plain decoding; the second of two runs).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
KV, G, D = 8, 4, 128                                   # llama-3.1-8b's attention
SHAPES = ((1, 1, 500, 2048), (1, 1, 4000, 4096), (1, 1, 4000, 8192), (1, 8, 4000, 8192), (8, 1, 160, 2048),
          (32, 1, 160, 2048), (32, 1, 160, 4096), (32, 4, 160, 2048), (32, 1, 1900, 2048), (64, 1, 160, 2048))
CAPACITIES = (160, 2048, 4096)


def kernel_us() -> list[float]:
    """us per decode_attention call at each of SHAPES (B, T tokens, L cached, S capacity), this process's verispec."""
    from benchmarks.common import graph_us_per_call
    from verispec.runtime import ops

    out = []
    for B, T, L, S in SHAPES:
        kc = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q = torch.randn(B * T, KV * G, D, device="cuda", dtype=torch.bfloat16)
        lengths = torch.full((B,), L, device="cuda", dtype=torch.long)
        out.append(graph_us_per_call(lambda i: ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5), 20, 15))
    return out


def sdpa_us() -> list[float]:
    """The peer: torch SDPA over the live slots [0, L + T) of each shape (causal within the T new tokens)."""
    from benchmarks.common import graph_us_per_call

    out = []
    for B, T, L, _ in SHAPES:
        k = torch.randn(B, KV, L + T, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(B, KV * G, T, D, device="cuda", dtype=torch.bfloat16)
        mask = (torch.arange(L + T, device="cuda")[None, :] <= L + torch.arange(T, device="cuda")[:, None])
        mask = None if T == 1 else mask
        call = lambda i: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
        out.append(graph_us_per_call(call, 20, 15))
    return out


def step_ms(capacity: int) -> float:
    """Median ms of a 32-row ``Scheduler.step`` of the 8B shape under a cache of ``capacity`` slots."""
    from verispec.engine.request import Request
    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.runtime import load_model

    target = load_model("llama-3.1-8b", device="cuda", dtype=torch.bfloat16)
    target.tokenizer = None                               # no EOS: every request runs its 64 tokens
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(94)] for _ in range(200)]
    scheduler = Scheduler(target, None, SchedulerConfig(32, capacity, 0))
    scheduler.warm_up(prompt_tokens=94)
    for _ in range(2):                                    # the second run is the one kept
        full = []
        for i, p in enumerate(prompts):
            request = Request(list(p), 64, id=i, seed=i)
            request.submitted_at = time.perf_counter()
            scheduler.submit(request)
        while not scheduler.idle:
            before, waiting = len(scheduler.running), len(scheduler.waiting)
            t = time.perf_counter()
            scheduler.step()
            if before == len(scheduler.running) == 32 and not (waiting and before < 32):
                full.append(time.perf_counter() - t)
    del target
    torch.cuda.empty_cache()
    return statistics.median(full) * 1e3


def measure(steps: bool) -> dict:
    """This process's verispec: kernel us per shape and, with ``steps``, step ms per capacity."""
    out = {"kernel_us": kernel_us()}
    if steps:
        out["step_ms"] = [step_ms(c) for c in CAPACITIES]
    return out


def measure_other_root(root: str, steps: bool) -> dict:
    """``measure`` in a subprocess that imports verispec from ``root`` (benchmarks from this checkout)."""
    code = (f"import sys, json; sys.path[:0] = [{os.path.abspath(root)!r}, {str(ROOT)!r}]; "
            "from benchmarks.decode_attention import measure; "
            f"print('RESULT' + json.dumps(measure({steps})))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, cwd=root)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"--compare-root {root}: the measurement failed:\n{run.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT"):])


def page(args, now: dict, before: dict | None, peer: list[float], bandwidth: float, seconds: float) -> str:
    from benchmarks.common import environment, environment_line, markdown_table

    command = "python benchmarks/decode_attention.py" + (" --compare-root OLD" if args.compare_root else "") + \
        ("" if args.steps else " --no-steps")
    lines = ["# Decode attention and the cache's capacity (the 8B shape)", "", environment_line(environment(), bandwidth),
             "", f"Command: `{command}` ({seconds:.0f} s). " + (f"before = {args.before_label}. " if before else "")
             + "Kernel: us per call (median of 15 replays of a graph of 20 calls); floor = K/V bytes of the live "
             "slots / copy bandwidth; SDPA = torch's over the live slots only.", ""]
    rows = []
    for j, (B, T, L, S) in enumerate(SHAPES):
        floor = 2 * B * KV * (L + T) * D * 2 / bandwidth * 1e6
        cells = [B, T, L, S, f"{floor:.1f}"]
        if before:
            cells.append(f"{before['kernel_us'][j]:.1f}")
        cells += [f"**{now['kernel_us'][j]:.1f}**", f"{peer[j]:.1f}"]
        if before:
            cells.append(f"{before['kernel_us'][j] / now['kernel_us'][j]:.2f}x")
        rows.append(cells)
    cols = ["B", "tokens", "cached L", "capacity S", "floor us"] + (["before us"] if before else []) + \
        ["now us", "SDPA (live slots) us"] + (["before / now"] if before else [])
    lines += markdown_table(cols, rows)
    if "step_ms" in now:
        lines += ["", "The whole step: `Scheduler.step` of 32 rows, llama-3.1-8b (random weights, bf16), median ms:", ""]
        srows = [[c] + ([f"{before['step_ms'][i]:.2f}"] if before and "step_ms" in before else [])
                 + [f"**{now['step_ms'][i]:.2f}**"] for i, c in enumerate(CAPACITIES)]
        lines += markdown_table(["capacity (slots)"] + (["before ms"] if before and "step_ms" in before else [])
                                + ["now ms"], srows)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for decode_attention.md")
    ap.add_argument("--compare-root", default=None, help="another checkout whose verispec is timed as 'before'")
    ap.add_argument("--before-label", default="the checkout given by --compare-root")
    ap.add_argument("--no-steps", dest="steps", action="store_false", help="the kernel alone (no 8B model load)")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/decode_attention.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import copy_bandwidth, write_page

    t0 = time.perf_counter()
    before = measure_other_root(args.compare_root, args.steps) if args.compare_root else None
    now = measure(args.steps)
    peer = sdpa_us()
    text = page(args, now, before, peer, copy_bandwidth(), time.perf_counter() - t0)
    write_page(text, args.out, "decode_attention.md", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
