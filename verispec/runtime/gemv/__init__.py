"""The runtime's weight matmuls for the decode / verify pass, as one CUDA extension (``verispec_gemv``):

    invariant.cu   ``invariant_matmul(x, w)`` = ``F.linear(x, w)`` for bf16/fp16 and ANY number of rows, every
                   output element reduced in one fixed order whatever M is (tensor-core MMAs, fixed split-K):
                   the batch-invariant matmul of the pass. Its header states the order.
    gemv.cu        ``gemv_cuda(x, w)`` for M <= 8 rows: v1 fp32 FMAs (every dtype; per-row order fixed by its
                   (rows, split) configuration, so fp32 passes run it in chunks of 8 rows), v2 tensor cores.
    packed.cu      ``packed_matmul(x, blocks, qtype)``: W kept as GGUF blocks (quant/formats.py), dequantized in registers,
                   any rows, one reduction order (the decode / verify pass of a packed model); ``packed_dequantize``:
                   blocks -> a dense copy (the prefill's, for cuBLAS). docs/runtime.md, "Packed weights".
    gemv_common.cuh  the device helpers they share; packed_decoders.cuh packed.cu's block decoders (also built for
                   the host by tests/test_quant_decoders.py); binding.cpp the torch glue (built on a CUDA machine only)

The extension is built on first use by ``verispec.jit``; it holds only these kernels, so the first decode step
does not compile the verification kernels. Which one a pass uses: ``verispec.runtime.ops.linear`` and the
table in docs/runtime.md ("Exact widths").
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...jit import is_built, load_extension

_SRC = Path(__file__).resolve().parent
NAME = "verispec_gemv"


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the ``verispec_gemv`` extension."""
    return load_extension(NAME, [_SRC / "binding.cpp", _SRC / "gemv.cu", _SRC / "invariant.cu", _SRC / "packed.cu"],
                          [_SRC],
                          what="the decode GEMV", verbose=verbose)


def built() -> bool:
    """Whether the extension is already on disk (loading it is then quick)."""
    return is_built(NAME)


