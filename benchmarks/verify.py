"""Benchmark of the verification backends through the public call (reference -> validate -> time), and the
measured table behind ``backend=None`` (verispec/verify/backend.py).

    python benchmarks/verify.py [--write-table]      # GPU: < 4 min on an H100 (the CUDA extension's first build included)
    python benchmarks/verify.py --table-only         # rewrite verispec/verify/backend_table.json from a saved run
    python benchmarks/verify.py --out v.md --json v.json    # CPU: a tiny smoke run of this script (tests)

The grid (GPU): greedy with float32 and bfloat16 logits, sampling with float32 logits (T = 1, float32
draft_probs, acceptance α = 0.6); B ∈ {1, 8, 32, 128}, K ∈ {1, 4, 8}, V = 128256. Per configuration the torch
reference runs first; each backend ("torch", "triton", "cuda") is then called through ``verify_greedy`` /
``verify_sample(backend=...)``, checked against the reference (greedy: identical tokens and counts; sampling:
identical tokens for the same seed), and only then timed:
  graph      the call with check_values=False replayed from a CUDA graph: median device µs (do_bench, L2 flushed)
  default    the call with its defaults (check_values=True), eager
  unchecked  the call with check_values=False, eager
Eager times are wall µs per call over back-to-back calls ending in one synchronize (median of 5 runs): the larger
of the host's and the device's time per call; L2 is not flushed. A backend whose check fails (or that raises) is
reported, not timed, and the run goes on. "torch" is the reference's per-sequence loop: it reads the device, so it
has no graph time, and it is timed only at small sizes.
floor = the bytes a call must read (the logits once; sampling also the draft_probs rows of the sequences that
rejected) / the copy bandwidth (benchmarks/common.py). Peers: vLLM's v1 rejection sampler is run when ``vllm``
imports, else quoted from the issue's measurements.

Writes benchmarks/results/verify.md and the raw rows to benchmarks/results/verify_backends.json;
``--write-table`` then updates this GPU's entry of verispec/verify/backend_table.json (the graph times of the
backends that passed their check); ``--table-only`` does that from an existing JSON without running anything.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import capture_graph, copy_bandwidth, environment, environment_line, markdown_table  # noqa: E402
from verispec.verify import rng, verify_greedy, verify_sample  # noqa: E402
from verispec.verify.backend import BACKENDS, TABLE_PATH, choose_backend, dtype_name, parse_table  # noqa: E402
from verispec.verify.workloads import greedy_workload, sampling_workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GPU_GRID = dict(batches=(1, 8, 32, 128), drafts=(1, 4, 8), vocab=128256,
                modes=(("greedy", torch.float32), ("sampling", torch.float32), ("greedy", torch.bfloat16)))
CPU_GRID = dict(batches=(1, 2), drafts=(1, 2), vocab=64, modes=(("greedy", torch.float32), ("sampling", torch.float32)))
ALPHA = 0.6
SEED = 1234
CPU_BANDWIDTH = 1e10   # CPU smoke: a nominal rate; the floor columns mean nothing there
TORCH_MAX_B = {"greedy": 8, "sampling": 1}   # the reference loop is timed only up to these B (it is slow)
CHECKED_SEQUENCES = 16   # sampling: how many sequences of a larger batch the reference checks (see Case)
PEER = "peer, measured 2026-11 by the team, not re-run"
# vLLM v1 rejection sampler, run standalone on an H100 (the issue's table); µs
VLLM_QUOTED = {"greedy graph, B=128 K=8 fp32": 239.0, "greedy eager, B=1..128": "81–256"}


# ---------------------------------------------------------------------------------------------- timing
def graph_us(fn) -> float:
    """Median device µs of one replay of a CUDA graph of ``fn()`` (do_bench flushes L2 before each). GPU only."""
    import triton.testing

    graph = capture_graph(fn)
    return triton.testing.do_bench(graph.replay, warmup=5, rep=25, return_mode="median") * 1e3


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def eager_us(fn, target_s: float = 0.01, runs: int = 5) -> float:
    """Wall µs per call of ``fn()`` called back to back, then one synchronize: the median of ``runs`` runs of
    as many calls as fill about ``target_s`` (1 to 20)."""
    fn()
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    calls = max(1, min(20, int(target_s / max(time.perf_counter() - t, 1e-9))))
    per_call = []
    for _ in range(runs):
        _sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        per_call.append((time.perf_counter() - t) / calls)
    return statistics.median(per_call) * 1e6


# ---------------------------------------------------------------------------------------------- calls
class Case:
    """One configuration: its workload, the reference output, and the public calls per backend.

    Sampling at B > ``CHECKED_SEQUENCES`` checks the first and last ``CHECKED_SEQUENCES / 2`` sequences of each
    backend's full-batch output against the reference run on just those sequences: the reference draws V random
    numbers a row on the CPU (seconds at B = 128), and with one seed per sequence a sequence's tokens depend only
    on its own seed, offset, rows and drafts (docs/verification.md), so the sub-batch is an exact check."""

    def __init__(self, mode: str, size: int, k: int, vocab: int, dtype: torch.dtype, device: str):
        self.mode, self.size, self.k, self.vocab, self.dtype = mode, size, k, vocab, dtype
        if mode == "greedy":
            self.w = greedy_workload(size, k, vocab, ALPHA, dtype=dtype, device=device, seed=size + k)
        else:
            self.w = sampling_workload(size, k, vocab, ALPHA, dtype=dtype, device=device, seed=size + k)
            self.seeds = rng.sequence_seeds(SEED, size).to(device)   # the keys of seed=SEED, as a device tensor
            self.offsets = torch.zeros(size, dtype=torch.int64, device=device)
        half = CHECKED_SEQUENCES // 2
        self.checked = (torch.arange(size) if mode == "greedy" or size <= CHECKED_SEQUENCES
                        else torch.cat([torch.arange(half), torch.arange(size - half, size)]))
        self.reference = self._reference()
        # every sequence's outcome (sampling floor): the reference's when it saw the whole batch, else the
        # output of the first backend that passed its check
        self.num_accepted = self.reference.num_accepted.cpu() if len(self.checked) == size else None

    def _reference(self):
        if len(self.checked) == self.size:
            return self.call("torch", checked=True)
        w, device = self.w, self.w.target_logits.device
        counts = w.num_draft.cpu().long()
        first_draft = torch.cumsum(counts, 0) - counts       # e.g. counts [2, 0, 3] -> [0, 2, 2]
        first_row = first_draft + torch.arange(self.size)    # each sequence's k_b + 1 rows start here
        seqs = self.checked.tolist()
        rows = torch.cat([torch.arange(first_row[b], first_row[b] + counts[b] + 1) for b in seqs]).to(device)
        drafts = torch.cat([torch.arange(first_draft[b], first_draft[b] + counts[b]) for b in seqs]).to(device)
        index = self.checked.to(device)
        return verify_sample(w.target_logits[rows], w.draft_tokens[drafts], w.num_draft[index], w.draft_probs[drafts],
                             seed=self.seeds[index], offset=self.offsets[index], max_num_draft=self.k, backend="torch")

    def call(self, backend: str, checked: bool):
        """The public call: with its defaults (``checked``), or graph-capturable (check_values=False, K given,
        seeds on the device)."""
        w = self.w
        if self.mode == "greedy":
            if checked:
                return verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, backend=backend)
            return verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, max_num_draft=self.k, backend=backend,
                                 check_values=False)
        if checked:
            return verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=SEED,
                                 backend=backend)
        return verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=self.seeds,
                             offset=self.offsets, max_num_draft=self.k, backend=backend, check_values=False)

    def mismatch(self, out) -> str | None:
        """None when ``out`` equals the reference (tokens and counts) on the checked sequences, else what differs."""
        ref, index = self.reference, self.checked
        bad = ((out.tokens.cpu()[index] != ref.tokens.cpu()).any(dim=1)
               | (out.num_accepted.cpu()[index] != ref.num_accepted.cpu()))
        if bool(bad.any()):
            return f"{int(bad.sum())} of {len(index)} checked sequences differ from the torch reference"
        if self.num_accepted is None:
            self.num_accepted = out.num_accepted.cpu()
        return None

    def floor_bytes(self) -> int:
        """Bytes a call must read: the logits once, and for sampling the draft_probs row of each sequence that
        rejected (its recovery row); without a passing backend's outcome, the logits alone."""
        logits = self.w.target_logits
        nbytes = logits.numel() * logits.element_size()
        if self.mode == "sampling" and self.num_accepted is not None:
            rejected = int((self.num_accepted < self.w.num_draft.cpu()).sum())
            nbytes += rejected * self.vocab * self.w.draft_probs.element_size()
        return nbytes


