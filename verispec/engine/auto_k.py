"""``k="auto"``: each request's drafts per round, chosen from that request's own state.

Why per request. A sampled request's tokens depend on its k: k decides which positions of a round are drafted,
verified or sampled as the bonus, so which uniforms of its seeded stream meet which logits. Were k chosen for
the whole batch (from its size and every row's acceptance), a seeded request would emit other tokens when
other requests ran beside it. So row b's k_b is a function of its own state and of fixed configuration only:

    its acceptance      per draft position, from its own rounds (``RowState``)
    its position        k_b <= the tokens it may still emit - 1 (drafts past its end are wasted)
    configuration       the cost table at a fixed reference batch size (default: the table's largest batch,
                        which the server measures at --max-batch-size), and K

A greedy request's tokens are the same at any k (greedy verification emits the target's argmax whatever was
drafted), so the greedy rows share one k, chosen for the batch: the k that maximizes the round's expected tokens
(every greedy row's at that k, within its room, plus the sampled rows' at their own k) per second of the round
at the running batch size, whose width is the widest row's. They never draft less than the sampled rows' widest
k: that target pass and those draft steps are run anyway. One k for them matters at load: chosen row by row,
some row's probe (below) would widen almost every round of a large batch to k >= 1, paying a wider pass for
one row's question -- on the 8B shape at 32 rows through HTTP that ran k=auto below plain decoding
(benchmarks/results/serve_http_8b.md).

The choice. With alpha_i the row's estimate at draft position i, a round of k drafts emits in expectation
    E(k) = 1 + alpha_0 + alpha_0 alpha_1 + ... + alpha_0 ... alpha_{k-1}      (``analysis.expected_tokens_from_positions``)
tokens and costs
    cost(B, k) = T_target(B, k + 1 tokens per row) + k * T_draft(B) + T_overhead(B, k + 1)
where T_overhead is what a whole round pays beyond its passes: verification (a launch and the status read), the
drafter's host work and commit, the scheduler's bookkeeping (a draft model's passes, a benchmark oracle's cost
model's among them, are the draft steps). A plain decode round of k=auto pays its own share (k = 0: the drafter
still takes in the emitted tokens). So
    k_b = argmax over k in [0, cap_b] of E(k) / cost(B, k)                         (the smallest k on ties)
k = 0 (a plain decode step, E = 1) is always a candidate, so no k is chosen whose predicted rate is below
plain decoding's. k = 0 wins when a wider pass costs more than the drafts are expected to return, as at large
batches where the target pass stops being weight-bandwidth bound and its time grows with the tokens it scores,
or where a round's fixed cost of drafting outweighs what the drafts return (with the passes alone in the cost, k=auto
on the 8B shape at 32 rows still drafted at times where drafting lost, benchmarks/results/serve_http_8b.md;
benchmarks/auto_cost.py measures both cost models side by side).

Estimates. alpha_i = (a_i + prior_alpha * prior_strength) / (t_i + prior_strength), where t_i counts the rounds
that *tested* position i (proposed it and accepted every draft before it: a rejection ends the round, so the
positions after it were never examined; accepted / proposed would count them as rejected) and a_i those that
accepted it. Each round of the request multiplies a_i and t_i by ``decay`` before adding its own evidence, so
evidence fades with a memory of about 1 / (1 - decay) rounds and the estimates follow a change of acceptance
either way. The prior is optimistic: a position with no recent evidence is presumed worth drafting.

Exploration. k = 0 tests nothing, so an estimate that once said "lose" would say it forever. Two rules bound
the cost of finding out again:
  * hold: when the choice falls to 0 the row stays at 0 for ``min_hold`` more rounds, twice as long each time
    it falls back to 0 within ``settle`` rounds of drafting (up to ``max_hold``). When the hold ends the row
    forgets its evidence and starts over from the optimistic prior: it probes k > 0 if drafting at the prior's
    acceptance would pay at all (else it holds again).
  * slow start: after a round at k = 0 the next k is at most 1, and k at most doubles from one round to the
    next: a probe starts with one draft, and k climbs 1, 2, 4, ... while drafts are accepted.
A zero chosen only because the rows are ending (it would draft were every row far from its end: most rows have no
room for a draft, and the wider pass would serve the few that have) starts no hold and leaves the slow start's k:
the estimates still say drafting pays for the rows that follow.
The greedy rows explore as one: the same hold and slow start, on the batch's state (``AutoK.greedy_state``); when
their hold ends, every greedy row forgets its evidence -- if the probe is worth its price (below); else the hold is
renewed. Their hold ends early when the batch shrinks to a smaller bucket than it began at (drafting may pay
there). A plain round inside their hold reads no row (``_holding``: O(1) host work; a row's evidence catches up
when it is next asked about, and plain rounds add none). So where drafting does not pay, a probe (a few rounds of
small k, until its rejections bring the estimate below break-even) comes at most once per max_hold + 1 rounds once
the holds have doubled up; and once acceptance is back, the row drafts again within max_hold + 1 rounds (if drafting
at the prior's acceptance pays at all; the greedy rows: once their priced probe pays) and its k doubles every round
up to what its estimate supports (``tests/test_auto_k.py`` and ``tests/test_auto_k_probes.py`` check both on
scripted acceptance).

Priced probes (the greedy rows). At 32 rows on the 8B shape every unpriced probe's first round paid the draft
model's prefill of each row that had never drafted and the catch-up of the others, once per max_hold + 1 rounds,
for a probe that found drafting still losing. So a probe runs only when
    value = tokens_left * E_alpha[max(0, s_plain - s_draft(alpha))]  >  debt + loss of its first round
tokens_left: the tokens the rows may still emit (each up to ``probe_horizon``); s_plain / s_draft(alpha): seconds per
token of a plain round and of the best drafting round at i.i.d. acceptance alpha (the measured round costs where
there are any, the table's else); alpha ~ Beta over the greedy rows' pooled evidence (``pool_accepted`` /
``pool_tested``: every greedy row's drafts, decayed by ``decay`` every round and outliving the rows), so the belief
widens while nobody drafts and a probe comes back once a rise of acceptance is plausible enough to pay for it;
the first round's loss is what a round of one draft loses against plain rounds at the belief's mean.

Draft debt. A drafter may owe one-time work before a row drafts (``Drafter.draft_debt``: a ``DraftModel``'s lazy
prefill of a row's prompt, the catch-up pass after rounds without drafting). A draft-model pass of N tokens is
priced as the table's draft step of N rows (the same weights read, about the same arithmetic; beyond the largest
batch, its last slope continued): one pass per prefilled row (its prompt's tokens) and one catch-up pass (B rows x
its width), times ``debt_scale``, the moving average of measured / predicted over the rounds that paid it
(``observe_debt_round``: the scheduler reports such rounds there, not to ``observe_round``). The choice to draft
spreads it over the tokens the greedy rows may still emit: a round of k >= 1 costs round(B, k) + debt * E / R (E its
expected tokens, R the tokens left), so a row near its end does not start drafting; the probe pays it whole.

Measured rounds. The table is a prediction made at startup, alone on the machine; a server's rounds also pay what
it cannot see (the event loop's share of the GIL, the draft model's catch-up after rounds at k = 0, a pass that
runs slower at this context length). So the greedy rows' choice prices each k by the rounds actually run: the
scheduler reports each round's wall time (``observe_round``; not a round that paid one-time work, an admission's, a
draft model's first prefill of a row or its catch-up: ``Scheduler._round``), kept per (batch bucket of the table, widest k) as a
moving average over about 1 / (1 - ``round_decay``) rounds; a k without a measured round at that bucket costs the
table's, scaled as the nearest measured k's measured / table. An average not fed for ``round_memory`` rounds is
ignored (that k is priced as if never measured): a k chosen rarely, e.g. k = 0 measured once in a burst of
admissions, would otherwise keep that price for good. A round that caught the draft model up is not a sample
either (its one-time part is the draft debt's), so the drafting rounds' measured costs are the drafting's own and
are kept when a hold ends (they expire after ``round_memory`` rounds like any other). The sampled rows' choices
keep the table alone: their k must not depend on the load.

Trees (``tree="auto"``, ``AutoK(trees=AUTO_TREES)``, ``decide``). The greedy rows' one choice extends to a shape:
plain decoding, a chain of k drafts, or one tree of ``trees`` (w_d children per node at depth d), whichever has the
most expected tokens per second of the round at the running batch. A tree of widths w_1..w_D emits in expectation
    E(tree) = 1 + c_0(w_1) + c_0(w_1) c_1(w_2) + ... + c_0(w_1) ... c_{D-1}(w_D)
tokens per row (within its room), c_d(w) the row's estimate that w children of the path's node cover the target's
token at depth d (``RowState.coverage``: its tree rounds of that width over a prior of 1 - (1 - alpha_d) w^-x, x =
``COVERAGE_EXPONENT``, never below alpha_d, the chain's estimate; c_d(1) = alpha_d). A tree round is evidence on the
widths it ran alone (``observe_tree``): its success with 2 children says nothing about the first child alone, and
read as a chain's round it would inflate the chain's estimates. alpha_d itself pools every width's rounds through
the same law (``RowState.alphas``: misses over tests weighted by w^-x), so depths that only trees tested do not keep
the prior's alpha, and with it every width's coverage. The round costs what the table timed of a whole round of
that tree (``CostTable.tree_round``; a table without it: T_target(B, nodes + 1) + D T_draft(B) + T_overhead(B,
nodes + 1)), or its measured rounds at that (bucket, tree) (``observe_round`` keyed by the widths), or the table's
scaled as the nearest measured drafting shape's measured / table. A tree is
chosen only where its rate beats the best chain's, with the chains' hold and slow start (a tree counts as a round of
its depth), and only when every row is greedy: a sampled row's tokens depend on the shape its round drafts, and one
tree for the batch would make them depend on the other rows, so a batch with a sampled row runs ``__call__``'s
chains.

Planned ahead (``plan_ahead``, default ``PLAN_AHEAD``: on). ``decide`` at a round's start runs on the host before
the round's first launch, so the device waits for it: on an H200 about 0.15 ms a round, 1.5% of a B = 8 round and
2.4% at B = 1 on the 8B shape (benchmarks/results/trees.md). With ``plan_ahead`` the scheduler asks ``plan`` for the
next round's shape once this round's target pass is launched (its host time then overlaps the device's) and
``adopt``s it at the next round's start. The choice sees the evidence one round later than ``decide`` at the round's
start would; for greedy rows that is exact (their tokens are the target's argmax whatever is drafted), so a plan is
made only for an all-greedy batch in which no row can end by its length this round, and only in a round that drafts
(after a plain round the drafter's catch-up, which the next choice prices, is not known until the round ends); a
plan whose batch changed anyway (a row met EOS, a request was admitted or cancelled) is dropped, uncounted, and the
round decided afresh. Measured on an H200: 1.00-1.055x the speed of deciding at each round's start. Chains alone
(``trees=()``, ``k="auto"``) plan the same way; a planned shape is also what lets the drafter launch the next
round's drafts before this round's outcome is read (``Drafter.prelaunch``, ``Scheduler._next_shape``).

The costs come from a ``CostTable``: measured on this machine at startup (``measure_costs``: target passes and a
draft step timed alone, then whole ``Scheduler`` rounds with every row's k forced, whose excess over those passes
is T_overhead, and a whole round of each candidate tree, its price) or given (synthetic tables in tests, a saved
JSON table between runs; one saved before the overhead column loads with T_overhead = 0, the passes alone).
"""
from __future__ import annotations

