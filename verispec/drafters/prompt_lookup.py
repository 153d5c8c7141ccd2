"""``PromptLookup``: draft by copying what followed the most recent earlier occurrence of the
history's last n tokens (n from ``max_ngram`` down to ``min_ngram``). No model, no device work.

Index: for every n, ``last_start[n][ngram]`` = start of the most recent occurrence of ``ngram`` that
has at least one token after it. Appending token h[i] registers the n-grams ending at h[i-1]
(their continuation h[i] now exists), so a lookup of the tail never finds the tail itself.
e.g. h = [5 6 7 5 6], n=2: tail (5, 6) -> start 0 -> drafts h[2:2+k] = [7, 5, 6][:k].
No match -> 0 drafts: that sequence's round is a plain decode step (floor ~ the baseline).

Adaptive length (``adaptive=True``): a verify pass costs more with more tokens (a lot more on CPUs,
a little on GPUs), so each sequence proposes at most ``cap_b`` drafts: after a round that accepted
a of its drafts, cap_b = a + 1 if some were rejected, else min(k, 2 * cap_b). A copy run grows the
cap quickly; a junk match costs one wasted draft, not k. After two rounds in a row with no draft
accepted the sequence also pauses drafting for 1, 2, 4, .. (at most 8) rounds, so free-form text,
where tail n-grams match often but predict badly, falls back to plain decode steps (the floor is the
baseline); one miss alone does not pause (in a list, "\n- " predicts the previous item once, then
the longer tail matches).
"""
from __future__ import annotations

import torch

from .base import DraftError, Drafter, Proposal, each_row


class _History:
    def __init__(self, tokens: list[int], min_ngram: int, max_ngram: int):
        self.tokens: list[int] = []
        self.ngrams = range(min_ngram, max_ngram + 1)
        self.last_start: dict[int, dict[tuple, int]] = {n: {} for n in self.ngrams}
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        h = self.tokens
        for t in new:
            i = len(h)
            for n in self.ngrams:
                if i - n >= 0:
                    self.last_start[n][tuple(h[i - n:i])] = i - n
            h.append(t)

    def lookup(self, k: int, max_ngram: int, min_ngram: int) -> list[int]:
        h = self.tokens
        for n in range(min(max_ngram, len(h) - 1), min_ngram - 1, -1):
            start = self.last_start[n].get(tuple(h[-n:]))
            if start is not None:
                return h[start + n:start + n + k]
        return []


class PromptLookup(Drafter):
    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, num_pred_tokens: int | None = None,
                 adaptive: bool = True):
        for name, v in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"PromptLookup: {name} must be an integer, got {v!r}")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"PromptLookup: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_pred_tokens is not None and num_pred_tokens < 1:
            raise ValueError(f"PromptLookup: num_pred_tokens must be >= 1, got {num_pred_tokens}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_pred_tokens = num_pred_tokens   # cap on drafts per round (None = the engine's k)
        self.adaptive = adaptive
        self._hist: list[_History] = []
        self._cap: list[int] = []                # adaptive per-sequence cap (see the module docstring)
        self._last: list[int] = []               # drafts proposed to each sequence in the last round
        self._pause: list[int] = []              # rounds left without drafting (adaptive back-off)
        self._misses: list[int] = []             # rounds in a row with nothing accepted

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        self._hist, self._cap, self._last, self._pause, self._misses = [], [], [], [], []

    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        self._hist += [_History(p + [t], self.min_ngram, self.max_ngram) for p, t in zip(prompts, first_tokens)]
        n = len(prompts)
        self._cap += [1 << 30] * n
        self._last += [0] * n
        self._pause += [0] * n
        self._misses += [0] * n

    def propose(self, max_num_draft: list[int]) -> Proposal:
        limit = [k if self.num_pred_tokens is None else min(k, self.num_pred_tokens) for k in max_num_draft]
        caps = [min(k, 0 if p else c) for k, c, p in zip(limit, self._cap, self._pause)] if self.adaptive else limit
        self._pause = [max(p - 1, 0) for p in self._pause]
        drafts, failed = each_row(
            lambda b: self._hist[b].lookup(caps[b], self.max_ngram, self.min_ngram) if caps[b] else [], len(caps))
        drafts = [d or [] for d in drafts]                  # a failed row proposes nothing
        num_draft = [len(d) for d in drafts]
        self._last = num_draft
        width = max(num_draft, default=0)
        padded = [d + [0] * (width - len(d)) for d in drafts]
        proposal = Proposal(torch.tensor(padded, dtype=torch.long).reshape(len(drafts), width), num_draft, None)
        if failed:
            raise DraftError(failed, proposal)
        return proposal

    def _commit_row(self, b: int, num_accepted: int, emitted: list[int]) -> None:
        self._hist[b].extend(emitted)
        proposed = self._last[b]
        if proposed:
            self._cap[b] = min(2 * self._cap[b], 1 << 30) if num_accepted == proposed else num_accepted + 1
            self._misses[b] = self._misses[b] + 1 if num_accepted == 0 else 0
            if self._misses[b] >= 2:
                self._pause[b] = min(1 << (self._misses[b] - 2), 8)

    def commit(self, num_accepted, emitted) -> None:
        _, failed = each_row(lambda b: self._commit_row(b, num_accepted[b], emitted[b]), len(self._hist))
        if failed:
            raise DraftError(failed)

    def keep(self, batch_indices) -> None:
        self._hist = [self._hist[i] for i in batch_indices]
        self._cap = [self._cap[i] for i in batch_indices]
        self._last = [self._last[i] for i in batch_indices]
        self._pause = [self._pause[i] for i in batch_indices]
        self._misses = [self._misses[i] for i in batch_indices]
