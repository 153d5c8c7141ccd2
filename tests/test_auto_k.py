"""k=auto (verispec/engine/auto_k.py): fed synthetic costs and acceptance, it picks the k that the analytical
model says is best, and 0 when the cost model says speculation loses."""
from __future__ import annotations

import pytest

from verispec.analysis import expected_tokens_per_round
from verispec.engine import Request, Sequence, Stats
from verispec.engine.auto_k import AutoK, CostTable, best_k

TOKENS = tuple(range(1, 10))      # passes of 1..9 tokens per row (k_max = 8)


def table(target_of, draft_of, batch_sizes=(1, 2, 4, 8, 16, 32)) -> CostTable:
    """A synthetic table: target_of(B, t) seconds per target pass, draft_of(B) per draft step."""
    return CostTable(batch_sizes, TOKENS, tuple(tuple(target_of(b, t) for t in TOKENS) for b in batch_sizes),
                     tuple(draft_of(b) for b in batch_sizes))


def brute_force(alphas, k_max, target_of, draft_of):
    B = len(alphas)
    rates = [sum(expected_tokens_per_round(a, k) for a in alphas) / (target_of(B, k + 1) + k * draft_of(B))
             for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (rates[k], -k))


# a bandwidth-bound target (a pass costs about the same for a few tokens) and a compute-bound one
BANDWIDTH = (lambda b, t: 0.020 + 0.0002 * b * t, lambda b: 0.002)
COMPUTE = (lambda b, t: 0.001 * b * t, lambda b: 0.0002 * b)


@pytest.mark.parametrize("costs", [BANDWIDTH, COMPUTE], ids=["bandwidth", "compute"])
@pytest.mark.parametrize("alphas", [[0.9], [0.5], [0.8, 0.3], [0.95, 0.9, 0.7, 0.1], [0.6] * 8, [0.99] * 32])
@pytest.mark.parametrize("k_max", [1, 4, 8])
def test_best_k_is_the_analytical_optimum(costs, alphas, k_max):
    assert best_k(alphas, k_max, table(*costs)) == brute_force(alphas, k_max, *costs)


def test_speculation_that_loses_picks_zero():
    # every extra token scored costs as much as a whole step: no acceptance rate < 1 pays for drafts
    target_of, draft_of = (lambda b, t: 0.01 * t), (lambda b: 0.001)
    assert best_k([0.9] * 4, 8, table(target_of, draft_of)) == 0
    # at high batch the pass is compute bound: k=0 there, k>0 at batch 1 with the same acceptance
    costs = table(*COMPUTE)
    high = best_k([0.7] * 32, 8, costs)
    assert high == 0 == brute_force([0.7] * 32, 8, *COMPUTE)
    bw = table(*BANDWIDTH)
    assert best_k([0.7], 8, bw) > 0


def test_higher_acceptance_never_lowers_k():
    costs = table(*BANDWIDTH)
    ks = [best_k([a] * 4, 8, costs) for a in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)]
    assert ks == sorted(ks) and ks[0] < ks[-1]


def test_cost_table_lookup_and_checks():
    t = CostTable((1, 4), (1, 3), ((1.0, 3.0), (2.0, 6.0)), (0.1, 0.4))
    assert t.target(1, 2) == pytest.approx(2.0)          # interpolated
    assert t.target(3, 1) == 2.0                          # the next larger bucket
    assert t.target(64, 5) == pytest.approx(10.0)        # beyond both ends
    assert t.round(4, 2) == pytest.approx(6.0 + 2 * 0.4)
    assert CostTable.from_json(t.to_json()) == t
    with pytest.raises(ValueError):
        CostTable((4, 1), (1,), ((1.0,), (1.0,)), (0.0, 0.0))
    with pytest.raises(ValueError):
        CostTable((1,), (2,), ((1.0,),), (0.0,))
    with pytest.raises(ValueError):
        CostTable((1,), (1,), ((0.0,),), (0.0,))


def _seq(rid: int) -> Sequence:
    return Sequence(Request([1, 2], id=rid), Stats())


def test_acceptance_estimate_counts_tested_positions():
    policy = AutoK(table(*BANDWIDTH), prior_alpha=0.5, prior_strength=2.0)
    seq = _seq(10**6)
    assert policy.alpha(seq) == pytest.approx(0.5)
    rounds = [(4, 4), (4, 1), (4, 0), (2, 2)]       # (proposed, accepted)
    for n, a in rounds:
        seq.stats.add_round(n, a)
        policy([seq], 8)
    accepted = sum(a for _, a in rounds)
    tested = sum(a + (a < n) for n, a in rounds)
    assert policy.alpha(seq) == pytest.approx((accepted + 1.0) / (tested + 2.0))
    assert policy.last_k == best_k([policy.alpha(seq)], 8, policy.costs)


def test_policy_forgets_finished_requests_and_picks_one_k():
    policy = AutoK(table(*BANDWIDTH))
    seqs = [_seq(2 * 10**6 + i) for i in range(3)]
    ks = policy(seqs, 6)
    assert len(set(ks)) == 1 and len(ks) == 3
    policy(seqs[:1], 6)
    assert set(policy._seen) == {seqs[0].request.id}


@pytest.mark.parametrize("prior", [dict(prior_alpha=1.5), dict(prior_alpha=-0.1), dict(prior_strength=0.0)])
def test_bad_priors_are_refused(prior):
    with pytest.raises(ValueError):
        AutoK(table(*BANDWIDTH), **prior)
