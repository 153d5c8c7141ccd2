"""Self-distillation data: the target answers prompts with its own distribution (plain decoding through the engine:
greedy for half the prompts, sampled at temperature 0.8 for the other half and for repeats, seeded), then one pass
over each whole sequence records the states the head reads and the target's last-layer state, from which the training loss
recomputes the target's next-token distribution (storing [T, V] logits would take 50x the memory).

A ``Corpus`` holds, per sequence: tokens [T] and states [T, C + 1, E] (the head's C layers, then the last layer),
on the target's device in its dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..engine import generate


@dataclass
class Corpus:
    layers: tuple[int, ...]                  # the C head layers (slots 0..C-1); slot C is the target's last layer
    tokens: list[Tensor] = field(default_factory=list)   # [T] int64 each
    states: list[Tensor] = field(default_factory=list)   # [T, C + 1, E] each
    top: list[Tensor] = field(default_factory=list)      # [T] int64 each: the target's argmax at each position
    prompt_len: list[int] = field(default_factory=list)  # P each: positions >= P are the target's answer

    @property
    def num_tokens(self) -> int:
        return sum(t.numel() for t in self.tokens)


@torch.no_grad()
def record_states(target, sequences: list[list[int]], layers: tuple[int, ...], twin=None) -> list[Tensor]:
    """One prefill pass per sequence with the hidden states on -> [T, C + 1, E] each (the C ``layers``, then the
    last layer). It runs on ``twin``, a twin of the target (``truncated`` to its full depth: the same weights, its
    own cache and graphs; made here when None), so the target's cache and captured graphs stay as generation left
    them."""
    last = target.config.num_layers - 1
    captured = tuple(layers) + (() if last in layers else (last,))
    slots = list(range(len(layers))) + [captured.index(last)]
    twin = twin or target.truncated(target.config.num_layers)
    twin.capture_hidden(captured)
    twin.setup_cache(1, max(len(s) for s in sequences), empty=True)
    out = []
    for seq in sequences:
        twin.setup_cache(1, twin.max_seq_len, empty=True)
        twin.admit([seq])
        out.append(twin.take_prompt_hidden(0)[:, slots].clone())
    return out


@torch.no_grad()
def target_argmax(target, last: Tensor, chunk: int = 256) -> Tensor:
    """The target's greedy next token at each position from its last-layer states last [T, E] -> [T] int64 (in
    chunks: a [T, V] logits tensor at once would be large)."""
    return torch.cat([target.net.logits(last[i:i + chunk]).argmax(-1) for i in range(0, last.shape[0], chunk)])


def distill(target, prompts: list[list[int]], layers: tuple[int, ...], *, max_new_tokens: int,
            batch_size: int | None = None, seed: int = 0, progress=None) -> Corpus:
    """Answer every prompt with the target, record the states of prompt + answer -> a ``Corpus``. The first
    occurrence of a prompt at an even index i is answered greedily, every other one sampled at T = 0.8 with seed
    + i (a prompt listed twice gets two different answers: how a budget larger than the prompts is filled).
    ``batch_size`` prompts per ``generate`` (None: 64 on a GPU, 16 on a CPU). ``progress(num_tokens)`` after each
    batch."""
    corpus = Corpus(tuple(layers))
    batch_size = batch_size or (64 if target.device.type == "cuda" else 16)
    seen: set[tuple[int, ...]] = set()
    twin = target.truncated(target.config.num_layers)   # one for the whole run: its prefill graphs are reused
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        temps = [0.0 if (start + i) % 2 == 0 and tuple(p) not in seen else 0.8 for i, p in enumerate(chunk)]
        seen.update(tuple(p) for p in chunk)
        outs = generate(target, chunk, drafter=None, max_new_tokens=max_new_tokens, temperature=temps,
                        seed=seed + start, warm=target.device.type == "cuda")
        sequences = [list(p) + list(o.tokens) for p, o in zip(chunk, outs)]
        for p, seq, states in zip(chunk, sequences, record_states(target, sequences, layers, twin)):
            corpus.prompt_len.append(len(p))
            corpus.tokens.append(torch.tensor(seq, dtype=torch.long, device=target.device))
            corpus.states.append(states)
            corpus.top.append(target_argmax(target, states[:, -1]))
        if progress is not None:
            progress(corpus.num_tokens)
    return corpus