GEMV_MAX_M = 8
GEMV_VERSIONS = (1, 2)  # 1: fp32 FMAs (every dtype), 2: tensor-core MMAs (bf16 / fp16)
GEMV_ROWS = (1, 2, 4)
GEMV_SPLITS = (1, 2, 4, 8)
_GEMV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gemv_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether gemv.cu takes (x, w) itself rather than falling back to F.linear: 1 <= M <= 8 rows of
    x (M = x.numel() / K), K * element size a multiple of 16 bytes (bf16/fp16: K % 8 == 0, fp32:
    K % 4 == 0), w contiguous and 16-byte aligned. (x is copied when it is not contiguous or not
    16-byte aligned: it is small.)"""
    K = w.shape[1]
    M = x.numel() // K if K else 0
    return 1 <= M <= GEMV_MAX_M and (K * w.element_size()) % 16 == 0 and w.is_contiguous() and w.data_ptr() % 16 == 0


def gemv_cuda(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
    version: int = 0, rows: int = 0, split: int = 0, pdl: bool = False,
) -> torch.Tensor:
    """``F.linear(x, w, b)`` for the decode step's few tokens: x [..., K], w [N, K], b [N] -> [..., N].

    One launch of gemv.cu (fp32 accumulation, deterministic: bit-identical run to run), on the
    current stream, no host sync: CUDA-graph capturable. Where ``gemv_supported`` is false (more
    than 8 rows, K not a multiple of 16 bytes, misaligned or non-contiguous w) it returns
    ``F.linear(x, w, b)`` instead (written into ``out`` when given).

    out: optional contiguous [..., N] tensor of x's dtype, written in place and returned.
    version: 1 (fp32 FMAs) or 2 (tensor cores, bf16/fp16 only); rows (v1): rows per warp group
    (1, 2, 4); split: warps per row group (1, 2, 4, 8). 0 = the launcher's choice for the shape
    and dtype (see ``gemv_config``); benchmarks/gemv.py sweeps them.
    pdl: launch with programmatic dependent launch (sm_90+): the kernel may start while the previous
    kernel on the stream finishes, prefetching its first weights into L2 before it waits for x (gemv.cu's
    pdl_wait). Same result bit for bit.

    Example: ``gemv_cuda(torch.ones(1, 8, device="cuda"), torch.ones(3, 8, device="cuda"))``
    -> ``tensor([[8., 8., 8.]], device='cuda:0')``.
    """
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        raise TypeError("gemv_cuda: x and w must be tensors")
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"gemv_cuda: x {tuple(x.shape)} @ w {tuple(w.shape)}^T: w must be [N, K] and x [..., K]")
    if not (x.is_cuda and w.device == x.device):
        raise ValueError(f"gemv_cuda: x and w must be on one CUDA device, got x on {x.device}, w on {w.device}")
    if x.dtype not in _GEMV_DTYPES or w.dtype != x.dtype:
        raise ValueError(f"gemv_cuda: x and w must share one dtype of float32/bfloat16/float16, got x {x.dtype}, "
                         f"w {w.dtype}")
    N, K = w.shape
    out_shape = (*x.shape[:-1], N)
    if b is not None and (b.shape != (N,) or b.dtype != x.dtype or b.device != x.device):
        raise ValueError(f"gemv_cuda: b must be [{N}] {x.dtype} on {x.device}, got {tuple(b.shape)} {b.dtype} on {b.device}")
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError(f"gemv_cuda: out must be a contiguous {out_shape} {x.dtype} tensor on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if version not in (0, *GEMV_VERSIONS) or rows not in (0, *GEMV_ROWS) or split not in (0, *GEMV_SPLITS):
        raise ValueError(f"gemv_cuda: version must be 0 or one of {GEMV_VERSIONS}, rows 0 or one of {GEMV_ROWS}, "
                         f"split 0 or one of {GEMV_SPLITS}; got version={version}, rows={rows}, split={split}")
    if version == 2 and x.dtype == torch.float32:
        raise ValueError("gemv_cuda: version 2 (tensor cores) needs bfloat16 or float16, got float32")
    if not gemv_supported(x, w):
        y = torch.nn.functional.linear(x, w, b)
        return y if out is None else out.copy_(y)
    x2 = x.reshape(-1, K).contiguous()  # [M, K]
    if x2.data_ptr() % 16:  # a fresh copy is 16-byte aligned
        x2 = x2.clone()
    y = load().gemv(x2, w, None if b is None else b.contiguous(), None if out is None else out.view(-1, N),
                    version, rows, split, bool(pdl))
    return y.view(out_shape) if out is None else out


def gemv_config(w: torch.Tensor, M: int) -> tuple[int, int, int]:
    """(version, rows, split) that gemv_cuda picks for w [N, K] (its dtype) and M rows of x on this GPU;
    rows is 16 (the MMA tile) for version 2."""
    version, rows, split = load().gemv_config(w, M)
    return version, rows, split


# ------------------------------------------------------------------------------------ invariant matmul
INVARIANT_DTYPES = (torch.bfloat16, torch.float16)


def invariant_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether invariant.cu takes (x, w): bf16/fp16, K % 8 == 0 (16-byte rows), w contiguous and 16-byte aligned,
    at least one row of x, at most 65535 tiles of 16 rows of w (N < 1048576). x is copied when it is not
    contiguous or aligned (it is small)."""
    if x.dtype not in INVARIANT_DTYPES or w.dtype != x.dtype or w.dim() != 2:
        return False
    N, K = w.shape
    return (K % 8 == 0 and K >= 8 and x.numel() >= K and w.is_contiguous() and w.data_ptr() % 16 == 0
            and N < 16 * 65536)


