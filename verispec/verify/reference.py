"""The PyTorch reference semantics of verification: the oracle every kernel is tested against.

Readable first, fast never: one Python loop over sequences, one over draft positions.

Vocabulary (used the same way everywhere in verispec):
    accepted   draft tokens the target agrees with (a prefix of each sequence's drafts)
    recovered  the token emitted at the first rejected position, instead of the draft
    bonus      the token emitted after all drafts were accepted, from the extra row
    emitted    accepted + exactly one recovered-or-bonus token: num_emitted = num_accepted + 1

Ragged, flattened layout (B sequences, sequence b proposes k_b >= 0 drafts):
    num_draft      [B]              k_b
    cu_num_draft   [B + 1]          exclusive prefix sum, e.g. num_draft=[2,0,3] -> [0,2,2,5]
    draft_tokens   [sum k_b]        sequence b's drafts at cu_num_draft[b] : cu_num_draft[b+1]
    draft_probs    [sum k_b, V]     the distribution each draft was drawn from (None = point mass)
    target_logits  [sum (k_b+1), V] sequence b's rows start at cu_num_draft[b] + b: k_b rows
                                    scoring its drafts, then one bonus row
    tokens (out)   [B, max_k + 1]   int32: accepted drafts, then the recovered/bonus token, -1 pad

Randomness comes from ``verispec.verify.rng``: sequence b draws with its own key seed[b] and
offset[b], at the *local* row i in [0, k_b] (draft position i, bonus row k_b), so its tokens do
not depend on the other sequences of the batch or on its position in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rng
from .sampling import MIN_TEMPERATURE, filtered_probs
from .status import DEAD_ROW, DRAFT_ID, DRAFT_PROBS, MAX_SCALED_LOGIT, NAN, NUM_DRAFT, POS_INF, SCALED, SETTINGS


@dataclass
class VerifyOutput:
    """Result of verifying one batch.

    tokens:       [B, max_k + 1] int32, emitted tokens left-aligned, padded with -1
    num_accepted: [B] int32, accepted drafts per sequence (0 <= num_accepted <= k_b)
    num_emitted:  [B] int32, num_accepted + 1
    status:       [B] int32, 0 = sequence b's inputs were clean (``verispec.verify.status``); a non-zero
                  word means that sequence's tokens must not be used
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    status: torch.Tensor | None = None


def _race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Sample from unnormalized ``weights`` [..., V] by the exponential race: argmax w_v / E_v.

    If E_v ~ Exp(1) iid, P(argmax = v) = w_v / sum(w): no normalizer and no prefix sum are
    needed, which is what lets a kernel sample in the same pass that reads the row.
    Ties (probability ~0) go to the lowest index, like torch.argmax.
    """
    return torch.argmax(weights / exponentials, dim=-1)


def _stream_keys(value, batch: int, name: str) -> torch.Tensor:
    """``value`` as a CPU [B] int64 tensor; a scalar is refused, as it would silently give every
    sequence the same stream (``verify_sample`` expands a batch seed with rng.sequence_seeds)."""
    is_int = isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex
                                                      or value.dtype == torch.bool)
    if not is_int or value.shape != (batch,):
        got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a [B]={batch} integer tensor (one per sequence), got {got}")
    return value.cpu().to(torch.int64)


def settings_valid(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(settings in range, temperature in range) per sequence, [B] bool each: temperature 0 or finite and
    >= MIN_TEMPERATURE, top_k >= 0, top_p in (0, 1] (the ranges ``sampling.check_*`` enforce on host values)."""
    temperature_ok = (temperature == 0) | (torch.isfinite(temperature) & (temperature >= MIN_TEMPERATURE))
    return temperature_ok & (top_k >= 0) & (top_p > 0) & (top_p <= 1), temperature_ok


