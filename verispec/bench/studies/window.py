"""``window``: how many draft steps fit inside one target pass, per K (the T_SD table for this pair).

T_SD = K * T_draft / T_target, the drafting time of a round in units of one target step (T_draft: one draft
step, T_target: one autoregressive target step, both measured). ``steps_per_pass`` = T_verify(K) / T_draft:
the draft steps that fit in the time of the round's own target pass. ``e_sd`` and ``predicted`` come from
``verispec.analysis`` at the measured per-position acceptance (E(K) = 1 + alpha_0 + alpha_0 alpha_1 + ..., with
alpha_i = accepted / tested at position i, and E(K) / (1 + T_SD)).
"""
from __future__ import annotations

from ... import analysis
from .shared import ar_runs, mid_alpha, sd_runs

STUDY = "window"


def points(bench) -> list[dict]:
    return [{"k": k} for k in bench.options.ks]


def measure(bench, point: dict) -> list[dict]:
    batch, alpha, k = bench.options.batches[0], mid_alpha(bench.options), point["k"]
    ar_phase, _ = ar_runs(bench, batch)
    phase, _ = sd_runs(bench, batch, k, alpha)
    t_target = ar_phase.per_round("target")
    t_draft = phase.per_round("draft") / k
    t_verify = phase.per_round("target")
    alphas = phase.position_alphas(k)
    e = analysis.expected_tokens_from_positions(alphas)
    return [{"batch": batch, "t_target_ms": 1e3 * t_target, "t_draft_ms": 1e3 * t_draft,
             "t_verify_ms": 1e3 * t_verify, "t_sd": k * t_draft / t_target,
             "steps_per_pass": t_verify / t_draft if t_draft > 0 else float("inf"), "alpha_measured": phase.alpha,
             "alpha_per_position": alphas, "e_sd": e, "predicted": e / (1 + k * t_draft / t_target)}]
