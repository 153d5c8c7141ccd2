"""Quantizers: float weights -> GGUF blocks, the way ggml's reference quantizers (``quantize_row_*_ref``) round.

    Q8_0   d = max|x| / 127, q = round-half-away(x / d)            (equal to gguf-py's quantizer bit for bit)
    Q4_0   d = x_max / -8 (x_max: the first weight of largest |x|), q = min(15, trunc(x / d + 8.5))
                                                                   (equal to gguf-py's quantizer bit for bit)
    Q4_K   kquants.py: per sub-block scale + min found by ggml's ``make_qkx2_quants`` search, then 6-bit codes
    Q6_K   kquants.py: per sub-block signed scale found by ggml's ``make_qx_quants`` search, then 8-bit codes

``quantize(w, qtype)``: w [N, K] (any float dtype; computed in fp32) -> uint8 [N, K / QK * type_size], the
layout ``dequantize`` reads (formats.py). Rows are independent, so a big matrix is quantized in chunks of rows.
"""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from .formats import Q4_0, Q4_K, Q6_K, Q8_0, block_format
from .kquants import div, quantize_q4_k, quantize_q6_k

# weights per chunk: bounds the temporaries of the K-quant searches (~20 fp32 copies of a chunk)
CHUNK_WEIGHTS = 1 << 22


def f16_bytes(d: Tensor) -> Tensor:
    """fp32 [n, 1] -> its f16 (round to nearest even, as ggml's GGML_FP32_TO_FP16) as bytes [n, 2]."""
    return d.to(torch.float16).view(torch.uint8).view(-1, 2)


def pack_nibbles(q: Tensor) -> Tensor:
    """[n, 2, b] values in [0, 16) -> [n, b] bytes: q[:, 0] in the low nibbles, q[:, 1] in the high ones."""
    q = q.to(torch.uint8)
    return q[:, 0] | (q[:, 1] << 4)


def quantize_q8_0(x: Tensor) -> Tensor:
    """x [n, 32] fp32 -> Q8_0 blocks [n, 34]."""
    d = div(x.abs().amax(dim=1, keepdim=True), 127.0)
    inv = torch.where(d == 0, torch.zeros_like(d), div(1.0, d))
    v = x * inv
    a = v.abs()                                       # round half away from zero, as C's roundf
    r = a.floor()
    q = torch.sign(v) * (r + (2 * (a - r)).floor())
    return torch.cat([f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=1)


def quantize_q4_0(x: Tensor) -> Tensor:
    """x [n, 32] fp32 -> Q4_0 blocks [n, 18]."""
    x_max = x.gather(1, x.abs().argmax(dim=1, keepdim=True))        # first weight of the largest magnitude
    d = div(x_max, -8.0)
    inv = torch.where(d == 0, torch.zeros_like(d), div(1.0, d))
    q = torch.trunc(x * inv + 8.5).clamp(0, 15)                     # (int8_t)(x/d + 8.5), at most 15
    return torch.cat([f16_bytes(d), pack_nibbles(q.view(-1, 2, 16))], dim=1)


_QUANTIZERS = {Q8_0.ggml_type: quantize_q8_0, Q4_0.ggml_type: quantize_q4_0, Q4_K.ggml_type: quantize_q4_k,
               Q6_K.ggml_type: quantize_q6_k}


def quantize(w: Tensor, qtype, *, name: str = "tensor") -> Tensor:
    """w [..., K] -> uint8 [..., K / QK * type_size] in GGML type ``qtype`` (Q4_0, Q8_0, Q4_K or Q6_K).

    ValueError when K is not a multiple of the block size or w is not finite (``name`` says which tensor).

    >>> import torch
    >>> quantize(torch.full((1, 32), 2.0), "Q8_0")[0, :4].tolist()   # d = 2/127 as f16 (0x2408), q = 127, 127
    [8, 36, 127, 127]
    """
    fmt = block_format(qtype)
    if fmt.ggml_type not in _QUANTIZERS:
        raise ValueError(f"{name}: verispec does not quantize to {fmt.name} (it quantizes to "
                         f"{sorted(block_format(t).name for t in _QUANTIZERS)})")
    K = w.shape[-1]
    if w.dim() == 0 or K % fmt.block_size:
        raise ValueError(f"{name}: rows of {K} weights are not a whole number of {fmt.name} blocks of "
                         f"{fmt.block_size}")
    x = w.detach().reshape(-1, fmt.block_size).float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: has NaN or infinite weights; cannot quantize to {fmt.name}")
    step = max(1, CHUNK_WEIGHTS // fmt.block_size)
    with _one_cpu_thread(x.device):
        blocks = torch.cat([_QUANTIZERS[fmt.ggml_type](x[i:i + step]) for i in range(0, x.shape[0], step)])
    return blocks.view(*w.shape[:-1], K // fmt.block_size * fmt.type_size)


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device):
    """NOTE: the K-quant searches are thousands of small elementwise ops; with 2 threads on a 2-core machine that
    others use they ran 36x slower than with one (measured: 2.49 s vs 0.069 s for 131k weights), so the CPU path
    runs single-threaded (restored after)."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
