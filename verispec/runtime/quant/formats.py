"""The GGUF block formats verispec reads from their bytes: their type ids, block sizes and byte layouts.

A quantized matrix W [N, K] is stored row by row; each row is K / QK consecutive blocks of ``type_size`` bytes,
every block holding QK weights. All multi-byte fields are little-endian; ``f16`` is IEEE half precision.

    type  id  QK   bytes  block layout (offsets in bytes)                                       weight = ...
    Q4_0   2   32   18    d f16 @0, qs[16] @2: weight j < 16 in the low nibble of qs[j],         d * (q - 8)
                          weight j + 16 in its high nibble
    Q4_1   3   32   20    d f16 @0, m f16 @2, qs[16] @4 (nibbles as Q4_0)                         d * q + m
    Q8_0   8   32   34    d f16 @0, qs[32] int8 @2                                                q * d
    Q4_K  12  256  144    d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16: 8 sub-blocks of 32;  (d * sc_s) * q - dmin * m_s
                          6-bit scale sc_s and min m_s per sub-block packed in scales (below);
                          qs chunk c (32 bytes) holds sub-block 2c in its low nibbles, 2c+1 high
    Q6_K  14  256  210    ql[128] @0, qh[64] @128, scales[16] int8 @192, d f16 @208: 16           (d * sc_s) * (q - 32)
                          sub-blocks of 16; per half h (128 weights) ql[64 h + l] and
                          qh[32 h + l] give weights l, l+32, l+64, l+96 (below)

Q4_K's ``scales`` (j = sub-block, 6 bits each; bytes 0-3 A..D / a..d, 4-7 low bits of mins, 8-11 mixed):
    j < 4:   sc_j = scales[j] & 63                      m_j = scales[j + 4] & 63
    j >= 4:  sc_j = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4
             m_j  = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
Q6_K's weight of half h, lane l in [0, 32): the 6-bit q of weight 128 h + l + 32 i (i = 0..3) is
    low 4 bits = nibble (i // 2) of ql[64 h + l + 32 (i % 2)],  high 2 bits = bits 2i..2i+1 of qh[32 h + l],
and its scale is scales[8 h + 2 i + l // 16].

References: ggml's ``block_q4_0`` ... ``block_q6_K`` (ggml-common.h) and their ``dequantize_row_*`` (ggml-quants.c,
ggml-org/llama.cpp); gguf-py's ``gguf/quants.py`` is the dequantizer our tests compare with, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockFormat:
    name: str          # "Q4_K"
    ggml_type: int     # GGML type id in a GGUF tensor table
    block_size: int    # QK: weights per block
    type_size: int     # bytes per block

    def row_bytes(self, K: int) -> int:
        """Bytes of one row of K weights (K a multiple of ``block_size``)."""
        return K // self.block_size * self.type_size


Q4_0 = BlockFormat("Q4_0", 2, 32, 18)
Q4_1 = BlockFormat("Q4_1", 3, 32, 20)
Q8_0 = BlockFormat("Q8_0", 8, 32, 34)
Q4_K = BlockFormat("Q4_K", 12, 256, 144)
Q6_K = BlockFormat("Q6_K", 14, 256, 210)

# The formats verispec decodes itself (torch reference dequantizer; packed weights in memory).
FORMATS: dict[int, BlockFormat] = {f.ggml_type: f for f in (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)}
BY_NAME: dict[str, BlockFormat] = {f.name: f for f in FORMATS.values()}
QK_K = 256         # K-quant super-block


def block_format(qtype) -> BlockFormat:
    """The format of a GGML type given as its id, its name ("Q4_K") or a ``gguf.GGMLQuantizationType``;
    ValueError naming the supported ones otherwise."""
    key = getattr(qtype, "value", qtype)
    fmt = BY_NAME.get(key) if isinstance(key, str) else FORMATS.get(int(key))
    if fmt is None:
        name = getattr(qtype, "name", qtype)
        if not hasattr(qtype, "name") and not isinstance(key, str):
            try:                                   # a bare id: say which type it is (e.g. "Q5_0 (6)")
                from gguf.constants import GGMLQuantizationType

                name = f"{GGMLQuantizationType(int(key)).name} ({int(key)})"
            except (ImportError, ValueError):
                pass
        raise ValueError(f"GGML type {name} is not a block format verispec decodes (supported: {sorted(BY_NAME)})")
    return fmt


def is_supported(qtype) -> bool:
    key = getattr(qtype, "value", qtype)
    return (key in BY_NAME) if isinstance(key, str) else (int(key) in FORMATS)
