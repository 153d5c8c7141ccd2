"""``batch``: throughput vs per-sequence latency (the Pareto front) for AR and SD across batch sizes and
request arrival rates, and what k="auto" does there.

Static points: B prompts submitted at once, for every swept B: AR, SD at the fixed K (``shared.sd_k``) and
k="auto" capped at the largest K (when the engine has a k policy). Arrival points: 2 x the largest B requests
arrive as a Poisson process at each rate (requests/s, seeded) into a scheduler of the largest B rows; a
request's latency runs from its arrival to its last token, so queueing counts. Throughput = tokens/s over
all sequences; latency = the median request's milliseconds per generated token.
"""
from __future__ import annotations


from ..measure import poisson_arrivals, run_engine
from .shared import ar_runs, auto_runs, drafter_factory, has_auto_policy, mid_alpha, sd_k, sd_runs

STUDY = "batch"


def points(bench) -> list[dict]:
    o = bench.options
    methods = ["ar", "sd"] + (["auto"] if has_auto_policy(bench) else [])
    pts = [{"mode": "static", "method": m, "batch": b} for b in o.batches for m in methods]
    pts += [{"mode": "arrivals", "method": m, "rate": r} for r in o.rates for m in ("ar", "sd")]
    return pts


def _row(run, k) -> dict:
    return {"k": k, "tokens_per_s": run.tokens_per_s, "ms_per_token": run.ms_per_token,
            "alpha_measured": run.alpha, "mean_k": run.proposed / run.rounds / run.batch if run.rounds else 0.0}


def measure(bench, point: dict) -> list[dict]:
    o = bench.options
    alpha, k = mid_alpha(o), sd_k(o)
    if point["mode"] == "static":
        b = point["batch"]
        if point["method"] == "ar":
            return [{"batch": b, **_row(ar_runs(bench, b)[1], 0)}]
        if point["method"] == "sd":
            return [{"batch": b, **_row(sd_runs(bench, b, k, alpha)[1], k)}]
        runs = auto_runs(bench, b, max(o.ks), alpha)
        return [] if runs is None else [{"batch": b, **_row(runs[1], max(o.ks))}]
    rows = max(o.batches)
    n = 2 * rows
    prompts = bench.prompts(n)
    arrivals = poisson_arrivals(n, point["rate"], o.seed)
    make = (lambda: None) if point["method"] == "ar" else drafter_factory(bench, n, alpha)
    kk = 0 if point["method"] == "ar" else k
    if bench.device_type == "cuda":   # warm-up: CUDA graphs for every batch bucket the arrivals meet
        run_engine(bench.target, make(), prompts, k=kk, max_new_tokens=o.max_new_tokens, arrivals=arrivals,
                   max_batch=rows)
    run = run_engine(bench.target, make(), prompts, k=kk, max_new_tokens=o.max_new_tokens, arrivals=arrivals,
                     max_batch=rows)
    return [{"batch": rows, "requests": n, **_row(run, kk)}]
