"""Ablation of the CUDA greedy verification kernels and the KV compaction variants (dev/kv/), on one GPU.

    python benchmarks/ablation.py --out benchmarks/results            # full sweep
    python benchmarks/ablation.py --ncu-only                          # a few launches for ncu

Sweep: b in {1, 4, 16, 32, 64, 256} x alpha in {0.3, 0.6, 0.9} x K in {4, 8}, V = 128256, bf16
logits (greedy_workload: drafts equal the target argmax with probability alpha per position).

Methods (every one is first checked against the workload's exact answer, then timed):
    full verify (argmax over V + acceptance scan):
        cuda-naive    warp-shuffle argmax (v3) + one thread per sequence (v1 scan)
        cuda-ballot   warp-shuffle argmax (v3) + one warp per sequence, __ballot_sync (v2 scan)
        cuda-segment  warp-shuffle argmax (v3) + 32/next_pow2(K) sequences per warp (v3 scan)
        triton        verispec.verify.triton.greedy (split-V argmax + scan), "n/a" if missing
        torch-vec     logits.argmax(-1) + a padded [B, K] cumprod acceptance (vectorized torch)
        reference     the per-sequence Python loop (small b only)
    argmax only: cuda v2 (one warp-shuffle reduction a block), cuda v3 (+ streaming loads), torch.argmax
    scan only (over a precomputed [R] argmax; where the raggedness is):
        cuda-naive, cuda-ballot, cuda-segment, torch-vec
    KV compaction (dev/kv/; packed layout; rows of one layer's K+V [2, 8, 128] bf16 = 4 KiB and of
    all 32 layers = 128 KiB):
        cuda-naive (thread per sequence), cuda-scan (prefix sum + coalesced copy, 2 launches),
        cuda-fused (the same in 1 launch), triton, torch-vec (index_select)

Timing: device time per call from CUDA events around a CUDA-graph replay of N calls (so launch
gaps of the Python wrappers do not count), median of many replays; the full-verify inputs are
rotated among enough copies to exceed L2, so the argmax reads HBM as it would after lm_head.
Byte floor: R * V * 2 bytes over the copy bandwidth (benchmarks/common.py defines both).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import copy_bandwidth, environment, graph_us_per_call, table_header, table_row, time_calls  # noqa: E402
from dev.kv.kv import reference_compact_kv  # noqa: E402
from verispec.verify.reference import reference_verify_greedy  # noqa: E402
from verispec.verify import rng  # noqa: E402
from verispec.verify.api import canonical_batch  # noqa: E402
from verispec.verify.workloads import greedy_workload, sampling_workload  # noqa: E402

VOCAB = 128256
BATCHES = [1, 4, 16, 32, 64, 256]
ALPHAS = [0.3, 0.6, 0.9]
KS = [4, 8]


# ---- baselines -------------------------------------------------------------------------------
def torch_scan(target_argmax: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorized acceptance over a padded [B, max_k] view; no host sync (graph-capturable)."""
    max_k = batch.max_num_draft
    size = batch.batch_size
    device = target_argmax.device
    pos = torch.arange(max_k + 1, device=device)  # [W]
    row0 = (batch.cu_num_draft[:-1] + torch.arange(size, device=device, dtype=torch.int32)).long()  # [B]
    valid = pos[None, :max_k] < batch.num_draft[:, None]  # [B, K]
    n_drafts = batch.draft_tokens.shape[0]
    draft_idx = (batch.cu_num_draft[:-1, None].long() + pos[None, :max_k]).clamp(max=max(n_drafts - 1, 0))
    drafts = batch.draft_tokens[draft_idx] if n_drafts else torch.zeros_like(draft_idx)  # [B, K]
    rows = (row0[:, None] + pos[None, :]).clamp(max=target_argmax.shape[0] - 1)  # [B, W]
    targets = target_argmax[rows].long()  # [B, W]
    match = (drafts == targets[:, :max_k]) & valid
    num_accepted = match.int().cumprod(dim=1).sum(dim=1)  # [B]
    tokens = torch.where(pos[None, :max_k] < num_accepted[:, None], drafts, -1)
    tokens = torch.cat([tokens, torch.full((size, 1), -1, device=device, dtype=tokens.dtype)], dim=1)
    tokens.scatter_(1, num_accepted[:, None].long(), targets.gather(1, num_accepted[:, None].long()))
    return tokens.int(), num_accepted.int()