import bisect
import collections
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters.base import full_tree
from .request import Request, Sequence
from .scheduler import tree_nodes

# The tree shapes ``tree="auto"`` chooses among (besides plain decoding and the chains of 1..K drafts): children per
# node at each depth. Shallow and narrow to wide and deep: on an H200 at B = 1 the depth-2 trees [2, 2] and [4, 2]
# are the fastest fixed shapes on the 8B shape (as many draft passes as chain k = 2, 1.12x its speed); with them
# among its candidates auto ran 1.03-1.06x faster at B = 1 in two runs (1.04-1.10x the best chain); at B = 8 a tree's
# pass grows with its nodes and chains win (benchmarks/results/trees.md).
AUTO_TREES = ((2, 1), (2, 2), (3, 1), (4, 2), (2, 2, 1), (2, 2, 2, 1), (3, 2, 2, 1), (4, 2, 2, 1))
# The prior of a width's coverage before a row has run it: a node of w children misses the target's token
# (1 - alpha) w^-x as often as one child does. x is measured: the embedded SmolLM2 head's top-w on held-out prompts
# gave x = 0.44 / 0.39 / 0.37 at depths 1 / 2 / 3 (benchmarks/results/head_coverage.md); independent tries,
# 1 - (1 - alpha)^w, promised 0.93 at w = 4 where the head covers 0.73, and the wide trees it tried first cost more
# than a short generation recovered (benchmarks/results/trees_auto.md).
COVERAGE_EXPONENT = 0.4
# AutoK.plan_ahead's default (module docstring, "Planned ahead"): on an H200 (8B shape, B = 1 and 8, three calls a
# config in turn) planned ahead ran 1.00-1.055x the speed of auto deciding at each round's start (results/trees.md)
PLAN_AHEAD = True
ROUNDS_LOG = 4096             # AutoK.rounds_log's length


@dataclass(frozen=True)
class CostTable:
    """Seconds of one target pass, one draft step and the rest of a round, by batch size.

    batch_sizes:  ascending measured batch sizes (e.g. the CUDA-graph buckets 1, 2, 4, 8, 16, 32)
    tokens:       ascending tokens per row of the measured target passes (1 = a plain decode step)
    target_s:     target_s[i][j] = one target pass of batch_sizes[i] rows x tokens[j] tokens
    draft_s:      draft_s[i] = one draft step (one token per row) at batch_sizes[i] rows
    overhead_s:   overhead_s[i][j] = what a whole round of batch_sizes[i] rows and tokens[j] - 1 drafts per row
                  costs beyond its target pass and its draft steps: verification (its launch and the status
                  read), the drafter's host work and commit, the scheduler's bookkeeping. >= 0. None (tables
                  saved before this column): zero everywhere, i.e. a round costs its passes alone.
    tree_round_s: tree_round_s[i] = ((widths, seconds), ...): a whole round of each candidate tree at
                  batch_sizes[i] rows, timed as it runs (its tree pass, tree verification, a draft pass per depth
                  and the host work); its parts priced from the chains' columns miss the tree's own costs (an
                  H200, B = 1: [2, 1] priced 7.5 ms there, a round of it took 8.2). None: no tree timed.

    A batch between two measured sizes costs as the next larger one (the bucket it runs in); tokens
    between two measured counts interpolate linearly; beyond the table the last entry is extrapolated
    (batch) or the last slope continued (tokens).
    """

    batch_sizes: tuple[int, ...]
    tokens: tuple[int, ...]
    target_s: tuple[tuple[float, ...], ...]
    draft_s: tuple[float, ...]
    overhead_s: tuple[tuple[float, ...], ...] | None = None
    tree_round_s: tuple[tuple[tuple[tuple[int, ...], float], ...], ...] | None = None

    def __post_init__(self):
        nb, nt = len(self.batch_sizes), len(self.tokens)
        if nb == 0 or nt == 0 or list(self.batch_sizes) != sorted(set(self.batch_sizes)) \
                or list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] != 1:
            raise ValueError("CostTable: batch_sizes and tokens must be ascending, distinct, non-empty; tokens "
                             f"must start at 1; got {self.batch_sizes}, {self.tokens}")
        if len(self.target_s) != nb or any(len(row) != nt for row in self.target_s) or len(self.draft_s) != nb:
            raise ValueError(f"CostTable: target_s must be [{nb}][{nt}] and draft_s [{nb}]")
        if any(not t > 0 for row in self.target_s for t in row) or any(not d >= 0 for d in self.draft_s):
            raise ValueError("CostTable: target times must be > 0 and draft times >= 0")
        if self.overhead_s is None:       # frozen: the zero column is set once, here
            object.__setattr__(self, "overhead_s", tuple((0.0,) * nt for _ in range(nb)))
        if len(self.overhead_s) != nb or any(len(row) != nt for row in self.overhead_s):
            raise ValueError(f"CostTable: overhead_s must be [{nb}][{nt}] like target_s")
        if any(not 0 <= o < float("inf") for row in self.overhead_s for o in row):
            raise ValueError(f"CostTable: overhead times must be finite and >= 0, got {self.overhead_s}")
        if self.tree_round_s is not None:
            object.__setattr__(self, "tree_round_s", self._checked_tree_rounds(self.tree_round_s, nb))

    @staticmethod
    def _checked_tree_rounds(rows, nb: int) -> tuple:
        """``tree_round_s`` as tuples, or ValueError naming what is wrong with it."""
        why = f"CostTable: tree_round_s must be [{nb}] rows of (widths >= 1, seconds > 0, finite) pairs, got {rows}"
        try:
            rounds = tuple(tuple((tuple(w), float(t)) for w, t in row) for row in rows)
        except (TypeError, ValueError):
            raise ValueError(why) from None
        if len(rounds) != nb or any(not w or any(not isinstance(x, int) or x < 1 for x in w)
                                    or not 0 < t < float("inf") for row in rounds for w, t in row):
            raise ValueError(why)
        return rounds

    def bucket(self, batch: int) -> int:
        """The index of the measured batch size ``batch`` costs as (the next larger one, or the largest)."""
        return min(bisect.bisect_left(self.batch_sizes, batch), len(self.batch_sizes) - 1)

    def _along_tokens(self, row: tuple[float, ...], tokens: int) -> float:
        """``row`` (one value per measured token count) at ``tokens``: linear between measured counts, the
        last slope continued beyond them."""
        ts = self.tokens
        if len(ts) == 1:
            return row[0]
        j = min(max(bisect.bisect_left(ts, tokens), 1), len(ts) - 1)
        t0, t1 = ts[j - 1], ts[j]
        return row[j - 1] + (row[j] - row[j - 1]) * (tokens - t0) / (t1 - t0)

    def target(self, batch: int, tokens: int) -> float:
        """Seconds of one target pass of ``batch`` rows x ``tokens`` tokens."""
        return max(self._along_tokens(self.target_s[self.bucket(batch)], tokens), 1e-12)

    def draft(self, batch: int) -> float:
        return self.draft_s[self.bucket(batch)]

    def overhead(self, batch: int, tokens: int) -> float:
        """Seconds a round of ``batch`` rows x ``tokens`` tokens (tokens - 1 drafts) costs beyond its passes."""
        return max(self._along_tokens(self.overhead_s[self.bucket(batch)], tokens), 0.0)

    def round(self, batch: int, k: int) -> float:
        """cost(B, k) = T_target(B, k + 1) + k * T_draft(B) + T_overhead(B, k + 1)."""
        return self.target(batch, k + 1) + k * self.draft(batch) + self.overhead(batch, k + 1)

    def tree_round(self, batch: int, widths: tuple[int, ...]) -> float | None:
        """Seconds of a whole round of the tree ``widths`` at ``batch`` rows as timed (``tree_round_s``, at the
        batch's bucket), or None where it was not."""
        if self.tree_round_s is None:
            return None
        return dict(self.tree_round_s[self.bucket(batch)]).get(tuple(widths))

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> str:
        return json.dumps(dict(batch_sizes=self.batch_sizes, tokens=self.tokens, target_s=self.target_s,
                               draft_s=self.draft_s, overhead_s=self.overhead_s, tree_round_s=self.tree_round_s))

    @staticmethod
    def from_json(text: str) -> "CostTable":
        """The table ``to_json`` wrote; one saved without ``overhead_s`` loads with zero overhead, one without
        ``tree_round_s`` prices its trees from their parts."""
        d = json.loads(text)
        overhead, trees = d.get("overhead_s"), d.get("tree_round_s")
        return CostTable(tuple(d["batch_sizes"]), tuple(d["tokens"]), tuple(tuple(r) for r in d["target_s"]),
                         tuple(d["draft_s"]), None if overhead is None else tuple(tuple(r) for r in overhead),
                         trees)                  # lists: the check makes them tuples


