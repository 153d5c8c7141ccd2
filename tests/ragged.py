"""One sequence verified alone and inside a larger ragged batch: the batch-independence check.

With per-sequence seeds, a sequence's sampled tokens must depend only on its own (seed, offset,
logits, drafts, sampling parameters), never on the other sequences or its row in the batch
(``verispec.verify.rng``). Shared by the reference and the kernel tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec import verify_sample


@dataclass
class Sequence:
    """One sequence's verification inputs: logits [k+1, V], drafts [k], q [k, V] or None."""

    logits: torch.Tensor
    drafts: torch.Tensor
    q: torch.Tensor | None
    temperature: float
    top_k: int
    top_p: float
    seed: int
    offset: int


def random_sequence(gen: torch.Generator, vocab: int, k: int, with_q: bool, filters: bool = True) -> Sequence:
    """Logits near the drafts' q, so that drafts are often accepted and later rows matter.
    ``filters``: draw top-k / top-p settings too (else both off)."""
    base = torch.randn(k + 1, vocab, generator=gen) * 2
    q = torch.softmax(base[:k], -1)
    logits = base + 0.5 * torch.randn(k + 1, vocab, generator=gen)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1) if k else torch.zeros(0, dtype=torch.long)
    if not with_q:  # point-mass drafts are accepted with probability p(x): make p(x) large
        logits[torch.arange(k), drafts] += 6.0
    pick = lambda options: options[int(torch.randint(len(options), (), generator=gen))]  # noqa: E731
    return Sequence(
        logits, drafts, q if with_q else None,
        temperature=pick([0.0, 0.7, 1.0, 1.0, 1.5]),
        top_k=pick([0, 0, 3, vocab // 2] if filters else [0]), top_p=pick([1.0, 1.0, 0.8] if filters else [1.0]),
        seed=int(torch.randint(-(2**63), 2**63 - 1, (), generator=gen)), offset=int(torch.randint(0, 2**31, (), generator=gen)),
    )


def verify(seqs: list[Sequence], backend: str, device: str):
    """verify_sample on the ragged batch of ``seqs``, with per-sequence seed / offset tensors."""
    with_q = seqs[0].q is not None
    cat = lambda ts: torch.cat(ts).to(device)  # noqa: E731
    return verify_sample(
        cat([s.logits for s in seqs]), cat([s.drafts for s in seqs]), [s.drafts.shape[0] for s in seqs],
        cat([s.q for s in seqs]) if with_q else None,
        temperature=torch.tensor([s.temperature for s in seqs]).to(device),
        top_k=torch.tensor([s.top_k for s in seqs], dtype=torch.int32).to(device),
        top_p=torch.tensor([s.top_p for s in seqs]).to(device),
        seed=torch.tensor([s.seed for s in seqs]).to(device), offset=torch.tensor([s.offset for s in seqs]).to(device),
        backend=backend,
    )


def batch_independence(trials: int, vocab: int, max_k: int, max_others: int, backend: str, device: str,
                       gen_seed: int, filters: bool = True) -> tuple[int, int]:
    """Verifies each trial's random sequence alone and at a random position of a random batch.

    Returns (trials whose tokens differ, drafts accepted in all): the caller checks the first
    and that acceptance runs were exercised.
    """
    gen = torch.Generator().manual_seed(gen_seed)
    accepted = mismatches = 0
    for trial in range(trials):
        with_q = trial % 2 == 0
        k = int(torch.randint(0, max_k + 1, (), generator=gen))
        alone_seq = random_sequence(gen, vocab, k, with_q, filters)
        others = [random_sequence(gen, vocab, int(torch.randint(0, max_k + 1, (), generator=gen)), with_q, filters)
                  for _ in range(int(torch.randint(1, max_others + 1, (), generator=gen)))]
        position = int(torch.randint(0, len(others) + 1, (), generator=gen))
        batch = others[:position] + [alone_seq] + others[position:]
        alone = verify([alone_seq], backend, device)
        inside = verify(batch, backend, device)
        n = int(alone.num_emitted[0])
        same = (int(inside.num_accepted[position]) == int(alone.num_accepted[0])
                and inside.tokens[position, :n].tolist() == alone.tokens[0, :n].tolist()
                and bool((inside.tokens[position, n:] == -1).all()))
        mismatches += not same
        accepted += int(alone.num_accepted[0])
    return mismatches, accepted
