"""A tiny pure-torch model that implements the runtime contract exactly (its own tests: test_fakes.py).

``FakeModel`` is a stack of tanh RNN cells whose per-position states live in a static cache
(one [B_max, S, H] buffer per layer + lengths [B]): position p of a sequence reads layer l's
state at p - 1 from the cache, so a wrong length, a stale slot or a bad rollback changes the
logits, exactly as a wrong KV cache would in a transformer. Logits also read the mean of the
last layer's states over [0, p], so every committed slot matters. Math in float64 (logits
returned as float32): a verify pass and token-by-token decoding agree to ~1e-15, so greedy
parity tests never hit numerical near-ties.

Engine, drafter and CLI tests import it: ``from fakes import FakeModel``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class FakeTokenizer:
    CHARS = "abcdefghijklmnopqrstuvwxyz .,!?\n"   # ids 0..31; 32..vocab-2 decode to ""; eos = vocab - 1

    def __init__(self, vocab_size: int = 40):
        self.vocab_size = vocab_size
        self.eos_token_ids = [vocab_size - 1]

    def encode(self, text: str) -> list[int]:
        return [self.CHARS.index(c) if c in self.CHARS else self.CHARS.index("?") for c in text.lower()]

    def decode(self, ids) -> str:
        return "".join(self.CHARS[i] if i < len(self.CHARS) else "" for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self.encode(text + ("assistant: " if add_generation_prompt else ""))


@dataclass(frozen=True)
class FakeConfig:
    vocab_size: int
    num_layers: int
    hidden_size: int
    max_position_embeddings: int = 4096


class FakeModel:
    def __init__(self, vocab_size=40, hidden=16, num_layers=3, seed=0, scale=2.5, weights=None,
                 num_active=None, tokenizer=None, device="cpu", eos_bias=0.0):
        g = torch.Generator().manual_seed(seed)
        if weights is None:
            r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
            weights = dict(emb=r(vocab_size, hidden), pos=0.3 * r(4096, hidden),
                           a=[r(hidden, hidden) / hidden**0.5 for _ in range(num_layers)],
                           rec=[0.8 * r(hidden, hidden) / hidden**0.5 for _ in range(num_layers)],
                           out=scale * r(vocab_size, hidden) / hidden**0.5)
            weights["bias"] = torch.zeros(vocab_size, dtype=torch.float64)
            weights["bias"][vocab_size - 1] = eos_bias
        self.w = weights
        self.total_layers = len(weights["a"])
        self.num_layers = num_active or self.total_layers
        self.config = FakeConfig(weights["emb"].shape[0], self.num_layers, weights["emb"].shape[1])
        self.tokenizer = tokenizer or FakeTokenizer(self.config.vocab_size)
        self.device = torch.device(device)
        self.dtype = torch.float32
        self.states = None
        self.num_passes = 0          # verify/decode passes (prefill not counted)
        self.num_prefills = 0
        self.nan_at = None           # (batch row, position): the next append() returns NaN there (a broken model)
        self.nan_on_admit = None     # prompt index: the next admit() returns NaN in that prompt's logits
        self.admit_fault = None      # (prompt, exception): every admit() whose prompts include it raises it

    # ------------------------------------------------------------------ contract
    def setup_cache(self, batch_size, max_seq_len, empty=False):
        H = self.config.hidden_size
        self.states = [torch.zeros(batch_size, max_seq_len, H, dtype=torch.float64) for _ in range(self.num_layers)]
        self._lengths = torch.zeros(batch_size, dtype=torch.long)
        self.max_seq_len = max_seq_len
        self._batch = 0 if empty else batch_size

    @property
    def lengths(self):
        return self._lengths[: self._batch]

    def _position(self, tokens, pos, first_row=0):
        """tokens [n], pos [n] -> logits [n, V]; writes the states of rows [first_row, first_row + n) at pos."""
        B = tokens.shape[0]
        rows = torch.arange(first_row, first_row + B)
        x = self.w["emb"][tokens] + self.w["pos"][pos]
        for l in range(self.num_layers):
            prev = self.states[l][rows, (pos - 1).clamp(min=0)] * (pos > 0)[:, None]
            x = torch.tanh(x @ self.w["a"][l].T + prev @ self.w["rec"][l].T)
            self.states[l][rows, pos] = x
        S = self.states[-1].shape[1]
        mask = (torch.arange(S)[None, :] <= pos[:, None]).to(torch.float64)          # [B, S]
        mean = (self.states[-1][rows] * mask[..., None]).sum(1) / (pos + 1)[:, None]
        return ((x + mean) @ self.w["out"].T + self.w["bias"]).float()

    def prefill(self, prompts):
        if len(prompts) != self._batch:
            raise ValueError(f"prefill got {len(prompts)} prompts for a cache of {self._batch}")
        self._batch = 0
        return self.admit(prompts)

    def admit(self, prompts):
        first = self._batch
        if first + len(prompts) > self.states[0].shape[0]:
            raise ValueError("admit: no free rows")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if any(len(p) > self.max_seq_len for p in prompts):
            raise ValueError("prompt longer than max_seq_len")
        self.num_prefills += 1
        # right-padded, all rows from position 0 (pad positions write dead slots past each length)
        T = max(len(p) for p in prompts)
        tokens = torch.tensor([p + [0] * (T - len(p)) for p in prompts])
        logits = torch.stack([self._position(tokens[:, i], torch.full((len(prompts),), i), first) for i in range(T)], 1)
        last = torch.tensor([len(p) - 1 for p in prompts])
        self._lengths[first: first + len(prompts)] = last + 1
        self._batch = first + len(prompts)
        if self.admit_fault is not None and any(list(p) == self.admit_fault[0] for p in prompts):
            # e.g. out of memory at the end of the prefill, its rows already added: the caller must cut them off
            raise self.admit_fault[1]
        out = logits[torch.arange(len(prompts)), last]
        if self.nan_on_admit is not None:
            out[self.nan_on_admit, 0] = float("nan")
            self.nan_on_admit = None
        return out

    def _one(self, b, token, pos):
        x = self.w["emb"][token] + self.w["pos"][pos]
        for l in range(self.num_layers):
            prev = self.states[l][b, pos - 1] if pos > 0 else torch.zeros_like(x)
            x = torch.tanh(self.w["a"][l] @ x + self.w["rec"][l] @ prev)
            self.states[l][b, pos] = x
        mean = self.states[-1][b, : pos + 1].mean(0)
        return (self.w["out"] @ (x + mean) + self.w["bias"]).float()

    def append(self, tokens):
        if tokens.dim() != 2 or tokens.shape[0] != self._batch:
            raise ValueError(f"tokens must be [B={self._batch}, k], got {tuple(tokens.shape)}")
        k = tokens.shape[1]
        if int(self.lengths.max()) + k > self.max_seq_len:
            raise ValueError("cache full")
        self.num_passes += 1
        tokens = tokens.cpu().long()
        logits = torch.stack([self._position(tokens[:, i], self.lengths + i) for i in range(k)], dim=1)
        self.lengths.add_(k)
        if self.nan_at is not None:
            row, pos = self.nan_at
            logits[row, min(pos, k - 1), 0] = float("nan")
            self.nan_at = None
        return logits

    def decode(self, tokens):
        assert tokens.shape[1] == 1
        return self.append(tokens)

    def rollback(self, new_lengths):
        new = torch.as_tensor(new_lengths).long().cpu()
        assert new.shape == self.lengths.shape, (new.shape, self.lengths.shape)
        torch.minimum(new, self.lengths, out=self.lengths)

    def keep(self, batch_indices):
        idx = torch.as_tensor(batch_indices, dtype=torch.long).cpu()
        for s in self.states:
            s[: len(idx)] = s[idx].clone()
        self._lengths[: len(idx)] = self._lengths[idx].clone()
        self._batch = len(idx)

    def truncated(self, num_layers):
        if not 1 <= num_layers <= self.total_layers:
            raise ValueError("bad num_layers")
        return FakeModel(weights=self.w, num_active=num_layers, tokenizer=self.tokenizer)

    # ------------------------------------------------------------------ test helpers
    def committed_states(self, b, n):
        """[L, n, H] cache contents of sequence b's first n positions."""
        return torch.stack([s[b, :n] for s in self.states])


def fresh_states(model: FakeModel, tokens: list[int]) -> torch.Tensor:
    """The cache contents a fresh prefill of ``tokens`` produces: [L, n, H]."""
    clone = FakeModel(weights=model.w, num_active=model.num_layers, tokenizer=model.tokenizer)
    clone.setup_cache(1, len(tokens) + 1)
    clone.prefill([tokens])
    return clone.committed_states(0, len(tokens))


def greedy_reference(model: FakeModel, prompt: list[int], n: int) -> list[int]:
    """Token-by-token greedy decoding, no engine involved."""
    m = FakeModel(weights=model.w, num_active=model.num_layers, tokenizer=model.tokenizer)
    m.setup_cache(1, len(prompt) + n + 1)
    logits = m.prefill([prompt])[0]
    out = []
    for _ in range(n):
        t = int(logits.argmax())
        out.append(t)
        if t in m.tokenizer.eos_token_ids:
            break
        logits = m.decode(torch.tensor([[t]]))[0, 0]
    return out