def best_k(alphas: list[float], k_max: int, costs: CostTable, batch: int) -> int:
    """argmax over k in [0, k_max] of E(k) / cost(batch, k), E(k) from the per-position acceptance ``alphas``
    (alphas[i]: position i; at least k_max of them); the smallest k on ties."""
    return _best_k(alphas, [costs.round(batch, k) for k in range(k_max + 1)])


def _best_k(alphas: list[float], round_s: list[float]) -> int:
    """``best_k`` with the round costs of k = 0 .. len(round_s) - 1 drafts given."""
    best, best_rate, tokens, reach = 0, 1.0 / round_s[0], 1.0, 1.0
    for k in range(1, len(round_s)):
        reach *= alphas[k - 1]                 # P(position k - 1 is reached and accepted)
        tokens += reach                        # E(k) = expected_tokens_from_positions(alphas[:k])
        rate = tokens / round_s[k]
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def expected_tokens(alphas: list[float], k: int) -> float:
    """E(k) = 1 + alpha_0 + alpha_0 alpha_1 + ... (k terms after the 1)."""
    tokens, reach = 1.0, 1.0
    for a in alphas[:k]:
        reach *= a
        tokens += reach
    return tokens


def _best_joint(rows: list[tuple[list[float], int]], fixed: float, floor: int, round_s: list[float]) -> int:
    """argmax over k in [0, len(round_s) - 1] of (fixed + sum over rows of E_row(min(k, room_row))) /
    round_s[max(k, floor)]; ``rows``: (per-position alphas, room) of each row; the smallest k on ties."""
    return _best_joint_rate(rows, fixed, floor, round_s)[0]


def _best_joint_rate(rows: list[tuple[list[float], int]], fixed: float, floor: int,
                     round_s: list[float], debt_per_token: float = 0.0) -> tuple[int, float]:
    """``_best_joint``'s k and its rate (expected tokens of the round per second). ``debt_per_token``: seconds the
    rows' draft debt adds per token a round of k >= 1 emits (the debt spread over the tokens they may still emit)."""
    reach = [1.0] * len(rows)
    tokens = fixed + len(rows)
    best, best_rate = 0, tokens / round_s[floor]
    for k in range(1, len(round_s)):
        for i, (alphas, room) in enumerate(rows):
            if k <= room:
                reach[i] *= alphas[k - 1]
                tokens += reach[i]
        rate = tokens / (round_s[max(k, floor)] + debt_per_token * tokens)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


@dataclass(frozen=True)
class Plan:
    """A shape ``AutoK.plan`` chose for the next round: the rows it was chosen for (their ids, in row order), the shape
    (a chain's widest k, or a tree's widths) and the draft debt its choice predicted."""

    rows: tuple[int, ...]
    shape: int | tuple[int, ...]
    debt: float


def shape_depth(shape) -> int:
    """The positions a round of ``shape`` tests: k for a chain of k drafts (an int), the depth of a tree (widths)."""
    return len(shape) if isinstance(shape, tuple) else shape