def invariant_matmul(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                     out: torch.Tensor | None = None, variant: int = 0, slices: int = 0,
                     pdl: bool = False) -> torch.Tensor:
    """``F.linear(x, w, b)`` with every output element reduced in one order that does not depend on the number
    of rows: row i of ``invariant_matmul(x, w)`` equals ``invariant_matmul(x[i:i+1], w)`` bit for bit, for any
    x (the batch invariance that keeps greedy speculative output equal to plain decoding in bf16).

    x [..., K], w [N, K], b [N] (bf16 or fp16, one CUDA device) -> [..., N] of x's dtype; fp32 accumulation.
    One launch of invariant.cu, no host sync: CUDA-graph capturable. ``invariant_supported`` must hold (a
    ValueError says which requirement fails otherwise).
    out: optional contiguous [..., N] tensor of x's dtype, written in place and returned.
    variant: 0 = ``invariant_variant(M, N, K)`` (speed only: every variant computes the same bits); 1..n a fixed
    one (benchmarks/exact.py sweeps them). slices: 0 = the product's order (``vs_inv_slices(K)``); 1, 2, 4, 8
    select another fixed order (tests).
    pdl: launch with programmatic dependent launch (sm_90+), as ``gemv_cuda``.

    Example: ``invariant_matmul(torch.ones(3, 8, device="cuda", dtype=torch.bfloat16), torch.ones(2, 8,
    device="cuda", dtype=torch.bfloat16))`` -> ``[[8., 8.], [8., 8.], [8., 8.]]`` (bf16).
    """
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        raise TypeError("invariant_matmul: x and w must be tensors")
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"invariant_matmul: x {tuple(x.shape)} @ w {tuple(w.shape)}^T: w must be [N, K] and x [..., K]")
    if not (x.is_cuda and w.device == x.device):
        raise ValueError(f"invariant_matmul: x and w must be on one CUDA device, got x on {x.device}, w on {w.device}")
    if not invariant_supported(x, w):
        raise ValueError(f"invariant_matmul: needs bf16/fp16 x and w of one dtype (got {x.dtype}, {w.dtype}), "
                         f"K % 8 == 0 (K = {w.shape[1]}), at least one row, w contiguous and 16-byte aligned, "
                         f"N < 1048576 (N = {w.shape[0]})")
    N, K = w.shape
    out_shape = (*x.shape[:-1], N)
    if b is not None and (b.shape != (N,) or b.dtype != x.dtype or b.device != x.device):
        raise ValueError(f"invariant_matmul: b must be [{N}] {x.dtype} on {x.device}, got {tuple(b.shape)} {b.dtype} "
                         f"on {b.device}")
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError(f"invariant_matmul: out must be a contiguous {out_shape} {x.dtype} tensor on {x.device}")
    if slices not in (0, 1, 2, 4, 8):
        raise ValueError(f"invariant_matmul: slices must be 0, 1, 2, 4 or 8, got {slices}")
    if variant and not 1 <= variant <= invariant_variants():   # 0 (the product's): nothing to ask the extension
        raise ValueError(f"invariant_matmul: variant must be 0 (automatic) or 1..{invariant_variants()}, got {variant}")
    x2 = x.reshape(-1, K).contiguous()
    if x2.data_ptr() % 16:
        x2 = x2.clone()
    variant = variant or invariant_variant(x2.shape[0], N, K)
    y = load().inv_matmul(x2, w, None if b is None else b.contiguous(), None if out is None else out.view(-1, N),
                          int(variant), int(slices), bool(pdl))
    return y.view(out_shape) if out is None else out


# The variant invariant_matmul runs for M rows of w [N, K] (speed only: every variant computes the same bits).
# Variants 1-12 and 17-20: invariant.cu's slice-warp kernel, (RT, NT, U) = row tiles, token tiles, unroll;
# VARIANT_RULE = (max M, variant for N <= 4096, for N <= 8192, for N > 8192), first match: the H200 sweep of
# 2026-11-29 for M <= 16 (benchmarks/results/exact_h200.md: the 8B qkv, N = 6144, on v4 at one row, 16.9 against v2's
# 19.3 us; the wide matrices on v18, 64 rows of W a block, at 9-16 rows: the 8B gate/up 63.3 against v6's 67.2), the
# H100 sweep of 2026-11-25 (exact.md) for 17-32 rows and the H200 sweep of invariant_cluster.md for 33-64. Variant 13:
# its cluster kernel (sm_90; elsewhere variant 12 runs instead), which that H200 sweep has faster past 32 rows for
# matrices wider than CLUSTER_RULE's N (max M, N), with rows of at least CLUSTER_MIN_K (shorter rows leave each
# slice's block too few steps).
VARIANT_RULE = ((8, 2, 4, 18), (16, 5, 6, 18), (32, 8, 8, 8), (64, 10, 10, 12), (1 << 31, 8, 8, 8))
CLUSTER_VARIANT, CLUSTER_MIN_K = 13, 2048
CLUSTER_VARIANTS = (13, 14, 15, 16)   # invariant.cu's cluster-kernel variants (the rest: its slice-warp kernel)
CLUSTER_RULE = ((32, 1 << 62), (128, 4096), (1 << 31, 2048))


