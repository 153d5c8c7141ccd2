"""How temperature, top-k and top-p shape a distribution: the one definition every backend follows.

For one row of logits ``l`` (``[V]``) and a sequence's ``(temperature T, top_k, top_p)``:

    z = l.float() / T
    top-k (0 = off, >= V = off):   keep v iff z_v >= (k-th largest z)          ties at the cut are kept
    p' = softmax(z over kept)
    top-p (>= 1 = off):            sort p' descending, n = fewest entries whose sum >= top_p,
                                   t = n-th largest p'; keep v iff p'_v >= t     ties at the cut are kept
    p  = p' over kept, renormalized

Both cuts are *value thresholds* (not "the first n of a sort"), so a kernel can find them
without sorting, and the result does not depend on how a sort orders ties.

``T == 0`` means greedy: the distribution is the point mass at the argmax (lowest index on
ties, as ``torch.argmax``). Drafters that sample use the same function for their own q.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Scaled logits ``[..., V]`` (float32) with filtered-out entries at ``-inf``. ``temperature > 0``."""
    z = logits.float() / temperature
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(z, dim=-1)
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # n - 1 = number of sorted entries whose running sum is still below top_p
        num_below = (cumulative < top_p).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
        threshold = torch.gather(sorted_probs, -1, num_below)
        z = z.masked_fill(probs < threshold, float("-inf"))
    return z


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution p ``[..., V]`` (float32) described in the module docstring.

    ``temperature == 0`` returns the one-hot of the argmax.
    """
    if temperature == 0:
        one_hot = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return one_hot.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
