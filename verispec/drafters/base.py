"""The one small interface every drafter implements, and the helpers drafters share.

A drafter sees each sequence's *history* h_b: its prompt, then every token emitted so far. The
last token of h_b is the round's *certain* token (emitted, but not yet in the target's cache):

    begin(target, prompts, first_tokens, sampling, max_seq_len)   h_b = prompt_b + [first_b]
    propose(k) -> Proposal         up to k drafts continuing each h_b (k_b = 0 is allowed)
    commit(num_accepted, emitted)  h_b += emitted_b (accepted drafts + the recovered/bonus token)
    keep(batch_indices)            only these sequences go on (finished ones stop costing)

``attach(target)`` runs once, when a ``SpeculativeDecoder`` is built: it checks compatibility
(vocabulary, tokenizer) so that bad pairings fail before any work.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..device import to_device
from ..verify.sampling import filtered_probs


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings of one batch (lists of length B, in batch order)."""

    temperature: tuple[float, ...]  # 0 = greedy
    top_k: tuple[int, ...]          # 0 = off
    top_p: tuple[float, ...]        # 1 = off
    seed: int                       # keys the verification stream (verispec.verify.rng) and drafters' generators

    @property
    def all_greedy(self) -> bool:
        return all(t == 0 for t in self.temperature)

    def select(self, batch_indices: list[int]) -> "SamplingParams":
        pick = lambda xs: tuple(xs[i] for i in batch_indices)  # noqa: E731
        return SamplingParams(pick(self.temperature), pick(self.top_k), pick(self.top_p), self.seed)


@dataclass
class Proposal:
    """Drafts for one round.

    draft_tokens: [B, K] int64, any device; row b is valid in [:num_draft[b]], the rest is padding
    num_draft:    B host ints k_b <= K (K = max k_b, may be 0)
    draft_probs:  [sum k_b, V] float32, the distribution q each valid draft was drawn from, rows in
                  (b, i) order; None = point-mass drafts (prompt lookup, oracle)
    """

    draft_tokens: Tensor
    num_draft: list[int]
    draft_probs: Tensor | None = None


class Drafter:
    """Base class: a drafter that never proposes anything (plain decoding). Subclasses override."""

    def attach(self, target) -> None:
        """Check that this drafter can serve ``target``; raise ValueError otherwise."""

    def begin(self, target, prompts: list[list[int]], first_tokens: list[int], sampling: SamplingParams,
              max_seq_len: int) -> None:
        raise NotImplementedError

    def propose(self, k: int) -> Proposal:
        raise NotImplementedError

    def commit(self, num_accepted: list[int], emitted: list[list[int]]) -> None:
        raise NotImplementedError

    def keep(self, batch_indices: list[int]) -> None:
        raise NotImplementedError


def check_same_vocab(target, draft, what: str = "draft model") -> None:
    """Raise a clear ValueError unless ``draft`` scores the same token ids as ``target``."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise ValueError(f"{what} vocab {dv} != target vocab {tv}: the {what} must share the target's "
                         f"tokenizer and vocabulary")
    ttok, dtok = target.tokenizer, draft.tokenizer
    if ttok is not None and dtok is not None and ttok is not dtok:
        tsize, dsize = getattr(ttok, "vocab_size", None), getattr(dtok, "vocab_size", None)
        probe = "Speculative decoding, 2026: 0123456789 ÅÉ!"
        if tsize != dsize or ttok.encode(probe) != dtok.encode(probe):
            raise ValueError(f"{what} tokenizer (vocab {dsize}) differs from the target's (vocab {tsize}): "
                             f"the {what} must use the target's tokenizer")


def draw(logits: Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> tuple[Tensor, Tensor | None]:
    """Draw one token per row of ``logits`` [B, V] under each row's settings.

    Returns (tokens [B] int64, q [B, V] float32 or None). q is the exact distribution each token was
    drawn from (``verispec.verify.sampling.filtered_probs``; one-hot for greedy rows); it is None when every
    row is greedy (greedy verification never reads q).
    """
    if sampling.all_greedy:
        return logits.argmax(dim=-1), None
    q = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # [B, V]
    groups: dict[tuple, list[int]] = {}
    for b, key in enumerate(zip(sampling.temperature, sampling.top_k, sampling.top_p)):
        groups.setdefault(key, []).append(b)
    for (temp, top_k, top_p), rows in groups.items():  # one call per distinct setting, usually one
        idx = to_device(rows, logits.device, torch.long)
        q[idx] = filtered_probs(logits[idx], temp, top_k, top_p)
    # exponential race: argmax q / E with E ~ Exp(1) samples q (one-hot rows give their argmax)
    e = torch.empty_like(q).exponential_(generator=generator)
    return (q / e).argmax(dim=-1), q
