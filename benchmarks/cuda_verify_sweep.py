"""Sweep of the backend="cuda" verification versions (GPU): reference -> validate -> time, every version.

    python benchmarks/cuda_verify_sweep.py [--quick] [--out benchmarks/results/cuda_verify_sweep.md]

Greedy, V = 128256, fp32 and bf16, B in {1, 8, 32, 128}, K in {1, 4, 8}: every argmax version of
verify_greedy.cu (``verispec.verify.cuda.ARGMAX_VARIANTS``) with the ballot scan, plus the naive and segment
scans with the current default argmax. Sampling, V = 128256 fp32, q fp32, K = 4, T = 1, B in
{1, 4, 32, 128} (+ 512 and 1056 for the crossover to one block per sequence): the race on one block per
sequence (v1, ``race_blocks_per_sm=0``) and split over about N blocks an SM (v2, N in 2..32), the default
with the whole-q-row check off, and the Triton sampler as a peer.

Every version is first checked against the PyTorch reference on the same inputs (greedy: exact tokens;
sampling: the same seeds, exact tokens, and every CUDA version bit-identical to every other); a version
that fails is reported (FAIL) and not timed, and the sweep goes on. Then it is timed as CUDA-graph replay
of back-to-back calls over enough copies of the inputs to exceed L2 (``benchmarks.common.graph_us_per_call``):
median µs per call. ``floor`` = the logits bytes / the measured copy bandwidth.

The "Defaults" section names the version to make the default: per (dtype, B, K) the fastest, and over all
configurations the one whose worst slowdown against the per-configuration best is smallest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.common import (copy_bandwidth, environment, environment_line, floor_s,  # noqa: E402
                               graph_us_per_call, markdown_table)
from verispec.verify import rng  # noqa: E402
from verispec.verify.api import canonical_batch  # noqa: E402
from verispec.verify.reference import reference_verify_greedy, reference_verify_sample  # noqa: E402
from verispec.verify.workloads import greedy_workload, sampling_workload  # noqa: E402

VOCAB = 128256
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GREEDY_BATCHES = (1, 8, 32, 128)
GREEDY_DRAFTS = (1, 4, 8)
SAMPLE_BATCHES = (1, 4, 32, 128)
CROSSOVER_BATCHES = (512, 1056)   # sampling: reference-checked on their first REFERENCE_PREFIX sequences
REFERENCE_PREFIX = 16
SAMPLE_DRAFTS = 4
RACE_SPLITS = (0, 2, 4, 8, 16, 32)  # race_blocks_per_sm; 0 = one block per sequence (v1)
REPS = 20


# ---------------------------------------------------------------------------------------------- helpers
def _copies(nbytes: int, l2_bytes: int) -> int:
    """Input copies so that one graph replay streams more than L2 holds (at most 64)."""
    return max(1, min(64, math.ceil(3 * l2_bytes / max(nbytes, 1))))


def _same(out, ref) -> bool:
    return (torch.equal(out.tokens.cpu(), ref.tokens.cpu().to(torch.int32))
            and torch.equal(out.num_accepted.cpu(), ref.num_accepted.cpu().to(torch.int32)))


def _clean(out) -> bool:
    return out.status is None or not bool(out.status.any())


def _time(fn, batches) -> float:
    """µs per call of fn(batch) replayed from one CUDA graph over the rotating batches."""
    return graph_us_per_call(lambda i: fn(batches[i % len(batches)]), calls=max(len(batches), 4), reps=REPS)


def _time_versions(row: dict, versions: dict, batch, batches, check_for, log) -> None:
    """Check then time every version into row["us"]; a version that fails its check goes to row["fail"].
    check_for(name) -> the check of that version's output."""
    for name, fn in versions.items():
        us, reason = _checked_time(name, fn, batch, batches, check_for(name), log)
        row["us"][name] = us
        if reason:
            row["fail"][name] = reason

def _checked_time(name, fn, batch, batches, check, log) -> tuple[float | None, str]:
    """(µs, "") when fn passes ``check`` on ``batch`` and then times; (None, reason) when it does not."""
    try:
        out = fn(batch)
        torch.cuda.synchronize()
        reason = check(out)
        if reason:
            log(f"    {name}: FAIL ({reason})")
            return None, reason
        return _time(fn, batches), ""
    except Exception as exc:  # noqa: BLE001 - a failing version is reported, the sweep goes on
        log(f"    {name}: FAIL ({type(exc).__name__}: {exc})")
        return None, f"{type(exc).__name__}"


