"""``make_peaked``: a random-weight model with a well-separated greedy argmax, for oracle-draft benchmarks."""
from __future__ import annotations

import torch


@torch.no_grad()
def make_peaked(model, embed_scale: float = 1e4, seed: int = 0) -> None:
    """Give a random-weight model a well-separated greedy argmax (same shapes, same cost), in place.

    With N(0, 0.02) weights the top-2 logits of a 128k vocabulary are often closer than bf16 noise,
    and the noise depends on the batch shape (a [B, K+1] verify pass and a [B, 1] decode step use
    different GEMM kernels), so the greedy path of AR and speculative decoding can split at a near-tie
    and an oracle's replayed continuation becomes useless. Here the residual stream is dominated by
    the (scaled) token embedding and the LM head is a row permutation of the embedding, so the next
    token is perm^-1(current token) by a margin of ~sqrt(hidden) standard deviations.
    """
    net = model.net
    if net.lm_head is None:
        raise ValueError("make_peaked needs an untied LM head")
    perm = torch.randperm(net.cfg.vocab_size, generator=torch.Generator().manual_seed(seed)).to(net.embed.device)
    head = net.embed[perm].clone()
    net.embed.mul_(embed_scale)
    net.lm_head.copy_(head)