def invariant_variant(M: int, N: int, K: int) -> int:
    """The variant for M rows and w [N, K]: ``CLUSTER_VARIANT`` where ``CLUSTER_RULE`` and ``CLUSTER_MIN_K`` pick
    it, else ``VARIANT_RULE``'s."""
    if K >= CLUSTER_MIN_K and N > next(n for max_m, n in CLUSTER_RULE if M <= max_m):
        return CLUSTER_VARIANT
    for max_m, narrow, middle, wide in VARIANT_RULE:
        if M <= max_m:
            return narrow if N <= 4096 else middle if N <= 8192 else wide
    raise AssertionError("VARIANT_RULE ends with an unbounded row")


def invariant_config(M: int, N: int, K: int, variant: int = 0) -> dict:
    """What ``invariant_matmul`` runs for M rows and w [N, K]: the order's slice count and the variant's tile
    shape, e.g. ``{"slices": 8, "variant": 1, "rt": 1, "nt": 1, "u": 4, "wr": 0}`` (wr: the warps of a block of the
    cluster kernel, 0 for the slice-warp kernel; invariant.cu's header). variant: 0 = ``invariant_variant``'s."""
    if variant and not 1 <= variant <= invariant_variants():
        raise ValueError(f"invariant_config: variant must be 0 (automatic) or 1..{invariant_variants()}, got {variant}")
    s, v, rt, nt, u, wr = load().inv_config(int(M), int(N), int(K), int(variant or invariant_variant(M, N, K)))
    return dict(slices=s, variant=v, rt=rt, nt=nt, u=u, wr=wr)


def invariant_variants() -> int:
    """How many variants ``invariant_matmul(variant=...)`` accepts (1..n)."""
    return int(load().inv_num_variants())


# ------------------------------------------------------------------------------------ packed (GGUF block) matmul
PACKED_VARIANTS = (1, 2, 3, 4, 5)   # packed.cu's variants (its header says what differs): v1 and v2 the same bits;
                                    # v3 its own order on the tensor cores, every type, bf16 x (v1's bits for fp32 /
                                    # fp16 x); v4 v3's bits, the weights staged through shared memory; v5 v3's bits, a
                                    # producer warp's bulk copies feeding 8 computing warps (the default:
                                    # vs_packed_default_variant). 0 = the default