@dataclass
class RowState:
    """What k=auto keeps about one request (``Sequence.k_state``): decayed per-position evidence and the
    exploration state (see the module docstring)."""

    accepted: list[float] = field(default_factory=list)   # [i]: decayed rounds that accepted position i
    tested: list[float] = field(default_factory=list)     # [i]: decayed rounds that tested position i
    rounds: int = 0                  # the request's rounds seen so far (its Stats.rounds), and its Stats' counts then:
    seen_proposed_total: int = 0
    seen_accepted_total: int = 0
    seen_accepted: list[int] = field(default_factory=list)  # per position
    seen_tested: list[int] = field(default_factory=list)
    last_k: int | None = None        # the k it was given last round (None: none yet)
    hold: int = 0                    # rounds left at k = 0
    next_hold: int = 0               # the length of its next hold (0: min_hold)
    drafting: int = 0                # rounds in a row it has drafted since its last hold
    # tree rounds (``tree="auto"``): w -> [d] decayed rounds that tested / covered depth d with w children per node
    # (w >= 2; w = 1 is the chain's ``accepted`` / ``tested``)
    wide_accepted: dict = field(default_factory=dict)
    wide_tested: dict = field(default_factory=dict)

    def observe(self, stats, decay: float) -> tuple[float, float]:
        """Fold in the rounds ``stats`` counted since the last call: each round first multiplies the evidence by
        ``decay``, then adds what it tested and accepted. Usually one round, whose evidence its proposed and
        accepted counts give. After several (rounds the policy was not asked about, e.g. while the drafter was set
        aside) the old evidence decays once per round and their per-position counts are added as they are."""
        new_rounds = stats.rounds - self.rounds
        if new_rounds <= 0:
            return 0.0, 0.0
        if decay != 1.0:
            factor = decay ** new_rounds
            self._decay(factor)
        n, a = stats.num_draft_last, stats.accepted - self.seen_accepted_total
        if stats.proposed - self.seen_proposed_total == n:      # one round's drafts: n proposed, a accepted
            self._grow(n)
            for i in range(min(a + 1, n)):
                self.tested[i] += 1.0
                self.accepted[i] += i < a
            added = (float(min(a, n)), float(min(a + 1, n)))
        else:                                                     # several rounds' drafts: their per-position sums
            acc, tst = stats.accepted_per_position, stats.tested_per_position
            self._grow(len(tst))
            added = (0.0, 0.0)
            for i, (ai, ti) in enumerate(zip(acc, tst)):
                da = ai - (self.seen_accepted[i] if i < len(self.seen_accepted) else 0)
                dt = ti - (self.seen_tested[i] if i < len(self.seen_tested) else 0)
                self.accepted[i] += da
                self.tested[i] += dt
                added = (added[0] + da, added[1] + dt)
        self.rounds, self.seen_proposed_total, self.seen_accepted_total = stats.rounds, stats.proposed, stats.accepted
        self.seen_accepted, self.seen_tested = list(stats.accepted_per_position), list(stats.tested_per_position)
        return added

    def _decay(self, factor: float) -> None:
        self.accepted = [factor * x for x in self.accepted]
        self.tested = [factor * x for x in self.tested]
        for table in (self.wide_accepted, self.wide_tested):
            for w, row in table.items():
                table[w] = [factor * x for x in row]

    def observe_tree(self, stats, decay: float, widths: tuple[int, ...], depth: int, accepted: int) -> None:
        """Fold in one tree round of ``widths`` that ``stats`` has just counted (``Stats.add_round(depth, accepted)``:
        its tree was ``depth`` deep for this row, ``accepted`` nodes were accepted). Depth d < accepted was covered by
        the widths[d] children of the path's node, depth ``accepted`` (if < depth) was not; the depths after it were
        never tested. The evidence goes to width widths[d] alone: the round says nothing about other widths (a
        success at w = 2 does not say whether the first child alone would have been accepted). Rounds ``stats``
        counted before this one that were not folded in yet are skipped (their evidence is lost, never misread)."""
        self._decay(decay)
        for d in range(min(accepted + 1, depth)):
            w = widths[d]
            if w == 1:
                self._grow(d + 1)
                acc, tst = self.accepted, self.tested
            else:
                acc, tst = self.wide_accepted.setdefault(w, []), self.wide_tested.setdefault(w, [])
                acc += [0.0] * (d + 1 - len(acc))
                tst += [0.0] * (d + 1 - len(tst))
            tst[d] += 1.0
            acc[d] += d < accepted
        self.rounds, self.seen_proposed_total, self.seen_accepted_total = stats.rounds, stats.proposed, stats.accepted
        self.seen_accepted, self.seen_tested = list(stats.accepted_per_position), list(stats.tested_per_position)

    def coverage(self, depth: int, width: int, alpha: float, prior_strength: float) -> float:
        """The estimate that one of ``width`` children per node covers the target's token at ``depth`` (0-based),
        given ``alpha``, this row's chain (width 1) estimate there: the evidence of tree rounds of that width on a
        prior of 1 - (1 - alpha) width^-``COVERAGE_EXPONENT`` (the miss rate of a draft's top-w falls as a power of
        w), and never below ``alpha`` (more children cover at least what the first one does)."""
        if width == 1:
            return alpha
        acc, tst = self.wide_accepted.get(width, ()), self.wide_tested.get(width, ())
        a = acc[depth] if depth < len(acc) else 0.0
        t = tst[depth] if depth < len(tst) else 0.0
        prior = 1.0 - (1.0 - alpha) * width ** -COVERAGE_EXPONENT
        return max((a + prior * prior_strength) / (t + prior_strength), alpha)

    def _grow(self, width: int) -> None:
        if len(self.tested) < width:
            self.accepted += [0.0] * (width - len(self.accepted))
            self.tested += [0.0] * (width - len(self.tested))

    def forget(self) -> None:
        """Drop the evidence (the counts seen so far stay the baseline of the next ``observe``)."""
        self.accepted, self.tested = [], []
        self.wide_accepted, self.wide_tested = {}, {}

    def alphas(self, k_max: int, prior_alpha: float, prior_strength: float) -> list[float]:
        """The acceptance estimate of positions 0..k_max-1 (the prior alone where there is no evidence). Tree rounds
        count too, through the coverage law: w children miss the target's token m w^-x as often as one child
        misses it (m), so a depth's miss rate pools every width's misses over its tests weighted by w^-x. A depth
        only trees have tested thus leaves the prior's optimistic alpha as their rounds come in, and so does every
        width's coverage there (never below alpha)."""
        prior = prior_alpha * prior_strength
        if not self.wide_tested:         # chain evidence alone (every round of a chain policy): one pass, same values
            acc, tst = self.accepted, self.tested          # always of one length (``_grow``)
            n = min(k_max, len(tst))
            return ([(acc[i] + prior) / (tst[i] + prior_strength) for i in range(n)]
                    + [(0.0 + prior) / (0.0 + prior_strength)] * (k_max - n))
        acc, tst, n = self.accepted, self.tested, len(self.tested)
        wides = [(w ** -COVERAGE_EXPONENT, self.wide_accepted[w], t) for w, t in self.wide_tested.items()]
        prior_misses = (1.0 - prior_alpha) * prior_strength
        out = []
        for i in range(k_max):
            accepted, tested = (acc[i], tst[i]) if i < n else (0.0, 0.0)
            misses, weight, wide = tested - accepted + prior_misses, tested + prior_strength, False
            for scale, w_acc, w_tst in wides:
                if i < len(w_tst) and w_tst[i] > 0.0:
                    misses += w_tst[i] - w_acc[i]
                    weight += w_tst[i] * scale
                    wide = True
            out.append(max(0.0, 1.0 - misses / weight) if wide else (accepted + prior) / (tested + prior_strength))
        return out


