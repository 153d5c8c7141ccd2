"""``PromptLookup``: draft by copying what followed the most recent earlier occurrence of the
history's last n tokens (n from ``max_ngram`` down to ``min_ngram``). No model, no device work.

Index: for every n, ``last_start[n][ngram]`` = start of the most recent occurrence of ``ngram`` that
has at least one token after it. Appending token h[i] registers the n-grams ending at h[i-1]
(their continuation h[i] now exists), so a lookup of the tail never finds the tail itself.
e.g. h = [5 6 7 5 6], n=2: tail (5, 6) -> start 0 -> drafts h[2:2+k] = [7, 5, 6][:k].
No match -> 0 drafts: that sequence's round is a plain decode step (floor ~ the baseline).
"""
from __future__ import annotations

import torch

from .base import Drafter, Proposal


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
    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, num_pred_tokens: int | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"PromptLookup: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_pred_tokens is not None and num_pred_tokens < 1:
            raise ValueError(f"PromptLookup: num_pred_tokens must be >= 1, got {num_pred_tokens}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_pred_tokens = num_pred_tokens   # cap on drafts per round (None = the engine's k)
        self._hist: list[_History] = []

    def begin(self, target, prompts, first_tokens, sampling, max_seq_len) -> None:
        self._hist = [_History(p + [t], self.min_ngram, self.max_ngram) for p, t in zip(prompts, first_tokens)]

    def propose(self, k: int) -> Proposal:
        if self.num_pred_tokens is not None:
            k = min(k, self.num_pred_tokens)
        drafts = [h.lookup(k, self.max_ngram, self.min_ngram) for h in self._hist]
        num_draft = [len(d) for d in drafts]
        width = max(num_draft)
        padded = [d + [0] * (width - len(d)) for d in drafts]
        return Proposal(torch.tensor(padded, dtype=torch.long).reshape(len(drafts), width), num_draft, None)

    def commit(self, num_accepted, emitted) -> None:
        for h, e in zip(self._hist, emitted):
            h.extend(e)

    def keep(self, batch_indices) -> None:
        self._hist = [self._hist[i] for i in batch_indices]