def torch_verify(batch):
    return torch_scan(batch.target_logits.argmax(dim=-1), batch)


def torch_compact(new_kv, num_rows, num_emitted):
    """Vectorized packing: gather index of every kept row (capacity R, no host sync)."""
    rows_total = new_kv.shape[0]
    num_rows, num_emitted = num_rows.long(), num_emitted.long()
    cu_rows = torch.cumsum(num_rows, 0) - num_rows  # [B]
    cu_emit = torch.cumsum(num_emitted, 0) - num_emitted
    j = torch.arange(rows_total, device=new_kv.device)
    seq = torch.searchsorted(torch.cumsum(num_emitted, 0), j, right=True).clamp(max=num_rows.shape[0] - 1)
    src = (cu_rows[seq] + j - cu_emit[seq]).clamp(max=rows_total - 1)
    return new_kv.index_select(0, src)


# ---- timing ----------------------------------------------------------------------------------
def time_graph(fns, reps: int = 30, inner: int | None = None) -> tuple[float, str]:
    """Median device ms per call of the callables ``fns`` (cycled), through a CUDA graph of ``inner`` calls.

    Falls back to eager event timing (launch gaps included) if the calls cannot be captured.
    """
    inner = inner or max(len(fns), 20)
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    try:
        return graph_us_per_call(lambda i: fns[i % len(fns)](), calls=inner, reps=reps) / 1e3, "graph"
    except Exception:  # noqa: BLE001 - e.g. a host sync inside fn
        torch.cuda.synchronize()
        seconds = time_calls(lambda: [f() for f in fns], iters=max(5, reps // 3), warmup=0)
        return seconds * 1e3 / len(fns), "eager"


def time_host(fn, reps: int = 5) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


# ---- the sweep -------------------------------------------------------------------------------
def _same(tokens, num_accepted, expected) -> bool:
    return bool(torch.equal(tokens.cpu(), expected.tokens.cpu()) and torch.equal(num_accepted.cpu(), expected.num_accepted.cpu()))


def greedy_methods():
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    methods = {
        "cuda-naive": lambda b: vc.verify_greedy_cuda(b, variant="naive"),
        "cuda-ballot": lambda b: vc.verify_greedy_cuda(b, variant="ballot"),
        "cuda-segment": lambda b: vc.verify_greedy_cuda(b, variant="segment"),
    }
    try:
        from verispec.verify.triton.greedy import verify_greedy_triton

        methods["triton"] = verify_greedy_triton
    except Exception as exc:  # noqa: BLE001
        print(f"triton greedy kernel unavailable: {exc}")
        methods["triton"] = None
    methods["torch-vec"] = torch_verify
    return methods


def run_greedy(l2_bytes: int, log) -> list[dict]:
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    methods = greedy_methods()
    results = []
    for k in KS:
        for alpha in ALPHAS:
            for bsz in BATCHES:
                w = greedy_workload(bsz, k, VOCAB, alpha, dtype=torch.bfloat16, device="cuda", seed=bsz * 10 + k)
                batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, False)
                rows = batch.target_logits.shape[0]
                logit_bytes = rows * VOCAB * 2
                copies = max(1, min(64, math.ceil(3 * l2_bytes / logit_bytes)))
                batches = [batch] + [
                    canonical_batch(w.target_logits.clone(), w.draft_tokens, w.num_draft, k, False) for _ in range(copies - 1)
                ]
                row = {"K": k, "alpha": alpha, "b": bsz, "rows": rows, "bytes": logit_bytes,
                       "accepted": float(w.expected.num_accepted.float().mean())}
                for name, fn in methods.items():
                    if fn is None:
                        row[f"full:{name}"] = None
                        continue
                    try:
                        out = fn(batch)
                        tokens, acc = (out.tokens, out.num_accepted) if hasattr(out, "tokens") else out
                        if not _same(tokens, acc, w.expected):
                            raise AssertionError("wrong result")
                        row[f"full:{name}"], row[f"mode:{name}"] = time_graph([lambda bb=bb, fn=fn: fn(bb) for bb in batches])
                    except Exception as exc:  # noqa: BLE001
                        log(f"  {name} b={bsz} a={alpha} K={k}: FAILED {type(exc).__name__}: {exc}")
                        row[f"full:{name}"] = None
                if bsz <= 4:
                    row["full:reference"] = time_host(
                        lambda: reference_verify_greedy(batch.target_logits, batch.draft_tokens, batch.num_draft, k))
                # argmax only (auto vocabulary split, as in the full verify)
                for name, fn in {
                    "v2": lambda bb: vc.target_argmax_partial_cuda(bb.target_logits, "v2"),
                    "v3": lambda bb: vc.target_argmax_partial_cuda(bb.target_logits, "v3"),
                    "torch": lambda bb: bb.target_logits.argmax(dim=-1),
                }.items():
                    row[f"argmax:{name}"], _ = time_graph([lambda bb=bb, fn=fn: fn(bb) for bb in batches])
                # scan only, over the precomputed argmax (L2-resident, like right after the argmax)
                am = vc.target_argmax_cuda(batch.target_logits)
                for name, fn in {
                    "cuda-naive": lambda: vc.greedy_scan_cuda(am, batch, "naive"),
                    "cuda-ballot": lambda: vc.greedy_scan_cuda(am, batch, "ballot"),
                    "cuda-segment": lambda: vc.greedy_scan_cuda(am, batch, "segment"),
                    "torch-vec": lambda: torch_scan(am, batch),
                }.items():
                    out = fn()
                    tokens, acc = (out.tokens, out.num_accepted) if hasattr(out, "tokens") else out
                    assert _same(tokens, acc, w.expected), f"scan {name} wrong at b={bsz}"
                    row[f"scan:{name}"], _ = time_graph([fn], reps=50, inner=50)
                results.append(row)
                log("  " + ", ".join(f"{key}={_fmt(v)}" for key, v in row.items() if not key.startswith("mode")))
                del batches, batch, w
                torch.cuda.empty_cache()
    return results


def run_kv(log) -> list[dict]:
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    try:
        from dev.kv.kv_compact_triton import compact_kv_triton
    except Exception:  # noqa: BLE001
        compact_kv_triton = None
    results = []
    k = 8
    for row_shape, label in [((2, 8, 128), "4 KiB"), ((32, 2, 8, 128), "128 KiB")]:
        for alpha in ALPHAS if label == "4 KiB" else [0.6]:
            for bsz in BATCHES:
                g = torch.Generator().manual_seed(bsz)
                w = greedy_workload(bsz, k, 1000, alpha, device="cuda", seed=bsz)  # only for num_accepted
                num_rows = (w.num_draft + 1).int()
                num_emitted = w.expected.num_accepted.int() + 1
                total = int(num_rows.sum())
                new_kv = torch.randn(total, *row_shape, generator=g).to(torch.bfloat16).cuda()
                ref = reference_compact_kv(new_kv, num_rows, num_emitted)
                kept = ref.shape[0]
                row = {"rows": label, "alpha": alpha, "b": bsz, "kept_bytes": kept * new_kv[0].numel() * 2}
                methods = {
                    "cuda-naive": lambda: dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="naive", check_values=False)[0],
                    "cuda-scan": lambda: dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="scan", check_values=False)[0],
                    "cuda-fused": lambda: dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="fused", check_values=False)[0],
                    "triton": (lambda: compact_kv_triton(new_kv, num_rows, num_emitted)[0]) if compact_kv_triton else None,
                    "torch-vec": lambda: torch_compact(new_kv, num_rows, num_emitted),
                }
                for name, fn in methods.items():
                    if fn is None:
                        row[f"kv:{name}"] = None
                        continue
                    try:
                        assert torch.equal(fn()[:kept], ref), "wrong result"
                        row[f"kv:{name}"], _ = time_graph([fn], reps=30, inner=20)
                    except Exception as exc:  # noqa: BLE001
                        log(f"  kv {name} b={bsz}: FAILED {type(exc).__name__}: {exc}")
                        row[f"kv:{name}"] = None
                results.append(row)
                log("  " + ", ".join(f"{key}={_fmt(v)}" for key, v in row.items()))
                del new_kv
                torch.cuda.empty_cache()
    return results


