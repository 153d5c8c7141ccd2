import math
from dataclasses import replace

import pytest

from verispec import analysis
from verispec.distributed import simulator as sim
from verispec.distributed.simulator import HostCost, PassTime, SimConfig, SSDCosts, TensorParallel

TARGET = PassTime(((1, 6.0e-3), (5, 6.3e-3), (9, 7.4e-3), (40, 8.0e-3)))
DRAFT = PassTime(((1, 1.2e-3), (8, 1.4e-3), (64, 2.0e-3)))


def row(cfg, method):
    return sim.predict(cfg, method)


@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.5, 2), (0.8, 4), (0.9, 6), (1.0, 5)])
def test_sd_tokens_per_round_is_e_sd(alpha, k):
    cfg = SimConfig(TARGET, DRAFT, alpha=alpha, k=k)
    assert row(cfg, "sd")["tokens_per_round"] == pytest.approx(analysis.expected_tokens_per_round(alpha, k))


@pytest.mark.parametrize("alpha,k,c", [(0.9, 4, 0.1725), (0.7, 3, 0.05), (0.6, 8, 0.3), (1.0, 2, 0.0)])
def test_sd_speedup_formula_with_constant_step_times(alpha, k, c):
    # a verify pass costs one target step, a draft step c of it: S = E_SD / (1 + K c)
    t = 7e-3
    cfg = SimConfig(PassTime.constant(t), PassTime.constant(c * t), alpha=alpha, k=k)
    rows = {r["method"]: r for r in sim.compare(cfg)}
    assert rows["sd"]["speedup_vs_ar"] == pytest.approx(analysis.speedup(alpha, k, c), rel=1e-12)
    assert rows["ar"]["tokens_per_s"] == pytest.approx(1 / t)


def test_sd_matches_speedup_from_times_with_measured_shapes():
    cfg = SimConfig(TARGET, DRAFT, alpha=0.8, k=4)
    rows = {r["method"]: r for r in sim.compare(cfg)}
    want = analysis.speedup_from_times(0.8, 4, DRAFT(1), TARGET(5), TARGET(1))
    assert rows["sd"]["speedup_vs_ar"] == pytest.approx(want, rel=1e-12)
    assert rows["sd"]["tokens_per_s"] == pytest.approx(analysis.tokens_per_second_bound(0.8, 4, DRAFT(1), TARGET(5)))


@pytest.mark.parametrize("batch,policy", [(1, "sequences"), (4, "sequences"), (4, "batch")])
def test_ssd_hit_rate_zero_is_sd_plus_fallback(batch, policy):
    L, fb = 20e-6, 50e-6
    base = SimConfig(TARGET, DRAFT, alpha=0.8, k=4, batch_size=batch, link_latency_s=L, fallback_s=fb,
                     miss_policy=policy)
    ssd = row(replace(base, fanout=0), "ssd")           # nothing pre-speculated: every round misses
    sd = row(base, "sd")
    assert ssd["hit_rate"] == 0.0
    # the spot draft runs K + 1 passes (the last ranks the next bonus outcomes), SD's K
    spot_extra = fb + DRAFT(batch)
    assert ssd["round_s"] == pytest.approx(sd["round_s"] + spot_extra, rel=1e-12)
    assert ssd["tokens_per_round"] == sd["tokens_per_round"]
    forced = row(replace(base, fanout=(1, 0, 0, 0, 0), hit_rate=0.0), "ssd")  # pre-speculating in vain: free
    assert forced["round_s"] == pytest.approx(sd["round_s"] + spot_extra, rel=1e-12)  # here: it fits in the pass


def test_ssd_hit_rate_one_hides_the_draft_when_it_fits():
    L = 20e-6
    cfg = SimConfig(TARGET, DRAFT, alpha=0.8, k=3, fanout=1, hit_rate=1.0, link_latency_s=L)
    r = row(cfg, "ssd")
    assert (cfg.k + 1) * DRAFT(cfg.branches) < TARGET(4)          # the pre-speculation fits in the pass
    assert r["round_s"] == pytest.approx(TARGET(4) + 2 * L, rel=1e-12)
    assert r["target_waiting_s"] == pytest.approx(0.0, abs=1e-15)
    sd = row(cfg, "sd")     # same tokens per round, a shorter round: the simulated SSD is the faster one
    assert r["tokens_per_round"] == pytest.approx(sd["tokens_per_round"], rel=1e-12)
    assert r["round_s"] < sd["round_s"]


