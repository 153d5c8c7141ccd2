"""``PackedWeight``: a weight matrix kept in memory as its GGUF blocks instead of a dequantized copy.

    W [N, K] = rows [part 0; part 1; ...]; part j: ``blocks`` uint8 [n_j, K / QK * type_size] of one GGML type

A fused matrix of the runtime (``wqkv`` = [q; k; v], ``w13`` = [gate; up]) is one PackedWeight of one part per run of
rows of one type: consecutive GGUF tensors of the same type are joined at construction (Q4_K_M's w13 is one Q4_K
part; a wqkv whose attn_v is Q6_K is [q and k Q4_K; v Q6_K]), so a matmul is one launch per type, not per tensor.
Rows are whole blocks, so a row permutation (llama.cpp's Q/K layout, undone at load), a join or a row gather (an
embedding lookup) moves bytes, never re-quantizes.

How a pass uses it:
  * matmul on the CPU (``linear`` below, the torch path of transformer.py): ``dequantize`` to the activations' dtype,
    then F.linear. The results equal the dense model's whose weights are the dequantized blocks (same values, same
    matmul), bit for bit: tests/test_quant_packed.py.
  * matmul on CUDA (``ops.linear``, the kernels path): gemv/packed.cu reads the blocks in place for the decode /
    verify pass, the prefill dequantizes a matrix at a time for cuBLAS (docs/runtime.md, "Packed weights").
  * embedding: gather the token rows' blocks and dequantize those rows only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .dequantize import dequantize
from .formats import block_format


class PackedWeight:
    """W [N, K] as GGUF blocks, computing in ``dtype``.

    parts: [(GGML type, blocks uint8 [n_j, K / QK_j * type_size_j])], stacked by rows (consecutive parts of one type
    are joined into one); K: the row length."""

    def __init__(self, parts: list[tuple[int, Tensor]], K: int, dtype: torch.dtype):
        if not parts:
            raise ValueError("PackedWeight needs at least one part")
        self.parts: list[tuple[int, Tensor]] = []
        for qtype, blocks in parts:
            fmt = block_format(qtype)
            if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != fmt.row_bytes(K) \
                    or K % fmt.block_size:
                raise ValueError(f"a {fmt.name} part of rows of {K} weights must be uint8 [n, {fmt.row_bytes(K)}], "
                                 f"got {blocks.dtype} {tuple(blocks.shape)}")
            if self.parts and self.parts[-1][0] == fmt.ggml_type:      # one launch per run of one type
                self.parts[-1] = (fmt.ggml_type, torch.cat([self.parts[-1][1], blocks]))
            else:
                self.parts.append((fmt.ggml_type, blocks))
        devices = {b.device for _, b in self.parts}
        if len(devices) != 1:
            raise ValueError(f"PackedWeight parts on several devices: {devices}")
        self.K = K
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, int]:
        return sum(b.shape[0] for _, b in self.parts), self.K

    @property
    def device(self) -> torch.device:
        return self.parts[0][1].device

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for _, b in self.parts)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(block_format(q).name for q, _ in self.parts)

    def __repr__(self) -> str:
        rows = " + ".join(f"{b.shape[0]} {block_format(q).name}" for q, b in self.parts)
        return f"PackedWeight([{self.shape[0]}, {self.K}] = {rows} rows, {self.nbytes} bytes, {self.dtype}, {self.device})"

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """W [N, K] in ``dtype`` (default: the compute dtype)."""
        w = torch.cat([dequantize(b, q) for q, b in self.parts]) if len(self.parts) > 1 else \
            dequantize(self.parts[0][1], self.parts[0][0])
        return w.to(dtype or self.dtype)

    def embedding(self, ids: Tensor) -> Tensor:
        """Rows ``ids`` [...] of W -> [..., K] in the compute dtype; only those rows are dequantized."""
        flat = ids.reshape(-1)
        if len(self.parts) == 1:
            q, blocks = self.parts[0]
            rows = dequantize(blocks.index_select(0, flat), q)
        else:
            rows = self.dequantize(torch.float32).index_select(0, flat)
        return rows.to(self.dtype).view(*ids.shape, self.K)


def linear(x: Tensor, w, b: Tensor | None = None) -> Tensor:
    """``F.linear(x, w, b)`` for a dense or packed w: x [..., K], w [N, K] -> [..., N]."""
    if isinstance(w, PackedWeight):
        w = w.dequantize(x.dtype)
    return F.linear(x, w, b)


def embedding(ids: Tensor, w) -> Tensor:
    """``F.embedding(ids, w)`` for a dense or packed w."""
    return w.embedding(ids) if isinstance(w, PackedWeight) else F.embedding(ids, w)


def packed_weights(net) -> dict[str, PackedWeight]:
    """{attribute path: PackedWeight} of a Transformer (empty for a dense one)."""
    out = {}
    for name, module in net.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, PackedWeight):
                out[f"{name}.{attr}" if name else attr] = value
    return out