def _error(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text[:160]


def measure_backend(case: Case, backend: str, on_gpu: bool) -> dict:
    """Check ``backend`` against the reference, then time it; failures are recorded, never raised."""
    res = dict(ok=False, error=None, skipped=None, graph_us=None, default_us=None, unchecked_us=None)
    if backend == "cuda" and not on_gpu:
        res["skipped"] = "no CUDA device"
        return res
    if backend == "torch" and case.size > TORCH_MAX_B[case.mode]:
        res.update(ok=True, skipped="the reference itself: not timed at this B (a Python loop)")
        return res
    try:
        for checked in (True, False):
            problem = case.mismatch(case.call(backend, checked))
            if problem:
                res["error"] = f"check_values={checked}: {problem}"
                return res
    except Exception as e:   # a failing backend is a result, not the end of the run
        res["error"] = _error(e)
        return res
    res["ok"] = True
    try:
        if on_gpu and backend != "torch":              # the reference loop reads the device: not capturable
            res["graph_us"] = graph_us(lambda: case.call(backend, False))
        runs = 5 if on_gpu else 2                      # CPU: the smoke run of the script, kept short
        res["default_us"] = eager_us(lambda: case.call(backend, True), runs=runs)
        res["unchecked_us"] = eager_us(lambda: case.call(backend, False), runs=runs)
    except Exception as e:
        res["error"] = "timing: " + _error(e)
    return res


# ---------------------------------------------------------------------------------------------- vLLM
def vllm_rows(on_gpu: bool) -> tuple[str, list[dict]]:
    """(what happened, rows) for vLLM's v1 rejection sampler on the greedy fp32 grid points B ∈ {1, 128}, K = 8.

    Its greedy path takes the argmax of the draft rows and a bonus token per sequence; both are computed inside
    the timed call from our layout's rows (gathered once, outside). Best effort: the function's signature has
    changed between vLLM versions, so a failure is reported and the issue's figures are quoted instead."""
    try:
        import vllm
    except ImportError:
        return "vllm is not installed here: its figures are quoted", []
    if not on_gpu:
        return f"vllm {vllm.__version__} is installed but there is no GPU: quoted", []
    try:
        from types import SimpleNamespace

        from vllm.v1.sample.rejection_sampler import rejection_sample

        rows = []
        for size in (1, 128):
            w = greedy_workload(size, 8, GPU_GRID["vocab"], ALPHA, dtype=torch.float32, device="cuda", seed=size + 8)
            counts = w.num_draft.long()
            bonus_row = torch.cumsum(counts + 1, 0) - 1           # each sequence's last row
            is_bonus = torch.zeros(w.target_logits.shape[0], dtype=torch.bool, device="cuda")
            is_bonus[bonus_row] = True
            draft_logits = w.target_logits[~is_bonus].contiguous()
            bonus_logits = w.target_logits[is_bonus].contiguous()
            cu = torch.cumsum(w.num_draft, 0).to(torch.int32)
            meta = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
            num_draft = w.num_draft.tolist()

            def run():
                bonus = bonus_logits.argmax(-1, keepdim=True).to(torch.int32)
                return rejection_sample(w.draft_tokens.to(torch.int32), num_draft, 8, cu, None, draft_logits, bonus,
                                        meta)

            out = run()
            ok = bool((out[:, : 9].cpu().long() == w.expected.tokens.cpu().long()).all())
            rows.append(dict(B=size, K=8, ok=ok, graph_us=graph_us(run), eager_us=eager_us(run)))
        return f"vllm {vllm.__version__}: rejection_sample run here (greedy, fp32)", rows
    except Exception as e:
        return f"vllm {vllm.__version__} is installed but its rejection sampler could not be run ({_error(e)}): quoted", []


# ---------------------------------------------------------------------------------------------- the run
def run_grid(grid: dict, on_gpu: bool, budget_s: float) -> tuple[list[dict], int]:
    """Every configuration of ``grid`` (all backends each), until ``budget_s`` runs out; (rows, skipped)."""
    device = "cuda" if on_gpu else "cpu"
    rows, skipped, t0 = [], 0, time.time()
    for mode, dtype in grid["modes"]:
        for size in grid["batches"]:
            for k in grid["drafts"]:
                if time.time() - t0 > budget_s:
                    skipped += 1
                    continue
                case = Case(mode, size, k, grid["vocab"], dtype, device)
                backends = {b: measure_backend(case, b, on_gpu) for b in BACKENDS}
                row = dict(mode=mode, B=size, K=k, V=grid["vocab"], dtype=dtype_name(dtype),
                           floor_bytes=case.floor_bytes(), checked_sequences=len(case.checked),
                           pick=choose_backend(torch.device(device), size, k, grid["vocab"], dtype, mode == "greedy"),
                           backends=backends)
                rows.append(row)
                print(_summary(row), flush=True)
                del case
                if on_gpu:
                    torch.cuda.empty_cache()
    return rows, skipped


def _summary(row: dict) -> str:
    cells = [f"{b} {'n/a' if r['skipped'] and not r['ok'] else 'ok' if r['ok'] else 'FAIL'} "
             f"g={_us(r['graph_us'])} e={_us(r['unchecked_us'])}"
             for b, r in row["backends"].items()]
    return f"{row['mode']:8} B={row['B']:3} K={row['K']} {row['dtype']:8} | " + " | ".join(cells)


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


# ---------------------------------------------------------------------------------------------- the page
def _eager_cell(r: dict) -> str:
    if r["skipped"]:
        return "n/a"
    if not r["ok"]:
        return "FAIL"
    if r["default_us"] is None:
        return "-"
    return f"{r['default_us']:.0f} / {r['unchecked_us']:.0f} ({r['default_us'] / r['unchecked_us']:.1f}×)"


def _fastest(row: dict) -> tuple[str | None, float | None]:
    timed = {b: r["graph_us"] for b, r in row["backends"].items() if r["ok"] and r["graph_us"] is not None}
    if not timed:
        return None, None
    best = min(timed, key=timed.get)
    return best, timed[best]


def page(rows: list[dict], meta: dict, skipped: int, vllm_note: str, vllm_measured: list[dict]) -> list[str]:
    bw = meta["bandwidth"]
    lines = ["# Verification backends: the public call, graph and eager", "",
             environment_line(meta["env"], bw if meta["on_gpu"] else None), "",
             f"Command: `{meta['command']}` ({meta['seconds']:.0f} s; {skipped} configurations skipped by the budget).",
             "",
             "µs, medians. `graph`: the call with check_values=False replayed from a CUDA graph (device time, L2 "
             "flushed). Eager cells: `default / unchecked (ratio)`: the call with its defaults (check_values=True) "
             "and with check_values=False, wall time per call back to back (host and device). `floor`: bytes read "
             "once / copy bandwidth. `picks`: what backend=None chose in this run (the committed table at the "
             "time). Every backend was checked against the torch reference before timing (greedy: identical; "
             f"sampling: identical tokens for the same seed, on every sequence up to B = {CHECKED_SEQUENCES}, on the "
             f"first and last {CHECKED_SEQUENCES // 2} beyond); FAIL cells are listed under the tables.", ""]
    for mode, title in (("greedy", "Greedy (α = 0.6)"), ("sampling", "Sampling (T = 1, draft_probs, α = 0.6)")):
        table = []
        for row in (r for r in rows if r["mode"] == mode):
            floor_us = row["floor_bytes"] / bw * 1e6
            b = row["backends"]
            best, best_us = _fastest(row)
            table.append([row["B"], row["K"], row["dtype"], f"{floor_us:.1f}", _us(b["triton"]["graph_us"]),
                          _us(b["cuda"]["graph_us"]), f"{best} {best_us / floor_us:.2f}×" if best else "-",
                          row["pick"], _eager_cell(b["triton"]), _eager_cell(b["cuda"]), _eager_cell(b["torch"])])
        lines += [f"## {title}", "", *markdown_table(
            ["B", "K", "dtype", "floor", "triton graph", "cuda graph", "fastest, × floor", "picks",
             "triton eager", "cuda eager", "torch eager"], table), ""]
    failures = [f"- {row['mode']} B={row['B']} K={row['K']} {row['dtype']} `{b}`: {r['error']}"
                for row in rows for b, r in row["backends"].items() if r["error"]]
    skips = sorted({f"- `{b}` not run: {r['skipped']}" for row in rows for b, r in row["backends"].items()
                    if r["skipped"] and not r["ok"]})
    lines += ["## Failures and skips", "", *(failures or ["no failures"]), *skips, ""]
    lines += ["## Peers", "", f"vLLM v1 rejection sampler: {vllm_note}.", ""]
    if vllm_measured:
        lines += markdown_table(["B", "K", "ok", "graph", "eager"], [
            [r["B"], r["K"], "yes" if r["ok"] else "NO", _us(r["graph_us"]), _us(r["eager_us"])]
            for r in vllm_measured]) + [""]
    lines += [f"- greedy, B=128, K=8, V=128256 fp32, graph replay: {VLLM_QUOTED['greedy graph, B=128 K=8 fp32']:.0f} µs "
              f"({PEER})",
              f"- greedy, eager call, B=1..128: {VLLM_QUOTED['greedy eager, B=1..128']} µs ({PEER})", ""]
    lines += ["## Against the issue's goals", "",
              *(goals(rows, bw) if meta["on_gpu"] else ["- a CPU smoke run: the goals are about the GPU"]), ""]
    return lines


def goals(rows: list[dict], bw: float) -> list[str]:
    """One line per goal of the issue that this grid measures, with met / MISSED."""
    out = []
    verdict = lambda ok: "met" if ok else "MISSED"   # noqa: E731
    find = lambda mode, size, k, dtype="float32": next(   # noqa: E731
        (r for r in rows if (r["mode"], r["B"], r["K"], r["dtype"]) == (mode, size, k, dtype)), None)
    head = find("greedy", 128, 8)
    if head:
        best, best_us = _fastest(head)
        if best:
            ratio = best_us / (head["floor_bytes"] / bw * 1e6)
            out.append(f"- greedy B=128 K=8 fp32 graph ≤ 1.15× floor and ≤ vLLM's 239 µs: {best} {best_us:.1f} µs = "
                       f"{ratio:.2f}× floor: {verdict(ratio <= 1.15 and best_us <= 239.0)}")
    for backend in ("triton", "cuda"):
        ratios = [(r["backends"][backend]["default_us"] / r["backends"][backend]["unchecked_us"], r) for r in rows
                  if r["backends"][backend]["ok"] and r["backends"][backend]["default_us"]]
        if ratios:
            worst, r = max(ratios, key=lambda x: x[0])
            out.append(f"- {backend}: default call ≤ 1.2× the unchecked call (eager): worst {worst:.2f}× at "
                       f"{r['mode']} B={r['B']} K={r['K']} {r['dtype']}: {verdict(worst <= 1.2)}")
    for backend in ("triton", "cuda"):
        one = [r["backends"][backend]["unchecked_us"] for r in rows if r["mode"] == "greedy" and r["B"] == 1
               and r["backends"][backend]["unchecked_us"] is not None]
        if one:
            out.append(f"- {backend}: eager greedy call at B=1 ≤ 40 µs: {min(one):.0f}–{max(one):.0f} µs: "
                       f"{verdict(max(one) <= 40)}")
    pairs = [(r, r["backends"]["cuda"]["graph_us"] / r["backends"]["triton"]["graph_us"]) for r in rows
             if r["mode"] == "sampling" and r["backends"]["cuda"]["graph_us"] and r["backends"]["triton"]["graph_us"]]
    if pairs:
        worst_row, worst = max(pairs, key=lambda x: x[1])
        out.append(f"- cuda sampling within 1.5× of triton at every B (graph): worst {worst:.2f}× at B={worst_row['B']} "
                   f"K={worst_row['K']}: {verdict(worst <= 1.5)}")
    return out or ["- no goal measurable in this run"]


# ---------------------------------------------------------------------------------------------- the table
def table_entry(data: dict) -> tuple[str, dict]:
    """(GPU name, its backend_table.json entry) from a run's JSON: per mode, one point per configuration with the
    graph µs of every backend that passed its check."""
    meta = data["meta"]
    if not meta.get("on_gpu"):
        raise SystemExit("the backend table needs a GPU run's JSON (this one ran on the CPU: no graph times)")
    entry = dict(source=f"benchmarks/verify.py, {meta['env']['date']}, torch {meta['env']['torch']}, "
                        f"triton {meta['env']['triton']}", provisional=False, greedy=[], sampling=[])
    for row in data["rows"]:
        us = {b: round(r["graph_us"], 2) for b, r in row["backends"].items() if r["ok"] and r["graph_us"]}
        if us:
            entry[row["mode"]].append(dict(B=row["B"], K=row["K"], V=row["V"], dtype=row["dtype"], us=us))
    return meta["env"]["device"], entry


def format_table(table: dict) -> str:
    """backend_table.json's text: one point a line, so a regenerated table diffs point by point."""
    out = ["{", f' "_comment": {json.dumps(table.get("_comment", ""))},', ' "devices": {']
    devices = list(table["devices"].items())
    for i, (gpu, entry) in enumerate(devices):
        out.append(f"  {json.dumps(gpu)}: {{")
        out.append(f'   "source": {json.dumps(entry["source"])}, "provisional": {json.dumps(entry["provisional"])},')
        for j, mode in enumerate(("greedy", "sampling")):
            points = [f"    {json.dumps(p)}" for p in entry.get(mode, [])]
            out.append(f'   "{mode}": [' + ("\n" + ",\n".join(points) + "\n   ]" if points else "]")
                       + ("," if j == 0 else ""))
        out.append("  }" + ("," if i < len(devices) - 1 else ""))
    out += [" }", "}"]
    return "\n".join(out) + "\n"


def write_table(json_path: Path, table_path: Path) -> None:
    """Replace this run's GPU entry of the table at ``table_path`` (other GPUs' entries stay)."""
    gpu, entry = table_entry(json.loads(Path(json_path).read_text()))
    table = json.loads(table_path.read_text()) if table_path.exists() else {"devices": {}}
    table["devices"][gpu] = entry
    text = format_table(table)
    parse_table(json.loads(text), where=str(table_path))   # never write a table the library would refuse
    table_path.write_text(text)
    print(f"wrote {table_path}: {gpu}, {len(entry['greedy'])} greedy and {len(entry['sampling'])} sampling points")


def _build_cuda_extension() -> None:
    """Build backend="cuda" before the grid's clock starts (a fresh machine compiles it: about a minute); a failed
    build shows as the cuda backend's error in every row."""
    try:
        from verispec.verify.cuda import load

        load()
    except Exception as e:
        print(f"backend='cuda' unavailable: {_error(e)}", flush=True)


# ---------------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="markdown (GPU default: benchmarks/results/verify.md)")
    ap.add_argument("--json", default=None, help="raw rows (GPU default: benchmarks/results/verify_backends.json)")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the grid; later configurations are skipped")
    ap.add_argument("--write-table", action="store_true", help="after the run, update this GPU's backend table entry")
    ap.add_argument("--table-only", action="store_true", help="update the backend table from --json; run nothing")
    ap.add_argument("--table", default=str(TABLE_PATH), help="the backend table to update")
    args = ap.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    json_path = Path(args.json or RESULTS / "verify_backends.json")
    if args.table_only:
        write_table(json_path, Path(args.table))
        return None
    if not on_gpu and (args.out is None or args.json is None):
        sys.exit("CPU smoke run: give --out and --json (the results files hold GPU runs)")
    t0 = time.time()
    if on_gpu:
        _build_cuda_extension()
    bw = copy_bandwidth() if on_gpu else CPU_BANDWIDTH
    rows, skipped = run_grid(GPU_GRID if on_gpu else CPU_GRID, on_gpu, args.budget)
    vllm_note, vllm_measured = vllm_rows(on_gpu)
    meta = dict(env=environment(), bandwidth=bw, on_gpu=on_gpu, seconds=time.time() - t0,
                command="python " + " ".join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])]),
                vllm=vllm_note)
    data = dict(meta=meta, rows=rows, vllm=vllm_measured, skipped=skipped)
    json_path.write_text(json.dumps(data, indent=1) + "\n")   # first: the measurements survive a page error
    out = Path(args.out or RESULTS / "verify.md")
    out.write_text("\n".join(page(rows, meta, skipped, vllm_note, vllm_measured)) + "\n")
    print(f"wrote {out} and {json_path} ({meta['seconds']:.0f} s)")
    if args.write_table:
        write_table(json_path, Path(args.table))
    return data


if __name__ == "__main__":
    main()