def test_ssd_hit_rate_one_waits_for_a_pre_speculation_longer_than_the_pass():
    slow = PassTime.constant(3e-3)
    cfg = SimConfig(TARGET, slow, alpha=0.8, k=4, fanout=1, hit_rate=1.0, link_latency_s=0.0)
    r = row(cfg, "ssd")
    assert r["round_s"] == pytest.approx(5 * 3e-3, rel=1e-12)              # K + 1 passes of the branch rows
    assert r["target_waiting_s"] == pytest.approx(5 * 3e-3 - TARGET(5), rel=1e-9)
    host = replace(cfg, draft_host=HostCost(1e-3, 0.25e-3))      # its host work before them: 1 ms + 5 rows x 0.25
    assert row(host, "ssd")["round_s"] == pytest.approx(5 * 3e-3 + 2.25e-3, rel=1e-12)


def test_derived_hit_rate_closed_form():
    # uniform alpha and fan-out F: p_hit = 1 - (1 - alpha)^F whatever K
    for alpha, k, f in [(0.8, 4, 1), (0.6, 3, 2), (0.9, 6, 3)]:
        cfg = SimConfig(TARGET, DRAFT, alpha=alpha, k=k, fanout=f)
        assert sim.hit_rate(cfg) == pytest.approx(1 - (1 - alpha) ** f)
    # hand computed, K=1, alpha=0.5, fan-out (2, 0): P(j=0)=0.5 covered w.p. 0.75, j=1 never
    cfg = SimConfig(TARGET, DRAFT, alpha=0.5, k=1, fanout=(2, 0))
    assert sim.hit_rate(cfg) == pytest.approx(0.375)


def test_fanout_policies():
    alphas = (0.9,) * 4
    assert sim.fanout_for_budget(alphas, 7, "uniform") == (2, 2, 1, 1, 1)
    geo = sim.fanout_for_budget(alphas, 10, "geometric")
    assert sum(geo) == 10 and geo[-1] == max(geo)                # alpha^K = 0.66 holds most mass
    for budget in (3, 5, 8, 12):
        prof = sim.fanout_for_budget(alphas, budget, "profile")
        assert sum(prof) == budget
        best = sim.derived_hit_rate(alphas, prof, 0.9)
        for other in ("uniform", "geometric"):
            assert best >= sim.derived_hit_rate(alphas, sim.fanout_for_budget(alphas, budget, other), 0.9) - 1e-12
    with pytest.raises(ValueError, match="policy"):
        sim.fanout_for_budget(alphas, 3, "random")


def test_batch_miss_policy_costs_more_than_sequences():
    cfg = SimConfig(TARGET, PassTime(((1, 1e-3), (32, 4e-3))), alpha=0.8, k=4, batch_size=16, fanout=1,
                    link_latency_s=10e-6)
    seq = row(cfg, "ssd")
    whole = row(replace(cfg, miss_policy="batch"), "ssd")
    assert whole["round_s"] > seq["round_s"]
    assert seq["batch_hit_rate"] == pytest.approx(seq["hit_rate"] ** 16)


def test_monte_carlo_converges_to_prediction():
    cfg = SimConfig(TARGET, DRAFT, alpha=0.7, k=3, batch_size=2, fanout=1, link_latency_s=20e-6)
    rows = sim.simulate(cfg, "ssd", 4000, seed=1)
    tok_s = sum(r["tokens"] for r in rows) / sum(r["round_s"] for r in rows)
    assert tok_s == pytest.approx(row(cfg, "ssd")["tokens_per_s"], rel=0.03)


def test_tensor_parallel_pass():
    tp = TensorParallel(ranks=4, num_layers=80, hidden_size=8192, allreduce_latency_s=10e-6, bandwidth_bytes_s=1e12)
    compute, comm = tp.pass_s(PassTime.constant(20e-3), 1)
    assert compute == pytest.approx(5e-3)
    assert comm == pytest.approx(160 * (10e-6 + 1.5 * 8192 * 2 / 1e12))
    cfg = SimConfig(PassTime.constant(20e-3), DRAFT, tp=tp)
    ar = row(cfg, "ar")
    assert ar["round_s"] == pytest.approx(compute + comm)
    assert ar["allreduce_s"] == pytest.approx(comm)


def test_pass_time_interpolation_and_errors():
    assert TARGET(3) == pytest.approx(6.15e-3)
    assert TARGET(0.5) == TARGET(1)
    assert TARGET(50) == pytest.approx(8.0e-3 + 10 * 0.6e-3 / 31)
    with pytest.raises(ValueError, match="at least one"):
        PassTime(())
    with pytest.raises(ValueError, match="alpha"):
        SimConfig(TARGET, DRAFT, alpha=1.5)
    with pytest.raises(ValueError, match="K\\+1"):
        SimConfig(TARGET, DRAFT, k=2, fanout=(1, 1))
    with pytest.raises(ValueError, match="method"):
        sim.predict(SimConfig(TARGET, DRAFT), "tree")
    assert math.isclose(sim.expected_tokens((0.5, 0.5)), 1.75)


