"""``k="auto"``: each round, the number of drafts that maximizes the batch's expected tokens per second.

For a running batch of B rows with live acceptance estimates alpha_b, one round with k drafts per row
emits in expectation sum_b E_SD(alpha_b, k) tokens (``verispec.analysis``) and costs

    cost(B, k) = T_target(B, k + 1 tokens per row) + k * T_draft(B)          (k = 0: one plain decode step)

so the policy picks argmax_k sum_b E_SD(alpha_b, k) / cost(B, k) over k in [0, K] (the smallest k on ties).
One k serves the whole batch: the target pass is as wide as the widest row, so a row given fewer drafts
saves nothing in this model while E_SD only grows with k. k = 0 wins when a wider pass costs more than the
drafts are expected to return, as at large batches where the target pass stops being weight-bandwidth
bound and its time grows with the tokens it scores.

The costs come from a ``CostTable``: measured on this machine at startup (``measure_costs``) or given
(synthetic tables in tests, a saved JSON table between runs).

The acceptance estimate of a request is a Beta-prior-smoothed rate over the draft positions that were
actually *tested*: a round that accepted a of its n drafts tested a + 1 positions when a < n (the first
rejection ends the round) and n when a == n. accepted / proposed would count untested positions after
a rejection as failures and underestimate alpha.
"""
from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass, field

import torch

from ..analysis import expected_tokens_per_round
from .request import Sequence


@dataclass(frozen=True)
class CostTable:
    """Seconds of one target pass and one draft step, by batch size.

    batch_sizes:  ascending measured batch sizes (e.g. the CUDA-graph buckets 1, 2, 4, 8, 16, 32)
    tokens:       ascending tokens per row of the measured target passes (1 = a plain decode step)
    target_s:     target_s[i][j] = one target pass of batch_sizes[i] rows x tokens[j] tokens
    draft_s:      draft_s[i] = one draft step (one token per row) at batch_sizes[i] rows

    A batch between two measured sizes costs as the next larger one (the bucket it runs in); tokens
    between two measured counts interpolate linearly; beyond the table the last entry is extrapolated
    (batch) or the last slope continued (tokens).
    """

    batch_sizes: tuple[int, ...]
    tokens: tuple[int, ...]
    target_s: tuple[tuple[float, ...], ...]
    draft_s: tuple[float, ...]

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

    def _row(self, batch: int) -> int:
        return min(bisect.bisect_left(self.batch_sizes, batch), len(self.batch_sizes) - 1)

    def target(self, batch: int, tokens: int) -> float:
        """Seconds of one target pass of ``batch`` rows x ``tokens`` tokens."""
        row, ts = self.target_s[self._row(batch)], self.tokens
        if len(ts) == 1:
            return row[0]
        j = min(max(bisect.bisect_left(ts, tokens), 1), len(ts) - 1)
        t0, t1 = ts[j - 1], ts[j]
        return max(row[j - 1] + (row[j] - row[j - 1]) * (tokens - t0) / (t1 - t0), 1e-12)

    def draft(self, batch: int) -> float:
        return self.draft_s[self._row(batch)]

    def round(self, batch: int, k: int) -> float:
        """cost(B, k) = T_target(B, k + 1) + k * T_draft(B)."""
        return self.target(batch, k + 1) + k * self.draft(batch)

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> str:
        return json.dumps(dict(batch_sizes=self.batch_sizes, tokens=self.tokens, target_s=self.target_s,
                               draft_s=self.draft_s))

    @staticmethod
    def from_json(text: str) -> "CostTable":
        d = json.loads(text)
        return CostTable(tuple(d["batch_sizes"]), tuple(d["tokens"]), tuple(tuple(r) for r in d["target_s"]),
                         tuple(d["draft_s"]))


def best_k(alphas: list[float], k_max: int, costs: CostTable) -> int:
    """argmax over k in [0, k_max] of sum_b E_SD(alpha_b, k) / cost(B, k); the smallest k on ties."""
    if not alphas:
        return 0
    batch = len(alphas)

    def rate(k: int) -> float:
        return sum(expected_tokens_per_round(a, k) for a in alphas) / costs.round(batch, k)

    return max(range(k_max + 1), key=lambda k: (rate(k), -k))


