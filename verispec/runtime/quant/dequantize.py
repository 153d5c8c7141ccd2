"""The reference dequantizer: GGUF blocks (raw bytes) -> float32 weights, in torch, on any device.

Every format's arithmetic is the one ggml's ``dequantize_row_*`` and gguf-py's ``dequantize_blocks`` do, in
the same order and precision (f16 scales widened exactly to fp32, one rounding per product / sum, no fused
multiply-add), so the result equals ``gguf.quants.dequantize`` bit for bit (tests/test_quant_formats.py checks
random blocks with edge scales and the embedded SmolLM2's real tensors). Layouts: formats.py.

    blocks [n, type_size] uint8 -> weights [n, block_size] float32          (``dequantize_blocks``)
    data   [N, K / QK * type_size] uint8 (a GGUF matrix) -> W [N, K] float32 (``dequantize``)

This is the CPU path of packed weights (packed.py) and the oracle of the CUDA packed GEMV. No host -> device copy
and no data-dependent shape: it runs inside a CUDA graph capture.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .formats import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, BlockFormat, block_format


def f16(blocks: Tensor, at: int) -> Tensor:
    """The f16 field at byte ``at`` of each block, widened to fp32 (exact): [n, type_size] -> [n, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def nibbles(qs: Tensor) -> Tensor:
    """[n, c, b] bytes -> [n, c, 2, b]: the low nibbles, then the high ones (int32)."""
    q = qs.to(torch.int32)
    return torch.stack([q & 0xF, q >> 4], dim=-2)


def _q4_0(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    q = nibbles(blocks[:, 2:18].view(n, 1, 16)).view(n, 32) - 8            # weight j: low (j < 16), high nibble
    return f16(blocks, 0) * q.float()


def _q4_1(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    q = nibbles(blocks[:, 4:20].view(n, 1, 16)).view(n, 32)
    return f16(blocks, 0) * q.float() + f16(blocks, 2)


def _q8_0(blocks: Tensor) -> Tensor:
    return blocks[:, 2:34].contiguous().view(torch.int8).float() * f16(blocks, 0)


def q4_k_scales_mins(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K's packed 12 bytes [n, 12] -> (sc [n, 8], m [n, 8]) 6-bit integers (formats.py has the bit map)."""
    s = scales.to(torch.int32).view(-1, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]                                    # bytes 0-3, 4-7, 8-11
    sc = torch.cat([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], dim=1)
    m = torch.cat([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], dim=1)
    return sc, m


def _q4_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    sc, m = q4_k_scales_mins(blocks[:, 4:16])
    d = (f16(blocks, 0) * sc.float()).view(n, 8, 1)                        # per sub-block scale
    dm = (f16(blocks, 2) * m.float()).view(n, 8, 1)                        # per sub-block min
    q = nibbles(blocks[:, 16:144].view(n, 4, 32)).view(n, 8, 32)          # sub-block 2c low, 2c + 1 high
    return (d * q.float() - dm).view(n, 256)


def _q6_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    # [half, 32-byte row, nibble, lane] -> [half, i = 2 * nibble + row, lane]: weight 128 half + 32 i + lane
    ql = nibbles(blocks[:, 0:128].view(n, 2, 2, 32)).transpose(2, 3).reshape(n, 2, 4, 32)
    qh = blocks[:, 128:192].to(torch.int32).view(n, 2, 32)
    qh = torch.stack([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, qh >> 6], dim=2)    # [half, i, lane]: bits 2i, 2i + 1
    q = (ql | (qh << 4)) - 32                                             # [n, 2, 4, 32] = weights 128 h + 32 i + l
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()     # [n, 16]
    d = (f16(blocks, 208) * scales).view(n, 16, 1)
    return (d * q.float().view(n, 16, 16)).view(n, 256)


_DECODERS = {Q4_0.ggml_type: _q4_0, Q4_1.ggml_type: _q4_1, Q8_0.ggml_type: _q8_0, Q4_K.ggml_type: _q4_k,
             Q6_K.ggml_type: _q6_k}


def dequantize_blocks(blocks: Tensor, qtype) -> Tensor:
    """blocks [n, type_size] uint8 of GGML type ``qtype`` (id, name or gguf enum) -> [n, block_size] float32."""
    fmt = block_format(qtype)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != fmt.type_size:
        raise ValueError(f"{fmt.name} blocks must be uint8 [n, {fmt.type_size}], got {blocks.dtype} "
                         f"{tuple(blocks.shape)}")
    return _DECODERS[fmt.ggml_type](blocks.contiguous())


def dequantize(data: Tensor, qtype, shape: tuple[int, ...] | None = None) -> Tensor:
    """GGUF tensor bytes -> float32 weights.

    data: uint8 [..., R] whose last dim holds whole blocks (e.g. a matrix [N, K / QK * type_size]), or flat;
    shape: the weights' shape (default: data's leading dims + [R / type_size * block_size]).

    >>> import torch
    >>> block = torch.tensor([0, 60] + [0x98] * 16, dtype=torch.uint8)     # Q4_0: d = f16 0x3c00 = 1.0, q = 8, 9
    >>> dequantize(block, "Q4_0").tolist() == [0.0] * 16 + [1.0] * 16
    True
    """
    fmt: BlockFormat = block_format(qtype)
    if data.dtype != torch.uint8:
        raise ValueError(f"{fmt.name} data must be uint8 bytes, got {data.dtype}")
    if data.shape[-1] % fmt.type_size if data.dim() else True:
        raise ValueError(f"{fmt.name}: the last dim ({data.shape[-1] if data.dim() else 0} bytes) is not a whole "
                         f"number of {fmt.type_size}-byte blocks")
    if shape is None:
        shape = (*data.shape[:-1], data.shape[-1] // fmt.type_size * fmt.block_size)
    out = dequantize_blocks(data.reshape(-1, fmt.type_size), fmt.ggml_type)
    return out.view(shape)
