"""k=auto's cost table against whole rounds, and k=auto with and without its overhead column, in one run.

    python benchmarks/auto_cost.py --out DIR [--write]        GPU: llama-3.1-8b (random bf16 weights, peaked) +
                                                              SuccessorOracle (alpha 0.8) paying llama-3.2-1b passes
    (tests/test_auto_cost_bench.py runs the same code on the CPU with tiny random models: ``main(argv, target,
    draft)``; ``make_peaked`` needs an untied LM head, which no small named shape has)

1. ``measure_costs`` at the batch buckets up to --concurrency: per bucket B, the target pass, the draft step, the
   round's overhead (a whole ``Scheduler`` round less its passes) at k = 0, 1, K/2, K, and the k that the
   acceptance --alpha at every position picks with the passes alone (the formula before the overhead column) and
   with the overhead.
2. In process at saturation (``run_engine``: --num-prompts requests all at once, --concurrency rows, greedy,
   --max-tokens each), the model the server makes (``make_peaked`` + ``SuccessorOracle``): AR (the floor k=auto
   must not go below), K=2, K=4, k=auto over the measured table, k=auto over the same table with its overhead
   zeroed (a peer: the cost model before the column) and k=auto with unpriced probes (a peer: every hold ends in a
   probe, the draft debt ignored). One warm-up run each, then the median of --reps runs; how each k=auto explored
   (probes that drafted, holds renewed, the draft debt's measured / predicted, its measured rounds).

Writes DIR/auto_cost.md and DIR/cost_table.json; benchmarks/results/auto_cost.md only with --write.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import environment, environment_line, markdown_table  # noqa: E402
from verispec.bench.measure import run_engine  # noqa: E402
from verispec.drafters import SuccessorOracle, make_peaked  # noqa: E402
from verispec.engine.auto_k import AutoK, CostTable, best_k, default_batch_sizes, measure_costs  # noqa: E402
from verispec.runtime import load_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def without_overhead(table: CostTable) -> CostTable:
    """The same table with the overhead column zeroed: a round costs its passes alone."""
    return replace(table, overhead_s=None)


def table_rows(table: CostTable, k_max: int, alpha: float) -> list[list[str]]:
    ks = [t - 1 for t in table.tokens]
    old = without_overhead(table)
    rows = []
    for b in table.batch_sizes:
        rows.append([b, f"{1e3 * table.target(b, 1):.2f}", f"{1e3 * table.target(b, k_max + 1):.2f}",
                     f"{1e3 * table.draft(b):.3f}", " / ".join(f"{1e3 * table.overhead(b, k + 1):.2f}" for k in ks),
                     best_k([alpha] * k_max, k_max, old, b), best_k([alpha] * k_max, k_max, table, b)])
    return rows


def main(argv=None, target=None, draft=None) -> list[list[str]]:
    """Run it; ``target`` / ``draft`` replace the --model / --draft-cost models (tests: tiny ones)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="the target shape (random weights, made peaked)")
    p.add_argument("--draft-cost", default="llama-3.2-1b", help="the model whose passes the drafts pay ('none': no cost)")
    p.add_argument("--alpha", type=float, default=0.8, help="the oracle's acceptance per draft position")
    p.add_argument("--concurrency", type=int, default=32, help="scheduler rows (the largest bucket measured)")
    p.add_argument("--k-max", type=int, default=8, help="k=auto's largest k (the server's --k-max)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=64, help="prompt tokens")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--reps", type=int, default=3, help="timed runs per configuration (the median is reported)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/auto_cost")))
    p.add_argument("--write", action="store_true", help="also write benchmarks/results/auto_cost.md")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device (--device cpu runs on the CPU: slow for the default shapes)")
    if args.num_prompts < 1 or args.concurrency < 1 or args.reps < 1 or not 0 <= args.alpha <= 1:
        p.error("--num-prompts, --concurrency and --reps must be >= 1 and --alpha in [0, 1]")
    t_start = time.perf_counter()
    names = (args.model if target is None else "the caller's target", args.draft_cost if draft is None else
             "the caller's draft model")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = target or load_model(args.model, device=args.device, dtype=dtype, seed=0)
    if draft is None and args.draft_cost != "none":
        draft = load_model(args.draft_cost, device=args.device, dtype=dtype, seed=1)
    successor = make_peaked(target)

    def oracle():
        drafter = SuccessorOracle(successor, args.alpha, cost_model=draft)
        drafter.attach(target)
        return drafter

    t0 = time.perf_counter()
    table = measure_costs(target, oracle(), args.k_max, default_batch_sizes(args.concurrency))
    measure_s = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost_table.json").write_text(table.to_json())

    rng = random.Random(0)
    vocab = target.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    configs = [("AR", 0, None), ("K=2", 2, None), ("K=4", 4, None),
               ("k=auto", args.k_max, lambda: AutoK(table, reference_batch=args.concurrency)),
               ("k=auto, passes only", args.k_max,
                lambda: AutoK(without_overhead(table), reference_batch=args.concurrency)),
               ("k=auto, unpriced probes", args.k_max,
                lambda: AutoK(table, reference_batch=args.concurrency, price_probes=False))]
    engine_rows, reference, explored = [], None, []
    for name, k, policy in configs:
        runs = []
        for _ in range(args.reps + 1):        # the first run is the warm-up (graph captures, kernel compiles)
            chooser = policy() if policy else None
            runs.append(run_engine(target, oracle() if k else None, prompts, k=k, max_new_tokens=args.max_tokens,
                                   k_policy=chooser, arrivals=[0.0] * len(prompts), max_batch=args.concurrency,
                                   warm_up=args.device != "cpu"))
        if chooser is not None:               # the last run's policy: how it explored
            explored.append(f"- {name}: greedy probes that drafted {chooser.probes}, holds renewed "
                            f"{chooser.probes_declined}; "
                            f"draft debt measured / predicted {chooser.debt_scale:.2f}; rounds measured vs table: "
                            + "; ".join(f"B<={table.batch_sizes[b]} k={kk}: {1e3 * sec:.2f} ms (table "
                                        f"{1e3 * table.round(table.batch_sizes[b], kk):.2f})"
                                        for (b, kk), sec in sorted(chooser.measured_s.items())))
        timed = runs[1:]
        tps = statistics.median(r.tokens_per_s for r in timed)
        request_rounds = sum(s.rounds for r in timed for s in r.stats)
        mean_k = sum(r.proposed for r in timed) / request_rounds if request_rounds else 0.0
        reference = reference or runs[0].outputs            # AR's: greedy speculation must emit the same tokens
        identical = all(r.outputs == reference for r in runs)
        engine_rows.append([name, f"{tps:.0f}", f"{min(r.tokens_per_s for r in timed):.0f}",
                            f"{max(r.tokens_per_s for r in timed):.0f}", f"{mean_k:.2f}",
                            "yes" if identical else "NO"])
        print(name, f"{tps:.0f} tok/s, mean k {mean_k:.2f}, AR's tokens: {identical}", flush=True)
    ar = float(engine_rows[0][1])
    for row in engine_rows:
        row.append(f"{float(row[1]) / ar:.2f}x")

    command = "python benchmarks/auto_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ks = " / ".join(str(t - 1) for t in table.tokens)
    lines = ["# k=auto's cost of a round: the overhead column, and k=auto with and without it", "",
             environment_line(environment()), "",
             f"Command: `{command}` ({time.perf_counter() - t_start:.0f} s in all; the cost table took "
             f"{measure_s:.1f} s).", "",
             f"Target {names[0]} (random weights made peaked: the text is meaningless, the cost is the model's), "
             f"SuccessorOracle drafts accepted with probability {args.alpha} each, paying "
             f"{names[1]} draft passes; greedy.", "",
             "## The cost table (`measure_costs`)", "",
             f"Per batch bucket: the target pass of 1 and K+1 = {args.k_max + 1} tokens per row, one draft step, and "
             f"the overhead of a whole round at k = {ks} (a `Scheduler.step` round with every row's k forced, less "
             f"its passes; the best of 3, never below 0); then the k chosen at acceptance {args.alpha} at every "
             "position from the passes alone (the formula before the overhead column) and with the overhead.", "",
             *markdown_table(["B", "target 1 tok ms", f"target {args.k_max + 1} tok ms", "draft step ms",
                              f"overhead ms at k = {ks}", "k (passes only)", "k (with overhead)"],
                             table_rows(table, args.k_max, args.alpha)), "",
             f"## In process at saturation ({args.num_prompts} requests all at once, {args.concurrency} rows, "
             f"{args.input_len} prompt tokens, {args.max_tokens} new tokens each)", "",
             f"`run_engine`; every graph its rounds can replay captured before each run (`Scheduler.warm_up`, as the "
             f"server does) and one warm-up run per configuration, then {args.reps} timed (median, min, max). AR is "
             "the floor k=auto must not go below; \"k=auto, passes only\" is a peer: the same measured table with "
             "its overhead column zeroed, i.e. the cost model before it; \"k=auto, unpriced probes\" the other: "
             "the greedy rows probe at every hold's end and the draft debt is not priced (`AutoK(price_probes=False)`)."
             " mean k: drafts per request per round; AR's tokens: every run emitted plain greedy decoding's tokens.",
             "", *markdown_table(["configuration", "tok/s (median)", "min", "max", "mean k", "AR's tokens", "vs AR"],
                                 engine_rows), "",
             "How k=auto explored (its last run):", "", *explored, ""]
    text = "\n".join(lines)
    (args.out / "auto_cost.md").write_text(text)
    if args.write:
        (RESULTS / "auto_cost.md").write_text(text)
    print(text)
    return engine_rows


if __name__ == "__main__":
    main()