def run_sampling(log) -> list[dict]:
    """verify_sample at T = 1 with draft_probs (K = 8, alpha = 0.6): cuda vs triton (not swept)."""
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    try:
        from verispec.verify.triton.rejection import verify_sample_triton
    except Exception:  # noqa: BLE001
        verify_sample_triton = None
    results = []
    for bsz in [1, 16, 256]:
        w = sampling_workload(bsz, 8, VOCAB, 0.6, dtype=torch.bfloat16, device="cuda", seed=bsz)
        batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, 8, False)
        batch.draft_probs = w.draft_probs
        batch.temperature = torch.ones(bsz, device="cuda")
        batch.top_k = torch.zeros(bsz, dtype=torch.int32, device="cuda")
        batch.top_p = torch.ones(bsz, device="cuda")
        batch.seed = rng.sequence_seeds(1234, bsz).cuda()  # the keys verify_sample(seed=1234) uses
        batch.offset = torch.zeros(bsz, dtype=torch.int64, device="cuda")
        rows = batch.target_logits.shape[0]
        row = {"b": bsz, "bytes": rows * VOCAB * 2}  # draft_probs: only q(x) and one recovered row are needed
        outs = {}
        for name, fn in {"cuda": vc.verify_sample_cuda, "triton": verify_sample_triton}.items():
            if fn is None:
                row[f"sample:{name}"] = None
                continue
            try:
                outs[name] = fn(batch)
                row[f"sample:{name}"], _ = time_graph([lambda fn=fn: fn(batch)], reps=20, inner=10)
            except Exception as exc:  # noqa: BLE001
                log(f"  sample {name} b={bsz}: FAILED {type(exc).__name__}: {exc}")
                row[f"sample:{name}"] = None
        if len(outs) == 2:
            row["same_tokens"] = float((outs["cuda"].tokens == outs["triton"].tokens).all(dim=1).float().mean())
        results.append(row)
        log("  " + ", ".join(f"{key}={_fmt(v)}" for key, v in row.items()))
        del w, batch, outs
        torch.cuda.empty_cache()
    return results


