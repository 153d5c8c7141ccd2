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


def _per_row(value, rows: int, dtype, device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=dtype, device=device).reshape(-1).expand(rows)


def filter_logits(logits: torch.Tensor, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """Scaled logits ``[R, V]`` (float32) with filtered-out entries at ``-inf``.

    ``temperature`` (> 0), ``top_k`` and ``top_p`` are scalars or per-row ``[R]`` tensors.
    """
    rows, vocab = logits.shape
    temperature = _per_row(temperature, rows, torch.float32, logits.device)
    top_k = _per_row(top_k, rows, torch.int64, logits.device)
    top_p = _per_row(top_p, rows, torch.float32, logits.device)
    z = logits.float() / temperature[:, None]
    if bool(((top_k > 0) & (top_k < vocab)).any()):
        sorted_z = torch.sort(z, dim=-1, descending=True).values
        kth = sorted_z.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])
        use = ((top_k > 0) & (top_k < vocab))[:, None]
        z = z.masked_fill(use & (z < kth), float("-inf"))
    if bool((top_p < 1.0).any()):
        probs = torch.softmax(z, dim=-1)
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # number of sorted entries whose running sum is still below top_p = index of the cut
        num_below = (cumulative < top_p[:, None]).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
        threshold = sorted_probs.gather(1, num_below)
        use = (top_p < 1.0)[:, None]
        z = z.masked_fill(use & (probs < threshold), float("-inf"))
    return z


def filtered_probs(logits: torch.Tensor, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """The distribution p ``[R, V]`` (float32) described in the module docstring.

    Rows with ``temperature == 0`` get the one-hot of their argmax.

    >>> logits = torch.tensor([[2., 1, 0, -1]])
    >>> filtered_probs(logits, 1.0, top_k=2)                       # softmax over the two largest
    tensor([[0.7311, 0.2689, 0.0000, 0.0000]])
    >>> filtered_probs(logits, 0.0)                                # greedy
    tensor([[1., 0., 0., 0.]])
    """
    if logits.dim() == 1:
        return filtered_probs(logits[None], temperature, top_k, top_p)[0]
    rows = logits.shape[0]
    temperature = _per_row(temperature, rows, torch.float32, logits.device)
    greedy = temperature == 0
    probs = torch.softmax(filter_logits(logits, torch.where(greedy, 1.0, temperature), top_k, top_p), dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs
