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

from ..device import to_device


def is_greedy(temperature):
    """Whether a row samples greedily: temperature exactly 0 (a float, or elementwise for a tensor). The one
    definition every backend, the drafters and the engine use."""
    return temperature == 0


def _per_row(value, rows: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(value on ``device`` as [rows], the same on the host or None when it was given on an accelerator).

    Host values (Python scalars, lists, CPU tensors) let the filters below decide on the host which of them
    any row uses, without reading the device; values already on an accelerator are read there (a sync)."""
    if isinstance(value, torch.Tensor) and value.device.type != "cpu":
        return value.to(dtype).reshape(-1).expand(rows), None
    host = torch.as_tensor(value, dtype=dtype).reshape(-1).expand(rows)
    return to_device(host, device), host


def _any(device_mask: torch.Tensor, host_mask: torch.Tensor | None) -> bool:
    return bool((device_mask if host_mask is None else host_mask).any())


def filter_logits(logits: torch.Tensor, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """Scaled logits ``[R, V]`` (float32) with filtered-out entries at ``-inf``.

    ``temperature`` (> 0), ``top_k`` and ``top_p`` are scalars or per-row ``[R]`` tensors.
    """
    rows, vocab = logits.shape
    temperature, _ = _per_row(temperature, rows, torch.float32, logits.device)
    top_k, top_k_host = _per_row(top_k, rows, torch.int64, logits.device)
    top_p, top_p_host = _per_row(top_p, rows, torch.float32, logits.device)
    z = logits.float() / temperature[:, None]
    use_k = (top_k > 0) & (top_k < vocab)
    if _any(use_k, None if top_k_host is None else (top_k_host > 0) & (top_k_host < vocab)):
        sorted_z = torch.sort(z, dim=-1, descending=True).values
        kth = sorted_z.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])
        z = z.masked_fill(use_k[:, None] & (z < kth), float("-inf"))
    if _any(top_p < 1.0, None if top_p_host is None else top_p_host < 1.0):
        probs = torch.softmax(z, dim=-1)
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # number of sorted entries whose running sum is still below top_p = index of the cut
        num_below = (cumulative < top_p[:, None]).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
        threshold = sorted_probs.gather(1, num_below)
        z = z.masked_fill((top_p < 1.0)[:, None] & (probs < threshold), float("-inf"))
    return z


def filtered_probs(logits: torch.Tensor, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """The distribution p ``[R, V]`` (float32) described in the module docstring.

    Rows with ``temperature == 0`` get the one-hot of their argmax. With host values (Python scalars,
    lists, CPU tensors) for the settings this never reads the device (no host sync).
    """
    if logits.dim() == 1:
        return filtered_probs(logits[None], temperature, top_k, top_p)[0]
    rows = logits.shape[0]
    temperature, temperature_host = _per_row(temperature, rows, torch.float32, logits.device)
    greedy = is_greedy(temperature)
    probs = torch.softmax(filter_logits(logits, torch.where(greedy, 1.0, temperature), top_k, top_p), dim=-1)
    if _any(greedy, None if temperature_host is None else is_greedy(temperature_host)):
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs
