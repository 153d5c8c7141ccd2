"""k=auto (verispec/engine/auto_k.py), fed synthetic cost tables and scripted acceptance: each row's k is the
analytical optimum for its own per-position acceptance estimate (never below plain decoding's predicted rate),
depends on nothing but that row (for sampled rows), follows acceptance down and back up within the documented
number of rounds, and explores at a bounded cost where drafting does not pay."""
from __future__ import annotations

import json
import math
import random
import time

import pytest
from hypothesis import given, settings, strategies as st

from fakes import FakeModel, greedy_reference
from test_engine import noisy_copy
from verispec.analysis import expected_tokens_from_positions, expected_tokens_per_round
from verispec.drafters import DraftModel
from verispec.engine import Request, Scheduler, SchedulerConfig, Sequence, Stats
from verispec.engine.auto_k import AutoK, CostTable, RowState, best_k, measure_costs

TOKENS = tuple(range(1, 10))      # passes of 1..9 tokens per row (k_max = 8)
K = 8


def table(target_of, draft_of, batch_sizes=(1, 2, 4, 8, 16, 32), overhead_of=None) -> CostTable:
    """A synthetic table: target_of(B, t) seconds per target pass, draft_of(B) per draft step, overhead_of(B, t)
    per round of t - 1 drafts beyond its passes (None: no overhead column, as in tables saved before it)."""
    overhead = None if overhead_of is None else tuple(tuple(overhead_of(b, t) for t in TOKENS) for b in batch_sizes)
    return CostTable(batch_sizes, TOKENS, tuple(tuple(target_of(b, t) for t in TOKENS) for b in batch_sizes),
                     tuple(draft_of(b) for b in batch_sizes), overhead)


def brute_force(alphas, k_max, batch, target_of, draft_of):
    rates = [expected_tokens_from_positions(alphas[:k]) / (target_of(batch, k + 1) + k * draft_of(batch))
             for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (rates[k], -k))


# a bandwidth-bound target (a pass costs about the same for a few tokens) and a compute-bound one
BANDWIDTH = (lambda b, t: 0.020 + 0.0002 * b * t, lambda b: 0.002)
COMPUTE = (lambda b, t: 0.001 * b * t, lambda b: 0.0002 * b)
# drafting pays only above ~25% acceptance: break-even of one draft = (0.0201 + 0.005) / 0.02 - 1
COSTLY = (lambda b, t: 0.020 + 0.0001 * t, lambda b: 0.005)
# the load decides: one row drafts from ~31% acceptance (K at 0.9), 32 rows only above ~92% (none at 0.9)
LOADED = (lambda b, t: 0.01 + 0.003 * b * t, lambda b: 0.001)


@pytest.mark.parametrize("costs", [BANDWIDTH, COMPUTE], ids=["bandwidth", "compute"])
@pytest.mark.parametrize("alphas", [[0.9] * K, [0.5] * K, [0.8, 0.3] * 4, [0.95, 0.9, 0.7, 0.1, 0.9, 0.9, 0.9, 0.9],
                                    [0.2, 0.99, 0.99, 0.99, 0.99, 0.99, 0.99, 0.99]])
@pytest.mark.parametrize("k_max,batch", [(1, 1), (4, 8), (8, 1), (8, 32)])
def test_best_k_is_the_analytical_optimum(costs, alphas, k_max, batch):
    assert best_k(alphas, k_max, table(*costs), batch) == brute_force(alphas, k_max, batch, *costs)


@settings(max_examples=60, deadline=None)
@given(alphas=st.lists(st.floats(0, 1), min_size=K, max_size=K), batch=st.integers(1, 40),
       base=st.floats(1e-4, 1.0), slope=st.floats(0, 1.0), draft=st.floats(0, 1.0))
def test_no_choice_is_predicted_slower_than_plain_decoding(alphas, batch, base, slope, draft):
    costs = table(lambda b, t: base * (1 + slope * b * (t - 1)), lambda b: draft * base)
    k = best_k(alphas, K, costs, batch)
    rate = expected_tokens_from_positions(alphas[:k]) / costs.round(batch, k)
    assert rate >= 1.0 / costs.round(batch, 0)


def test_speculation_that_loses_picks_zero():
    # every extra token scored costs as much as a whole step: no acceptance rate < 1 pays for drafts
    target_of, draft_of = (lambda b, t: 0.01 * t), (lambda b: 0.001)
    assert best_k([0.9] * K, K, table(target_of, draft_of), 4) == 0
    # at high batch the pass is compute bound: k=0 there, k>0 at batch 1 with the same acceptance
    assert best_k([0.7] * K, K, table(*COMPUTE), 32) == 0
    assert best_k([0.7] * K, K, table(*BANDWIDTH), 1) > 0


def test_higher_acceptance_never_lowers_k():
    costs = table(*BANDWIDTH)
    ks = [best_k([a] * K, K, costs, 4) for a in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)]
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
    with pytest.raises(ValueError, match="overhead_s must be"):
        CostTable((1,), (1, 2), ((1.0, 2.0),), (0.0,), ((0.0,),))
    with pytest.raises(ValueError, match="finite and >= 0"):
        CostTable((1,), (1,), ((1.0,),), (0.0,), ((-0.1,),))


def test_the_overhead_column_is_part_of_a_rounds_cost_and_survives_json():
    t = CostTable((1, 4), (1, 3), ((1.0, 3.0), (2.0, 6.0)), (0.1, 0.4), ((0.5, 1.5), (1.0, 2.0)))
    assert t.overhead(1, 2) == pytest.approx(1.0)         # interpolated like the target's passes
    assert t.round(4, 2) == pytest.approx(6.0 + 2 * 0.4 + 2.0)
    assert t.round(1, 0) == pytest.approx(1.0 + 0.5)     # a plain decode round pays its share too
    assert CostTable.from_json(t.to_json()) == t
    # a table saved before the column: it loads, with no overhead, and costs a round as its passes
    old = {k: v for k, v in json.loads(t.to_json()).items() if k != "overhead_s"}
    loaded = CostTable.from_json(json.dumps(old))
    assert loaded.overhead_s == ((0.0, 0.0), (0.0, 0.0))
    assert loaded.round(4, 2) == pytest.approx(6.0 + 2 * 0.4)


def test_an_overhead_that_makes_drafting_lose_at_32_rows_picks_zero_there():
    """A round with drafts pays 3 ms per row beyond its passes (verification, the drafter's and the scheduler's
    host work): at 32 rows no k pays any more, while the passes alone (the formula before the column) say draft.
    At one row the same overhead is small and drafting still pays."""
    passes = dict(target_of=BANDWIDTH[0], draft_of=BANDWIDTH[1])
    overhead = table(**passes, overhead_of=lambda b, t: 0.0 if t == 1 else 0.003 * b)
    prior = [0.9] * K
    assert best_k(prior, K, table(**passes), 32) > 0
    assert best_k(prior, K, overhead, 32) == 0
    assert best_k(prior, K, overhead, 1) > 0
    rows = [_seq(800 + i) for i in range(32)]
    assert AutoK(table(**passes))(rows, K) != [0] * 32
    rows = [_seq(850 + i) for i in range(32)]
    assert AutoK(overhead)(rows, K) == [0] * 32


ROUND_SLEEP_S = 0.05


def test_measure_costs_times_whole_rounds(monkeypatch):
    """The overhead column comes from whole scheduler rounds: with every round made to pay ROUND_SLEEP_S more host
    work (a stand-in for the scheduler's bookkeeping), every entry at every batch size and k shows at least half of
    it. measure_costs leaves the target and the drafter to the next Scheduler, which decodes exactly."""
    target = FakeModel(seed=0, eos_bias=-30.0)
    drafter = DraftModel(FakeModel(weights=noisy_copy(target, 0.2, seed=5).w, tokenizer=target.tokenizer))
    drafter.attach(target)
    account = Scheduler._account

    def slow_account(self, result):
        time.sleep(ROUND_SLEEP_S)
        account(self, result)

    monkeypatch.setattr(Scheduler, "_account", slow_account)
    costs = measure_costs(target, drafter, 2, (1, 2))
    monkeypatch.undo()
    assert costs.tokens == (1, 2, 3) and len(costs.overhead_s) == 2
    assert all(ROUND_SLEEP_S / 2 <= o < 1.0 for row in costs.overhead_s for o in row)
    assert all(costs.round(b, k) >= costs.target(b, k + 1) + k * costs.draft(b) for b in (1, 2) for k in range(3))
    assert measure_costs(target, None, 2, (1,)).overhead_s == ((0.0, 0.0, 0.0),)   # no drafter: no rounds timed

    scheduler = Scheduler(target, drafter, SchedulerConfig(2, 64, 2), k_policy=AutoK(costs))
    prompts = [[3, 9, 4, 3, 9, 4, 3], [5, 1, 2]]
    seqs = [scheduler.submit(Request(p, 12, id=i)) for i, p in enumerate(prompts)]
    scheduler.run()
    assert [s.generated for s in seqs] == [greedy_reference(target, p, 12) for p in prompts]


# ------------------------------------------------------------------------------------------ one request
def _seq(rid: int, temperature: float = 0.0, max_new: int = 10**6) -> Sequence:
    seq = Sequence(Request([1, 2], max_new, temperature=temperature, seed=rid, id=rid), Stats())
    seq.generated = [0]
    return seq


def _round(seq: Sequence, k: int, accepted: int) -> None:
    """What the scheduler records after a round in which ``seq`` proposed k drafts and kept ``accepted``."""
    seq.stats.add_round(k, accepted)
    seq.generated += [0] * (accepted + 1)


def drive(policy: AutoK, script, rounds: int, seq: Sequence | None = None) -> list[int]:
    """Run ``rounds`` rounds of one request: k from the policy, accepted = script(round, k). -> the ks."""
    seq = seq or _seq(1)
    ks = []
    for r in range(rounds):
        k = policy([seq], K)[0]
        ks.append(k)
        _round(seq, k, script(r, k))
    return ks


def test_the_estimate_is_per_tested_position_with_decayed_evidence():
    policy = AutoK(table(*BANDWIDTH), prior_alpha=0.5, prior_strength=2.0, decay=1.0)
    seq = _seq(10)
    assert policy.alphas(seq, 4) == pytest.approx([0.5] * 4)
    for n, a in [(4, 4), (4, 1), (4, 0), (2, 2)]:       # (proposed, accepted) -> tested [4, 3, 1, 1], accepted [3, 2, 1, 1]
        _round(seq, n, a)
    assert policy.alphas(seq, 5) == pytest.approx([(3 + 1) / (4 + 2), (2 + 1) / (3 + 2), (1 + 1) / (1 + 2),
                                                   (1 + 1) / (1 + 2), 0.5])
    # decay 0.5: each round halves the evidence before adding its own; two rounds at once decay twice
    halving = AutoK(table(*BANDWIDTH), prior_alpha=0.5, prior_strength=2.0, decay=0.5)
    seq = _seq(11)
    _round(seq, 2, 2)
    halving.alphas(seq, 2)
    _round(seq, 2, 0)
    _round(seq, 2, 0)
    accepted0, tested0 = 1 * 0.25, 1 * 0.25 + 2            # the first round decayed twice; two rejections at 0
    assert halving.alphas(seq, 1) == pytest.approx([(accepted0 + 1) / (tested0 + 2)])
    accepted1, tested1 = 0.25, 0.25                         # position 1: tested by the first round only
    assert halving.alphas(seq, 2)[1] == pytest.approx((accepted1 + 1) / (tested1 + 2))


def test_k_goes_down_with_acceptance_and_back_up_within_the_bound():
    """Acceptance high -> zero -> high. k reaches K, falls to 0, and once the drafts are good again the row drafts
    within max_hold + 1 rounds and reaches K within log2(K) + 1 more. While nothing is accepted it explores in
    probes that start at one draft, one probe (fewer than ``settle`` rounds) per hold."""
    policy = AutoK(table(*COSTLY))
    high, low = 30, 200
    script = lambda r, k: k if r < high or r >= high + low else 0        # noqa: E731
    ks = drive(policy, script, high + low + 60)
    assert ks[0] > 0 and all(k == K for k in ks[high - 20:high])          # the optimistic prior, then confirmed
    fall = next(r for r in range(high, high + low) if ks[r] == 0)
    assert fall - high <= 2 / (1 - policy.decay)                          # the evidence's memory, twice over
    assert all(k <= max(1, 2 * j) for j, k in zip(ks, ks[1:]))            # slow start: a probe starts at 1
    late = ks[high + low - 100: high + low]                               # holds have doubled up to max_hold
    assert sum(1 for k in late if k) <= policy.settle * math.ceil(100 / (policy.max_hold + 1))
    back = high + low
    first = next(r for r in range(back, len(ks)) if ks[r] > 0)
    assert first - back <= policy.max_hold + 1
    full = next(r for r in range(first, len(ks)) if ks[r] == K)
    assert full - first <= math.log2(K) + 1
    assert all(k == K for k in ks[full:])


def test_a_row_whose_drafting_never_pays_stays_at_zero():
    policy = AutoK(table(lambda b, t: 0.01 * t, lambda b: 0.001))       # scoring a token costs a whole step
    assert set(drive(policy, lambda r, k: k, 50)) == {0}


def test_drafts_stop_where_the_request_ends():
    policy = AutoK(table(*BANDWIDTH))
    seq = _seq(12, max_new=6)                                             # 1 token emitted, 5 to go
    assert policy([seq], K) == [4]
    _round(seq, 4, 2)                                                     # 4 emitted, 2 to go
    assert policy([seq], K) == [1]
    _round(seq, 1, 0)
    assert policy([seq], K) == [0]                                        # the last token: no draft can help


# ------------------------------------------------------------------------------------------ a batch
def test_a_sampled_rows_k_depends_on_that_row_alone():
    """The same sampled request, scripted alike, alone and among 31 others (greedy and sampled, accepting
    everything or nothing): the same k every round. A batch-wide choice (the old policy: one k from the batch's
    size and every row's acceptance) fails this."""
    costs = table(*LOADED)                                                # the best k moves with the batch size
    script = lambda r, k: min(k, r % 3)                                   # noqa: E731
    alone = drive(AutoK(costs, reference_batch=8), script, 40, _seq(100, temperature=0.8))
    policy, me = AutoK(costs, reference_batch=8), _seq(100, temperature=0.8)
    others = [_seq(200 + i, temperature=0.0 if i % 2 else 1.0) for i in range(31)]
    got = []
    for r in range(40):
        ks = policy([*others[: r % 32], me, *others[r % 32:]], K)         # its row moves too
        k = ks[r % 32]
        got.append(k)
        _round(me, k, script(r, k))
        for o, ko in zip(others, ks[: r % 32] + ks[r % 32 + 1:]):
            _round(o, ko, ko if o.request.id % 3 else 0)
    assert got == alone
    assert len(set(alone)) > 1                                            # it did move with its own acceptance


def test_greedy_rows_follow_the_load_and_draft_to_the_widest_row():
    costs = table(*LOADED)
    prior = [0.9] * K
    policy = AutoK(costs, reference_batch=1, prior_alpha=0.9)
    assert policy([_seq(300)], K) == [best_k(prior, K, costs, 1)] and policy.last_k > 0
    assert policy([_seq(400 + i) for i in range(32)], K) == [0] * 32      # at 32 rows the pass is compute bound
    # 3 rows: a greedy row alone would take best_k at 3 rows; the sampled row takes its reference batch's (1) k,
    # and the greedy rows draft as wide (the round scores that many tokens anyway), within their room
    own_greedy, own_sampled = best_k(prior, K, costs, 3), best_k(prior, K, costs, 1)
    assert 0 < own_greedy < own_sampled
    ks = policy([_seq(600), _seq(500, temperature=1.0), _seq(601, max_new=3)], K)
    assert ks == [own_sampled, own_sampled, 1]


def test_a_loaded_greedy_batch_explores_as_one():
    """32 greedy rows, admitted a few rounds apart, at a load where their drafts (each accepted with probability
    0.8) do not pay: the batch's rounds stay plain decode steps but for one probe per hold. Chosen row by row, each
    row's own probes (desynchronized by the staggered admissions) widened every late round to k >= 1."""
    policy, rng = AutoK(table(*LOADED)), random.Random(0)
    rows, ks = [], []
    for r in range(32 * 3 + 300):
        if r % 3 == 0 and len(rows) < 32:
            rows.append(_seq(900 + len(rows)))
        got = policy(rows, K)
        ks.append(max(got))
        for seq, k in zip(rows, got):
            _round(seq, k, next((i for i in range(k) if rng.random() >= 0.8), k))
    late = ks[-300:]
    assert sum(1 for k in late if k) <= policy.settle * math.ceil(300 / (policy.max_hold + 1))


def test_state_lives_on_the_sequence():
    policy = AutoK(table(*BANDWIDTH))
    seq = _seq(700)
    policy([seq], K)
    assert isinstance(seq.k_state, RowState) and seq.k_state.last_k == K
    assert AutoK(table(*BANDWIDTH), reference_batch=4).reference_batch == 4
    assert AutoK(table(*BANDWIDTH)).reference_batch == 32


@pytest.mark.parametrize("bad", [dict(prior_alpha=1.5), dict(prior_alpha=-0.1), dict(prior_strength=0.0),
                                 dict(decay=1.5), dict(min_hold=0), dict(min_hold=8, max_hold=4), dict(settle=0),
                                 dict(reference_batch=0), dict(round_decay=1.0), dict(round_memory=0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        AutoK(table(*BANDWIDTH), **bad)


def test_iid_expectation_is_the_closed_form():
    assert expected_tokens_from_positions([0.7] * 5) == pytest.approx(expected_tokens_per_round(0.7, 5))


def _greedy_batch_drafting_rounds(observe: bool, rounds: int = 300) -> int:
    """8 greedy rows (drafts accepted with probability 0.8) under a table that says drafting pays (BANDWIDTH), on a
    machine where every round that drafts really costs 5x the table's (say its draft loop runs eagerly): the
    number of rounds that drafted. ``observe``: the rounds' wall times go to ``observe_round``, as the scheduler
    reports them."""
    costs = table(*BANDWIDTH)
    policy, rng = AutoK(costs), random.Random(0)
    rows = [_seq(700 + i) for i in range(8)]
    drafted = 0
    for _ in range(rounds):
        got = policy(rows, K)
        k = max(got)
        drafted += k > 0
        if observe:
            policy.observe_round(len(rows), k, costs.round(len(rows), k) * (5.0 if k else 1.0))
        for seq, kb in zip(rows, got):
            _round(seq, kb, next((i for i in range(kb) if rng.random() >= 0.8), kb))
    return drafted


def test_measured_rounds_overrule_a_table_that_is_wrong():
    """The greedy rows price k by the rounds they ran: where drafting rounds cost far more than the table says,
    they stay at k = 0 but for a probe per hold (a few rounds each); priced by the table alone they draft on."""
    bound = AutoK(table(*BANDWIDTH))
    probes = bound.settle * math.ceil(300 / (bound.max_hold + 1)) + bound.max_hold
    assert _greedy_batch_drafting_rounds(observe=True) <= probes
    assert _greedy_batch_drafting_rounds(observe=False) > 250


def test_measured_rounds_leave_sampled_rows_alone():
    """A sampled row's k comes from the table at the reference batch only: the measured rounds (the load) never
    change it, so its seeded tokens do not depend on the requests beside it."""
    costs = table(*BANDWIDTH)
    quiet, loaded = AutoK(costs), AutoK(costs)
    for k in range(K + 1):
        for batch in (1, 8, 32):
            loaded.observe_round(batch, k, 10.0 * (k + 1))
    a, b = _seq(5, temperature=0.8), _seq(5, temperature=0.8)
    rng = random.Random(3)
    for _ in range(40):
        ka, kb = quiet([a], K)[0], loaded([b], K)[0]
        assert ka == kb
        acc = next((i for i in range(ka) if rng.random() >= 0.7), ka)
        _round(a, ka, acc)
        _round(b, kb, acc)


def test_observe_round_ignores_nonsense_and_averages():
    policy = AutoK(table(*BANDWIDTH))
    policy.observe_round(8, 2, float("nan"))
    policy.observe_round(8, 2, -1.0)
    assert policy.measured_s == {}
    policy.observe_round(8, 2, 1.0)
    policy.observe_round(7, 2, 2.0)                  # the same bucket (8)
    assert policy.measured_s == {(3, 2): pytest.approx(0.9 * 1.0 + 0.1 * 2.0)}


def _loaded_batch_ks(round_memory: int, rounds: int = 200) -> list[int]:
    """32 greedy rows at a load where plain decoding wins by the table (LOADED), after drafting rounds measured at the
    table's cost and one plain round that cost 5x the table (a burst of admissions); every later round costs what the
    table says. -> the batch's k per round."""
    costs = table(*LOADED)
    policy, rng = AutoK(costs, round_memory=round_memory), random.Random(1)
    rows = [_seq(800 + i) for i in range(32)]
    for k in range(1, K + 1):                        # drafting rounds measured at their true cost
        policy.observe_round(32, k, costs.round(32, k))
    policy.observe_round(32, 0, 5 * costs.round(32, 0))
    ks = []
    for _ in range(rounds):
        got = policy(rows, K)
        k = max(got)
        ks.append(k)
        policy.observe_round(32, k, costs.round(32, k))
        for seq, kb in zip(rows, got):
            _round(seq, kb, next((i for i in range(kb) if rng.random() >= 0.8), kb))
    return ks


def test_a_stale_measurement_expires():
    """A k measured once at a bad moment is priced by that measurement only for ``round_memory`` rounds: then plain
    decoding, which the table says wins here, is chosen again (and measured at its true cost). Without the expiry the
    batch drafts on for good."""
    ks = _loaded_batch_ks(round_memory=64)
    assert sum(1 for k in ks[100:] if k) <= 8
    assert all(_loaded_batch_ks(round_memory=10**9)[100:])


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 50)), max_size=10), st.integers(0, 12),
       st.floats(0, 1), st.floats(0.01, 8))
@settings(max_examples=200, deadline=None)
def test_chain_alphas_fast_path_equals_the_general_one(evidence, k_max, prior_alpha, prior_strength):
    """RowState.alphas without tree evidence (its one-pass branch) gives the general loop's values bit for bit."""
    from verispec.engine.auto_k import RowState
    fast = RowState(accepted=[min(a, t) for a, t in evidence], tested=[t for _, t in evidence])
    general = RowState(accepted=list(fast.accepted), tested=list(fast.tested), wide_tested={2: []},
                       wide_accepted={2: []})     # a width never tested anywhere: the general loop, the same values
    assert fast.alphas(k_max, prior_alpha, prior_strength) == general.alphas(k_max, prior_alpha, prior_strength)
