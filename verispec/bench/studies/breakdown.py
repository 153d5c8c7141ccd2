"""``breakdown``: where the time of one round goes, per method, as stacked bars.

AR: the target pass over one token per row, verification (the argmax) and commit. SD at every K: K draft
steps, the target pass over K + 1 tokens per row, verification and commit, measured with ``timing=True``.
SSD (simulated, ``verispec.distributed.simulator``): the draft on a second device pre-speculates while the
target verifies, so a round costs max(target pass, pre-speculation) + the two messages; the pass times fed
to the simulator are the ones measured here (see the ``ssd`` study for its other inputs).
"""
from __future__ import annotations

from ...distributed import simulator as sim
from .shared import ar_runs, mid_alpha, phase_ms, sd_runs

STUDY = "breakdown"
LINK_LATENCY_S = 20e-6      # one message between two GPUs of one host (NVLink, small payload)
SSD_FANOUT = 2              # pre-speculated candidates per position


def points(bench) -> list[dict]:
    ks = bench.options.ks
    return [{"method": "ar"}] + [{"method": "sd", "k": k} for k in ks] + [{"method": "ssd", "k": k} for k in ks]


def ssd_config(ar_phase, sd_phase, k: int, batch: int) -> sim.SimConfig:
    """A simulator config whose pass times are the measured ones: the target pass at B and B (K + 1) tokens,
    a draft step at B tokens (pre-speculation runs B x branches tokens per step, interpolated)."""
    target = sim.PassTime(tuple(sorted({(batch, ar_phase.per_round("target")),
                                        (batch * (k + 1), sd_phase.per_round("target"))})))
    draft = sim.PassTime.constant(sd_phase.per_round("draft") / k)
    return sim.SimConfig(target=target, draft=draft, alpha=sd_phase.alpha, k=k, batch_size=batch,
                         fanout=SSD_FANOUT, link_latency_s=LINK_LATENCY_S)


def measure(bench, point: dict) -> list[dict]:
    batch, alpha = bench.options.batches[0], mid_alpha(bench.options)
    ar_phase, _ = ar_runs(bench, batch)
    if point["method"] == "ar":
        per = phase_ms(ar_phase)
        return [{"batch": batch, **per, "round_ms": sum(per.values()), "tokens_per_round": 1.0}]
    phase, _ = sd_runs(bench, batch, point["k"], alpha)
    if point["method"] == "sd":
        per = phase_ms(phase)
        return [{"batch": batch, **per, "round_ms": sum(per.values()), "alpha_measured": phase.alpha,
                 "tokens_per_round": phase.decode_tokens / phase.rounds / batch}]
    pred = sim.predict(ssd_config(ar_phase, phase, point["k"], batch), "ssd")
    return [{"batch": batch, "target_ms": 1e3 * pred["target_busy_s"], "link_ms": 1e3 * pred["link_s"],
             "waiting_ms": 1e3 * pred["target_waiting_s"], "round_ms": 1e3 * pred["round_s"],
             "prespec_ms": 1e3 * pred["draft_busy_s"], "hit_rate": pred["hit_rate"],
             "alpha_measured": phase.alpha, "tokens_per_round": pred["tokens_per_round"] / batch}]