# ---- report ----------------------------------------------------------------------------------
def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _us(v) -> str:
    return "n/a" if v is None else f"{v * 1e3:.1f}"


def write_report(out_dir: Path, header: list[str], bw: float, greedy: list[dict], kv: list[dict], ncu_csv: Path | None,
                 sampling: list[dict] | None = None):
    lines = ["# Ablation: CUDA verification kernels and KV compaction", "", *header, "",
             f"Measured device-to-device copy: **{bw / 1e12:.2f} TB/s** (read + write bytes; benchmarks/common.py). "
             "Times are device microseconds per call (CUDA-graph replay, median); 'floor' = bytes moved / copy bandwidth.", ""]
    names = ["cuda-naive", "cuda-ballot", "cuda-segment", "triton", "torch-vec"]
    lines += ["## Full greedy verify (argmax over V = 128256 bf16 + acceptance scan), µs", "",
              *table_header(["K", "α", "b", "rows", "mean acc", "floor", *names, "reference loop", "ballot vs naive"])]
    for r in greedy:
        floor = r["bytes"] / bw * 1e3
        sp = (r["full:cuda-naive"] / r["full:cuda-ballot"]) if r.get("full:cuda-naive") and r.get("full:cuda-ballot") else None
        ref = r.get("full:reference")
        lines.append(table_row([r['K'], r['alpha'], r['b'], r['rows'], f"{r['accepted']:.2f}", f"{floor * 1e3:.1f}",
                                *(_us(r.get(f"full:{n}")) for n in names),
                                '-' if ref is None else f'{ref * 1e3:.0f}', 'n/a' if sp is None else f'{sp:.2f}x']))
    lines += ["", "## Argmax only (α does not matter: shown for α = 0.6), µs; % of the byte floor's bandwidth", "",
              *table_header(["K", "b", "floor", "cuda v2", "cuda v3", "torch.argmax", "v3 % of floor"])]
    for r in greedy:
        if r["alpha"] != 0.6:
            continue
        floor = r["bytes"] / bw * 1e3
        lines.append(table_row([r['K'], r['b'], f"{floor * 1e3:.1f}", _us(r['argmax:v2']), _us(r['argmax:v3']),
                                _us(r['argmax:torch']), f"{100 * floor / r['argmax:v3']:.0f}%"]))
    lines += ["", "## Acceptance scan only (over a precomputed argmax), µs", "",
              *table_header(["K", "α", "b", "cuda-naive", "cuda-ballot", "cuda-segment", "torch-vec", "ballot vs naive",
                             "segment vs naive"])]
    for r in greedy:
        n, bl, sg, tv = r["scan:cuda-naive"], r["scan:cuda-ballot"], r["scan:cuda-segment"], r["scan:torch-vec"]
        lines.append(table_row([r['K'], r['alpha'], r['b'], _us(n), _us(bl), _us(sg), _us(tv), f"{n / bl:.2f}x",
                                f"{n / sg:.2f}x"]))
    kvn = ["cuda-naive", "cuda-scan", "cuda-fused", "triton", "torch-vec"]
    lines += ["", "## KV compaction (packed layout, K = 8), µs", "",
              *table_header(["row size", "α", "b", "kept MB", "floor", *kvn, "scan vs naive"])]
    for r in kv:
        floor = 2 * r["kept_bytes"] / bw * 1e6
        sp = r["kv:cuda-naive"] / r["kv:cuda-scan"] if r.get("kv:cuda-naive") and r.get("kv:cuda-scan") else None
        lines.append(table_row([r['rows'], r['alpha'], r['b'], f"{r['kept_bytes'] / 1e6:.2f}", f"{floor:.1f}",
                                *(_us(r.get(f"kv:{n}")) for n in kvn), 'n/a' if sp is None else f'{sp:.1f}x']))
    if sampling:
        lines += ["", "## Rejection sampling (T = 1, draft_probs fp32, K = 8, α = 0.6; not part of the sweep), µs", "",
                  "Floor: the bf16 logits read once (of draft_probs only q(x) and the recovered row's q are needed). 'same tokens': fraction of sequences where the two "
                  "backends emit identical tokens (same Philox stream; differences are float near-ties).", "",
                  *table_header(["b", "floor", "cuda", "triton", "same tokens"])]
        for r in sampling:
            same = r.get("same_tokens")
            lines.append(table_row([r['b'], f"{r['bytes'] / bw * 1e6:.1f}", _us(r.get('sample:cuda')),
                                    _us(r.get('sample:triton')), 'n/a' if same is None else f'{same:.3f}']))
    if ncu_csv is not None and ncu_csv.exists():
        try:
            table = ncu_table(ncu_csv)
        except Exception as exc:  # noqa: BLE001
            table = [f"(could not parse {ncu_csv.name}: {exc})"]
        lines += ["", "## Nsight Compute (b = 256, K = 8, α = 0.6; `--clock-control none`)", ""] + table
    lines += ["", "Plots: `ablation_latency.png` (full verify latency vs b per α), `ablation_speedup.png` "
              "(scan and full-verify speedup of ballot / segment over naive), `ablation_kv.png` (KV compaction)."]
    (out_dir / "ablation.md").write_text("\n".join(lines) + "\n")


