"""Launchers for the dev/ CUDA experiments, over one JIT-built extension ``verispec_dev``:

    kv/kv_compact.cu            KV compaction: v1 naive, v2 prefix sum + coalesced copy, v3 the same in one launch
    gemv_fused/gemv_fused.cu    gemv.cu's v1 with a fused RMSNorm or SwiGLU prologue (M <= 2)
    binding.cpp                 torch glue

Measured, never imported by verispec/ (docs/architecture.md, the import rule): the ablation benchmark
(benchmarks/ablation.py) and benchmarks/gemv.py --fused use them; tests/test_cuda_parity.py checks them
against their references (dev/kv/kv.py, the runtime's separate kernels) on the GPU.
"""
from __future__ import annotations

from pathlib import Path

import torch

from verispec.device import is_capturing
from verispec.jit import load_extension
from verispec.runtime.gemv import _GEMV_DTYPES

_DEV = Path(__file__).resolve().parent
_ROOT = _DEV.parent
KV_VARIANTS = {"naive": 0, "scan": 1, "fused": 2}
DEFAULT_KV = "fused"


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the ``verispec_dev`` extension."""
    sources = [_DEV / "binding.cpp", _DEV / "kv" / "kv_compact.cu", _DEV / "gemv_fused" / "gemv_fused.cu"]
    includes = [_ROOT / "verispec" / "verify" / "cuda", _ROOT / "verispec" / "runtime" / "gemv"]
    return load_extension("verispec_dev", sources, includes, what="the dev/ experiments", verbose=verbose)


# ---- KV compaction -----------------------------------------------------------------------
def _counts(num_rows: torch.Tensor, num_emitted: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (num_rows.to(device=device, dtype=torch.int32).contiguous(),
            num_emitted.to(device=device, dtype=torch.int32).contiguous())


def compact_kv_cuda(
    new_kv: torch.Tensor, num_rows: torch.Tensor, num_emitted: torch.Tensor, *, variant: str = DEFAULT_KV,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv.compact_kv`` on the GPU: (packed [R, ...], cu_num_emitted [B + 1] int32).

    check_values: refuse num_emitted outside [0, num_rows] like the reference (a host sync;
    skipped under graph capture, where the kernel clamps instead).
    """
    if variant not in KV_VARIANTS:
        raise ValueError(f"variant must be one of {tuple(KV_VARIANTS)}, got {variant!r}")
    rows32, emit32 = _counts(num_rows, num_emitted, new_kv.device)
    if check_values and not is_capturing() and bool(((emit32 > rows32) | (emit32 < 0)).any()):
        raise ValueError("num_emitted must satisfy 0 <= num_emitted <= num_rows for every sequence")
    packed, cu_num_emitted = load().kv_compact(KV_VARIANTS[variant], new_kv.contiguous(), rows32, emit32)
    return packed, cu_num_emitted


def scatter_to_cache_cuda(
    cache: torch.Tensor, cache_lens: torch.Tensor, new_kv: torch.Tensor, num_rows: torch.Tensor,
    num_emitted: torch.Tensor, *, variant: str = DEFAULT_KV, check_values: bool = True,
) -> torch.Tensor:
    """``kv.scatter_to_cache`` on the GPU: writes cache in place, returns cache_lens + num_emitted.

    check_values: refuse a cache overflow like the reference (a host sync; skipped under graph
    capture, where the kernel drops the entries past the capacity instead).
    """
    if variant not in KV_VARIANTS:
        raise ValueError(f"variant must be one of {tuple(KV_VARIANTS)}, got {variant!r}")
    if not cache.is_contiguous():
        raise ValueError("cache must be contiguous ([B, S_max, ...] static buffer)")
    new_lens = cache_lens + num_emitted
    if check_values and not is_capturing() and bool((new_lens > cache.shape[1]).any()):
        raise ValueError(f"cache overflow: lengths {new_lens.tolist()} exceed capacity {cache.shape[1]}")
    rows32, emit32 = _counts(num_rows, num_emitted, new_kv.device)
    lens64 = cache_lens.to(device=new_kv.device, dtype=torch.int64).contiguous()
    load().kv_scatter(KV_VARIANTS[variant], cache, lens64, new_kv.contiguous(), rows32, emit32)
    return new_lens