def _packed_args(fn: str, blocks: torch.Tensor, qtype: int, K: int, variant: int):
    """The block format of ``qtype``, after checking blocks [N, row bytes of K] and the variant (ValueError naming
    what is wrong)."""
    from ..quant.formats import block_format

    fmt = block_format(qtype)
    if K % fmt.block_size:
        raise ValueError(f"{fn}: rows of {K} weights are not a whole number of {fmt.name} blocks of {fmt.block_size}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != fmt.row_bytes(K):
        raise ValueError(f"{fn}: rows of {K} weights need {fmt.name} blocks uint8 [N, {fmt.row_bytes(K)}], got "
                         f"{blocks.dtype} {tuple(blocks.shape)}")
    if variant not in (0, *PACKED_VARIANTS):
        raise ValueError(f"{fn}: variant must be 0 (the default) or one of {PACKED_VARIANTS}, got {variant}")
    return fmt


def packed_matmul(x: torch.Tensor, blocks: torch.Tensor, qtype: int, b: torch.Tensor | None = None, *,
                  out: torch.Tensor | None = None, variant: int = 0, pdl: bool = False) -> torch.Tensor:
    """``F.linear(x, W, b)`` with W [N, K] given as GGUF blocks: ``blocks`` uint8 [N, K / QK * type_size] of GGML type
    ``qtype`` (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K). x [..., K] (fp32 / bf16 / fp16, CUDA) -> [..., N] of x's dtype, fp32
    accumulation, each output element reduced in packed.cu's one order (row i of the result does not depend on the
    other rows). One launch, no host sync. variant: 0 = the default (``PACKED_VARIANTS``), 1 or 2 (the same bits;
    packed.cu's header), 3 (tensor cores, bf16 x: batch-invariant too, in another order, so not v2's bits; fp32 /
    fp16 x run v1), 4 (v3's bits, the weights staged through shared memory), 5 (v3's bits, loads and arithmetic in
    different warps; the default). pdl: launch v3 / v4 / v5 with programmatic dependent launch (sm_90+), as
    ``gemv_cuda``; v1 and v2 ignore it.

    Example: W = 2 rows of 32 weights, all 1.0 in Q8_0 (d = 1, q = 1):
    ``blocks = torch.tensor([[0, 60] + [1] * 32] * 2, dtype=torch.uint8, device="cuda")``,
    ``packed_matmul(torch.ones(1, 32, device="cuda"), blocks, 8)`` -> ``tensor([[32., 32.]], device='cuda:0')``.
    """
    K = x.shape[-1]
    fmt = _packed_args("packed_matmul", blocks, qtype, K, variant)
    if x.dtype not in _GEMV_DTYPES:
        raise ValueError(f"packed_matmul: x must be float32/bfloat16/float16, got {x.dtype}")
    if not (x.is_cuda and blocks.device == x.device):
        raise ValueError(f"packed_matmul: x and blocks must be on one CUDA device, got {x.device}, {blocks.device}")
    N = blocks.shape[0]
    out_shape = (*x.shape[:-1], N)
    x2 = x.reshape(-1, K).contiguous()
    if x2.data_ptr() % 16:                      # v2 reads x as 16-byte vectors
        x2 = x2.clone()
    blocks = blocks.contiguous()
    if variant in (0, 3, 4, 5) and blocks.data_ptr() % 16:   # v3 / v4 / v5 read blocks as 16-byte vectors: a fresh
        blocks = blocks.clone()                             # copy is aligned (a model's matrices always are)
    y = load().packed_matmul(x2, blocks, fmt.ggml_type, fmt.type_size,
                             None if b is None else b.contiguous(), None if out is None else out.view(-1, N),
                             int(variant), bool(pdl))
    return y.view(out_shape) if out is None else out


def packed_dequantize(blocks: torch.Tensor, qtype: int, K: int, dtype: torch.dtype, *, out: torch.Tensor | None = None,
                      variant: int = 0) -> torch.Tensor:
    """W [N, K] in ``dtype`` from its GGUF blocks (uint8 [N, K / QK * type_size], CUDA): one launch, each weight the
    value ``quant.dequantize`` gives (bit for bit, as fp32) rounded once to ``dtype``. The prefill's dense copy of a
    packed matrix for a tensor-core GEMM (``ops.linear``). out: optional contiguous [N, K] ``dtype`` tensor (e.g. a
    row slice of a fused matrix's copy), written and returned. variant: as ``packed_matmul``'s (the same decoders)."""
    fmt = _packed_args("packed_dequantize", blocks, qtype, K, variant)
    if dtype not in _GEMV_DTYPES:
        raise ValueError(f"packed_dequantize: dtype must be float32/bfloat16/float16, got {dtype}")
    if not blocks.is_cuda:
        raise ValueError(f"packed_dequantize: blocks must be on a CUDA device, got {blocks.device}")
    shape = (blocks.shape[0], K)
    if out is None:
        out = torch.empty(shape, device=blocks.device, dtype=dtype)
    elif (tuple(out.shape) != shape or out.dtype != dtype or out.device != blocks.device or not out.is_contiguous()
          or out.data_ptr() % 16):
        raise ValueError(f"packed_dequantize: out must be a contiguous 16-byte aligned {shape} {dtype} tensor on "
                         f"{blocks.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    return load().packed_dequantize(blocks.contiguous(), fmt.ggml_type, fmt.type_size, out, int(variant))
