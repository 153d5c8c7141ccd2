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

Randomness comes from ``verispec.rng`` keyed by ``(seed, offset)``; row indices in the stream
are the target_logits row indices above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import rng
from .sampling import filtered_probs


@dataclass
class VerifyOutput:
    """Result of verifying one batch.

    tokens:       [B, max_k + 1] int32, emitted tokens left-aligned, padded with -1
    num_accepted: [B] int32, accepted drafts per sequence (0 <= num_accepted <= k_b)
    num_emitted:  [B] int32, num_accepted + 1
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor


def _race(weights: torch.Tensor, seed: int, offset: int, row: int) -> int:
    """Sample from unnormalized ``weights`` [V] by the exponential race: argmax w_v / E_v.

    If E_v ~ Exp(1) iid, P(argmax = v) = w_v / sum(w): no normalizer and no prefix sum are
    needed, which is what lets a kernel sample in the same pass that reads the row.
    Ties (probability ~0) go to the lowest index, like torch.argmax.
    """
    vocab = weights.shape[0]
    u = rng.uniform(seed, offset, row, torch.arange(vocab), rng.RACE)
    keys = weights / -torch.log(u)
    return int(torch.argmax(keys))


def reference_verify_greedy(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor, max_num_draft: int
) -> VerifyOutput:
    """Greedy: accept drafts while they equal the target argmax; then emit the target argmax."""
    batch = num_draft.shape[0]
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
    return VerifyOutput(tokens.to(target_logits.device), num_accepted.to(target_logits.device),
                        (num_accepted + 1).to(target_logits.device))


def reference_verify_sample(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    max_num_draft: int,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: int,
    offset: int,
) -> VerifyOutput:
    """Leviathan et al. rejection sampling, per sequence, with per-sequence T / top-k / top-p.

    For draft position i (target row r, draft token x, draft distribution q, filtered target p):
        accept  iff  u_r * q(x) < p(x)          (u_r from the ACCEPT stream; == u < min(1, p/q))
        else emit a sample of norm(max(0, p - q)) and stop.
    If all k drafts are accepted, emit a sample of p from the bonus row.
    n-gram mode (draft_probs None): q is the point mass at x, so the accept test is u < p(x)
    and the recovery distribution is p with x removed.
    Temperature 0 rows behave exactly as greedy (no randomness used).
    """
    batch = num_draft.shape[0]
    tokens = torch.full((batch, max_num_draft + 1), -1, dtype=torch.int32)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    logits = target_logits.float().cpu()
    drafts = draft_tokens.cpu()
    probs_q = draft_probs.float().cpu() if draft_probs is not None else None
    draft_start = 0
    for b, k in enumerate(num_draft.tolist()):
        row0 = draft_start + b
        temp, kk, pp = float(temperature[b]), int(top_k[b]), float(top_p[b])
        emitted = None
        accepted = 0
        for i in range(k + 1):
            row = row0 + i
            p = filtered_probs(logits[row], temp, kk, pp)
            if i == k:  # bonus row
                emitted = int(p.argmax()) if temp == 0 else _race(p, seed, offset, row)
                break
            x = int(drafts[draft_start + i])
            if temp == 0:
                target_token = int(p.argmax())
                if x == target_token:
                    tokens[b, i] = x
                    accepted += 1
                    continue
                emitted = target_token
                break
            if probs_q is not None:
                q = probs_q[draft_start + i]
            else:
                q = torch.zeros_like(p)
                q[x] = 1.0
            u = float(rng.uniform(seed, offset, row, 0, rng.ACCEPT))
            if u * float(q[x]) < float(p[x]):
                tokens[b, i] = x
                accepted += 1
                continue
            residual = torch.clamp(p - q, min=0.0)
            # p != q guarantees mass in the residual; float rounding can still empty it.
            emitted = _race(residual if bool((residual > 0).any()) else p, seed, offset, row)
            break
        tokens[b, accepted] = emitted
        num_accepted[b] = accepted
        draft_start += k
    device = target_logits.device
    return VerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device))