@dataclass
class AutoK:
    """A ``KPolicy`` for ``Scheduler(k_policy=...)``: ``AutoK(costs)(running, K)`` -> each row's k, from its
    own state (module docstring). Each request's state lives on its ``Sequence`` (``k_state``).

    reference_batch: the batch size whose costs sampled rows are chosen for (None: the table's largest).
    trees: the tree shapes ``decide`` may choose for an all-greedy batch (``tree="auto"``; () = chains only).
    prior_alpha / prior_strength: the optimistic Beta prior of each position's acceptance, worth
    ``prior_strength`` tested rounds. decay: evidence kept per round (memory ~ 1 / (1 - decay) rounds).
    min_hold / max_hold / settle: the exploration back-off. ``last_k`` is the latest round's widest k (each
    row's own is its ``Stats.num_draft_last``).
    """

    costs: CostTable
    reference_batch: int | None = None
    prior_alpha: float = 0.9
    prior_strength: float = 0.5
    decay: float = 0.95
    min_hold: int = 4
    max_hold: int = 32
    settle: int = 4
    round_decay: float = 0.9
    round_memory: int = 64
    last_k: int = 0
    trees: tuple = ()
    probe_horizon: int = 256
    price_probes: bool = True        # False: the greedy rows probe at every hold's end and ignore the draft debt (the
                                     # exploration before the pricing; benchmarks/auto_cost.py's peer)
    greedy_state: RowState = field(default_factory=RowState)   # the greedy rows' shared exploration (its hold fields)
    # () -> (owed prompt tokens per running row, catch-up width) or None: the drafter's ``draft_debt``, set by the
    # scheduler before each round (None: drafting owes nothing)
    debt_source: Callable | None = field(default=None, repr=False, compare=False)
    # measured / predicted seconds of the draft debt (``observe_debt_round``); predicted from the table's draft step
    debt_scale: float = field(default=1.0, init=False, repr=False, compare=False)
    # the greedy rows' pooled acceptance evidence (decayed accepted, tested drafts, every position), which outlives
    # the rows: what the probe pricing believes about the batch's acceptance
    pool_accepted: float = field(default=0.0, init=False, repr=False, compare=False)
    pool_tested: float = field(default=0.0, init=False, repr=False, compare=False)
    # greedy holds that ended in a probe that drafted, and those renewed instead (the probe not worth its price, or
    # the rows' choice from the prior still 0)
    probes: int = field(default=0, init=False, repr=False, compare=False)
    probes_declined: int = field(default=0, init=False, repr=False, compare=False)
    _probe_priced: bool = field(default=False, init=False, repr=False, compare=False)  # a priced probe's first round
    _hold_bucket: int = field(default=-1, init=False, repr=False, compare=False)   # the bucket the greedy hold began at
    _debt_round: float = field(default=0.0, init=False, repr=False, compare=False)  # the chosen round's predicted debt
    # (bucket, k) -> the moving average of measured round seconds (``observe_round``; the greedy rows' costs), and
    # the round count when it was last fed (``_seen``): an average not fed for ``round_memory`` rounds is ignored
    measured_s: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _seen: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _observed: int = field(default=0, init=False, repr=False, compare=False)
    # (batch, k_max) -> the round costs of k = 0..k_max: a CostTable is frozen, and a round's choice would otherwise
    # look up 2 (k_max + 1) interpolated costs on the request path
    _round_s: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # decide's choices so far: shape (a chain's widest k, or a tree's widths) -> rounds (what tree="auto" ran)
    chosen: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # the latest measured rounds (``observe_round``), (batch, shape, measured seconds): what a benchmark reads to see
    # where the table (``table_round``) and the machine disagree (bounded: a server runs for days)
    rounds_log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=ROUNDS_LOG),
                                          init=False, repr=False, compare=False)
    # tree="auto": choose an all-greedy batch's next shape during this round's target pass (``plan`` / ``adopt``)
    plan_ahead: bool = field(default_factory=lambda: PLAN_AHEAD)
    plans_adopted: int = field(default=0, init=False, repr=False, compare=False)
    plans_dropped: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not 0.0 <= self.prior_alpha <= 1.0 or not self.prior_strength > 0:
            raise ValueError(f"AutoK: prior_alpha must be in [0, 1] and prior_strength > 0, got "
                             f"{self.prior_alpha}, {self.prior_strength}")
        if not 0.0 <= self.decay <= 1.0 or not 0.0 <= self.round_decay < 1.0 or self.round_memory < 1:
            raise ValueError(f"AutoK: decay must be in [0, 1], round_decay in [0, 1) and round_memory >= 1, got "
                             f"{self.decay}, {self.round_decay}, {self.round_memory}")
        if not 1 <= self.min_hold <= self.max_hold or self.settle < 1:
            raise ValueError(f"AutoK: need 1 <= min_hold <= max_hold and settle >= 1, got {self.min_hold}, "
                             f"{self.max_hold}, {self.settle}")
        self.trees = tuple(tuple(t) for t in self.trees)
        if any(not t or any(not isinstance(w, int) or w < 1 for w in t) for t in self.trees):
            raise ValueError(f"AutoK: trees must be non-empty widths >= 1, e.g. (2, 2, 1), got {self.trees}")
        if self.probe_horizon < 1:
            raise ValueError(f"AutoK: probe_horizon must be >= 1 token, got {self.probe_horizon}")
        if self.reference_batch is None:
            self.reference_batch = self.costs.batch_sizes[-1]
        elif self.reference_batch < 1:
            raise ValueError(f"AutoK: reference_batch must be >= 1, got {self.reference_batch}")

    def __call__(self, running: list[Sequence], k_max: int) -> list[int]:
        if self._holding(running):
            return [0] * len(running)
        reference = self._rounds(self.reference_batch, k_max)
        ks = [0 if seq.request.greedy else self._choose(seq, k_max, reference) for seq in running]
        greedy = [seq for seq in running if seq.request.greedy]
        if greedy:
            sampled = [(seq, k) for seq, k in zip(running, ks) if not seq.request.greedy]
            round_s = self._measured_rounds(len(running), k_max)
            k_greedy = self._choose_greedy(running, greedy, sampled, k_max, round_s)
            ks = [min(k_greedy, _room(seq, k_max)) if seq.request.greedy else k for seq, k in zip(running, ks)]
        for seq, k in zip(running, ks):
            self.state(seq).last_k = k
        self.last_k = max(ks, default=0)
        return ks

    def decide(self, running: list[Sequence], k_max: int) -> tuple[list[int], tuple[int, ...] | None]:
        """This round's shape (``tree="auto"``, module docstring "Trees"): (each row's k, None) for a chain round
        (k = 0: plain decoding), or (each row's depth, the tree's widths) for a tree round. A tree only when every
        row is greedy: a sampled row's tokens depend on the shape its round drafts, which must not depend on the
        batch, so a batch with sampled rows gets ``__call__``'s chains (each sampled row's k its own)."""
        if self._holding(running):
            self.chosen[0] = self.chosen.get(0, 0) + 1
            return [0] * len(running), None
        if not self.trees or not running or any(not seq.request.greedy for seq in running):
            ks = self(running, k_max)
            self.chosen[max(ks, default=0)] = self.chosen.get(max(ks, default=0), 0) + 1
            return ks, None
        shape = self._choose_greedy_shape(running, k_max, self._measured_rounds(len(running), k_max))
        if isinstance(shape, tuple):
            ks = [min(len(shape), _remaining(seq)) for seq in running]
        else:
            ks = [min(shape, _room(seq, k_max)) for seq in running]
        for seq, k in zip(running, ks):
            self.state(seq).last_k = k
        self.last_k = shape_depth(shape)
        key = shape if isinstance(shape, tuple) else max(ks, default=0)
        self.chosen[key] = self.chosen.get(key, 0) + 1
        return ks, shape if isinstance(shape, tuple) else None

    def plan(self, running: list[Sequence], k_max: int) -> "Plan | None":
        """The next round's shape, chosen now by ``decide`` (the scheduler calls this once this round's target pass
        is launched, so that the choice's host time overlaps the device's; module docstring, "Planned ahead"), or
        None where no plan may stand: ``plan_ahead`` off, a sampled row (its k must not depend on the batch, and
        whether a plan is kept does), a row that may end by its length this round (the next batch would differ), or
        a round that drafts nothing: the drafter's catch-up the next round would pay grows by this round's token,
        which the draft debt (``_debt_seconds``, ``debt_source``) does not yet see while the round runs. A plain
        round's next choice is cheap anyway (inside a hold, ``_holding``) or a probe's, priced at its start."""
        if (not self.plan_ahead or not running or self.last_k == 0
                or any(not seq.request.greedy for seq in running)
                or any(_remaining(seq) <= self.last_k + 1 for seq in running)):
            return None
        debt = self._debt_round             # this round's, which observe_debt_round may still read
        ks, tree = self.decide(running, k_max)
        shape = tree if tree is not None else max(ks, default=0)
        plan = Plan(tuple(map(id, running)), shape, self._debt_round)
        self._debt_round = debt
        return plan

    def adopt(self, plan: "Plan", running: list[Sequence],
              k_max: int) -> tuple[list[int], tuple[int, ...] | None] | None:
        """``plan``'s shape for this round (each row's k cut to its room now, as ``decide`` cuts it), or None if the
        batch is no longer the one it was made for (a row ended, one was admitted): the plan is then dropped and
        uncounted from ``chosen``, and the round is decided afresh."""
        if plan.rows != tuple(map(id, running)):
            self.drop(plan)
            return None
        self.plans_adopted += 1
        self._debt_round = plan.debt
        if isinstance(plan.shape, tuple):
            return [min(len(plan.shape), _remaining(seq)) for seq in running], plan.shape
        return [min(plan.shape, _room(seq, k_max)) for seq in running], None

    def drop(self, plan: "Plan") -> None:
        """Forget ``plan`` (its round was not run as planned): uncounted from ``chosen`` (where this policy counted
        it: a plan of another policy uncounts nothing)."""
        if self.chosen.get(plan.shape, 0) > 0:
            self.chosen[plan.shape] -= 1
            if not self.chosen[plan.shape]:
                del self.chosen[plan.shape]
        self.plans_dropped += 1

    def _holding(self, running: list[Sequence]) -> bool:
        """A round of an all-greedy batch inside the greedy rows' hold, not its last round: k = 0 for every row, with
        O(1) work (no row's state is read: a row's evidence is caught up when it is next asked about, and rounds
        without drafts add none; on the 8B shape at 32 rows the per-row bookkeeping of every plain round was host time
        the device waited for). The pooled evidence decays by one round here (``_decay_pool``, on the other path in
        ``_choose_greedy``). A batch that shrank to a smaller bucket than the hold began at ends the hold now: drafting
        may pay there, and the probe is priced afresh."""
        st = self.greedy_state
        if st.hold <= 1 or not running or any(seq.request.temperature != 0 for seq in running):
            return False
        if self.costs.bucket(len(running)) < self._hold_bucket:
            st.hold = 1                    # the next decrement ends it (``_explore``), with the probe priced there
            return False
        st.hold -= 1
        self._decay_pool()
        self.last_k = 0
        return True

    def _decay_pool(self) -> None:
        self.pool_accepted *= self.decay
        self.pool_tested *= self.decay

    def _choose_greedy_shape(self, greedy: list[Sequence], k_max: int, round_s: list[float]):
        """The all-greedy batch's shape: a chain k (an int, 0 = plain) or a tree of ``self.trees``, the most expected
        tokens per second of the round at the running batch, with the chains' hold and slow start (a tree is a
        round of its depth: after a plain round the next is at most k = 1, then the depth at most doubles). A tree
        only where its rate beats the best chain's (ties: the chain)."""
        batch, deepest = len(greedy), max(len(t) for t in self.trees)

        def best(cap: int):
            chain_cap = min(cap, k_max)
            alphas = [self.alphas(seq, max(chain_cap, deepest)) for seq in greedy]
            remaining = [_remaining(seq) for seq in greedy]
            debt = self._debt_seconds(greedy, greedy)
            per_token = debt / sum(r + 1 for r in remaining)
            shape, rate = _best_joint_rate([(a, min(k_max, r)) for a, r in zip(alphas, remaining)], 0.0, 0,
                                           round_s[:chain_cap + 1], per_token)
            # a tree whose rate loses to the best chain's even if every node were accepted is not worth its
            # coverage estimates (at a large batch a wide pass costs too much: every tree, and the estimates would
            # be most of this round's host work)
            trees, fewest = [], min(remaining)
            for tree, cost in zip(self.trees, self._tree_rounds(batch)):
                if len(tree) <= cap:
                    most = batch * (1 + len(tree)) if fewest >= len(tree) else sum(
                        1 + min(len(tree), r) for r in remaining)
                    if most / (cost + per_token * most) > rate:
                        trees.append((tree, cost))
            for (tree, cost), tokens in zip(trees, self._tree_tokens(greedy, alphas, remaining, trees)):
                tree_rate = tokens / (cost + per_token * tokens)
                if tree_rate > rate:
                    shape, rate = tree, tree_rate
            self._debt_round = debt if shape_depth(shape) > 0 else 0.0
            return shape

        self._decay_pool()
        cap = max(min(max(k_max, deepest), _remaining(seq)) for seq in greedy)
        shape = self._explore(self.greedy_state, cap, greedy, best,
                              lambda: self._probe_pays(greedy, greedy, k_max, round_s, True), len(greedy))
        self.greedy_state.last_k = shape_depth(shape)
        return shape

    def _tree_tokens(self, greedy: list[Sequence], alphas: list[list[float]], remaining: list[int],
                     trees: list[tuple[tuple[int, ...], float]]) -> list[float]:
        """The expected tokens of a round of each of ``trees`` summed over the rows ``greedy`` (each row's E(tree) =
        1 + c_0 + c_0 c_1 + ..., its depth cut to the tokens it may still emit). A row's coverage of a (depth, width)
        is computed once for all the trees that share it: this runs every round, on the host, before the drafts.
        ``remaining``: each row's ``_remaining``; ``trees``: (widths, round cost) pairs. The rows' states are up to
        date (``alphas`` was computed from them this round)."""
        pairs = sorted({(d, w) for tree, _ in trees for d, w in enumerate(tree)})
        index = {pair: i for i, pair in enumerate(pairs)}
        paths = [[index[d, w] for d, w in enumerate(tree)] for tree, _ in trees]
        totals = [0.0] * len(trees)
        for seq, a, room in zip(greedy, alphas, remaining):
            st = seq.k_state
            cov = [st.coverage(d, w, a[d], self.prior_strength) if d < room else 0.0 for d, w in pairs]
            room = max(room, 0)
            for i, path in enumerate(paths):
                reach = tokens = 1.0
                for j in path[:room]:
                    reach *= cov[j]
                    tokens += reach
                totals[i] += tokens
        return totals

    def _fresh(self, key) -> bool:
        """Whether the measured average of ``key`` (bucket, shape) exists and was fed within ``round_memory`` rounds."""
        return key in self.measured_s and self._observed - self._seen[key] <= self.round_memory

    def table_round(self, batch: int, shape) -> float:
        """The table's cost of a round of ``shape`` (a chain's k, or a tree's widths) at ``batch`` rows. A tree:
        its whole round as the table timed it (``CostTable.tree_round``), else its parts: its pass of nodes + 1
        tokens per row, one draft step per depth (a draft model drafts each depth in one batched pass; a wide
        depth's pass costs more at a large batch, which the measured rounds then show) and the round's overhead at
        that width."""
        if not isinstance(shape, tuple):
            return self.costs.round(batch, shape)
        key = (batch, shape)
        if key not in self._round_s:
            timed = self.costs.tree_round(batch, shape)
            tokens = tree_nodes(shape) + 1
            self._round_s[key] = timed if timed is not None else (
                self.costs.target(batch, tokens) + len(shape) * self.costs.draft(batch)
                + self.costs.overhead(batch, tokens))
        return self._round_s[key]

    def _tree_rounds(self, batch: int) -> list[float]:
        """The cost of a round of each of ``self.trees`` at ``batch`` rows: measured where one ran at that bucket
        (``observe_round``); else the table's, scaled as the measured / table of the drafting shape (chain or tree)
        nearest in tokens per row at that bucket, if one ran (as ``_measured_rounds`` prices an unmeasured k)."""
        bucket = self.costs.bucket(batch)

        def width(shape) -> int:
            return tree_nodes(shape) + 1 if isinstance(shape, tuple) else shape + 1

        near = sorted(((width(shape), str(shape), shape) for (b, shape) in self.measured_s if b == bucket
                       and shape_depth(shape) > 0 and self._fresh((b, shape))), key=lambda item: item[:2])
        out = []
        for tree in self.trees:
            if self._fresh((bucket, tree)):
                out.append(self.measured_s[bucket, tree])
                continue
            table = self.table_round(batch, tree)
            if not near:
                out.append(table)
                continue
            tokens = tree_nodes(tree) + 1
            j = min(near, key=lambda item: abs(item[0] - tokens))[2]     # ties: the narrower, then by name
            out.append(table * self.measured_s[bucket, j] / self.table_round(batch, j))
        return out

    def observe_tree(self, running: list[Sequence], widths: tuple[int, ...], depths: list[int],
                     accepted: list[int]) -> None:
        """A tree round of ``widths`` ran over ``running`` (row b: a tree ``depths[b]`` deep, ``accepted[b]`` nodes
        accepted) and each row's Stats counted it: fold its evidence into each row's coverage of those widths
        (``RowState.observe_tree``) instead of the chain estimates, which a tree's acceptance would inflate."""
        for seq, n, a in zip(running, depths, accepted):
            if not isinstance(seq.k_state, RowState):
                seq.k_state = RowState(rounds=seq.stats.rounds - 1)
            seq.k_state.observe_tree(seq.stats, self.decay, widths, n, a)

    def _rounds(self, batch: int, k_max: int) -> list[float]:
        key = (batch, k_max)
        if key not in self._round_s:
            self._round_s[key] = [self.costs.round(batch, k) for k in range(k_max + 1)]
        return self._round_s[key]

    def _measured_rounds(self, batch: int, k_max: int) -> list[float]:
        """The round costs of k = 0..k_max at ``batch`` rows: measured where a round of that (bucket, k) ran; else
        the table's, scaled by measured / table of the nearest measured k at that bucket (one that drafted, for a
        k that drafts, if there is one; k = 0 only by k = 0), so that one slow probe prices the ks it did not
        try too; the table's alone where nothing ran at that bucket."""
        bucket = self.costs.bucket(batch)
        table = self._rounds(batch, k_max)
        measured = {k: self.measured_s[bucket, k] for k in range(k_max + 1) if self._fresh((bucket, k))}
        if not measured:
            return table
        out = []
        for k, t in enumerate(table):
            if k in measured:
                out.append(measured[k])
                continue
            near = [j for j in measured if (j > 0) == (k > 0)] or (list(measured) if k else [])
            if not near:                 # a plain step is never priced by drafting rounds: unknown, it is the table's
                out.append(t)
                continue
            j = min(near, key=lambda j: (abs(j - k), j))
            out.append(t * measured[j] / table[j])
        return out

    def observe_round(self, batch: int, k, seconds: float) -> None:
        """A round of ``batch`` rows whose widest row drafted ``k`` (or a tree round of widths ``k``, a tuple) took
        ``seconds`` (the scheduler's wall time of the round: drafting, the target pass, verification, commit)."""
        if not seconds > 0 or seconds == float("inf"):
            return
        self.rounds_log.append((batch, k, seconds))
        self._observed += 1
        key = (self.costs.bucket(batch), k)
        old = self.measured_s.get(key)
        if old is None or self._observed - self._seen[key] > self.round_memory:
            old = None                   # an average gone stale starts over
        self.measured_s[key] = seconds if old is None else self.round_decay * old + (1 - self.round_decay) * seconds
        self._seen[key] = self._observed

    def state(self, seq: Sequence) -> RowState:
        """``seq``'s state, brought up to date with the rounds its Stats counted since the last call (a greedy row's
        new evidence also goes to the pooled evidence, ``pool_accepted`` / ``pool_tested``)."""
        if not isinstance(seq.k_state, RowState):
            seq.k_state = RowState()
        accepted, tested = seq.k_state.observe(seq.stats, self.decay)
        if tested and seq.request.temperature == 0:
            self.pool_accepted += accepted
            self.pool_tested += tested
        return seq.k_state

    def alphas(self, seq: Sequence, k_max: int) -> list[float]:
        """``seq``'s acceptance estimate at positions 0..k_max-1."""
        return self.state(seq).alphas(k_max, self.prior_alpha, self.prior_strength)

    def _choose(self, seq: Sequence, k_max: int, round_s: list[float]) -> int:
        """Sampled row ``seq``'s own choice: from its state, its position and ``round_s``, the round costs of
        0..k_max drafts at the reference batch."""
        st = self.state(seq)
        return self._explore(st, _room(seq, k_max), [seq],
                             lambda cap: _best_k(st.alphas(cap, self.prior_alpha, self.prior_strength),
                                                 round_s[:cap + 1]))

    def _choose_greedy(self, running: list[Sequence], greedy: list[Sequence], sampled: list[tuple[Sequence, int]],
                       k_max: int, round_s: list[float]) -> int:
        """The greedy rows' one k: the most expected tokens per second of the round at the running batch (``running``,
        in row order; the sampled rows' tokens at their own k, ``sampled``; the round as wide as its widest row; the
        greedy rows' draft debt spread over the tokens they may still emit), never below the sampled rows' widest k."""
        self._decay_pool()
        floor = max((k for _, k in sampled), default=0)
        fixed = sum(expected_tokens(self.alphas(seq, k), k) for seq, k in sampled)

        def best(cap: int, room: bool = True) -> int:
            rows = [(self.alphas(seq, max(cap, floor)), _room(seq, k_max) if room else k_max) for seq in greedy]
            debt = self._debt_seconds(running, greedy, catch_up=floor == 0)
            per_token = debt / sum(_remaining(seq) + 1 for seq in greedy)
            k = _best_joint_rate(rows, fixed, floor, round_s[:max(cap, floor) + 1], per_token)[0]
            self._debt_round = debt if k > 0 else 0.0
            return k

        def roomy(cap: int) -> int:          # the choice were no row ending; this round's predicted debt kept
            debt, k = self._debt_round, best(cap, room=False)
            self._debt_round = debt
            return k

        k = self._explore(self.greedy_state, max(_room(seq, k_max) for seq in greedy), greedy, best,
                          lambda: self._probe_pays(running, greedy, k_max, round_s, floor == 0), len(running), roomy)
        if k or floor or self.greedy_state.hold:   # a zero for ending rows alone keeps the slow start's k
            self.greedy_state.last_k = max(k, floor)
        return max(k, floor)

    def _debt_seconds(self, running: list[Sequence], rows: list[Sequence], catch_up: bool = True) -> float:
        """Seconds of the one-time draft work that making ``rows`` (of ``running``, the drafter's row order) draft
        now would cost (module docstring, "Draft debt"): their owed prompts' prefill, one pass per row, and (with
        ``catch_up``) the batch's catch-up pass, each priced as the table's draft step of as many rows as the pass
        has tokens (``_draft_pass``), times ``debt_scale``."""
        debt = self.debt_source() if self.debt_source is not None and self.price_probes else None
        if debt is None:
            return 0.0
        owed, gap = debt
        if len(owed) != len(running):        # not this batch's rows (a drafter set aside and back): owes unknown
            return 0.0
        mine = set(map(id, rows))
        seconds = sum(self._draft_pass(n) for seq, n in zip(running, owed) if n and id(seq) in mine)
        if catch_up and gap > 0:
            seconds += self._draft_pass(len(running) * gap)
        return self.debt_scale * seconds

    def _draft_pass(self, tokens: int) -> float:
        """The table's price of one draft-model pass of ``tokens`` tokens: its draft step at that many rows (beyond
        the largest batch measured, the slope between the two largest continued: a pass's fixed cost, the weights
        read once, is paid once)."""
        sizes, draft = self.costs.batch_sizes, self.costs.draft_s
        if tokens <= sizes[-1] or len(sizes) == 1:
            return self.costs.draft(tokens)
        slope = max(draft[-1] - draft[-2], 0.0) / (sizes[-1] - sizes[-2])
        return draft[-1] + slope * (tokens - sizes[-1])

    def observe_debt_round(self, batch: int, k, seconds: float) -> None:
        """A round of ``batch`` rows whose widest row drafted ``k`` also ran the drafter's one-time work (a lazy
        prefill, a catch-up) and took ``seconds``: what it cost beyond a round of that k (measured, or the table's)
        against the debt predicted when it was chosen moves ``debt_scale`` (a moving average of the ratio)."""
        predicted, self._debt_round = self._debt_round, 0.0
        if not predicted > 0 or not seconds > 0 or seconds == float("inf") or isinstance(k, tuple) or k < 1:
            return
        key = (self.costs.bucket(batch), k)
        plain = self.measured_s[key] if self._fresh(key) else self.costs.round(batch, k)
        ratio = min(max((seconds - plain) / (predicted / self.debt_scale), 0.05), 20.0)
        self.debt_scale = 0.7 * self.debt_scale + 0.3 * ratio

    def _probe_pays(self, running: list[Sequence], greedy: list[Sequence], k_max: int, round_s: list[float],
                    catch_up: bool) -> bool:
        """Whether a probe of the greedy rows is worth its price now (module docstring, "Exploration"): the seconds
        drafting is expected to save over the tokens the rows may still emit (up to ``probe_horizon`` each),
        averaged over the pooled acceptance belief (a Beta over one i.i.d. acceptance rate), against the draft debt
        the probe pays at once and what its first round (k = 1) loses if drafting loses at the belief's mean."""
        batch, k_top = len(running), min(k_max, len(round_s) - 1)
        if k_top < 1:
            return False
        tokens_left = sum(min(_remaining(seq) + 1, self.probe_horizon) for seq in greedy)
        a = self.pool_accepted + self.prior_alpha * self.prior_strength
        b = self.pool_tested - self.pool_accepted + (1.0 - self.prior_alpha) * self.prior_strength
        plain = round_s[0] / batch                                  # seconds per token of a plain round
        value, weights = 0.0, 0.0
        for alpha, w in _beta_grid(a, b):
            per_token, tokens, reach = plain, 1.0, 1.0
            for k in range(1, k_top + 1):             # E(k) at i.i.d. alpha, built up one position at a time
                reach *= alpha
                tokens += reach
                per_token = min(per_token, round_s[k] / (batch * tokens))
            value += w * (plain - per_token)
            weights += w
        value = tokens_left * value / weights
        mean = a / (a + b)
        first_round_loss = max(round_s[1] - batch * (1.0 + mean) * plain, 0.0)
        return value > self._debt_seconds(running, greedy, catch_up) + first_round_loss

    def _explore(self, st: RowState, cap: int, rows: list[Sequence], best, probe_pays=None, batch: int = 0,
                 roomy=None) -> int:
        """The hold and the slow start (module docstring) on exploration state ``st`` around ``best(cap) -> k``. At a
        hold's end, if ``probe_pays()`` (given: the greedy rows' pricing) says so, or always without it, ``rows``
        forget their evidence (the next round starts over from the prior, with k <= 1: a probe); else the hold is
        renewed, as long as the next one. ``batch``: the running rows (the bucket a hold begins at). ``roomy(cap) ->
        k``: the same choice were every row far from its end; a zero that it does not share is the ending rows' (a
        round whose rows mostly have no room left for drafts) and starts no hold: the estimates still say drafting
        pays for the rows that follow."""
        if cap <= 0:
            return 0
        if not self.price_probes:
            probe_pays = None
        if st.hold > 0:
            st.hold -= 1
            if st.hold == 0:
                if probe_pays is None or probe_pays():
                    for seq in rows:
                        self.state(seq).forget()
                    self._probe_priced = probe_pays is not None
                else:
                    self.probes_declined += 1
                    self._hold(st, batch)
            return 0
        if st.last_k is not None:
            cap = min(cap, max(1, 2 * st.last_k))                       # slow start
        k = best(cap)
        priced = False
        if st is self.greedy_state:
            priced, self._probe_priced = self._probe_priced, False
        if shape_depth(k) > 0:
            st.drafting += 1
            self.probes += priced
            return k
        if roomy is not None and shape_depth(roomy(cap)) > 0:
            return 0
        self.probes_declined += priced          # worth its price from the belief, not from the rows' fresh prior
        if st.drafting >= self.settle or st.next_hold == 0:              # a fall after a run of drafting: start over
            st.next_hold = self.min_hold
        st.drafting = 0
        self._hold(st, batch)
        return 0

    def _hold(self, st: RowState, batch: int) -> None:
        """Start a hold of ``st.next_hold`` rounds and double the next one (up to ``max_hold``)."""
        st.hold, st.next_hold = st.next_hold, min(2 * st.next_hold, self.max_hold)
        if st is self.greedy_state:
            self._hold_bucket = self.costs.bucket(batch)


