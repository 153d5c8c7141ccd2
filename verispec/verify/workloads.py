"""Synthetic verification workloads with a known answer (tests and benchmarks).

greedy_workload: random target logits whose argmax is unambiguous (a margin of 2 above the
rest), and drafts that equal the target argmax with probability alpha at each position,
otherwise a different token. The exact verification result is known by construction.

sampling_workload: target p and draft q built so that the per-position acceptance probability
sum_v min(p_v, q_v) equals alpha exactly:
    q   supported on the first half of the vocabulary (random weights),
    r   supported on the second half,
    p = alpha * q + (1 - alpha) * r,    so min(p, q) = alpha * q and sum_v min(p_v, q_v) = alpha.
Drafts are sampled from q. With ``draft_probs=False`` (n-gram mode, q = point mass at x) the
draft x is chosen with p(x) = alpha instead. In both modes accepted tokens per sequence follow
P(a >= i) = alpha^i, so E[num_accepted] = sum_{i=1..k} alpha^i (``analysis.expected_accepted``).

All tensors are generated on ``device`` in a vectorized way, so benchmark-size workloads
(B=256, K=8, V=151936) are cheap to build on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .reference import VerifyOutput


@dataclass
class Workload:
    """One verification batch in the ragged layout of ``verispec.verify.reference``.

    target_logits: [sum(k_b + 1), V]     draft_tokens: [sum(k_b)] int64     num_draft: [B] int32
    draft_probs:   [sum(k_b), V] or None
    expected:      the exact VerifyOutput (greedy workloads), None for sampling workloads
    acceptance_rate: the per-position acceptance probability alpha the workload was built for
    """

    target_logits: torch.Tensor
    draft_tokens: torch.Tensor
    num_draft: torch.Tensor
    draft_probs: torch.Tensor | None
    expected: VerifyOutput | None
    acceptance_rate: float

    @property
    def batch_size(self) -> int:
        return self.num_draft.shape[0]


def _num_draft(batch_size: int, num_draft: int | Sequence[int]) -> torch.Tensor:
    if isinstance(num_draft, int):
        if num_draft < 0:
            raise ValueError(f"num_draft must be >= 0, got {num_draft}")
        return torch.full((batch_size,), num_draft, dtype=torch.int32)
    counts = torch.tensor(list(num_draft), dtype=torch.int32)
    if counts.shape[0] != batch_size:
        raise ValueError(f"num_draft has {counts.shape[0]} entries for batch_size={batch_size}")
    if bool((counts < 0).any()):
        raise ValueError("num_draft entries must be >= 0")
    return counts


def _check(batch_size: int, vocab_size: int, acceptance_rate: float) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if not 0.0 <= acceptance_rate <= 1.0:
        raise ValueError(f"acceptance_rate must be in [0, 1], got {acceptance_rate}")


def _draft_rows(counts: torch.Tensor, device) -> torch.Tensor:
    """Target row index of every draft in the ragged layout: draft j of sequence b -> row j + b."""
    seq_of_draft = torch.repeat_interleave(torch.arange(counts.shape[0]), counts.long())
    return (torch.arange(seq_of_draft.shape[0]) + seq_of_draft).to(device)


def greedy_workload(
    batch_size: int,
    num_draft: int | Sequence[int],
    vocab_size: int,
    acceptance_rate: float,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Workload:
    """Greedy workload with its exact answer (see module docstring)."""
    _check(batch_size, vocab_size, acceptance_rate)
    counts = _num_draft(batch_size, num_draft)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_rows = int(counts.sum()) + batch_size
    logits = torch.randn(num_rows, vocab_size, generator=gen, device=device)
    target_token = torch.randint(0, vocab_size, (num_rows,), generator=gen, device=device)
    # A margin of 2 keeps the argmax unique after rounding to bf16/fp16.
    top = logits.max(dim=1).values + 2.0
    logits[torch.arange(num_rows, device=device), target_token] = top
    draft_row = _draft_rows(counts, device)
    match = torch.rand(draft_row.shape[0], generator=gen, device=device) < acceptance_rate
    shift = torch.randint(1, vocab_size, draft_row.shape, generator=gen, device=device)
    wrong = (target_token[draft_row] + shift) % vocab_size
    draft_tokens = torch.where(match, target_token[draft_row], wrong).to(torch.int64)
    expected = _greedy_answer(counts, draft_tokens.cpu(), match.cpu(), target_token.cpu(), device)
    return Workload(logits.to(dtype), draft_tokens, counts.to(device), None, expected, acceptance_rate)


def _greedy_answer(counts, draft_tokens, match, target_token, device) -> VerifyOutput:
    batch = counts.shape[0]
    max_k = int(counts.max())
    tokens = torch.full((batch, max_k + 1), -1, dtype=torch.int32)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    draft_start = 0
    for b, k in enumerate(counts.tolist()):
        row0 = draft_start + b
        seq_match = match[draft_start : draft_start + k].tolist() + [False]
        accepted = seq_match.index(False)
        tokens[b, :accepted] = draft_tokens[draft_start : draft_start + accepted].to(torch.int32)
        tokens[b, accepted] = int(target_token[row0 + accepted])
        num_accepted[b] = accepted
        draft_start += k
    return VerifyOutput(tokens.to(device), num_accepted.to(device), (num_accepted + 1).to(device))


def sampling_workload(
    batch_size: int,
    num_draft: int | Sequence[int],
    vocab_size: int,
    acceptance_rate: float,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    draft_probs: bool = True,
) -> Workload:
    """Sampling workload whose per-position acceptance probability is exactly ``acceptance_rate``.

    Logits are log p (temperature 1, no top-k/top-p, reproduces p exactly up to rounding).
    """
    _check(batch_size, vocab_size, acceptance_rate)
    counts = _num_draft(batch_size, num_draft)
    gen = torch.Generator(device=device).manual_seed(seed)
    num_rows = int(counts.sum()) + batch_size
    half = vocab_size // 2
    alpha = acceptance_rate
    weights_q = torch.rand(num_rows, vocab_size, generator=gen, device=device) + 0.05
    weights_r = torch.rand(num_rows, vocab_size, generator=gen, device=device) + 0.05
    in_first = torch.arange(vocab_size, device=device) < half
    q_full = torch.where(in_first, weights_q, 0.0)
    q_full = q_full / q_full.sum(dim=1, keepdim=True)
    r_full = torch.where(in_first, 0.0, weights_r)
    r_full = r_full / r_full.sum(dim=1, keepdim=True)
    draft_row = _draft_rows(counts, device)
    if draft_probs:
        p = alpha * q_full + (1 - alpha) * r_full
        q = q_full[draft_row]
        draft_tokens = torch.multinomial(q, 1, generator=gen).squeeze(1) if q.shape[0] else torch.zeros(0, dtype=torch.int64, device=device)
    else:
        # Point-mass drafts: token 0 (in the first half) gets p = alpha; the rest of p spread by r.
        point = torch.zeros(num_rows, vocab_size, device=device)
        point[:, 0] = 1.0
        p = alpha * point + (1 - alpha) * r_full
        q = None
        draft_tokens = torch.zeros(draft_row.shape[0], dtype=torch.int64, device=device)
    # log(0) = -inf for tokens p cannot produce; verification must never emit them.
    logits = torch.log(p)
    return Workload(logits.to(dtype), draft_tokens.to(torch.int64), counts.to(device), q, None, alpha)
