"""``PromptLookup``: draft by copying what followed the most recent earlier occurrence of the
history's last n tokens (n from ``max_ngram`` down to ``min_ngram``). No model, no device work.

Index: for every n, ``last_start[n][ngram]`` = start of the most recent occurrence of ``ngram`` that
has at least one token after it. Appending token h[i] registers the n-grams ending at h[i-1]
(their continuation h[i] now exists), so a lookup of the tail never finds the tail itself.
e.g. h = [5 6 7 5 6], n=2: tail (5, 6) -> start 0 -> drafts h[2:2+k] = [7, 5, 6][:k].
No match -> 0 drafts: that sequence's round is a plain decode step (floor ~ the baseline).

Trees (``propose_tree(widths)``): the continuations of several earlier occurrences of the tail (the most recent
first, longest n-gram first, then shorter ones) become branches, merged into a trie of at most widths[d] children
per node at depth d and len(widths) levels. The first branch is the chain's draft. ``starts[n][ngram]`` keeps
the most recent MAX_BRANCH_STARTS starts of each n-gram for it.
e.g. h = [1 2 3 1 2 4 1 2], widths (2, 1): tail (1, 2) occurs at 3 and 0 -> continuations [4, 1], [3, 1]
     -> nodes [4, 1, 3, 1] with parents [-1, 0, -1, 2].

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

from dataclasses import dataclass

import torch

from .base import DraftError, Drafter, Proposal, TreeProposal, each_row

# Earlier occurrences of an n-gram kept for tree branches (the most recent ones).
MAX_BRANCH_STARTS = 8


class _History:
    def __init__(self, tokens: list[int], min_ngram: int, max_ngram: int):
        self.tokens: list[int] = []
        self.ngrams = range(min_ngram, max_ngram + 1)
        self.last_start: dict[int, dict[tuple, int]] = {n: {} for n in self.ngrams}
        self.starts: dict[int, dict[tuple, list[int]]] = {n: {} for n in self.ngrams}   # oldest first
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        h = self.tokens
        for t in new:
            i = len(h)
            for n in self.ngrams:
                if i - n >= 0:
                    key = tuple(h[i - n:i])
                    self.last_start[n][key] = i - n
                    starts = self.starts[n].setdefault(key, [])
                    starts.append(i - n)
                    if len(starts) > MAX_BRANCH_STARTS:
                        del starts[0]
            h.append(t)

    def branches(self, depth: int, max_branches: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
        """Up to ``max_branches`` distinct continuations of up to ``depth`` tokens of the tail's earlier
        occurrences: longest n-gram first, the most recent occurrence first within one n."""
        h, out = self.tokens, []
        for n in range(min(max_ngram, len(h) - 1), min_ngram - 1, -1):
            for start in reversed(self.starts[n].get(tuple(h[-n:]), [])):
                cont = h[start + n:start + n + depth]
                if cont and cont not in out:
                    out.append(cont)
                    if len(out) == max_branches:
                        return out
        return out

    def lookup(self, k: int, max_ngram: int, min_ngram: int) -> list[int]:
        h = self.tokens
        for n in range(min(max_ngram, len(h) - 1), min_ngram - 1, -1):
            start = self.last_start[n].get(tuple(h[-n:]))
            if start is not None:
                return h[start + n:start + n + k]
        return []


def merge_trie(branches: list[list[int]], widths: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Branches merged into one trie of at most widths[d] children per node at depth d -> (tokens, parents) in
    node order (-1 = the root), parents before children. A branch stops where its node would exceed a width.
    e.g. [[4, 1], [3, 1], [4, 2]], widths (2, 1) -> tokens [4, 1, 3, 1], parents [-1, 0, -1, 2]."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[int, dict[int, int]] = {-1: {}}
    for branch in branches:
        node = -1
        for d, tok in enumerate(branch[:len(widths)]):
            kids = children[node]
            if tok not in kids:
                if len(kids) >= widths[d]:
                    break
                kids[tok] = len(tokens)
                tokens.append(tok)
                parents.append(node)
                children[kids[tok]] = {}
            node = kids[tok]
    return tokens, parents


@dataclass
class _Row:
    """Everything prompt lookup keeps about one sequence (one object per row: ``keep`` moves it whole)."""

    history: _History
    cap: int = 1 << 30       # adaptive cap on its drafts (see the module docstring)
    last: int = 0            # drafts proposed to it in the last round
    pause: int = 0           # rounds left without drafting (adaptive back-off)
    misses: int = 0          # rounds in a row with nothing accepted


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
        self._rows: list[_Row] = []              # batch order

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        self._rows = []

    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        self._rows += [_Row(_History(p + [t], self.min_ngram, self.max_ngram)) for p, t in zip(prompts, first_tokens)]

    def _limit(self, row: _Row, k: int) -> int:
        """The drafts row may propose when asked for k: k, within num_pred_tokens and (adaptive) its cap, 0 while
        it pauses."""
        if self.num_pred_tokens is not None:
            k = min(k, self.num_pred_tokens)
        if self.adaptive:
            k = 0 if row.pause else min(k, row.cap)
        return k

    def propose(self, max_num_draft: list[int]) -> Proposal:
        rows = self._rows
        caps = [self._limit(row, k) for row, k in zip(rows, max_num_draft)]
        drafts, failed = each_row(
            lambda b: rows[b].history.lookup(caps[b], self.max_ngram, self.min_ngram) if caps[b] else [], len(caps))
        drafts = [d or [] for d in drafts]                  # a failed row proposes nothing
        num_draft = [len(d) for d in drafts]
        for row, n in zip(rows, num_draft):
            row.last = n
        width = max(num_draft, default=0)
        padded = [d + [0] * (width - len(d)) for d in drafts]
        proposal = Proposal(torch.tensor(padded, dtype=torch.long).reshape(len(drafts), width), num_draft, None)
        if failed:
            raise DraftError(failed, proposal)
        return proposal

    drafts_trees = True

    def propose_tree(self, widths: tuple[int, ...]) -> TreeProposal:
        """One trie per row from its tail's earlier continuations (the module docstring); a row that pauses
        (adaptive back-off) or matches nothing proposes no node."""
        rows = self._rows

        def one(b: int) -> tuple[list[int], list[int]]:
            if self.adaptive and rows[b].pause:
                return [], []
            return merge_trie(rows[b].history.branches(len(widths), widths[0], self.max_ngram, self.min_ngram),
                              widths)

        trees, failed = each_row(one, len(rows))
        trees = [t or ([], []) for t in trees]
        for row, (tokens, _) in zip(rows, trees):
            row.last = 0                       # the chain's adaptive cap is not a tree's: commit leaves it
        proposal = TreeProposal(torch.tensor([t for tokens, _ in trees for t in tokens], dtype=torch.long),
                                tuple(p for _, parents in trees for p in parents), [len(t) for t, _ in trees])
        if failed:
            raise DraftError(failed, proposal)         # the failed rows have no node
        return proposal

    @staticmethod
    def _commit_row(row: _Row, num_accepted: int, emitted: list[int]) -> None:
        row.history.extend(emitted)
        row.pause = max(row.pause - 1, 0)      # one of its rounds went by (with or without a propose)
        proposed, row.last = row.last, 0
        if proposed:
            row.cap = min(2 * row.cap, 1 << 30) if num_accepted == proposed else num_accepted + 1
            row.misses = row.misses + 1 if num_accepted == 0 else 0
            if row.misses >= 2:
                row.pause = min(1 << (row.misses - 2), 8)

    def commit(self, num_accepted, emitted) -> None:
        rows = self._rows
        _, failed = each_row(lambda b: self._commit_row(rows[b], num_accepted[b], emitted[b]), len(rows))
        if failed:
            raise DraftError(failed)

    def keep(self, batch_indices) -> None:
        self._rows = [self._rows[i] for i in batch_indices]