def _fmt(us) -> str:
    return "FAIL" if us is None else f"{us:.1f}"


# ---------------------------------------------------------------------------------------------- greedy
def greedy_versions():
    from verispec.verify import cuda as vc

    versions = {f"{a}": (lambda a: lambda b: vc.verify_greedy_cuda(b, "ballot", a))(a) for a in vc.ARGMAX_VARIANTS}
    for scan in ("naive", "segment"):
        versions[f"{vc.DEFAULT_ARGMAX or 'default'}+{scan}"] = (lambda s: lambda b: vc.verify_greedy_cuda(b, s))(scan)
    try:
        from verispec.verify.triton.greedy import verify_greedy_triton

        versions["triton"] = verify_greedy_triton
    except Exception as exc:  # noqa: BLE001
        print(f"triton greedy unavailable: {exc}")
    return versions


def run_greedy(dtype_name: str, size: int, k: int, bw: float, l2_bytes: int, log) -> dict:
    dtype = DTYPES[dtype_name]
    w = greedy_workload(size, k, VOCAB, 0.6, dtype=dtype, device="cuda", seed=size * 10 + k)
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, False)
    rows = batch.target_logits.shape[0]
    nbytes = rows * VOCAB * batch.target_logits.element_size()
    batches = [batch] + [canonical_batch(w.target_logits.clone(), w.draft_tokens, w.num_draft, k, False)
                         for _ in range(_copies(nbytes, l2_bytes) - 1)]
    ref = reference_verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, k)

    def check(out):
        if not _same(out, ref):
            return "tokens differ from the reference"
        return "" if _clean(out) else f"status {out.status.tolist()[:4]} on clean inputs"

    row = {"dtype": dtype_name, "B": size, "K": k, "R": rows, "floor_us": floor_s(nbytes, bw) * 1e6, "us": {},
           "fail": {}}
    _time_versions(row, greedy_versions(), batch, batches, lambda name: check, log)
    del w, batch, batches
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------------- sampling
def _sample_batch(w, k: int, seed: int):
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, False)
    size = w.batch_size
    batch.draft_probs = w.draft_probs
    batch.temperature = torch.ones(size, device="cuda")
    batch.top_k = torch.zeros(size, dtype=torch.int32, device="cuda")
    batch.top_p = torch.ones(size, device="cuda")
    batch.seed = rng.sequence_seeds(seed, size).cuda()   # the keys verify_sample(seed=seed) uses
    batch.offset = torch.arange(size, dtype=torch.int64, device="cuda") * 7
    return batch


def _reference_prefix(w, batch, k: int, count: int):
    """The reference on the first ``count`` sequences alone (a sequence's tokens depend only on its own inputs)."""
    num_draft = w.num_draft[:count].cpu()
    rows, drafts = int(num_draft.sum()) + count, int(num_draft.sum())
    return reference_verify_sample(
        w.target_logits[:rows], w.draft_tokens[:drafts], num_draft, k, w.draft_probs[:drafts],
        batch.temperature[:count].cpu(), batch.top_k[:count].cpu(), batch.top_p[:count].cpu(),
        batch.seed[:count].cpu(), batch.offset[:count].cpu())


def sample_versions():
    from verispec.verify import cuda as vc

    versions = {("v1 block" if n == 0 else f"split {n}"): (lambda n: lambda b: vc.verify_sample_cuda(b, n))(n)
                for n in RACE_SPLITS}
    versions[f"split {vc.RACE_BLOCKS_PER_SM} no-q-check"] = lambda b: vc.verify_sample_cuda(b, check_draft_probs=False)
    try:
        from verispec.verify.triton.rejection import verify_sample_triton

        versions["triton"] = verify_sample_triton
    except Exception as exc:  # noqa: BLE001
        print(f"triton sampler unavailable: {exc}")
    return versions


