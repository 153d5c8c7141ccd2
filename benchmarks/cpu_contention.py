"""Plain decoding on the embedded SmolLM2 (CPU) with and without a competing busy process: torch's default
thread count (one per core) vs verispec's policy (``device.pick_cpu_threads``: the cores others leave free).

    OMP_NUM_THREADS= python benchmarks/cpu_contention.py [--new-tokens 16] [--reps 3] [--competitors 1]

The competitors are busy-loop processes this script starts before and stops after each busy measurement
(each also exits by itself after --competitor-s seconds). Writes benchmarks/results/cpu_contention.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUSY_LOOP = "import time, sys\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"
PROMPT = "Write a short paragraph about the history of the bicycle."


def start_competitors(n: int, seconds: float) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)]) for _ in range(n)]
    time.sleep(0.5)   # let them reach the loop before anything is measured
    return procs


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)


def decode_rate(model, threads: int, new_tokens: int, reps: int) -> list[float]:
    """tok/s of plain decoding (the engine's Stats.tokens_per_s: tokens after the first, per decode second)."""
    import torch

    from verispec import generate

    torch.set_num_threads(threads)
    rates = []
    for _ in range(reps):
        out = generate(model, PROMPT, max_new_tokens=new_tokens, chat=True)
        rates.append(out.stats.tokens_per_s)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--competitors", type=int, default=1, help="busy-loop processes during the busy runs")
    ap.add_argument("--competitor-s", type=float, default=120.0, help="each competitor exits after this anyway")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_contention.md"))
    args = ap.parse_args()
    if os.environ.get("OMP_NUM_THREADS"):
        sys.exit("unset OMP_NUM_THREADS: this benchmark compares thread counts itself")

    import torch

    import verispec
    from verispec.device import _TORCH_DEFAULT_THREADS, busy_cpus, physical_cores, pick_cpu_threads
    from verispec.runtime import load_model

    model = load_model(device="cpu")
    generate_warm = decode_rate(model, _TORCH_DEFAULT_THREADS, 4, 1)   # thread pools, allocator
    del generate_warm
    rows = []
    for condition in ("quiet", "busy"):
        procs = start_competitors(args.competitors, args.competitor_s) if condition == "busy" else []
        try:
            busy = busy_cpus(0.5)
            policy = pick_cpu_threads(busy=busy)
            for name, threads in (("torch default", _TORCH_DEFAULT_THREADS), ("verispec policy", policy)):
                rates = decode_rate(model, threads, args.new_tokens, args.reps)
                rows.append((condition, f"{busy:.2f}", name, threads, statistics.median(rates), rates))
                print(f"{condition:5s} busy={busy:.2f} {name:15s} threads={threads}: median "
                      f"{statistics.median(rates):.1f} tok/s {[round(r, 1) for r in rates]}", flush=True)
        finally:
            stop_competitors(procs)

    command = "OMP_NUM_THREADS= python benchmarks/cpu_contention.py " + " ".join(sys.argv[1:])
    lines = [
        "# Plain decoding under CPU contention: torch's default threads vs verispec's policy",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}",
        f"- device: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"{physical_cores()} physical cores usable",
        f"- versions: verispec {getattr(verispec, '__version__', 'dev')}, torch {torch.__version__}, "
        f"Python {platform.python_version()}",
        f"- command: `{command}`",
        f"- model: embedded SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to fp32), plain decoding "
        f"(no drafter), greedy, {args.new_tokens} new tokens, {args.reps} runs per cell",
        f"- busy: {args.competitors} busy-loop process(es) started and stopped by the benchmark; "
        "\"busy CPUs\" is what /proc/stat showed over 0.5 s before the cell (other users of the machine "
        "included: the quiet rows are only as quiet as the machine was)",
        "- tok/s: tokens after the first one per second of decoding (Stats.tokens_per_s); medians",
        "",
        "| condition | busy CPUs | threads from | threads | median tok/s | runs |",
        "|---|---|---|---|---|---|",
    ]
    for condition, busy, name, threads, median, rates in rows:
        lines.append(f"| {condition} | {busy} | {name} | {threads} | {median:.1f} | "
                     f"{', '.join(f'{r:.1f}' for r in rates)} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