@dataclass
class _Evidence:
    rounds: int = 0
    accepted: int = 0
    tested: int = 0


@dataclass
class AutoK:
    """A ``KPolicy`` for ``Scheduler(k_policy=...)``: ``AutoK(costs)(running, K)`` -> one k per row (all equal).

    prior_alpha / prior_strength: the Beta prior of each request's acceptance rate, worth
    ``prior_strength`` tested positions. ``last_k`` is the latest choice (also in each row's
    ``Stats.num_draft_last``).
    """

    costs: CostTable
    prior_alpha: float = 0.6
    prior_strength: float = 4.0
    last_k: int = 0
    _seen: dict[int, _Evidence] = field(default_factory=dict)

    def __post_init__(self):
        if not 0.0 <= self.prior_alpha <= 1.0 or not self.prior_strength > 0:
            raise ValueError(f"AutoK: prior_alpha must be in [0, 1] and prior_strength > 0, got "
                             f"{self.prior_alpha}, {self.prior_strength}")

    def alpha(self, seq: Sequence) -> float:
        """The smoothed acceptance estimate of ``seq`` (updated from its Stats since the last call)."""
        ev = self._seen.setdefault(seq.request.id, _Evidence())
        st = seq.stats
        if st.rounds != ev.rounds:      # the scheduler adds one round per row between two policy calls
            n, a = st.num_draft_last, st.accepted - ev.accepted
            ev.tested += a + (1 if a < n else 0)
            ev.rounds, ev.accepted = st.rounds, st.accepted
        return (ev.accepted + self.prior_alpha * self.prior_strength) / (ev.tested + self.prior_strength)

    def __call__(self, running: list[Sequence], k_max: int) -> list[int]:
        alphas = [self.alpha(s) for s in running]
        live = {s.request.id for s in running}
        for rid in [r for r in self._seen if r not in live]:
            del self._seen[rid]
        self.last_k = best_k(alphas, k_max, self.costs)
        return [self.last_k] * len(running)


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
                  reps: int = 3) -> CostTable:
    """Time target passes of 1..k_max+1 tokens and one draft step at each batch size on this machine.

    Uses (and leaves in an undefined state) the target's cache and the drafter: call it before the
    ``Scheduler`` is built, which sets both up afresh. Token counts measured: 1, 2, k_max + 1 and a few
    between (linear interpolation fills the rest).
    """
    from ..drafters.base import SamplingParams

    device = target.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    tokens = tuple(sorted({1, 2, max(1, (k_max + 2) // 2), k_max + 1}))
    max_seq_len = prompt_len + (reps + 2) * (k_max + 2) + 8
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    target_rows, draft_row = [], []
    for batch in batch_sizes:
        prompts = torch.randint(0, vocab, (batch, prompt_len), generator=gen).tolist()
        target.setup_cache(batch, max_seq_len, empty=True)
        target.admit(prompts)
        base = target.lengths.clone()

        def one_pass(t):
            target.append(torch.randint(0, vocab, (batch, t), generator=gen))
            target.rollback(base)

        target_rows.append(tuple(_timed(lambda t=t: one_pass(t), reps, sync) for t in tokens))
        if drafter is None:
            draft_row.append(0.0)
            continue
        drafter.reserve(target, batch, max_seq_len)
        drafter.admit(list(range(batch)), prompts, [p[-1] for p in prompts],
                      SamplingParams.columns((0.0,) * batch, (0,) * batch, (1.0,) * batch, (0,) * batch))

        def one_step():
            drafts = drafter.propose([1] * batch).draft_tokens.tolist()     # [B, <=1]
            drafter.commit([0] * batch, [row[:1] or [0] for row in drafts])   # every draft rejected

        draft_row.append(_timed(one_step, reps, sync))
    return CostTable(tuple(batch_sizes), tokens, tuple(target_rows), tuple(draft_row))