# ---- decode GEMV with a fused prologue ----------------------------------------------------
# gemv.cu's gemv_fused_kernel: v1 (fp32 FMAs) with the RMSNorm (+ residual add) or the SwiGLU
# activation computed in the same launch, into shared memory, before the weight stream. Measured slower
# than the separate kernels on an H100 (benchmarks/results/gemv.md), so verispec.runtime does not call it.
GEMV_FUSED_MAX_M = 2
GEMV_FUSED_MAX_SMEM = 192 << 10  # bytes of h = [M, K] in shared memory (H100 / H200: 227 KB a block)


def _fused_shape_ok(M: int, K: int, w: torch.Tensor, dtype: torch.dtype) -> bool:
    elem = w.element_size()
    return (dtype in _GEMV_DTYPES and w.dtype == dtype and w.dim() == 2 and w.shape[1] == K and w.shape[0] >= 1
            and 1 <= M <= GEMV_FUSED_MAX_M and K >= 1 and (K * elem) % 16 == 0 and M * K * elem <= GEMV_FUSED_MAX_SMEM
            and w.is_contiguous() and w.data_ptr() % 16 == 0)


def gemv_rmsnorm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``gemv_rmsnorm_cuda`` runs for x [..., K] and w [N, K]: x and w CUDA tensors of one dtype
    (float32/bfloat16/float16), 1 <= M <= 2 rows (M = x.numel() / K), N >= 1, K * element size a multiple of
    16 bytes, M * K * element size <= 192 KB (h is staged in shared memory), w contiguous and 16-byte aligned."""
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.is_cuda and w.device == x.device):
        return False
    K = x.shape[-1] if x.dim() else 0
    return K > 0 and _fused_shape_ok(x.numel() // K, K, w, x.dtype)


def gemv_swiglu_supported(gu: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``gemv_swiglu_cuda`` runs for gu [..., 2I] and w [N, I]: the conditions of
    ``gemv_rmsnorm_supported`` with K = I."""
    if not (isinstance(gu, torch.Tensor) and isinstance(w, torch.Tensor) and gu.is_cuda and w.device == gu.device):
        return False
    I2 = gu.shape[-1] if gu.dim() else 0
    return I2 > 0 and I2 % 2 == 0 and _fused_shape_ok(gu.numel() // I2, I2 // 2, w, gu.dtype)


def _aligned_rows(t: torch.Tensor, K: int) -> torch.Tensor:
    """t as a contiguous, 16-byte aligned [M, K] tensor (a copy only where needed)."""
    t2 = t.reshape(-1, K).contiguous()
    return t2 if t2.data_ptr() % 16 == 0 else t2.clone()


def _check_fused(name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, K: int, tiles: int) -> None:
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        raise TypeError(f"{name}: inputs must be tensors")
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"{name}: w must be [N, {K}], got {tuple(w.shape)}")
    if not (x.is_cuda and w.device == x.device):
        raise ValueError(f"{name}: inputs must be on one CUDA device, got {x.device} and w on {w.device}")
    if x.dtype not in _GEMV_DTYPES or w.dtype != x.dtype:
        raise ValueError(f"{name}: inputs and w must share one dtype of float32/bfloat16/float16, got {x.dtype} and "
                         f"w {w.dtype}")
    N = w.shape[0]
    if b is not None and (b.shape != (N,) or b.dtype != x.dtype or b.device != x.device):
        raise ValueError(f"{name}: b must be [{N}] {x.dtype} on {x.device}, got {tuple(b.shape)} {b.dtype} on {b.device}")
    if not isinstance(tiles, int) or tiles < 0:
        raise ValueError(f"{name}: tiles must be an int >= 0 (0 = automatic), got {tiles!r}")


