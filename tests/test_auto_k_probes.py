"""k=auto's probes priced against the draft debt (verispec/engine/auto_k.py, "Exploration" and "Draft debt"), on
synthetic cost tables and scripted acceptance: at a batch bucket where drafting loses, the greedy rows' probes are
rare (each would pay the draft model's prefill of rows that never drafted, and its catch-up), yet they re-test
drafting when the batch shrinks to a bucket where it pays or when acceptance rises; the debt, spread over the tokens
a row may still emit, keeps a row near its end from starting to draft; a plain round inside a hold reads no row."""
from __future__ import annotations

import random

import pytest

from test_auto_k import K, table, _round, _seq
from verispec.engine.auto_k import AutoK

# one draft loses at 32 rows below ~89% acceptance and wins above it; at 2-8 rows it wins from ~32-65%; a draft pass
# costs 0.05 ms more per token (row) it scores
SPLIT = (lambda b, t: 0.01 + 0.001875 * b * t, lambda b: 0.0005 + 0.00005 * b)
PROMPT = 64        # prompt tokens a row owes the draft model until it first drafts
MAX_NEW = 64


class DebtBook:
    """What a lazy-prefill draft model (``DraftModel.draft_debt``) would report for the running rows: a row owes its
    prompt until its first drafting round; the catch-up width is the most rounds a row that drafted before has gone
    without drafting. ``owes=False``: a drafter that owes nothing (prompt lookup)."""

    def __init__(self, owes: bool = True):
        self.owes, self.rows, self.drafted, self.idle = owes, [], {}, {}

    def __call__(self):
        if not self.owes:
            return None
        owed = [0 if self.drafted.get(s.request.id) else PROMPT for s in self.rows]
        gap = max((self.idle.get(s.request.id, 0) for s in self.rows if self.drafted.get(s.request.id)), default=0)
        return owed, gap

    def after_round(self, ks: list[int]) -> None:
        for seq, k in zip(self.rows, ks):
            rid = seq.request.id
            if k:
                self.drafted[rid], self.idle[rid] = True, 0
            else:
                self.idle[rid] = self.idle.get(rid, 0) + 1


def serve(policy: AutoK, rounds: int, batch_of, alpha_of, owes: bool = True, seed: int = 0):
    """``rounds`` rounds of a server whose running rows are topped up to ``batch_of(r)`` greedy requests of MAX_NEW
    tokens (a row leaves when it has emitted them); each draft accepted with probability ``alpha_of(r)``. -> per round
    (rows, the round's k)."""
    rng, book, rows, out, next_id = random.Random(seed), DebtBook(owes), [], [], 0
    policy.debt_source = book
    for r in range(rounds):
        rows = [s for s in rows if len(s.generated) < MAX_NEW][: batch_of(r)]
        while len(rows) < batch_of(r):
            rows.append(_seq(10_000 + next_id, max_new=MAX_NEW))
            next_id += 1
        book.rows = rows
        ks = policy(rows, K)
        out.append((len(rows), max(ks)))
        book.after_round(ks)
        for seq, k in zip(rows, ks):
            _round(seq, k, next((i for i in range(k) if rng.random() >= alpha_of(r)), k))
    return out


def drafting_rounds(trace, rows=None) -> int:
    return sum(1 for b, k in trace if k and (rows is None or b == rows))


def test_a_round_of_ending_rows_starts_no_hold():
    """24 of 32 rows have one token left (no room for a draft) beside 8 new rows: the round is plain, because the
    wider pass would serve 8 rows only, but that says nothing about acceptance, so no hold starts and the next batch
    of drafting rows drafts at once, its k where the slow start had it."""
    policy = AutoK(table(*SPLIT))
    rows = [_seq(i) for i in range(32)]
    for _ in range(6):                       # settle at drafting rows: all drafts accepted
        ks = policy(rows, K)
        for seq, k in zip(rows, ks):
            _round(seq, k, k)
    drafting_k = policy.greedy_state.last_k
    assert drafting_k >= 1
    ending = [_seq(100 + i, max_new=2) for i in range(24)]          # one generated, one left: room 0
    policy.debt_source = lambda: ([0] * 24 + [2] * 8, 0)          # the new rows owe their prompts' prefill
    assert policy(ending + [_seq(200 + i) for i in range(8)], K) == [0] * 32
    assert policy.greedy_state.hold == 0 and policy.greedy_state.last_k == drafting_k
    assert policy._debt_round == 0.0                 # a plain round owes no draft work, whatever roomy rows would
    assert max(policy(rows, K)) >= 1