def reference_status(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    max_num_draft: int,
    draft_probs: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each sequence's status word (``verispec.verify.status``): [B] int32 on the host.

    The layout is read as the kernels read it, whatever num_draft holds: sequence b's rows start at
    cu_num_draft[b] + b (the prefix sum of num_draft as given), and rows / drafts outside the tensors are
    skipped. temperature / top_k / top_p ([B], None for greedy verification) add SETTINGS and SCALED.

    >>> logits = torch.tensor([[0., 1], [float("nan"), 0], [1, 0]])   # seq 0: one draft + bonus; seq 1: bonus
    >>> reference_status(logits, torch.tensor([5]), torch.tensor([1, 0]), 1).tolist()   # id 5 >= V = 2
    [9, 0]
    """
    logits = target_logits.float().cpu()
    num_rows, vocab = logits.shape
    counts = num_draft.cpu().long()
    drafts = draft_tokens.cpu().long()
    num_drafts_total = drafts.shape[0]
    cu_num_draft = torch.zeros(counts.shape[0] + 1, dtype=torch.long)
    cu_num_draft[1:] = torch.cumsum(counts, 0)
    # One pass settles the usual case: a row's max (NaN-propagating) is finite iff the row has no NaN, no +inf
    # and is not all -inf. Only a batch with a bad row pays the full scans, which name what is wrong. (The
    # engine computes this every round on the CPU: for 9 rows of SmolLM2's 49152 logits, 4.0 ms -> 0.4 ms.)
    row_max = logits.amax(1) if num_rows else logits.new_zeros(0)
    if bool(torch.isfinite(row_max).all()):
        row_bits = torch.zeros(num_rows, dtype=torch.long)
    else:
        nan = torch.isnan(logits)
        row_bits = (torch.where(nan.any(1), NAN, 0) | torch.where(torch.isposinf(logits).any(1), POS_INF, 0)
                    | torch.where(torch.isneginf(logits).all(1), DEAD_ROW, 0))                      # [R]
        row_max = torch.where(nan, float("-inf"), logits).amax(1)
    id_ok = (drafts >= 0) & (drafts < vocab)
    draft_bits = torch.where(id_ok, 0, DRAFT_ID)                                                     # [N]
    if draft_probs is not None:
        q = draft_probs.float().cpu()
        q_x = q.gather(1, drafts.clamp(0, vocab - 1)[:, None]).squeeze(1) if num_drafts_total else q.new_zeros(0)
        q_bad = (torch.isnan(q).any(1) | (q < 0).any(1) | ~((q.sum(1) - 1).abs() <= 1e-2)
                 | (id_ok & ~(q_x > 0)))
        draft_bits |= torch.where(q_bad, DRAFT_PROBS, 0)
    if temperature is not None:
        settings_ok, temperature_ok = settings_valid(temperature.cpu(), top_k.cpu(), top_p.cpu())
        inverse_t = torch.where(temperature_ok & (temperature.cpu() > 0), 1 / temperature.cpu().double(), 0.0)
    # the per-sequence loop reads Python lists: the same values, without a tensor index per element
    row_bits, draft_bits, row_max = row_bits.tolist(), draft_bits.tolist(), row_max.tolist()
    total = int(cu_num_draft[-1])
    if temperature is not None:
        settings_ok, inverse_t = settings_ok.tolist(), inverse_t.tolist()
    words = []
    for b, (k, draft0) in enumerate(zip(counts.tolist(), cu_num_draft.tolist())):
        if total != num_drafts_total or not 0 <= k <= max_num_draft:
            words.append(NUM_DRAFT)
            continue
        rows = [r for r in range(draft0 + b, draft0 + b + k + 1) if 0 <= r < num_rows]
        word = 0
        for r in rows:
            word |= row_bits[r]
        for j in range(max(draft0, 0), min(draft0 + k, num_drafts_total)):
            word |= draft_bits[j]
        if temperature is not None:
            word |= 0 if settings_ok[b] else SETTINGS
            clean = [r for r in rows if row_bits[r] == 0]
            if inverse_t[b] > 0 and any(abs(row_max[r] * inverse_t[b]) > MAX_SCALED_LOGIT for r in clean):
                word |= SCALED
        words.append(word)
    return torch.tensor(words, dtype=torch.int32)


def _unusable(batch: int, max_num_draft: int, status: torch.Tensor, device) -> VerifyOutput:
    """The output of a batch whose layout is wrong (a NUM_DRAFT word): no tokens, only the status."""
    tokens = torch.full((batch, max_num_draft + 1), -1, dtype=torch.int32)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    return VerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device), status.to(device))


def reference_verify_greedy(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor, max_num_draft: int
) -> VerifyOutput:
    """Greedy: accept drafts while they equal the target argmax; then emit the target argmax.

    >>> logits = torch.tensor([[0., 5, 0], [0, 0, 5], [5, 0, 0],   # seq 0: argmax 1, 2, 0
    ...                        [0, 5, 0]])                         # seq 1: argmax 1
    >>> out = reference_verify_greedy(logits, torch.tensor([1, 0]), torch.tensor([2, 0]), 2)
    >>> out.tokens.tolist(), out.num_accepted.tolist(), out.num_emitted.tolist()
    ([[1, 2, -1], [1, -1, -1]], [1, 0], [2, 1])
    """
    batch = num_draft.shape[0]
    status = reference_status(target_logits, draft_tokens, num_draft, max_num_draft)
    if bool((status == NUM_DRAFT).any()):
        return _unusable(batch, max_num_draft, status, target_logits.device)
    tokens = torch.full((batch, max_num_draft + 1), -1, dtype=torch.int32)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    target_argmax = target_logits.float().argmax(dim=-1).cpu()
    drafts = draft_tokens.cpu()
    draft_start = 0
    for b, k in enumerate(num_draft.tolist()):
        row0 = draft_start + b
        accepted = 0
        while accepted < k and int(drafts[draft_start + accepted]) == int(target_argmax[row0 + accepted]):
            tokens[b, accepted] = int(drafts[draft_start + accepted])
            accepted += 1
        tokens[b, accepted] = int(target_argmax[row0 + accepted])
        num_accepted[b] = accepted
        draft_start += k
    device = target_logits.device
    return VerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device), status.to(device))


def _accepted_prefixes(accept: list[bool], cu_num_draft: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B] int32: how many leading drafts of each sequence were accepted (``accept`` per draft, flat)."""
    accepted_list = []
    for start, k in zip(cu_num_draft.tolist(), counts.tolist()):
        accepted = 0
        while accepted < k and accept[start + accepted]:
            accepted += 1
        accepted_list.append(accepted)
    return torch.tensor(accepted_list, dtype=torch.int32)


def _stop_row_weights(p_stop: torch.Tensor, q_draft: torch.Tensor, cu_num_draft: torch.Tensor,
                      counts: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """[B, V] unnormalized weights of each sequence's emitted token: p at the bonus row (every draft
    accepted), else max(0, p - q) at the first rejected row."""
    num_drafts_total = q_draft.shape[0]
    if not num_drafts_total:
        return p_stop
    is_bonus = (num_accepted.long() == counts)[:, None]
    q_stop = q_draft[(cu_num_draft[:-1] + num_accepted).clamp(max=num_drafts_total - 1)]
    residual = torch.clamp(p_stop - q_stop, min=0.0)
    # p != q guarantees mass in the residual; float rounding can still empty it.
    residual = torch.where((residual > 0).any(dim=1, keepdim=True), residual, p_stop)
    return torch.where(is_bonus, p_stop, residual)


def reference_verify_sample(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    max_num_draft: int,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> VerifyOutput:
    """Leviathan et al. rejection sampling, per sequence, with per-sequence T / top-k / top-p.

    For draft position i (target row r, draft token x, draft distribution q, filtered target p):
        accept  iff  u_r * q(x) < p(x)          (u_r from the ACCEPT stream; == u < min(1, p/q);
                                                 the product is formed exactly, in float64)
        else emit a sample of norm(max(0, p - q)) and stop.
    If all k drafts are accepted, emit a sample of p from the bonus row.
    n-gram mode (draft_probs None): q is the point mass at x, so the accept test is u < p(x)
    and the recovery distribution is p with x removed.
    Temperature 0 rows behave exactly as greedy (no randomness used).
    seed, offset: [B] int64, sequence b's Philox key and counter offset (``verispec.verify.rng``);
    u_r is drawn at sequence b's local row i, as is the race of its stop row.

    Three stages: (1) the accept decision of every draft, (2) each sequence's first rejection,
    (3) one sample per sequence from its stop row (recovery or bonus).
    Inputs that make a sequence's status word non-zero give it tokens of no meaning (ids out of range are
    clamped into the vocabulary so that they can be looked up).
    """
    batch = num_draft.shape[0]
    status = reference_status(target_logits, draft_tokens, num_draft, max_num_draft, draft_probs, temperature,
                              top_k, top_p)
    if bool((status == NUM_DRAFT).any()):
        return _unusable(batch, max_num_draft, status, target_logits.device)
    logits = target_logits.float().cpu()
    vocab = logits.shape[1]
    counts = num_draft.cpu().long()
    drafts = draft_tokens.cpu().long().clamp(0, vocab - 1)
    num_drafts_total = drafts.shape[0]
    seq_of_row = torch.repeat_interleave(torch.arange(batch), counts + 1)
    seq_of_draft = torch.repeat_interleave(torch.arange(batch), counts)
    cu_num_draft = torch.zeros(batch + 1, dtype=torch.long)
    cu_num_draft[1:] = torch.cumsum(counts, 0)
    draft_row = torch.arange(num_drafts_total) + seq_of_draft  # draft j of seq b -> row j + b
    greedy_seq = temperature.cpu() == 0
    seed, offset = _stream_keys(seed, batch, "seed"), _stream_keys(offset, batch, "offset")
    pos_in_seq = torch.arange(num_drafts_total) - cu_num_draft[seq_of_draft]  # local row of each draft
    p_all = filtered_probs(logits, temperature[seq_of_row], top_k[seq_of_row], top_p[seq_of_row])

    # (1) accept decisions, one per draft
    p_draft = p_all[draft_row]                                            # [N, V]
    if draft_probs is not None:
        q_draft = draft_probs.float().cpu()
    else:
        q_draft = torch.zeros_like(p_draft)
        q_draft[torch.arange(num_drafts_total), drafts] = 1.0
    p_x = p_draft[torch.arange(num_drafts_total), drafts]
    q_x = q_draft[torch.arange(num_drafts_total), drafts]
    u = rng.uniform(seed[seq_of_draft], offset[seq_of_draft], pos_in_seq, 0, rng.ACCEPT)
    # u * q(x) in float64 is exact (two 24-bit mantissas), so the test has one answer on
    # every backend given the same float32 p(x) and q(x).
    sampled_accept = u.double() * q_x.double() < p_x.double()
    greedy_accept = drafts == p_draft.argmax(dim=1)
    accept = torch.where(greedy_seq[seq_of_draft], greedy_accept, sampled_accept).tolist()

    # (2) first rejection per sequence
    tokens = torch.full((batch, max_num_draft + 1), -1, dtype=torch.int32)
    num_accepted = _accepted_prefixes(accept, cu_num_draft, counts)
    # accepted drafts, left-aligned: draft i of sequence b is kept iff i < num_accepted[b]
    if num_drafts_total:
        kept = pos_in_seq < num_accepted[seq_of_draft]
        tokens[seq_of_draft[kept], pos_in_seq[kept]] = drafts[kept].to(torch.int32)

    # (3) the emitted token, sampled from each sequence's stop row: the bonus row if every
    # draft was accepted (weights p), else the first rejected row (weights max(0, p - q)).
    stop_row = cu_num_draft[:-1] + torch.arange(batch) + num_accepted
    p_stop = p_all[stop_row]
    weights = _stop_row_weights(p_stop, q_draft, cu_num_draft, counts, num_accepted)
    race_u = rng.uniform(seed[:, None], offset[:, None], num_accepted.long()[:, None], torch.arange(vocab)[None, :],
                         rng.RACE)  # the stop row is local row num_accepted
    exponentials = -torch.log(race_u)
    sampled = _race(weights, exponentials)
    emitted = torch.where(greedy_seq, p_stop.argmax(dim=1), sampled)
    tokens[torch.arange(batch), num_accepted.long()] = emitted.to(torch.int32)
    device = target_logits.device
    return VerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device), status.to(device))