def gemv_rmsnorm_cuda(
    x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
    b: torch.Tensor | None = None, *, tiles: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, residual) = (F.linear(RMSNorm(r) * norm_weight, w, b), r) with r = x + delta (or x), in one launch.

    x, delta: [..., K] (M = 1..2 rows), norm_weight [K], w [N, K], b [N], one dtype. Matches
    ``verispec.runtime.ops.add_rmsnorm`` followed by a linear: r = x + delta in fp32 rounded to the dtype,
    rstd = 1 / sqrt(mean(r^2) + eps) in fp32, h = round(r * rstd * norm_weight), y = h @ w^T with fp32
    accumulation (gemv.cu v1; deterministic). residual: a new tensor with delta, x itself without.
    tiles: row tiles per block (0 = automatic). Raises ValueError where ``gemv_rmsnorm_supported`` is false.
    CUDA-graph capturable once warmed up (the first call per shape caches occupancy and attributes).
    """
    K = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    _check_fused("gemv_rmsnorm_cuda", x, w, b, K, tiles)
    if not (isinstance(norm_weight, torch.Tensor) and norm_weight.shape == (K,) and norm_weight.dtype == x.dtype
            and norm_weight.device == x.device):
        raise ValueError(f"gemv_rmsnorm_cuda: norm_weight must be [{K}] {x.dtype} on {x.device}, got "
                         f"{getattr(norm_weight, 'shape', None)} {getattr(norm_weight, 'dtype', None)}")
    if delta is not None and (not isinstance(delta, torch.Tensor) or delta.shape != x.shape or delta.dtype != x.dtype
                              or delta.device != x.device):
        raise ValueError(f"gemv_rmsnorm_cuda: delta must match x {tuple(x.shape)} {x.dtype} on {x.device}, got "
                         f"{getattr(delta, 'shape', None)} {getattr(delta, 'dtype', None)}")
    if not gemv_rmsnorm_supported(x, w):
        raise ValueError(f"gemv_rmsnorm_cuda: x {tuple(x.shape)} @ w {tuple(w.shape)} {x.dtype} is outside the fused "
                         f"kernel (1 <= M <= {GEMV_FUSED_MAX_M} rows, K * elem % 16 == 0, M * K * elem <= "
                         f"{GEMV_FUSED_MAX_SMEM} bytes, N >= 1, w contiguous and 16-byte aligned): check "
                         "gemv_rmsnorm_supported first")
    N = w.shape[0]
    x2 = _aligned_rows(x, K)
    d2 = None if delta is None else _aligned_rows(delta, K)
    y, res = load().gemv_rmsnorm(x2, w, _aligned_rows(norm_weight, K).view(K), float(eps), d2,
                                 None if b is None else b.contiguous(), tiles)
    y = y.view(*x.shape[:-1], N)
    return y, (x if delta is None else res.view(x.shape))


def gemv_swiglu_cuda(gu: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                     tiles: int = 0) -> torch.Tensor:
    """F.linear(silu(gate) * up, w, b) in one launch, gu [..., 2I] = [gate | up] (M = 1..2 rows), w [N, I].

    Matches ``verispec.runtime.ops.silu_mul`` followed by a linear: silu(gate) = gate / (1 + exp(-gate)) in fp32,
    h = round(silu(gate) * up), y = h @ w^T with fp32 accumulation (gemv.cu v1; deterministic).
    tiles: row tiles per block (0 = automatic). Raises ValueError where ``gemv_swiglu_supported`` is false.
    """
    I2 = gu.shape[-1] if isinstance(gu, torch.Tensor) and gu.dim() else 0
    if I2 % 2:
        raise ValueError(f"gemv_swiglu_cuda: gu must be [..., 2I] ([gate | up]), got {tuple(gu.shape)}")
    _check_fused("gemv_swiglu_cuda", gu, w, b, I2 // 2, tiles)
    if not gemv_swiglu_supported(gu, w):
        raise ValueError(f"gemv_swiglu_cuda: gu {tuple(gu.shape)} with w {tuple(w.shape)} {gu.dtype} is outside the "
                         f"fused kernel (1 <= M <= {GEMV_FUSED_MAX_M} rows, I * elem % 16 == 0, M * I * elem <= "
                         f"{GEMV_FUSED_MAX_SMEM} bytes, N >= 1, w contiguous and 16-byte aligned): check "
                         "gemv_swiglu_supported first")
    y = load().gemv_swiglu(_aligned_rows(gu, I2), w, None if b is None else b.contiguous(), tiles)
    return y.view(*gu.shape[:-1], w.shape[0])