def test_host_cost_fit():
    fit = HostCost.fit([(2, 0.5e-3), (64, 1.5e-3)])
    assert fit.per_row_s == pytest.approx(1e-3 / 62) and fit.per_call_s == pytest.approx(0.5e-3 - 2e-3 / 62)
    assert fit(0) == 0.0 and fit(64) == pytest.approx(1.5e-3)
    assert HostCost.fit([(8, 2e-3), (64, 1e-3)]) == HostCost(1.5e-3, 0.0)       # a falling fit: the mean
    with pytest.raises(ValueError, match="at least one"):
        HostCost.fit([])
    with pytest.raises(ValueError, match=">= 0"):
        HostCost(-1.0)


def costs(draft_row_s: float, host_row_s: float = 0.0) -> SSDCosts:
    """Target 6-7.4 ms per [B, n] pass; a draft pass of 1 ms plus ``draft_row_s`` per row."""
    per_row = PassTime(((1, 6.0e-3), (5, 6.3e-3), (9, 7.4e-3)))
    return SSDCosts(((1, per_row), (8, per_row)), PassTime(((1, 1e-3 + draft_row_s), (256, 1e-3 + 256 * draft_row_s))),
                    HostCost(0.0, host_row_s), link_latency_s=20e-6)


def test_best_budget_free_rows_take_the_max_dear_rows_none():
    alphas = (0.6, 0.6, 0.6)
    # pre-speculation of 4 passes x 1 ms fits in the target's pass whatever the rows: every branch is a free hit
    assert sim.best_budget(costs(0.0), 8, alphas, 6) == 6
    # 4 passes of 8 F rows x 1 ms: even F = 1 runs past the target pass by more than the hits save
    assert sim.best_budget(costs(1e-3), 8, alphas, 6) == 0
    assert sim.best_budget(costs(0.0, host_row_s=1e-3), 8, alphas, 6) == 0   # so do dear host rows
    assert sim.best_budget(costs(1e-3), 8, alphas, 0) == 0
    with pytest.raises(ValueError, match="max_budget"):
        sim.best_budget(costs(0.0), 1, alphas, -1)


def test_best_budget_follows_the_acceptance():
    # rows cost a little (0.02 ms each): at alpha = 0.9 a branch is likelier to hit (beta = alpha) and a round
    # carries more tokens than at 0.5, so more branches pay for their rows
    table = costs(0.02e-3)
    high = sim.best_budget(table, 8, (0.9,) * 3, 8)
    low = sim.best_budget(table, 8, (0.5,) * 3, 8)
    assert 0 < low < high < 8
    for alphas, f in (((0.9,) * 3, high), ((0.5,) * 3, low)):      # the argmax of the model, checked directly
        rates = [sim.predict(table.sim_config(8, alphas, sim.fanout_for_budget(alphas, b)), "ssd")["tokens_per_s"]
                 for b in range(9)]
        assert rates[f] == max(rates)


def test_ssd_costs_from_the_results_json():
    calibration = {"target": {"1": {"1": 5e-3, "5": 6e-3}, "8": {"1": 6e-3, "5": 7e-3}},
                   "draft": {"1": 1e-3, "64": 2e-3}}
    measured = {"per_round": [{"rows": 2, "host_before_loop_ms": [0.5, 0.5]},
                              {"rows": 64, "host_before_loop_ms": [1.5, 1.5]}]}
    table = SSDCosts.from_results(calibration, measured, link_latency_s=1e-5)
    assert table.draft_host.per_row_s == pytest.approx(1e-3 / 62)
    assert table.target(8)(40) == pytest.approx(7e-3) and table.target(4)(20) == pytest.approx(7e-3)  # bucket 8
    assert table.target(1)(5) == pytest.approx(6e-3) and table.target(32)(160) == pytest.approx(7e-3)
    assert SSDCosts.from_results(calibration).draft_host == HostCost()
    with pytest.raises(ValueError, match="'draft'"):
        SSDCosts.from_results({"target": {}})
    with pytest.raises(ValueError, match="ascending"):
        SSDCosts((), table.draft)


def test_best_budget_follows_the_measured_rank_accept():
    # beta: how often the next candidate is the round's token. At a low beta each branch buys little hit rate
    table = costs(0.02e-3)
    alphas = (0.9,) * 3
    assert sim.best_budget(table, 8, alphas, 8, rank_accept=0.05) < sim.best_budget(table, 8, alphas, 8)
