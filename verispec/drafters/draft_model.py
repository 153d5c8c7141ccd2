"""``DraftModel``: a smaller model with the target's vocabulary drafts k tokens autoregressively.

Draft-cache invariant (L_b = len(h_b), the certain token is h_b[-1]):
    after every commit, the draft cache holds valid K/V for at least h_b[:L_b - 2].
``propose`` rolls the draft cache back to L_b - 2 and feeds the two tokens [h_b[-2], h_b[-1]] in one
pass, so one uniform [B, 2] step serves both cases:
  * some drafts rejected: the cache already held h_b[-2]; re-writing it is idempotent;
  * all k drafts accepted: the cache never saw the last draft d_k (it was only ever an output),
    and d_k = h_b[-2] is exactly the token that is missing.
Then k - 1 single-token steps produce d_2..d_k. Total: k draft passes per round.
e.g. k=3, L=10: rollback to 8, feed h[8], h[9] -> d1; feed d1 -> d2; feed d2 -> d3; cache length 12.
     If 1 draft is accepted, L'=12 and the next round rolls back to 10 (no-op clamp keeps h[:10] + d1).
"""
from __future__ import annotations

import os
from typing import Callable

import torch
from torch import Tensor

from ..device import to_device
from .base import Drafter, Proposal, SamplingParams, check_same_vocab, draw


class DraftModel(Drafter):
    """Draft with ``model`` (the runtime contract: setup_cache/prefill/verify/decode/rollback/keep).

    The draft model may live on another device or dtype than the target; drafts and q are moved to
    the target's device by the engine.
    """

    def __init__(self, model):
        if isinstance(model, (str, bytes)) or isinstance(model, os.PathLike):
            raise TypeError(f"DraftModel({model!r}) got a name: load the model first, "
                            f"DraftModel(verispec.load_model({model!r}))")
        if model is not None and not all(hasattr(model, a) for a in ("setup_cache", "prefill", "verify", "config")):
            raise TypeError(f"DraftModel(model) needs a loaded model (verispec.load_model(...)), "
                            f"got {type(model).__name__}")
        self.model = model
        self._hist_len: list[int] = []       # L_b
        self._last2: Tensor | None = None    # [B, 2] int64 on the draft device: h_b[-2:]
        self._last2_host: list[list[int]] = []  # the same on the host (no device reads)
        self._sampling: SamplingParams | None = None
        self._generator: torch.Generator | None = None

    def attach(self, target) -> None:
        if self.model is target:
            # one object as target and draft would share one KV cache; a full-depth twin shares the
            # weights but owns its cache, so the drafts are exactly the target's own predictions
            if not hasattr(target, "truncated"):
                raise ValueError("the draft model is the target model object (they would share one KV cache): "
                                 "load the draft model a second time")
            self.model = target.truncated(target.config.num_layers)
        check_same_vocab(target, self.model)

    def begin(self, target, prompts, first_tokens, sampling, max_seq_len) -> None:
        self._sampling = sampling
        self._generator = torch.Generator(device=self.model.device).manual_seed(sampling.seed ^ 0x5EED)
        self.model.setup_cache(len(prompts), max_seq_len)
        self.model.prefill(prompts)
        self._hist_len = [len(p) + 1 for p in prompts]
        self._set_last2([[p[-1], t] for p, t in zip(prompts, first_tokens)])

    def _set_last2(self, rows: list[list[int]]) -> None:
        self._last2_host = rows
        self._last2 = to_device(rows, self.model.device, torch.long)

    def _run(self, k: int, choose: Callable[[int, Tensor], tuple[Tensor, Tensor | None]]):
        """k draft passes; ``choose(i, logits [B, V]) -> (d_i [B], q_i [B, V] | None)``."""
        model = self.model
        model.rollback(torch.tensor(self._hist_len, dtype=torch.long) - 2)
        logits = model.verify(self._last2)[:, -1]                        # [B, V]
        tokens, probs = [], []
        for i in range(k):
            d, q = choose(i, logits)
            tokens.append(d)
            probs.append(q)
            if i < k - 1:
                logits = model.decode(to_device(d[:, None], model.device))[:, 0]
        return tokens, probs

    def propose(self, k: int) -> Proposal:
        tokens, probs = self._run(k, lambda i, logits: draw(logits, self._sampling, self._generator))
        draft_tokens = torch.stack(tokens, dim=1)                         # [B, k]
        draft_probs = None
        if probs[0] is not None:
            draft_probs = torch.stack(probs, dim=1).flatten(0, 1)        # [B * k, V], rows (b, i)
        return Proposal(draft_tokens, [k] * draft_tokens.shape[0], draft_probs)

    def commit(self, num_accepted, emitted) -> None:
        self._hist_len = [n + len(e) for n, e in zip(self._hist_len, emitted)]
        # every emitted chunk has >= 1 token; h[-2] is the previous certain token when only one came
        self._set_last2([e[-2:] if len(e) >= 2 else [last[1], e[0]] for last, e in zip(self._last2_host, emitted)])

    def keep(self, batch_indices) -> None:
        self.model.keep(torch.tensor(batch_indices, dtype=torch.long))
        self._hist_len = [self._hist_len[i] for i in batch_indices]
        self._set_last2([self._last2_host[i] for i in batch_indices])
        self._sampling = self._sampling.select(batch_indices)
