"""``FeatureHead``: an EAGLE-3-style head that drafts from the target's own hidden states (head_net.py: the network).

The target writes the chosen layers' states for every token it scores (``Model.capture_hidden``, switched on by
``reserve``), in the same pass. The head keeps one KV cache row per sequence; per row on the host (``_Row``):
the history h_b (L_b = len(h_b), the certain token h_b[-1]) and ``valid`` = the entries fed with the target's
own states. Entry j pairs the target's states at position j with token h_b[j + 1] (head_net.py), so the target
states of h_b[:-1] make entries 0..L_b - 2 and ``valid`` = L_b - 1 between rounds; ``last`` (on the device)
holds entry L_b - 2's output, which predicts the first draft.

    admit    the prompt's states (``Model.take_prompt_hidden``) -> entries 0..P-1, one head pass per prompt
    propose  d_1 from ``last``; then k - 1 single-entry passes on the head's own outputs (entries L-1, L, ...:
             written past ``valid``, dead after the round); k = max_b k_b, row b proposes its first k_b
    commit   the round's target states (``Model.hidden``: rows 0..a_b are the certain token and the accepted
             drafts) with the emitted tokens -> entries L-1 .. L-1+a_b, one pass of width max_b(a_b + 1),
             overwriting the speculative ones; ``last`` = the output of entry L-1+a_b
    keep     rows move whole (host rows, the cache rows, ``last``)

e.g. prompt of 5 tokens, first token x5: entries 0..4 (states of t0..t4 with tokens t1..x5), ``valid`` = 5;
k = 3: d1 from out_4, entry 5 = (out_4, d1) -> d2, entry 6 = (out_5, d2) -> d3; 2 accepted, recovered r:
commit feeds target states of x5, d1, d2 with tokens d1, d2, r as entries 5, 6, 7; ``valid`` = 8 = L' - 1.

Row b's drafts depend on row b alone: its own cache row and states, its draws from its own DRAFT stream
(``base.draw``, counter advanced by its own k_b). The head runs eagerly (a CUDA graph of its draft loop is not
written yet).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from ..device import to_device
from ..runtime.cache import StaticKVCache
from ..runtime.transformer import rope_table
from .base import Drafter, Proposal, Sampling, SamplingParams, draw
from .head_net import HeadNet


@dataclass
class _Row:
    """Everything the head keeps about one sequence on the host; its K/V are row b of the head's cache and its last
    output row b of ``FeatureHead._last`` (both moved by ``keep`` with the same indices)."""

    history: list[int]          # h_b
    valid: int                  # entries fed with the target's states (L_b - 1 between rounds)
    sampling: Sampling
    step: int = 0               # DRAFT-stream counter: its next draw uses step, step + 1, ...


def embedded_head_dir() -> Path:
    """The head shipped for the embedded SmolLM2 (package data, trained by ``verispec train-head``)."""
    return Path(str(resources.files("verispec.drafters") / "heads" / "smollm2"))


class FeatureHead(Drafter):
    """Draft with a feature-level head. ``FeatureHead()`` = the head shipped for the embedded SmolLM2;
    ``FeatureHead(path)`` loads a directory written by ``verispec train-head`` (or ``HeadNet.save``);
    ``FeatureHead(net)`` uses a ``HeadNet`` in memory (tests, training's evaluation)."""

    def __init__(self, head: "str | os.PathLike | HeadNet | None" = None):
        if head is None:
            head = embedded_head_dir()
            if not (head / "config.json").is_file():
                raise FileNotFoundError(f"no embedded feature head at {head}: train one with `verispec train-head "
                                        f"--out DIR` and pass FeatureHead(DIR)")
        if isinstance(head, HeadNet):
            self.net, self.meta = head, {}
        elif isinstance(head, (str, os.PathLike)):
            self.net, self.meta = HeadNet.load(head)
        else:
            raise TypeError(f"FeatureHead(head) takes a directory or a HeadNet, got {type(head).__name__}")
        self.cfg = self.net.cfg
        self.target = None
        self._rows: list[_Row] = []
        self._last: Tensor | None = None          # [B, E]: each row's last entry output
        self.cache: StaticKVCache | None = None
        self._rope: Tensor | None = None

    # ------------------------------------------------------------------------------------ setup
    def attach(self, target) -> None:
        c, t = self.cfg, target.config
        problems = []
        if c.hidden_size != t.hidden_size:
            problems.append(f"hidden size {c.hidden_size} != the target's {t.hidden_size}")
        if c.vocab_size != t.vocab_size:
            problems.append(f"vocabulary {c.vocab_size} != the target's {t.vocab_size}")
        if max(c.target_layers) >= t.num_layers:
            problems.append(f"reads target layers {list(c.target_layers)} but the target runs {t.num_layers}")
        elif c.target_num_layers and c.target_num_layers != t.num_layers:
            problems.append(f"trained on a {c.target_num_layers}-layer target, this one has {t.num_layers}")
        if not hasattr(target, "capture_hidden"):
            problems.append("the target cannot return hidden states (it needs verispec's runtime Model)")
        if problems:
            raise ValueError("feature head does not fit this target: " + "; ".join(problems))
        self.net = self.net.to(device=target.device, dtype=target.dtype).eval()
        self.net.requires_grad_(False)

    def reserve(self, target, max_batch_size: int, max_seq_len: int) -> None:
        if self.target is not target:
            self.attach(target)
            self.target = target
        target.capture_hidden(self.cfg.target_layers)
        mc = self.cfg.model_config()
        if self.cache is None or not self.cache.fits(max_batch_size, max_seq_len):
            self.cache = StaticKVCache(mc, max_batch_size, max_seq_len, target.device, target.dtype)
            self._rope = rope_table(mc, self.cache.capacity, target.device)
        self.cache.reset(0, max_seq_len)
        self._rows, self._last = [], torch.zeros(0, self.cfg.hidden_size, device=target.device, dtype=target.dtype)

    @property
    def _sampling(self) -> SamplingParams:
        return SamplingParams(tuple(r.sampling for r in self._rows))

    def _feed(self, first_row: int, states: Tensor, tokens: Tensor, pos: Tensor) -> Tensor:
        """One head pass over cache rows [first_row, first_row + n): states [n, T, C, E] or fused features
        [n, T, E] (``own``), tokens [n, T], pos [n, T] -> out [n, T, E]."""
        feats = self.net.fuse(states) if states.dim() == 4 else states
        n = feats.shape[0]
        k = self.cache.k[0][first_row:first_row + n]
        v = self.cache.v[0][first_row:first_row + n]
        return self.net.cached(feats, tokens, pos, self.target.net.embed, k, v, self._rope)

    # ------------------------------------------------------------------------------------ interface
    @torch.no_grad()
    def admit(self, seq_ids, prompts, first_tokens, sampling) -> None:
        first = len(self._rows)
        device = self.target.device
        lasts = []
        for j, (prompt, token) in enumerate(zip(prompts, first_tokens, strict=True)):
            states = self.target.take_prompt_hidden(first + j)                              # [P, C, E]
            P = len(prompt)
            if states.shape[0] != P:
                raise RuntimeError(f"feature head: the target's states of row {first + j} cover {states.shape[0]} "
                                   f"tokens, its prompt has {P}")
            tokens = to_device([list(prompt[1:]) + [token]], device, torch.long)            # [1, P]: t_{j+1}
            pos = torch.arange(P, device=device)[None]
            out = self._feed(first + j, states[None], tokens, pos)                          # [1, P, E]
            lasts.append(out[:, -1])
        self.cache.admit([len(p) for p in prompts])
        self._last = torch.cat([self._last, *lasts])
        self._rows += [_Row(list(p) + [t], len(p), s) for p, t, s in zip(prompts, first_tokens, sampling.rows)]

    @torch.no_grad()
    def propose(self, max_num_draft: list[int]) -> Proposal:
        B, k = len(self._rows), max(max_num_draft)
        if k == 0:
            return Proposal(torch.zeros(B, 0, dtype=torch.long), [0] * B, None)
        device = self.target.device
        sampling = self._sampling
        lm_head = self.target.net.lm_head_weight
        out = self._last[:, None]                                                           # [B, 1, E]
        logits = self.net.logits(self._last, lm_head)                                        # [B, V]
        base = to_device([r.valid for r in self._rows], device, torch.long)                  # [B]: entry L-1
        tokens, probs = [], []
        for i in range(k):
            d, q = draw(logits, sampling, [r.step + i for r in self._rows])
            tokens.append(d)
            probs.append(q)
            if i < k - 1:   # entry L-1+i = (the previous output, d_{i+1}) -> d_{i+2}
                out = self._feed(0, out, d[:, None], (base + i)[:, None])
                logits = self.net.logits(out[:, 0], lm_head)
        for r, n in zip(self._rows, max_num_draft):
            r.step += n
        draft_tokens = torch.stack(tokens, dim=1)                                             # [B, k]
        if probs[0] is None:
            return Proposal(draft_tokens, list(max_num_draft), None)
        q = torch.stack(probs, dim=1).flatten(0, 1).float()                                  # [B*k, V], rows (b, i)
        if any(n != k for n in max_num_draft):   # ragged: rows i < k_b (host indices: no sync)
            rows = [b * k + i for b, n in enumerate(max_num_draft) for i in range(n)]
            q = q[to_device(rows, device, torch.long)]
        return Proposal(draft_tokens, list(max_num_draft), q)

    @torch.no_grad()
    def commit(self, num_accepted: list[int], emitted: list[list[int]]) -> None:
        width = max((len(e) for e in emitted), default=0)
        if width == 0:
            return
        states = self.target.hidden                                                           # [B, K+1, C, E]
        if states is None or states.shape[0] != len(self._rows) or states.shape[1] < width:
            raise RuntimeError("feature head: the target's last pass left no hidden states for this round "
                               f"(got {None if states is None else tuple(states.shape)})")
        device = self.target.device
        tokens = to_device([(e + [0] * width)[:width] for e in emitted], device, torch.long)  # [B, W]
        base = to_device([r.valid for r in self._rows], device, torch.long)
        pos = base[:, None] + torch.arange(width, device=device)                             # [B, W]
        out = self._feed(0, states[:, :width], tokens, pos)                                  # [B, W, E]
        # a row's last entry is its (a_b + 1)-th; a row that emitted nothing (a failed round) keeps its own
        idx = to_device([max(len(e) - 1, 0) for e in emitted], device, torch.long)
        fresh = out[torch.arange(len(emitted), device=device), idx]                           # [B, E]
        has = to_device([bool(e) for e in emitted], device, torch.bool)
        self._last = torch.where(has[:, None], fresh, self._last)
        for r, e in zip(self._rows, emitted, strict=True):
            r.valid += len(e)
            r.history.extend(e)

    def keep(self, batch_indices) -> None:
        order = list(batch_indices)
        self.cache.keep(order)
        self._last = self._last[to_device(order, self._last.device, torch.long)]
        self._rows = [self._rows[i] for i in order]
