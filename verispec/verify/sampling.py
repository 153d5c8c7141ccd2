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

Temperatures in ``(0, MIN_TEMPERATURE)`` are refused (``check_temperature``): ``l / T`` then
overflows float32 for ordinary logits, and the NaN/inf distribution it gives would silently
become token 0. Nothing is lost: such a distribution is a point mass for any logit gap above
~1e-4, which is what ``T = 0`` (greedy) computes exactly.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from ..device import to_device
MIN_TEMPERATURE = 1e-6   # smallest non-zero temperature (see the module docstring)
SEED_MIN, SEED_END = -(2**63), 2**64   # a seed is any 64-bit pattern: signed or unsigned spelling


def check_temperature(value, name: str = "temperature") -> float:
    """``value`` as a float if it is 0 (greedy) or a finite number >= MIN_TEMPERATURE; else a clear error.

    TypeError for non-numbers (bool, str, None), ValueError for NaN, inf, negatives and tiny positives.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number (0 = greedy), got {value!r} ({type(value).__name__})")
    t = float(value)
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{name} must be finite and >= 0 (0 = greedy), got {t}")
    if 0 < t < MIN_TEMPERATURE:
        raise ValueError(f"{name} {t:g} is below the smallest supported {MIN_TEMPERATURE:g} (logits / T "
                         f"would overflow): use 0 for greedy decoding")
    return t


def check_top_k(value, name: str = "top_k") -> int:
    """``value`` as an int >= 0 (0 = off; values >= V are off too); TypeError / ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer >= 0 (0 = off), got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (0 = off), got {value}")
    return int(value)


def check_top_p(value, name: str = "top_p") -> float:
    """``value`` as a float in (0, 1] (1 = off); TypeError / ValueError otherwise (NaN included)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number in (0, 1] (1 = off), got {value!r} ({type(value).__name__})")
    p = float(value)
    if not 0 < p <= 1:   # False for NaN too
        raise ValueError(f"{name} must be in (0, 1] (1 = off), got {p}")
    return p


def check_seed(value, name: str = "seed") -> int:
    """``value`` as a signed 64-bit int (the stream key's bit pattern); TypeError / ValueError otherwise.

    Integers in [-2**63, 2**64) are accepted; 2**63..2**64-1 map to the negative int64 with the same
    64 bits, so ``seed=2**64 - 1`` and ``seed=-1`` are the same stream. Floats (even 2.0) are refused
    rather than truncated.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if not SEED_MIN <= v < SEED_END:
        raise ValueError(f"{name} must fit in 64 bits ([-2**63, 2**64)), got {v}")
    return v - 2**64 if v >= 2**63 else v



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

    >>> logits = torch.tensor([[2., 1, 0, -1]])
    >>> filtered_probs(logits, 1.0, top_k=2)                       # softmax over the two largest
    tensor([[0.7311, 0.2689, 0.0000, 0.0000]])
    >>> filtered_probs(logits, 0.0)                                # greedy
    tensor([[1., 0., 0., 0.]])
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