def _beta_grid(a: float, b: float, points: int = 48) -> list[tuple[float, float]]:
    """(x, Beta(a, b) density at x relative to the largest of them) at the midpoints of ``points`` equal cells of
    (0, 1): relative, so that a sharp belief (much evidence) never underflows to all zeros."""
    xs = [(i + 0.5) / points for i in range(points)]
    logs = [(a - 1) * math.log(x) + (b - 1) * math.log1p(-x) for x in xs]
    top = max(logs)
    return [(x, math.exp(v - top)) for x, v in zip(xs, logs)]


def _room(seq: Sequence, k_max: int) -> int:
    """The most drafts ``seq`` can use this round: K, and no more than the tokens it may still emit - 1."""
    return min(k_max, _remaining(seq))


def _remaining(seq: Sequence) -> int:
    """The tokens ``seq`` may still emit - 1: the most positions a round of it can use."""
    return seq.tokens_left - 1


# ---------------------------------------------------------------------------------- measurement
def default_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The CUDA-graph batch buckets up to ``max_batch_size`` (1, 2, 4, 8, 16, 32, ...), and it."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_batch_size])


def _timed(fn, reps: int, sync) -> float:
    fn()                                   # warm-up (CUDA graph capture, allocator)
    sync()
    best = float("inf")
    for _ in range(reps):                  # the best of reps: the cost the machine can deliver
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.no_grad()
def measure_costs(target, drafter, k_max: int, batch_sizes: tuple[int, ...], *, prompt_len: int = 32,
                  reps: int = 3, trees: tuple = ()) -> CostTable:
    """Time target passes of 1..k_max+1 tokens, one draft step and whole rounds at each batch size on this machine.

    Uses (and leaves in an undefined state) the target's cache and the drafter: call it before the
    ``Scheduler`` is built, which sets both up afresh. Token counts measured: 1, 2, k_max + 1 and a few
    between (linear interpolation fills the rest). With a drafter, ``_round_overheads`` then times whole
    scheduler rounds for the overhead column (``CostTable.overhead_s``); without one it stays zero.
    ``trees`` (``tree="auto"``'s candidates): also the pass of each tree's nodes + 1 tokens, timed as that tree's
    pass (``append_tree``, where the target has one), so that a tree is priced by a measured pass of its width
    and not by extending the chains' slope past a cliff (their overhead column is the widest chain round's); and,
    with a drafter that drafts trees, a whole round of each tree (``_timed_tree_rounds``: ``CostTable.tree_round_s``),
    which is what ``AutoK`` prices a tree by.
    """
    from ..drafters.base import SamplingParams

    device = target.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    chain_tokens = tuple(sorted({1, 2, max(1, (k_max + 2) // 2), k_max + 1}))
    tree_of = {tree_nodes(tuple(t)) + 1: tuple(t) for t in trees}
    tokens = tuple(sorted(set(chain_tokens) | set(tree_of)))
    max_seq_len = prompt_len + (reps + 2) * (max(tokens) + 1) + 8
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    target_rows, draft_row, overhead_rows, tree_rows = [], [], [], []
    time_trees = bool(trees) and drafter is not None and getattr(drafter, "drafts_trees", False)
    for batch in batch_sizes:
        prompts = _repeating_prompts(batch, prompt_len, vocab, gen)
        target.setup_cache(batch, max_seq_len, empty=True)
        if drafter is not None:   # before the admission: a feature head's reserve turns on the states it admits from
            drafter.reserve(target, batch, max_seq_len)
        target.admit(prompts)
        base = target.lengths.clone()

        def one_pass(t):
            fed = torch.randint(0, vocab, (batch, t), generator=gen)
            if t in tree_of and t not in chain_tokens and hasattr(target, "append_tree"):
                parents = (-1,) + tuple(p + 1 for p in full_tree(tree_of[t]))
                target.append_tree(fed, [parents] * batch)
            else:
                target.append(fed)
            target.rollback(base)

        target_rows.append(tuple(_timed(lambda t=t: one_pass(t), reps, sync) for t in tokens))
        if drafter is None:
            draft_row.append(0.0)
            overhead_rows.append((0.0,) * len(tokens))
            continue
        drafter.admit(list(range(batch)), prompts, [p[-1] for p in prompts],
                      SamplingParams.columns((0.0,) * batch, (0,) * batch, (1.0,) * batch, (0,) * batch))

        def one_step():
            drafts = drafter.propose([1] * batch).draft_tokens.tolist()     # [B, <=1]
            drafter.commit([0] * batch, [row[:1] or [0] for row in drafts])   # every draft rejected

        draft_row.append(_timed(one_step, reps, sync))
        parts = CostTable((batch,), tokens, (target_rows[-1],), (draft_row[-1],))
        overhead_rows.append(_round_overheads(target, drafter, k_max, prompts, parts, reps, sync,
                                              warm=device.type == "cuda", forced_tokens=chain_tokens))
        if time_trees:
            tree_rows.append(_timed_tree_rounds(target, drafter, prompts, trees, reps, sync,
                                                warm=device.type == "cuda"))
    return CostTable(tuple(batch_sizes), tokens, tuple(target_rows), tuple(draft_row), tuple(overhead_rows),
                     tuple(tree_rows) if time_trees else None)


def _repeating_prompts(batch: int, prompt_len: int, vocab: int, gen: torch.Generator) -> list[list[int]]:
    """``batch`` prompts of ``prompt_len`` tokens, each a random 8-token phrase repeated: a history that prompt
    lookup finds continuations in (a model drafter does not care), so that measured rounds do draft."""
    phrases = torch.randint(0, vocab, (batch, 8), generator=gen).tolist()
    return [(p * (prompt_len // 8 + 1))[:prompt_len] for p in phrases]


def _round_overheads(target, drafter, k_max: int, prompts: list[list[int]], parts: CostTable, reps: int,
                     sync, warm: bool, forced_tokens: tuple[int, ...] | None = None) -> tuple[float, ...]:
    """overhead_s of one batch size: whole ``Scheduler.step`` rounds, every row's k forced to tokens[j] - 1, the
    best of ``reps`` each, less the round's passes as ``parts`` (this batch's target_s and draft_s) predict them.
    ``warm``: one untimed round first for each k (on a GPU its first round captures the draft loop's graph and
    compiles verification's kernels; the CPU has no such first-call cost, and a round there costs seconds).

    A round is charged for the drafts it ran (its widest row's), which a drafter may cut below the k asked
    (prompt lookup finding no match, its adaptive cap); a token count whose width no timed round ran is
    interpolated between those that ran (constant beyond them). A round measured below its parts (noise, or
    host work that overlapped the device's) counts as no overhead. ``forced_tokens``: the token counts whose
    rounds are timed (default: every one of the table; a tree's wider count is not a chain round to force)."""
    from .scheduler import SchedulerConfig

    batch, tokens = parts.batch_sizes[0], parts.tokens
    timed = forced_tokens if forced_tokens is not None else tokens
    forced = [0]
    max_new = 3 + (reps + 1) * sum(timed)        # more than the rounds below emit (k + 1 per row at most): none ends
    scheduler = _measuring_scheduler(target, drafter, prompts, SchedulerConfig(
        batch, len(prompts[0]) + max_new + k_max + 1, k_max), max_new, lambda running, k: [forced[0]] * len(running))
    best: dict[int, float] = {}                   # drafts the round ran -> its least seconds beyond its passes
    for t in timed:
        forced[0] = t - 1
        if warm:
            scheduler.step()
        for _ in range(reps):
            elapsed = _timed_step(scheduler, sync)
            width = max(seq.stats.num_draft_last for seq in scheduler.running)
            extra = elapsed - parts.target(batch, width + 1) - width * parts.draft(batch)
            best[width] = min(best.get(width, float("inf")), extra)
    widths = sorted(best)
    return tuple(max(_interpolate(widths, [best[w] for w in widths], t - 1), 0.0) for t in tokens)


def _timed_tree_rounds(target, drafter, prompts: list[list[int]], trees: tuple, reps: int, sync,
                       warm: bool) -> tuple[tuple[tuple[int, ...], float], ...]:
    """((widths, seconds), ...): the least of ``reps`` whole ``Scheduler.step`` rounds of each tree of ``trees``
    over ``prompts`` (one row each), as a scheduler of that fixed tree runs them, after its admission and first
    round (and, with ``warm``, one more: on a GPU the first rounds capture the tree's graphs)."""
    from .scheduler import SchedulerConfig

    out = []
    for widths in (tuple(t) for t in trees):
        depth = len(widths)
        max_new = 3 + (reps + 3) * (depth + 1)           # more than the rounds below emit: no row ends
        scheduler = _measuring_scheduler(target, drafter, prompts, SchedulerConfig(
            len(prompts), len(prompts[0]) + max_new + tree_nodes(widths) + 1, depth, tree=widths), max_new)
        if warm:
            scheduler.step()
        out.append((widths, min(_timed_step(scheduler, sync) for _ in range(reps))))
    return tuple(out)


def _measuring_scheduler(target, drafter, prompts: list[list[int]], config, max_new: int, k_policy=None):
    """A ``Scheduler`` of ``config`` running ``prompts`` (ids 0..B-1, as ``measure_costs`` admitted them to the
    drafter: ``OracleDraft`` keys rows by id) for ``max_new`` tokens each, EOS off (a row that met it would leave and
    shrink the measured batch), after its admission and a first round."""
    from .scheduler import Scheduler

    scheduler = Scheduler(target, drafter, config, k_policy=k_policy)
    scheduler.eos = set()
    for b, prompt in enumerate(prompts):
        scheduler.submit(Request(prompt, max_new, id=b))
    scheduler.step()
    return scheduler


def _timed_step(scheduler, sync) -> float:
    """Seconds of one ``scheduler.step()`` (a round), the device synchronized before and after; RuntimeError if a row
    ended in it (the measured batch would have shrunk: the caller's ``max_new`` is too small)."""
    rows = len(scheduler.running)
    sync()
    t0 = time.perf_counter()
    scheduler.step()
    sync()
    elapsed = time.perf_counter() - t0
    if len(scheduler.running) != rows:
        raise RuntimeError(f"measure_costs: a measured row ended early ({len(scheduler.running)} of {rows} rows "
                           "left): increase its max_new_tokens")
    return elapsed


def _interpolate(xs: list[int], ys: list[float], x: float) -> float:
    """ys at x, linear between the ascending points xs, constant beyond them."""
    j = bisect.bisect_left(xs, x)
    if j < len(xs) and xs[j] == x:
        return ys[j]
    if j == 0 or j == len(xs):
        return ys[min(j, len(xs) - 1)]
    return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - xs[j - 1]) / (xs[j] - xs[j - 1])
