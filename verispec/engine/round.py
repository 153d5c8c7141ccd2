"""One speculative round, as a unit: draft -> ONE target pass -> verification -> commit.

Vocabulary as in ``verispec.verify.reference`` (accepted, recovered, bonus, emitted). For each row b of
the running batch:

    history h_b     prompt + every token emitted so far
    certain token   h_b[-1]: emitted, but not yet in the target's cache
    target cache    holds K/V for exactly h_b[:-1]          (invariant at the start of each round)

One round (the *folded* loop: no separate forward to commit the certain token):

    draft         d_1..d_k = drafter.propose(max_num_draft)      k_b per row, K = max k_b
    target pass   logits = target.append([c, d_1, .., d_K])      [B, K+1, V]; lengths += K+1
                  row i scores d_{i+1}; row k_b is the bonus row -> exactly verify_*'s ragged layout
    verification  num_accepted a_b, then one recovered/bonus token (verify_greedy / verify_sample)
    commit        target.rollback(lengths_before + 1 + a_b)       keeps c, d_1..d_a; the rest is dead
                  emitted = d_1..d_a + [recovered/bonus]; its last token is the next certain token

``RunningBatch`` is the round's explicit state (each row's ``Sequence``: its settings, seed and stream offset;
the certain tokens on the device); ``run_round`` advances it by one round and returns what each row emitted.
Admission, ends and compaction are the scheduler's (verispec/engine/scheduler.py).

Faults stay with their row where the round can tell whose they are (docs/engine.md, "Faults"): a row whose
status word is set (e.g. NaN in its logits) or whose drafter failed (``DraftError``) is reported in
``RoundResult.failed`` and the other rows' outcomes stand, since the target pass, verification and drafting
compute each row from its own data alone. A drafter exception that names no row makes the round run
without drafts (``RoundResult.draft_error``). What cannot be pinned on a row (the target pass raising, a
NUM_DRAFT word: the batch's layout is wrong) raises, and the scheduler fails the whole round.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ..device import to_device
from ..drafters.base import DraftError, Drafter, Proposal, Sampling, SamplingParams, TreeProposal
from ..verify import VerifyOutput, verify_greedy, verify_sample
from ..verify.status import NUM_DRAFT, describe
from .request import Sequence


@dataclass
class RunningBatch:
    """The running rows, in the target cache's row order: one ``Sequence`` per row (its request's settings and
    seed, the rounds it ran: its stream offset) and its certain token on the device. ``extend`` and ``keep``
    change both in one step, and ``sampling`` is derived from the sequences, so a row's state cannot come apart:
    there is no per-row list to re-index by hand."""

    certain: Tensor                      # [B, 1] int64 on the target device: each row's certain token
    seqs: list[Sequence]                 # [B], row b's sequence
    sampling: SamplingParams = field(init=False)   # the rows' settings and seeds as a batch (derived from seqs)

    def __post_init__(self):
        self._set(self.certain, self.seqs)

    def _set(self, certain: Tensor, seqs: list[Sequence]) -> None:
        """The one place that changes the rows: certain tokens, sequences and the derived settings together."""
        if certain.shape[0] != len(seqs):
            raise ValueError(f"RunningBatch: {certain.shape[0]} certain tokens for {len(seqs)} sequences")
        self.certain, self.seqs = certain, seqs
        self.sampling = SamplingParams(tuple(s.request.sampling for s in seqs))

    @property
    def size(self) -> int:
        return len(self.seqs)

    @property
    def offsets(self) -> list[int]:
        """Each row's verification stream offset for this round."""
        return [s.stream_offset for s in self.seqs]

    @staticmethod
    def empty(device) -> "RunningBatch":
        return RunningBatch(torch.zeros(0, 1, dtype=torch.long, device=device), [])

    def extend(self, certain: Tensor, seqs: list[Sequence]) -> None:
        """Append admitted rows (their first token is their certain token): certain [n, 1]."""
        self._set(torch.cat([self.certain, certain]), self.seqs + list(seqs))

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` go on, in this order (host indices: no sync)."""
        self._set(self.certain[to_device(rows, self.certain.device, torch.long)], [self.seqs[r] for r in rows])


@dataclass
class RoundResult:
    """What one round did, per row (host lists), and where its time went (seconds)."""

    num_draft: list[int]
    num_accepted: list[int]              # 0 for a failed row
    emitted: list[list[int]]             # accepted drafts + the recovered/bonus token; [] for a failed row
    phase_s: dict[str, float] = field(default_factory=dict)   # draft, target, verification, commit
    failed: dict[int, str] = field(default_factory=dict)      # row -> why its round failed (its request ends)
    # ("propose" | "commit", the exception): the drafter raised naming no row (after propose the round ran without
    # drafts; after commit its tokens stand)
    draft_error: tuple[str, Exception] | None = None


class PhaseClock:
    """perf_counter timestamps; with ``synchronize`` it waits for the device first, so that GPU phase
    times are exact (at a small cost in throughput)."""

    def __init__(self, device: torch.device, synchronize: bool):
        self.exact = synchronize            # asked for exact phases (no work of one round may run in another's)
        self.sync = synchronize and device.type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def verification(target_logits: Tensor, draft_tokens: Tensor, num_draft: list[int], max_num_draft: int,
                 draft_probs: Tensor | None, sampling: SamplingParams, offsets: list[int],
                 backend: str | None) -> VerifyOutput:
    """verify_greedy when every row is greedy, else verify_sample (greedy rows stay greedy), with each
    row's own seed and stream offset.

    check_values=False: the status is not read back here (that would be a second sync); the caller reads
    ``out.status`` with the round's outcome. num_draft and the settings go as host values (checked and
    cached by the API: no host->device copy for a layout or settings seen before); the seeds and offsets,
    which change every round, in one copy."""
    if sampling.all_greedy:
        return verify_greedy(target_logits, draft_tokens, num_draft, max_num_draft=max_num_draft,
                             check_values=False, backend=backend)
    keys = to_device(torch.tensor([sampling.seed, offsets], dtype=torch.int64), target_logits.device)   # [2, B]
    return verify_sample(
        target_logits, draft_tokens, num_draft, draft_probs, temperature=sampling.temperature,
        top_k=sampling.top_k, top_p=sampling.top_p, seed=keys[0], offset=keys[1],
        max_num_draft=max_num_draft, check_values=False, backend=backend)


def warm_verification(device, dtype, vocab: int, max_batch_size: int, k: int,
                      settings: list[tuple[float, int, float]], backend: str | None) -> None:
    """Run the verification once per batch size 1..max_batch_size, draft count 0..k and (temperature, top_k,
    top_p) setting, on zero logits and its outcome read as a round reads it, so that its kernels are compiled or
    loaded before the first rounds (``Scheduler.warm_up``)."""
    for b in range(1, max_batch_size + 1):
        for num_draft in warm_layouts(b, k):
            n, total = max(num_draft), sum(num_draft)
            for temp, top_k, top_p in settings:
                sampling = SamplingParams((Sampling(float(temp), int(top_k), float(top_p), 0),) * b)
                logits = torch.zeros(total + b, vocab, device=device, dtype=dtype)                # [N + b, V]
                drafts = torch.zeros(total, dtype=torch.long, device=device)                      # [N]
                probs = None if sampling.all_greedy else torch.full((total, vocab), 1.0 / vocab, device=device)
                read_outcome(verification(logits, drafts, num_draft, n, probs, sampling, [0] * b, backend))


def warm_layouts(b: int, k: int) -> list[list[int]]:
    """The draft counts per row ``warm_verification`` runs at batch size b (each at most k). Triton compiles a kernel
    anew for each class of its integer arguments (equal to 1, divisible by 16, neither) and block sizes; the
    verification's are the rows R = N + b, the drafts N and the widest row's width. Uniform counts alone miss
    classes a ragged round meets (one draft among 15 or 31 rows: R = 16 or 32 with N = 1), so beside every uniform
    count this runs every total N that is 1, a multiple of 16, or makes R a multiple of 16, spread over the rows."""
    totals = {b * n for n in range(k + 1)}
    totals |= {N for N in range(1, b * k + 1) if N == 1 or N % 16 == 0 or (N + b) % 16 == 0}
    return [[N // b + (row < N % b) for row in range(b)] for N in sorted(totals)]


def read_outcome(out: VerifyOutput, meanwhile: Callable[[], None] | None = None) -> list[list[int]]:
    """The verification outcome on the host, in the round's ONE device->host read: per row
    [num_accepted, tokens (K + 1)..., status]. A row whose status word (the last entry) is non-zero has
    tokens that mean nothing (``failed_rows``). ``meanwhile()`` is called once the read is queued on a GPU, before
    the host waits for it: work it queues runs after the read, so the wait does not include it."""
    status = out.status if out.status is not None else torch.zeros_like(out.num_accepted)   # a backend without one
    rows = torch.cat([out.num_accepted[:, None], out.tokens, status[:, None]], dim=1)        # [B, K + 3]
    # NOTE: the one host sync per round: the host must learn how many tokens each row emitted (EOS / stop /
    # length checks, the drafter's history, streaming) -- and whether it may use them.
    if meanwhile is None or rows.device.type != "cuda":
        if meanwhile is not None:
            meanwhile()
        return rows.cpu().tolist()
    host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
    host.copy_(rows, non_blocking=True)
    read = torch.cuda.Event()
    read.record()
    meanwhile()
    read.synchronize()
    return host.tolist()


def prelaunched(drafter: Drafter | None, out, certain_before: Tensor, num_draft: list[int],
                next_shape: Callable[[], int | tuple[int, ...] | None] | None, clock: PhaseClock,
                draft_error: tuple | None) -> tuple[list[list[int]], tuple | None]:
    """``read_outcome(out)`` of a chain or tree round, with the next round's drafts launched meanwhile when
    ``next_shape()`` names that round's shape (``Drafter.prelaunch``; not in a round whose drafter failed, nor
    when the phases are timed: the next round's drafting would run inside this one's). -> (the outcome,
    draft_error): a prelaunch that raises names no row; this round's tokens stand and the scheduler sets the
    drafter aside."""
    errors: list[tuple[str, Exception]] = []

    def prelaunch() -> None:
        shape = next_shape()
        if not shape:
            return
        tail = torch.cat([certain_before, out.tokens.to(torch.long)], dim=1)                # [B, D + 2]
        try:
            drafter.prelaunch(shape, num_draft, out.num_accepted, tail)
        except Exception as e:  # noqa: BLE001 - names no row: this round's tokens stand, the scheduler decides
            errors.append(("prelaunch", e))

    launch = next_shape is not None and drafter is not None and draft_error is None and not clock.exact
    outcome = read_outcome(out, prelaunch if launch else None)
    return outcome, draft_error or (errors[0] if errors else None)


def failed_rows(outcome: list[list[int]], what: str) -> dict[int, str]:
    """Row -> reason for every row of ``read_outcome``'s ``outcome`` whose status word is set: emitting its
    tokens would be silently wrong, while the other rows' tokens are exact (each row is verified from its
    own logits rows, drafts and stream alone). A NUM_DRAFT word means the batch's layout is wrong, so no row
    can be trusted: RuntimeError. ``what`` names the logits (e.g. "this round's target logits")."""
    words = [row[-1] for row in outcome]
    if any(w & NUM_DRAFT for w in words):
        bad = [b for b, w in enumerate(words) if w & NUM_DRAFT]
        raise RuntimeError(f"verification refused the batch's layout (rows {bad[:5]}): {describe(NUM_DRAFT)[0]}")
    return {b: f"verification refused {what}: " + "; ".join(describe(w)) for b, w in enumerate(words) if w}


def proposal_and_faults(propose: Callable[[], Proposal | TreeProposal]
                        ) -> tuple[Proposal | TreeProposal | None, dict[int, str], tuple | None]:
    """``propose()`` (the drafter's propose, or propose_tree for a tree round), with its faults sorted by owner:
    (the proposal, or None for a round without drafts; failed rows -> reason; ("propose", an exception that
    names no row))."""
    try:
        return propose(), {}, None
    except DraftError as e:
        return e.proposal, {b: f"drafter: {why}" for b, why in e.failed.items()}, None
    except Exception as e:  # noqa: BLE001 - no row to blame: this round runs without drafts (the scheduler decides)
        return None, {}, ("propose", e)


def commit_outcome(drafter: Drafter | None, batch: RunningBatch, outcome: list[list[int]], failed: dict[int, str],
                   draft_error: tuple | None) -> tuple[list[int], list[list[int]], tuple | None]:
    """The commit phase of a chain or tree round, from ``read_outcome``'s ``outcome``: (num_accepted, emitted,
    draft_error) per row -- 0 and [] for a failed row -- after each row's ``rounds_done`` and the drafter's commit.
    A ``DraftError`` of the commit adds its rows to ``failed`` (in place); an exception that names no row becomes
    ``draft_error`` (unless one is set): the tokens stand, the scheduler sets the drafter aside."""
    num_accepted = [0 if b in failed else row[0] for b, row in enumerate(outcome)]
    emitted = [[] if b in failed else row[1: a + 2] for b, (row, a) in enumerate(zip(outcome, num_accepted))]
    for seq in batch.seqs:
        seq.rounds_done += 1
    if drafter is not None:
        try:
            drafter.commit(num_accepted, emitted)
        except DraftError as e:
            failed.update((b, f"drafter: {why}") for b, why in e.failed.items() if b not in failed)
        except Exception as e:  # noqa: BLE001 - names no row: the tokens stand, the scheduler sets the drafter aside
            draft_error = draft_error or ("commit", e)
    return num_accepted, emitted, draft_error


def _ragged(logits: Tensor, draft_tokens: Tensor, num_draft: list[int]) -> tuple[Tensor, Tensor]:
    """The verification layout of a padded round: k_b + 1 logits rows and k_b drafts of each row.
    e.g. K=2, num_draft=[2,0,1]: logits rows [0,1,2, 3, 6,7], drafts [0,1, 4] (host indices: no sync)."""
    width = draft_tokens.shape[1]
    flat_logits, flat_drafts = logits.flatten(0, 1), draft_tokens.flatten()      # [B*(K+1), V], [B*K]
    if all(n == width for n in num_draft):
        return flat_logits, flat_drafts
    rows = [b * (width + 1) + i for b, n in enumerate(num_draft) for i in range(n + 1)]
    cols = [b * width + i for b, n in enumerate(num_draft) for i in range(n)]
    device = logits.device
    return flat_logits[to_device(rows, device, torch.long)], flat_drafts[to_device(cols, device, torch.long)]


def run_round(target, drafter: Drafter | None, batch: RunningBatch, max_num_draft: list[int],
              clock: PhaseClock, backend: str | None = None, launched: Callable[[], None] | None = None,
              next_shape: Callable[[], int | tuple[int, ...] | None] | None = None) -> RoundResult:
    """Advance every row of ``batch`` by one round; ``max_num_draft[b]`` caps row b's drafts (0 = plain
    decoding for that row). Updates ``batch`` (certain tokens), the target cache and the
    drafter, each row's ``rounds_done``; returns what each row emitted. Exactly one device->host read (the
    outcome). ``launched()``, if given, is called once the target pass is launched (``Scheduler.launched_hook``).
    ``next_shape()``, if given and the phases are not timed, is the next round's shape (k for every row, or a tree's
    widths) if the scheduler knows it now (else None): the drafter then launches that round's drafts before the host
    reads this one's outcome (``prelaunched``)."""
    device = batch.certain.device
    certain_before = batch.certain                                                          # [B, 1]
    t0 = clock.now()
    proposal, failed, draft_error = None, {}, None
    if drafter is not None and max(max_num_draft, default=0) > 0:
        proposal, failed, draft_error = proposal_and_faults(lambda: drafter.propose(max_num_draft))
    if proposal is not None:
        num_draft = [0 if b in failed else min(n, m)
                     for b, (n, m) in enumerate(zip(proposal.num_draft, max_num_draft))]
        draft_tokens = to_device(proposal.draft_tokens, device, torch.long)                 # [B, K]
        draft_probs = None if proposal.draft_probs is None else to_device(proposal.draft_probs, device)
        if num_draft != list(proposal.num_draft) and draft_probs is not None:
            raise RuntimeError("drafter proposed more drafts than asked for (or drafts for a failed row) along "
                               "with draft_probs")
    else:
        num_draft, draft_probs = [0] * batch.size, None
        draft_tokens = batch.certain[:, :0]                                                 # [B, 0]
    width = draft_tokens.shape[1]                                                           # K
    t1 = clock.now()
    tokens = torch.cat([batch.certain, draft_tokens], dim=1) if width else batch.certain    # [B, K+1]
    logits = target.append(tokens)                                                          # [B, K+1, V]
    if launched is not None:
        launched()
    t2 = clock.now()
    flat_logits, flat_drafts = _ragged(logits, draft_tokens, num_draft)
    out = verification(flat_logits, flat_drafts, num_draft, width, draft_probs, batch.sampling, batch.offsets,
                       backend)
    # lengths after the pass = before + K + 1; keep the certain token + the accepted drafts (all of them
    # when there were none). A failed row's length is meaningless, and it leaves at the next retire.
    if width:
        target.rollback(target.lengths - width + out.num_accepted.to(torch.long))
    # launched before the sync below, so it runs while the host waits
    batch.certain = out.tokens.gather(1, out.num_accepted[:, None].to(torch.long)).to(torch.long)  # [B, 1]
    outcome, draft_error = prelaunched(drafter, out, certain_before, num_draft, next_shape, clock, draft_error)
    failed.update(failed_rows(outcome, "this round's target logits"))
    t3 = clock.now()
    num_accepted, emitted, draft_error = commit_outcome(drafter, batch, outcome, failed, draft_error)
    t4 = clock.now()
    phases = dict(draft=t1 - t0, target=t2 - t1, verification=t3 - t2, commit=t4 - t3)
    return RoundResult(num_draft, num_accepted, emitted, phases, failed, draft_error)
