"""``speedup``: AR vs SD tokens/s over alpha and K, beside the analytical model fed with measured step times.

Points: AR once, then SD at every K (oracle drafts: at every alpha too), then k="auto" (when the engine has
a k policy) with the largest K as its cap. Every SD row carries, from ``verispec.analysis``:
    e_sd            E(K) = 1 + alpha_0 + alpha_0 alpha_1 + ... at the measured per-position acceptance
                    alpha_i = accepted / tested at draft position i   (``analysis.expected_tokens_from_positions``)
    predicted       E(K) / (1 + K * T_draft / T_target)
    predicted_pass  E(K) * T_target / (K * T_draft + T_verify)
with T_draft one draft step, T_verify the target pass over K + 1 tokens and T_target one AR step, all
measured in this run (``analysis.speedup`` / ``speedup_from_times`` with E(K) for E_SD). ``alpha_measured``
is accepted / tested over every position (not accepted / proposed: the drafts after a rejection were never
tested). The first assumes a verify pass costs one decode step; the second uses the measured
pass. Neither counts the per-round host work (verification, commit), which the measured speedup pays.
"""
from __future__ import annotations

from ... import analysis
from .shared import ar_runs, auto_runs, has_auto_policy, phase_ms, sd_runs

STUDY = "speedup"


def points(bench) -> list[dict]:
    o = bench.options
    alphas = list(o.alphas) if bench.uses_oracle else [None]
    pts = [{"method": "ar"}]
    pts += [{"method": "sd", "alpha": a, "k": k} for a in alphas for k in o.ks]
    if has_auto_policy(bench):
        pts += [{"method": "auto", "alpha": a, "k": max(o.ks)} for a in alphas]
    return pts


def sd_row(ar_phase, ar_fast, phase, fast, k: int) -> dict:
    """One SD (or auto) row: measured throughput and step times, and the analytical predictions."""
    t_target = ar_phase.per_round("target")
    t_verify = phase.per_round("target")
    t_draft = phase.per_round("draft") / k
    alphas = phase.position_alphas(k)
    e = analysis.expected_tokens_from_positions(alphas)
    c = t_draft / t_target
    return {"tokens_per_s": fast.tokens_per_s, "ar_tokens_per_s": ar_fast.tokens_per_s,
            "speedup": fast.tokens_per_s / ar_fast.tokens_per_s, "alpha_measured": phase.alpha,
            "alpha_per_position": alphas,
            "tokens_per_round": phase.decode_tokens / phase.rounds / phase.batch if phase.rounds else 0.0,
            "t_target_ms": 1e3 * t_target, "t_verify_ms": 1e3 * t_verify, "t_draft_ms": 1e3 * t_draft,
            "cost_ratio": c, "e_sd": e, "predicted": e / (1 + k * c),
            "predicted_pass": e * t_target / (k * t_draft + t_verify),
            "mean_k": phase.proposed / (phase.rounds * phase.batch) if phase.rounds else 0.0,
            **phase_ms(phase)}


def measure(bench, point: dict) -> list[dict]:
    batch = bench.options.batches[0]
    ar_phase, ar_fast = ar_runs(bench, batch)
    if point["method"] == "ar":
        return [{"batch": batch, "tokens_per_s": ar_fast.tokens_per_s, "t_target_ms": 1e3 * ar_phase.per_round("target"),
                 **phase_ms(ar_phase)}]
    if point["method"] == "sd":
        phase, fast = sd_runs(bench, batch, point["k"], point["alpha"])
    else:
        runs = auto_runs(bench, batch, point["k"], point["alpha"])
        if runs is None:
            return []
        phase, fast = runs
    return [{"batch": batch, **sd_row(ar_phase, ar_fast, phase, fast, point["k"])}]


def recommendations(rows: list[dict], k_max: int) -> list[dict]:
    """Per alpha group: the measured alpha and cost ratio (means over its SD rows), ``analysis.optimal_k``
    for them, and the best measured fixed K."""
    groups: dict = {}
    for r in rows:
        if r["point"]["method"] == "sd":
            groups.setdefault(r["point"]["alpha"], []).append(r)
    out = []
    for alpha, rs in groups.items():
        a = sum(r["alpha_measured"] for r in rs) / len(rs)
        c = sum(r["cost_ratio"] for r in rs) / len(rs)
        best = max(rs, key=lambda r: r["speedup"])
        auto = [r for r in rows if r["point"]["method"] == "auto" and r["point"]["alpha"] == alpha]
        out.append({"alpha": alpha, "alpha_measured": a, "cost_ratio": c,
                    "optimal_k": analysis.optimal_k(a, c, k_max=k_max),
                    "optimal_speedup": analysis.speedup(a, analysis.optimal_k(a, c, k_max=k_max), c),
                    "best_k": best["point"]["k"], "best_speedup": best["speedup"],
                    "auto_speedup": auto[0]["speedup"] if auto else None})
    return out