def ncu_table(path: Path) -> list[str]:
    import csv

    rows = list(csv.reader(path.read_text().splitlines()[_csv_start(path):]))
    if not rows:
        return ["(no ncu rows)"]
    head = rows[0]
    ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    table: dict[str, dict[str, str]] = {}
    for r in rows[1:]:
        if len(r) <= vi:
            continue
        name = r[ki].split("(")[0].replace("void ", "")
        idx = r[head.index("ID")] if "ID" in head else "0"
        table.setdefault(f"{idx}:{name}", {})[r[mi]] = r[vi]
    metrics = sorted({m for d in table.values() for m in d})
    return [*table_header(["launch", *metrics]), *(table_row([key, *(d.get(m, "") for m in metrics)])
                                                   for key, d in table.items())]


def _csv_start(path: Path) -> int:
    for i, line in enumerate(path.read_text().splitlines()):
        if line.startswith('"ID"'):
            return i
    return 0


def plot(out_dir: Path, greedy: list[dict], kv: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["cuda-naive", "cuda-ballot", "cuda-segment", "triton", "torch-vec"]
    fig, axes = plt.subplots(1, len(ALPHAS), figsize=(15, 4.2), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, alpha in zip(axes, ALPHAS):
        for name in names:
            for k, style in zip(KS, ["--", "-"]):
                pts = [(r["b"], r[f"full:{name}"] * 1e3) for r in greedy if r["alpha"] == alpha and r["K"] == k and r.get(f"full:{name}")]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{name} K={k}")
        floors = [(r["b"], r["bytes"] / BW * 1e6) for r in greedy if r["alpha"] == alpha and r["K"] == 8]
        ax.plot(*zip(*floors), ":", color="k", label="byte floor K=8")
        ax.set(xscale="log", yscale="log", xlabel="batch b", title=f"full verify, α={alpha}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("µs (device)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ablation_latency.png", dpi=110)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for alpha, color in zip(ALPHAS, ["C0", "C1", "C2"]):
        for k, style in zip(KS, ["--", "-"]):
            rs = [r for r in greedy if r["alpha"] == alpha and r["K"] == k]
            for ax, var in zip(axes[:2], ["ballot", "segment"]):
                ax.plot([r["b"] for r in rs], [r["scan:cuda-naive"] / r[f"scan:cuda-{var}"] for r in rs], style,
                        color=color, marker="o", label=f"α={alpha} K={k}")
            pts = [(r["b"], r["full:cuda-naive"] / r["full:cuda-segment"]) for r in rs if r.get("full:cuda-naive") and r.get("full:cuda-segment")]
            if pts:
                axes[2].plot(*zip(*pts), style, color=color, marker="o", label=f"α={alpha} K={k}")
    for ax, title in zip(axes, ["scan only: naive / ballot", "scan only: naive / segment", "full verify: naive / segment"]):
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xscale="log", xlabel="batch b", ylabel="speedup over naive", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ablation_speedup.png", dpi=110)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, label in zip(axes, ["4 KiB", "128 KiB"]):
        for name in ["cuda-naive", "cuda-scan", "cuda-fused", "triton", "torch-vec"]:
            pts = [(r["b"], r[f"kv:{name}"] * 1e3) for r in kv if r["rows"] == label and r["alpha"] == 0.6 and r.get(f"kv:{name}")]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="batch b", ylabel="µs", title=f"KV compaction, {label} rows, α=0.6, K=8")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ablation_kv.png", dpi=110)


def ncu_only() -> None:
    """A few launches for ``ncu -k regex:'scan|argmax|kv_' -c N``: b=256, K=8, alpha=0.6."""
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    w = greedy_workload(256, 8, VOCAB, 0.6, dtype=torch.bfloat16, device="cuda", seed=1)
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, 8, False)
    am = vc.target_argmax_cuda(batch.target_logits)
    vc.target_argmax_cuda(batch.target_logits, 2)
    vc.greedy_scan_cuda(am, batch, "naive")
    vc.greedy_scan_cuda(am, batch, "ballot")
    vc.greedy_scan_cuda(am, batch, "segment")
    num_rows = (w.num_draft + 1).int()
    num_emitted = w.expected.num_accepted.int() + 1
    new_kv = torch.randn(int(num_rows.sum()), 2, 8, 128, device="cuda").to(torch.bfloat16)
    dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="naive", check_values=False)
    dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="scan", check_values=False)
    dvc.compact_kv_cuda(new_kv, num_rows, num_emitted, variant="fused", check_values=False)
    torch.cuda.synchronize()


