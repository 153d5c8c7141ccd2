"""Benchmark of the Triton verification kernels (GPU): reference -> validate -> time.

    python benchmarks/verify.py [--quick] [--budget SECONDS] [--out benchmarks/results/verify.md]

For every configuration: build a workload (``verispec.verify.workloads``), check the Triton result
against the expected answer (greedy) or a second run (sampling: determinism), then time with
``triton.testing.do_bench(return_mode="median")`` (L2 flushed before each call):
  triton      the kernels alone (launcher on a validated batch), eager launches
  graph       the same kernels replayed from a CUDA graph (launch gaps removed)
  api+graph   the public ``verify_*`` call (validation metadata + dispatch) under graph replay
  torch-vec   a vectorized plain-PyTorch baseline (argmax / softmax over every row + gather)
  reference   the per-sequence reference backend (a Python loop; a few small configs only)
Sampling also times the other row-statistics schedule (waves on/off, see verispec/verify/triton/rejection.py).
Bytes: ``floor`` = target_logits read once (+ the draft_probs rows needed for recovery);
``need`` (sampling) = only the rows up to each sequence's stop row. GB/s = floor / time.
``%copy`` = achieved floor GB/s over the copy bandwidth (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.common import capture_graph, copy_bandwidth, environment, table_header, table_row  # noqa: E402
from verispec.verify.triton.greedy import verify_greedy_triton  # noqa: E402
from verispec.verify.triton.rejection import WAVE_MIN_BYTES, verify_sample_triton  # noqa: E402
from verispec.verify.reference import reference_verify_greedy, reference_verify_sample  # noqa: E402
from verispec.verify import rng  # noqa: E402
from verispec.verify.api import canonical_batch, per_sequence, verify_greedy, verify_sample  # noqa: E402
from verispec.verify.workloads import greedy_workload, sampling_workload  # noqa: E402

BATCHES = (1, 8, 32, 128, 256)
DRAFTS = (1, 4, 8)
VOCABS = (32000, 128256, 151936)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ALPHAS = (0.3, 0.6, 0.9)
DEVICE = "cuda"


def bench(fn, rep=40) -> float:
    """Median milliseconds."""
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def bench_graph(fn) -> float:
    """Median milliseconds of one replay of a CUDA graph of ``fn()`` (do_bench: L2 flushed before each)."""
    return bench(capture_graph(fn).replay)


# ---------- plain PyTorch baselines (vectorized, no host sync) ----------


def _padded(num_draft: torch.Tensor, width: int):
    """[B, width] positions, first target row and first draft of each sequence."""
    cu = torch.zeros(num_draft.shape[0] + 1, dtype=torch.long, device=num_draft.device)
    cu[1:] = num_draft.long().cumsum(0)
    pos = torch.arange(width, device=num_draft.device)
    row0 = cu[:-1] + torch.arange(num_draft.shape[0], device=num_draft.device)
    return pos, row0, cu[:-1]


def torch_greedy(logits, draft_tokens, num_draft, max_k):
    width = max_k + 1
    pos, row0, d0 = _padded(num_draft, width)
    k = num_draft.long()[:, None]
    target = logits.argmax(-1)  # [R]
    rows = (row0[:, None] + torch.minimum(pos, k)).clamp(max=logits.shape[0] - 1)
    am = target[rows]  # [B, width]
    drafts = draft_tokens[(d0[:, None] + pos).clamp(max=max(draft_tokens.shape[0] - 1, 0))]
    rejected = (pos < k) & (drafts != am)
    num_acc = torch.where(rejected, pos, k).min(1).values
    tokens = torch.where(pos <= num_acc[:, None], am, -1).int()
    return tokens, num_acc


def torch_sample(logits, draft_tokens, num_draft, max_k, q):
    """Softmax over every row, accept tests by gather, race on the stop rows (T = 1)."""
    width = max_k + 1
    pos, row0, d0 = _padded(num_draft, width)
    k = num_draft.long()[:, None]
    probs = torch.softmax(logits.float(), -1)  # [R, V]: the full-vocab tensor the kernels avoid
    n = draft_tokens.shape[0]
    draft_rows = torch.repeat_interleave(row0, num_draft.long(), output_size=n) + torch.arange(n, device=logits.device) - torch.repeat_interleave(d0, num_draft.long(), output_size=n)
    p_x = probs[draft_rows, draft_tokens]
    q_x = q[torch.arange(n, device=q.device), draft_tokens].float()
    accept = torch.rand(n, device=logits.device) * q_x < p_x
    acc = accept[(d0[:, None] + pos).clamp(max=max(n - 1, 0))]
    num_acc = torch.where((pos < k) & ~acc, pos, k).min(1).values
    stop_rows = row0 + num_acc
    p = probs[stop_rows]
    q_rows = q[(d0 + num_acc).clamp(max=max(n - 1, 0))].float()
    residual = torch.clamp(p - torch.where((num_acc < num_draft.long())[:, None], q_rows, 0.0), min=0)
    emitted = (residual / torch.empty_like(residual).exponential_()).argmax(-1)
    return emitted, num_acc


# ---------- one configuration ----------


def run_greedy(size, k, vocab, dtype, bw, with_reference):
    w = greedy_workload(size, k, vocab, 0.6, dtype=dtype, device=DEVICE, seed=size + k)
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, False)
    out = verify_greedy_triton(batch)
    ok = torch.equal(out.tokens, w.expected.tokens) and torch.equal(out.num_accepted, w.expected.num_accepted)
    floor = w.target_logits.numel() * w.target_logits.element_size()
    res = dict(ok=ok, floor=floor)
    res["triton"] = bench(lambda: verify_greedy_triton(batch))
    res["graph"] = bench_graph(lambda: verify_greedy_triton(batch))
    res["api+graph"] = bench_graph(
        lambda: verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, max_num_draft=k, backend="triton", check_values=False)
    )
    tv = torch_greedy(w.target_logits, w.draft_tokens, w.num_draft, k)
    res["ok"] &= torch.equal(tv[0], w.expected.tokens)
    res["torch-vec"] = bench(lambda: torch_greedy(w.target_logits, w.draft_tokens, w.num_draft, k))
    if with_reference:
        res["reference"] = bench(
            lambda: reference_verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, k), rep=20
        )
    res["gbps"] = floor / res["graph"] / 1e6
    res["copy"] = res["gbps"] / bw
    return res


def run_sample(size, k, vocab, dtype, alpha, bw, with_reference):
    w = sampling_workload(size, k, vocab, alpha, dtype=dtype, device=DEVICE, seed=size + k)
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, False)
    dev = w.target_logits.device
    batch.draft_probs = w.draft_probs
    batch.temperature = per_sequence(1.0, size, torch.float32, dev, "temperature", 1.0)
    batch.top_k = per_sequence(0, size, torch.int32, dev, "top_k", 0)
    batch.top_p = per_sequence(1.0, size, torch.float32, dev, "top_p", 1.0)
    batch.seed = rng.sequence_seeds(1234, size).to(dev)  # the keys verify_sample(seed=1234) uses
    batch.offset = torch.zeros(size, dtype=torch.int64, device=dev)
    out = verify_sample_triton(batch)
    again = verify_sample_triton(batch)
    other = verify_sample_triton(batch, waves=batch.target_logits.numel() * batch.target_logits.element_size() < WAVE_MIN_BYTES)
    ok = torch.equal(out.tokens, again.tokens) and torch.equal(out.tokens, other.tokens)
    ok = ok and bool((out.tokens[torch.arange(size, device=dev), out.num_accepted.long()] >= 0).all())
    row_bytes = vocab * w.target_logits.element_size()
    q_row_bytes = vocab * w.draft_probs.element_size()
    rejected = int((out.num_accepted < w.num_draft).sum())
    floor = w.target_logits.numel() * w.target_logits.element_size() + rejected * q_row_bytes
    need = int(out.num_emitted.sum()) * row_bytes + rejected * q_row_bytes
    res = dict(ok=ok, floor=floor, need=need, acc=float(out.num_accepted.float().mean()))
    res["triton"] = bench(lambda: verify_sample_triton(batch))
    res["graph"] = bench_graph(lambda: verify_sample_triton(batch))
    # ablation: the other stats schedule (waves on <-> off) than the default picked
    res["waves"] = batch.target_logits.numel() * batch.target_logits.element_size() >= WAVE_MIN_BYTES
    res["other"] = bench_graph(lambda: verify_sample_triton(batch, waves=not res["waves"]))
    res["api+graph"] = bench_graph(
        lambda: verify_sample(
            w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=batch.seed, offset=batch.offset,
            max_num_draft=k, backend="triton", check_values=False,
        )
    )
    res["torch-vec"] = bench(lambda: torch_sample(w.target_logits, w.draft_tokens, w.num_draft, k, w.draft_probs))
    if with_reference:
        res["reference"] = bench(
            lambda: reference_verify_sample(
                w.target_logits, w.draft_tokens, w.num_draft, k, w.draft_probs, batch.temperature.cpu(),
                batch.top_k.cpu(), batch.top_p.cpu(), batch.seed.cpu(), batch.offset.cpu(),
            ),
            rep=20,
        )
    res["gbps"] = floor / res["graph"] / 1e6
    res["copy"] = res["gbps"] / bw
    return res


def fmt_us(ms):
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a handful of configurations")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for the sweep; the rest is skipped")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "verify.md"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/verify.py needs a CUDA GPU")
    t0 = time.time()
    bw = copy_bandwidth() / 1e9   # GB/s
    env = environment()
    head = [
        "# verispec verification kernels: benchmark",
        "",
        f"device: {env['device']} ({env['sms']} SMs) · date: {env['date']} · torch {env['torch']} · triton {env['triton']}",
        f"measured device-to-device copy bandwidth: {bw:.0f} GB/s (read + write)",
        "",
        "Times are medians in µs (do_bench, L2 flushed). `graph` = the Triton launcher replayed from a CUDA graph;",
        "`api+graph` = the public verify_* call under graph replay; `torch-vec` = vectorized plain PyTorch (eager);",
        "GB/s and %copy use the `floor` bytes and the `graph` time. `x vec` = torch-vec / graph.",
        "",
    ]
    print("\n".join(head), flush=True)
    greedy_cfgs = [(b, k, v, d) for d in DTYPES for v in VOCABS for b in BATCHES for k in DRAFTS]
    sample_cfgs = [(b, k, v, d, a) for d in DTYPES for v in VOCABS for b in BATCHES for k in DRAFTS for a in ALPHAS]
    if args.quick:
        greedy_cfgs = [(1, 4, 128256, "bf16"), (128, 8, 128256, "fp32"), (256, 8, 151936, "bf16")]
        sample_cfgs = [(1, 4, 128256, "bf16", 0.6), (128, 8, 128256, "fp32", 0.3), (128, 8, 128256, "fp32", 0.9)]
    # the headline configurations first, so a budget cut keeps them
    # then V = 128256, then the other vocabularies
    key = lambda c: (0 if (c[0], c[1], c[2]) in {(1, 4, 128256), (128, 8, 128256), (256, 8, 151936)} else 1, c[2] != 128256)  # noqa: E731
    greedy_cfgs.sort(key=key)
    sample_cfgs.sort(key=key)
    lines = list(head)
    skipped = 0

    lines += ["## Greedy (acceptance 0.6)", "",
              *table_header(["B", "K", "V", "dtype", "ok", "floor MB", "triton", "graph", "api+graph", "torch-vec",
                             "reference", "GB/s", "%copy", "x vec"])]
    for b, k, v, d in greedy_cfgs:
        if time.time() - t0 > args.budget * 0.4:
            skipped += 1
            continue
        r = run_greedy(b, k, v, DTYPES[d], bw, with_reference=(v == 128256 and b <= 32))
        line = table_row([b, k, v, d, 'yes' if r['ok'] else 'NO', f"{r['floor'] / 1e6:.1f}", fmt_us(r['triton']),
                          fmt_us(r['graph']), fmt_us(r['api+graph']), fmt_us(r['torch-vec']), fmt_us(r.get('reference')),
                          f"{r['gbps']:.0f}", f"{100 * r['copy']:.0f}%", f"{r['torch-vec'] / r['graph']:.1f}"])
        print(line, flush=True)
        lines.append(line)
        torch.cuda.empty_cache()

    lines += ["", "## Sampling (T = 1, draft_probs; floor = logits once + q rows of rejected sequences; need = rows up to each stop row)", "",
              *table_header(["B", "K", "V", "dtype", "α", "mean acc", "ok", "floor MB", "need MB", "triton", "graph", "waves",
                             "graph, other schedule", "api+graph", "torch-vec", "reference", "GB/s", "%copy",
                             "graph / floor time", "x vec"])]
    for b, k, v, d, a in sample_cfgs:
        if time.time() - t0 > args.budget:
            skipped += 1
            continue
        r = run_sample(b, k, v, DTYPES[d], a, bw, with_reference=(v == 128256 and b <= 8 and a == 0.6))
        floor_ms = r["floor"] / (bw * 1e6)
        line = table_row([b, k, v, d, a, f"{r['acc']:.2f}", 'yes' if r['ok'] else 'NO', f"{r['floor'] / 1e6:.1f}",
                          f"{r['need'] / 1e6:.1f}", fmt_us(r['triton']), fmt_us(r['graph']), 'on' if r['waves'] else 'off',
                          fmt_us(r['other']), fmt_us(r['api+graph']), fmt_us(r['torch-vec']), fmt_us(r.get('reference')),
                          f"{r['gbps']:.0f}", f"{100 * r['copy']:.0f}%", f"{r['graph'] / floor_ms:.2f}",
                          f"{r['torch-vec'] / r['graph']:.1f}"])
        print(line, flush=True)
        lines.append(line)
        torch.cuda.empty_cache()
    lines += ["", f"{skipped} configurations skipped by the {args.budget:.0f} s budget; total {time.time() - t0:.0f} s."]
    print(lines[-1])
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