def test_probes_at_a_bucket_where_drafting_loses_are_rare():
    """32 rows, drafts accepted 80% of the time: drafting loses at this bucket, and a probe would pay every new row's
    prefill. Priced, no probe is worth it (the unpriced back-off probed once per max_hold + 1 rounds, each probe's
    first round paying 32 prefills); a drafter that owes nothing is probed only while the decayed belief leaves
    room for a gain."""
    policy = AutoK(table(*SPLIT))
    trace = serve(policy, 1500, lambda r: 32, lambda r: 0.8)
    assert drafting_rounds(trace[100:]) <= 2
    assert policy.probes_declined >= 1400 // (policy.max_hold + 1) - 2 and policy.probes <= 1
    unowed = serve(AutoK(table(*SPLIT)), 1500, lambda r: 32, lambda r: 0.8, owes=False)
    assert 0 < drafting_rounds(unowed[100:]) <= 1400 // 8


def test_a_batch_that_shrinks_to_a_bucket_where_drafting_pays_drafts_again():
    """After 600 rounds at 32 rows (plain decoding), the batch drains to 2 rows, where one draft pays from ~35%
    acceptance: the hold ends at the smaller bucket and the rows draft within a few rounds, and on."""
    trace = serve(AutoK(table(*SPLIT)), 800, lambda r: 32 if r < 600 else 2, lambda r: 0.8)
    assert drafting_rounds(trace[100:600]) <= 2
    first = next(r for r in range(600, 800) if trace[r][1])
    assert first - 600 <= 3
    assert drafting_rounds(trace[650:]) >= 0.9 * 150


def test_rising_acceptance_is_retested_at_the_same_bucket():
    """32 rows that owe no draft work (prompt lookup), acceptance 40% (drafting loses) for 600 rounds, then 100%
    (drafting wins at 32 rows too): the pooled belief decays while no row drafts, so a probe comes back within a
    bounded number of rounds and finds the higher acceptance; from then on the batch drafts."""
    policy = AutoK(table(*SPLIT))
    trace = serve(policy, 900, lambda r: 32, lambda r: 0.4 if r < 600 else 1.0, owes=False)
    assert drafting_rounds(trace[100:600]) <= 500 // 8
    first = next(r for r in range(600, 900) if trace[r][1])
    assert first - 600 <= 4 * (policy.max_hold + 1)
    assert drafting_rounds(trace[first + 10:]) >= 0.8 * (900 - first - 10)     # but the rows' turnover rounds


def test_the_debt_keeps_a_row_near_its_end_from_starting_to_draft():
    """One row alone (drafting pays at its prior), owing a 2000-token prompt to the draft model: with 500 tokens to
    go it starts drafting; with 8 to go the prefill is not earned back, and it stays plain."""
    for left, drafts in [(500, True), (8, False)]:
        policy = AutoK(table(*SPLIT))
        seq = _seq(1, max_new=left + 1)
        policy.debt_source = lambda: ([2000], 0)
        assert (policy([seq], K)[0] > 0) == drafts
    # without a debt the row near its end drafts too (the debt, not its room, decides)
    assert AutoK(table(*SPLIT))([_seq(2, max_new=9)], K)[0] > 0


def test_the_debt_is_read_in_row_order_and_charged_to_the_greedy_rows():
    """The drafter reports its debt in cache row order; the greedy rows' choice is charged their own prefills (a
    sampled row's is its own affair: its k is chosen from its own state) and the batch's catch-up pass."""
    policy = AutoK(table(*SPLIT))
    rows = [_seq(1, temperature=0.8), _seq(2), _seq(3)]
    policy.debt_source = lambda: ([1000, 0, 64], 5)
    greedy = rows[1:]
    assert policy._debt_seconds(rows, greedy) == pytest.approx(policy._draft_pass(64) + policy._draft_pass(3 * 5))
    assert policy._debt_seconds(rows, greedy, catch_up=False) == pytest.approx(policy._draft_pass(64))
    assert policy._draft_pass(16) == pytest.approx(SPLIT[1](16))
    assert policy._draft_pass(64) == pytest.approx(SPLIT[1](64))      # the last slope continued (linear here)
    policy.debt_source = lambda: ([64, 64], 0)                        # not this batch's rows: nothing is known
    assert policy._debt_seconds(rows, greedy) == 0.0
    policy([*rows], K)                                               # the mixed batch's choice runs with it


def test_a_plain_round_inside_a_hold_reads_no_row():
    """Inside the greedy rows' hold a round costs no per-row work: a row that joined during it has no state yet,
    and the evidence caught up afterwards is the same as if every round had been observed."""
    costs = table(*SPLIT)
    policy, watched = AutoK(costs), AutoK(costs)
    rows = [_seq(i) for i in range(32)]
    twins = [_seq(i) for i in range(32)]
    for r in range(3):                                     # drafting rounds, then the choice falls to 0: a hold
        for p, batch in ((policy, rows), (watched, twins)):
            ks = [max(1, r)] * 32
            for seq, k in zip(batch, ks):
                _round(seq, k, k - 1)
    assert policy(rows, K) == [0] * 32 and policy.greedy_state.hold > 1
    watched(twins, K)
    late, late_twin = _seq(99), _seq(99)
    rows.append(late)
    twins.append(late_twin)
    for _ in range(policy.greedy_state.hold - 1):
        assert policy(rows, K) == [0] * 33
        for seq in rows:
            _round(seq, 0, 0)
        for seq in twins:
            _round(seq, 0, 0)
            watched.state(seq)                              # observed every round
    assert late.k_state is None
    for seq, twin in zip(rows, twins):
        assert policy.alphas(seq, K) == pytest.approx(watched.alphas(twin, K))


def test_a_debt_round_measured_dearer_raises_the_debt_price():
    """``observe_debt_round``: a round that paid the draft debt and cost twice the predicted debt beyond its k's
    round moves ``debt_scale`` towards 2; a round with no predicted debt, or a plain one, leaves it."""
    costs = table(*SPLIT)
    policy = AutoK(costs)
    seq = _seq(1, max_new=500)
    policy.debt_source = lambda: ([PROMPT], 0)
    k = policy([seq], K)[0]
    predicted = policy._debt_seconds([seq], [seq])
    assert k > 0 and predicted > 0
    for _ in range(20):
        policy._debt_round = policy._debt_seconds([seq], [seq])          # as the choice records it (scaled)
        policy.observe_debt_round(1, k, costs.round(1, k) + 2 * predicted)
    assert policy.debt_scale == pytest.approx(2.0, rel=0.05)
    policy.observe_debt_round(1, 0, 1.0)
    policy.observe_debt_round(1, k, 1.0)                     # nothing predicted since the last one
    assert policy.debt_scale == pytest.approx(2.0, rel=0.05)


class TableOnly(AutoK):
    """k=auto priced by its table alone: the rounds' wall times on this machine (milliseconds, where the table says
    tens of them) would make its choices depend on the machine's load."""

    def observe_round(self, batch, k, seconds):
        pass

    def observe_debt_round(self, batch, k, seconds):
        pass


def test_greedy_tokens_through_the_engine_equal_plain_decoding():
    """k=auto with the draft debt wired in (a lazy-prefill ``DraftModel``: ``Scheduler`` hands its ``draft_debt`` to
    the policy and its one-time rounds to ``observe_debt_round``), rows ending at different lengths so the batch
    shrinks through the buckets: every request's tokens equal plain decoding's."""
    import torch

    from verispec.drafters import DraftModel
    from verispec.engine import Request, Scheduler, SchedulerConfig
    from verispec.runtime import ModelConfig, load_model

    cfg = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64)
    target = load_model(cfg, dtype=torch.float32, seed=0)
    prompts = [[(7 * i + j) % 64 for j in range(3 + 2 * i)] for i in range(6)]
    lengths = [6, 30, 12, 40, 20, 9]

    def run(drafter, policy):
        sched = Scheduler(target, drafter, SchedulerConfig(4, 96, 4), k_policy=policy)
        sched.eos = set()
        seqs = [sched.submit(Request(p, n, id=i)) for i, (p, n) in enumerate(zip(prompts, lengths))]
        sched.run()
        return [s.generated for s in seqs], sched

    plain, _ = run(None, None)
    drafter = DraftModel(target.truncated(1))       # the target's first layer: drafts it sometimes gets right
    # plain decoding at 3-4 rows, drafting at 1-2 (above ~45% acceptance at 1, ~75% at 2): the rows start plain, and
    # draft once the batch has shrunk, paying their prefill and a catch-up then
    policy = TableOnly(table(lambda b, t: 0.01 + 0.00625 * b * b * t, lambda b: 0.001, batch_sizes=(1, 2, 4)))
    spec, sched = run(drafter, policy)
    assert spec == plain
    assert sched.totals.proposed > 0 and policy.debt_source is not None
    assert drafter.prefill_tokens > 0 and drafter.catch_up_passes > 0


def test_a_sharp_belief_still_prices_the_probe():
    """Much pooled evidence (a sharp Beta) at a bucket where drafting loses: the probe is priced (not a division by
    an underflowed zero) and declined."""
    policy = AutoK(table(*SPLIT))
    policy.pool_accepted, policy.pool_tested = 0.8e6, 1e6
    rows = [_seq(i, max_new=64) for i in range(32)]
    assert not policy._probe_pays(rows, rows, K, policy._measured_rounds(32, K), True)
    policy.pool_accepted = 0.999e6                       # and at near-certain acceptance it is worth it
    assert policy._probe_pays(rows, rows, K, policy._measured_rounds(32, K), True)
