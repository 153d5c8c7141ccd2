"""``ssd``: the SSD simulator's sweeps (hit rate, fan-out, alpha x K) on this pair's measured pass times,
beside the measured AR and SD points.

The simulator (``verispec.distributed.simulator``) takes the target's pass time as a function of the tokens
it scores, measured here at B x 1 and B x (K + 1) tokens for every swept K (B = the first batch size), and
one draft step (measured inside the engine's rounds). The draft runs on a second device; messages cost
``breakdown.LINK_LATENCY_S``. The measured points are this run's AR and SD throughput at the same B and K
(colocated SD; SSD itself needs two devices and is not measured here).
"""
from __future__ import annotations

from dataclasses import replace

from ...distributed import simulator as sim
from .breakdown import LINK_LATENCY_S, SSD_FANOUT
from .shared import ar_runs, mid_alpha, sd_k, sd_runs

STUDY = "ssd"
HIT_RATES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
FANOUTS = (0, 1, 2, 3, 4, 6, 8)
ALPHAS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def points(bench) -> list[dict]:
    return [{"sweep": s} for s in ("measured", "hit_rate", "fanout", "alpha_k")]


def base_config(bench) -> sim.SimConfig:
    """The measured regime: target pass times at every swept K, the draft step, the measured alpha at sd_k."""
    o = bench.options
    batch, alpha, k = o.batches[0], mid_alpha(o), sd_k(o)
    ar_phase, _ = ar_runs(bench, batch)
    pts = {batch: ar_phase.per_round("target")}
    drafts = []
    for kk in o.ks:
        phase, _ = sd_runs(bench, batch, kk, alpha)
        pts[batch * (kk + 1)] = phase.per_round("target")
        drafts.append(phase.per_round("draft") / kk)
    phase, _ = sd_runs(bench, batch, k, alpha)
    return sim.SimConfig(target=sim.PassTime(tuple(pts.items())), draft=sim.PassTime.constant(min(drafts)),
                         alpha=phase.alpha, k=k, batch_size=batch, fanout=SSD_FANOUT, link_latency_s=LINK_LATENCY_S)


def _rows(rows: list[dict], **extra) -> list[dict]:
    keep = ("method", "tokens_per_s", "speedup_vs_ar", "hit_rate", "round_s", "tokens_per_round")
    return [{**{key: r.get(key) for key in keep}, **extra} for r in rows]


def measure(bench, point: dict) -> list[dict]:
    o = bench.options
    cfg = base_config(bench)
    sweep = point["sweep"]
    if sweep == "measured":
        batch, k = o.batches[0], sd_k(o)
        ar = ar_runs(bench, batch)[1]
        sd = sd_runs(bench, batch, k, mid_alpha(o))[1]
        pred = {r["method"]: r for r in sim.compare(cfg)}
        return [{"method": "ar", "tokens_per_s": ar.tokens_per_s, "predicted_tokens_per_s": pred["ar"]["tokens_per_s"],
                 "k": k, "alpha": cfg.alpha},
                {"method": "sd", "tokens_per_s": sd.tokens_per_s, "predicted_tokens_per_s": pred["sd"]["tokens_per_s"],
                 "k": k, "alpha": cfg.alpha},
                {"method": "ssd", "tokens_per_s": None, "predicted_tokens_per_s": pred["ssd"]["tokens_per_s"],
                 "k": k, "alpha": cfg.alpha, "hit_rate": pred["ssd"]["hit_rate"]}]
    if sweep == "hit_rate":
        return [row for h in HIT_RATES for row in _rows(sim.compare(replace(cfg, hit_rate=h)), value=h)]
    if sweep == "fanout":
        return [row for f in FANOUTS for row in _rows(sim.compare(replace(cfg, fanout=f)), value=f)]
    return [row for a in ALPHAS for k in o.ks
            for row in _rows(sim.compare(replace(cfg, alpha=a, k=k)), value=a, k=k)]
