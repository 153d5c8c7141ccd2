"""The runtime's decode GEMV: ``gemv_cuda(x, w)`` = ``F.linear(x, w)`` for the few tokens of a decode or
verify pass (M <= 8 rows), one launch of gemv.cu, deterministic (bit-identical run to run).

    gemv.cu       v1: fp32 FMAs, split-K inside the block, streaming 16-byte loads, fixed-order reduction;
                  v2: tensor-core MMAs (bf16/fp16). The file's header explains the work split.
    binding.cpp   torch glue, built only on a CUDA machine

The extension ``verispec_gemv`` is built on first use by ``verispec.jit``; it holds only this kernel, so
the first decode step does not compile the verification kernels. How the runtime uses it (one fixed
configuration for one sequence, which keeps verify passes batch-invariant): ``verispec.runtime.ops.linear``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...jit import is_built, load_extension

_SRC = Path(__file__).resolve().parent
NAME = "verispec_gemv"


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the ``verispec_gemv`` extension."""
    return load_extension(NAME, [_SRC / "binding.cpp", _SRC / "gemv.cu"], [_SRC], what="the decode GEMV",
                          verbose=verbose)


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