BW = 3.0e12


def main() -> None:
    global BW
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--ncu-csv", type=Path, default=None, help="ncu --csv output to tabulate in the report")
    parser.add_argument("--ncu-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="b in {1, 256}, alpha 0.6, K 8 only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/ablation.py needs a CUDA GPU")
    from verispec.verify import cuda as vc
    import dev.cuda_ext as dvc

    vc.load()
    if args.ncu_only:
        ncu_only()
        return
    if args.quick:
        BATCHES[:] = [1, 256]
        ALPHAS[:] = [0.6]
        KS[:] = [8]
    args.out.mkdir(parents=True, exist_ok=True)
    logf = open(args.out / "ablation_log.txt", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")

    props = torch.cuda.get_device_properties(0)
    env = environment()
    header = [
        f"- device: {env['device']}, {env['sms']} SMs, L2 {env['l2_mib']} MiB",
        f"- date: {env['date']}",
        f"- torch {env['torch']}, CUDA {env['cuda']}, triton {env['triton']}, driver {env['driver']}",
        "- kernels built with nvcc for the GPU's own architecture (`-O3`, no fast-math); workloads: "
        "`verispec.verify.workloads.greedy_workload`",
    ]
    for h in header:
        log(h)
    BW = copy_bandwidth()
    log(f"copy bandwidth {BW / 1e12:.2f} TB/s")
    t0 = time.time()
    greedy = run_greedy(props.L2_cache_size, log)
    log(f"greedy sweep {time.time() - t0:.0f} s")
    kv = run_kv(log)
    sampling = run_sampling(log)
    write_report(args.out, header, BW, greedy, kv, args.ncu_csv, sampling)
    plot(args.out, greedy, kv)
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