def run_sample(size: int, bw: float, l2_bytes: int, log) -> dict:
    k = SAMPLE_DRAFTS
    w = sampling_workload(size, k, VOCAB, 0.6, dtype=torch.float32, device="cuda", seed=size)
    batch = _sample_batch(w, k, seed=2026 + size)
    rows = batch.target_logits.shape[0]
    nbytes = rows * VOCAB * 4
    copies = _copies(nbytes, l2_bytes)
    batches = [batch] + [_sample_batch(sampling_workload(size, k, VOCAB, 0.6, device="cuda", seed=size), k, 2026 + size)
                         for _ in range(copies - 1)]
    count = size if size <= max(SAMPLE_BATCHES) else REFERENCE_PREFIX
    ref = _reference_prefix(w, batch, k, count)
    tolerance = max(1, count // 100)   # near-ties (float rounding against torch's CPU softmax), see tests
    first: dict = {}

    def check(name):
        def run(out):
            if not _clean(out):
                return f"status {out.status.tolist()[:4]} on clean inputs"
            prefix = type(ref)(out.tokens[:count], out.num_accepted[:count], out.num_emitted[:count])
            same = (prefix.tokens.cpu() == ref.tokens.cpu()).all(1) & (prefix.num_accepted.cpu() == ref.num_accepted.cpu())
            mismatches = int((~same).sum())
            row["mismatch"][name] = mismatches
            if mismatches > tolerance:
                return f"{mismatches}/{count} sequences differ from the reference"
            if name != "triton":   # every CUDA version gives the same tokens, bit for bit
                if "tokens" not in first:
                    first["tokens"] = out.tokens.clone()
                elif not torch.equal(out.tokens, first["tokens"]):
                    return "tokens differ from another CUDA version"
            return ""
        return run

    row = {"B": size, "K": k, "R": rows, "floor_us": floor_s(nbytes, bw) * 1e6, "us": {}, "fail": {}, "mismatch": {},
           "ref_sequences": count}
    _time_versions(row, sample_versions(), batch, batches, check, log)
    del w, batch, batches
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------------- report
def _best(row, names):
    timed = {n: row["us"][n] for n in names if row["us"].get(n) is not None}
    return min(timed, key=timed.get) if timed else None


def default_pick(rows, names) -> tuple[str | None, dict]:
    """The version whose worst slowdown against each row's best is smallest, and every version's worst."""
    worst = {}
    for name in names:
        ratios = []
        for row in rows:
            best = _best(row, names)
            if best is None:
                continue
            us = row["us"].get(name)
            ratios.append(math.inf if us is None else us / row["us"][best])
        worst[name] = max(ratios) if ratios else math.inf
    pick = min(worst, key=worst.get) if worst else None
    return pick, worst


def report(env, bw, greedy_rows, sample_rows, command, seconds) -> list[str]:
    from verispec.verify import cuda as vc

    lines = ["# backend='cuda' verification: version sweep", "",
             environment_line(env, bw), "",
             f"Command: `{command}` ({seconds:.0f} s). Times: µs per call, CUDA-graph replay of back-to-back calls "
             f"over input copies that exceed L2, median of {REPS} replays. floor = logits bytes / copy bandwidth. "
             "FAIL = the version did not match the reference (or reported a status on clean inputs) and was not "
             "timed.", ""]
    g_names = list(greedy_rows[0]["us"]) if greedy_rows else []
    argmax_names = [n for n in g_names if n in vc.ARGMAX_VARIANTS]
    if greedy_rows:
        lines += ["## Greedy, V = 128256 (ballot scan unless named)", ""]
        table = []
        for r in greedy_rows:
            best = _best(r, argmax_names)
            table.append([r["dtype"], r["B"], r["K"], r["R"], f"{r['floor_us']:.1f}",
                          *[_fmt(r["us"][n]) for n in g_names], best,
                          f"{r['us'][best] / r['floor_us']:.2f}" if best else "-"])
        lines += markdown_table(["dtype", "B", "K", "R", "floor", *g_names, "best argmax", "best/floor"], table)
        pick, worst = default_pick(greedy_rows, argmax_names)
        lines += ["", "Worst slowdown of each argmax version against the per-row best: "
                  + ", ".join(f"{n} {w:.2f}x" for n, w in sorted(worst.items(), key=lambda kv: kv[1])), ""]
        goal = [r for r in greedy_rows if (r["dtype"], r["B"], r["K"]) == ("fp32", 128, 8)]
        if goal and pick and goal[0]["us"].get(pick) is not None:
            lines.append(f"Goal row (fp32, B = 128, K = 8): {pick} {goal[0]['us'][pick]:.1f} µs = "
                         f"{goal[0]['us'][pick] / goal[0]['floor_us']:.2f}x the floor (goal <= 1.15x).")
        lines += ["", f"**Default argmax to set** (`DEFAULT_ARGMAX` in verispec/verify/cuda/__init__.py): `{pick}` "
                  f"(now `{vc.DEFAULT_ARGMAX}`).", ""]
    if sample_rows:
        s_names = list(sample_rows[0]["us"])
        split_names = [n for n in s_names if n == "v1 block" or (n.startswith("split") and "no-q" not in n)]
        lines += ["## Sampling, V = 128256 fp32, q fp32, K = 4, T = 1", "",
                  "mismatch = sequences whose tokens differ from the reference's (near-ties; `ref` sequences "
                  "compared). The CUDA versions are also checked to be bit-identical to one another.", ""]
        table = []
        for r in sample_rows:
            best = _best(r, split_names)
            mism = max((v for k_, v in r["mismatch"].items() if k_ != "triton"), default=0)
            table.append([r["B"], r["R"], f"{r['floor_us']:.1f}", *[_fmt(r["us"][n]) for n in s_names], best,
                          f"{mism}/{r['ref_sequences']}", r["mismatch"].get("triton", "-")])
        lines += markdown_table(["B", "R", "floor", *s_names, "best", "cuda mismatch", "triton mismatch"], table)
        pick, worst = default_pick(sample_rows, split_names)
        lines += ["", "Worst slowdown of each race split against the per-row best: "
                  + ", ".join(f"{n} {w:.2f}x" for n, w in sorted(worst.items(), key=lambda kv: kv[1])), "",
                  f"**Race split to set** (`RACE_BLOCKS_PER_SM`, now {vc.RACE_BLOCKS_PER_SM}): `{pick}`. "
                  "The rule it implies: one block per sequence from B >= N x SMs on (vs_race_chunks).", ""]
        triton = [(r["B"], r["us"].get("triton"), r["us"].get(pick)) for r in sample_rows]
        lines += ["CUDA (that split) / Triton: " + ", ".join(
            f"B={b} {c / t:.2f}x" for b, t, c in triton if t and c) + " (goal <= 1.5x).", ""]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two greedy and two sampling configurations")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cuda_verify_sweep.md"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/cuda_verify_sweep.py needs a CUDA GPU")
    from verispec.verify import cuda as vc

    t0 = time.time()
    vc.load()   # the build (first use only) is not part of any timing
    print(f"extension ready in {time.time() - t0:.0f} s", flush=True)
    env = environment()
    bw = copy_bandwidth()
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    print(environment_line(env, bw), flush=True)
    greedy_cfgs = [(d, b, k) for d in DTYPES for b in GREEDY_BATCHES for k in GREEDY_DRAFTS]
    sample_cfgs = [*SAMPLE_BATCHES, *CROSSOVER_BATCHES]
    if args.quick:
        greedy_cfgs, sample_cfgs = [("fp32", 1, 4), ("fp32", 128, 8)], [1, 128]
    greedy_rows, sample_rows = [], []
    for d, b, k in greedy_cfgs:
        row = run_greedy(d, b, k, bw, l2_bytes, print)
        greedy_rows.append(row)
        print(f"greedy {d} B={b} K={k} floor {row['floor_us']:.1f}: "
              + " ".join(f"{n}={_fmt(u)}" for n, u in row["us"].items()), flush=True)
    for b in sample_cfgs:
        row = run_sample(b, bw, l2_bytes, print)
        sample_rows.append(row)
        print(f"sample B={b} floor {row['floor_us']:.1f}: " + " ".join(f"{n}={_fmt(u)}" for n, u in row["us"].items())
              + f" mismatch {row['mismatch']}", flush=True)
    command = "python benchmarks/cuda_verify_sweep.py" + (" --quick" if args.quick else "")
    lines = report(env, bw, greedy_rows, sample_rows, command, time.time() - t0)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(dict(env=env, bandwidth=bw, greedy=greedy_rows, sample=sample_rows), f, indent=1)
    print("\n".join(lines))
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
