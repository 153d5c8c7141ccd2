"""The ``backend="cuda"`` verification kernels: a thin JIT loader and the Python launchers.

Sources, side by side (llm.c style; each file's header says what each version changes):
    common.cuh         16-byte row loads, warp-shuffle argmax / softmax statistics, Philox
    verify_greedy.cu   argmax v2 (seed 004's V2) / v3 (streaming loads) + acceptance scan:
                       v1 naive, v2 ballot (Opt A), v3 segmented ballot (several sequences a warp)
    verify_sample.cu   rejection sampling: softmax statistics + ballot accept tests + race
    kv_compact.cu      KV compaction: v1 naive, v2 prefix sum + coalesced copy (Opt B),
                       v3 the same fused into one launch
    gemv.cu            decode-step weight matmul y = x @ W^T (+ b) for M <= 8 tokens: v1 fp32 FMAs,
                       v2 tensor-core MMAs (bf16/fp16); split-K inside the block, streaming
                       16-byte loads, deterministic reduction; v1 with a fused RMSNorm or SwiGLU
                       prologue (M <= 2)
    binding.cpp        torch glue, built only on a CUDA machine

The .cu files are plain CUDA C++ (no torch headers), so CPU CI compiles them with nvcc alone
(tests/test_cuda_compile.py). The extension is built on first use with
``torch.utils.cpp_extension.load`` into ``$TORCH_EXTENSIONS_DIR`` (default
``~/.cache/verispec/torch_extensions``), for the GPU's own architecture (sm_90 on H100/H200).

Entry points (all CUDA-graph safe except where a host check is noted):
    verify_greedy_cuda(batch, variant=DEFAULT_GREEDY)   "naive" | "ballot" | "segment"
    verify_sample_cuda(batch)                           top-k / top-p: NotImplementedError
    compact_kv_cuda(new_kv, num_rows, num_emitted, variant=DEFAULT_KV)   "naive" | "scan" | "fused"
    scatter_to_cache_cuda(cache, cache_lens, new_kv, num_rows, num_emitted, variant=DEFAULT_KV)
    target_argmax_cuda(logits, version) / greedy_scan_cuda(target_argmax, batch, variant)  (benchmarks)
    gemv_cuda(x, w, b=None, out=None)                   F.linear for M <= 8 rows (falls back otherwise)
    gemv_rmsnorm_cuda(x, w, norm_weight, eps, delta, b) (y, residual): add + RMSNorm fused into the GEMV (M <= 2)
    gemv_swiglu_cuda(gu, w, b)                          SwiGLU activation fused into the GEMV (M <= 2)

The defaults are the fastest versions measured in benchmarks/results/ablation.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..reference import VerifyOutput

_SRC = Path(__file__).resolve().parent
_SOURCES = ("binding.cpp", "verify_greedy.cu", "verify_sample.cu", "kv_compact.cu", "gemv.cu")
GREEDY_VARIANTS = {"naive": 0, "ballot": 1, "segment": 2}
KV_VARIANTS = {"naive": 0, "scan": 1, "fused": 2}
DEFAULT_GREEDY = "ballot"
DEFAULT_ARGMAX = 3
DEFAULT_KV = "fused"
_ext = None


def build_dir() -> Path:
    """Where the JIT build lives: $TORCH_EXTENSIONS_DIR or ~/.cache/verispec/torch_extensions."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "verispec" / "torch_extensions")
    return Path(root) / "verispec_cuda"


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the extension module."""
    global _ext
    if _ext is not None:
        return _ext
    if not torch.cuda.is_available():
        raise RuntimeError(
            "verispec's CUDA backend needs a CUDA GPU and a CUDA build of torch "
            f"(torch {torch.__version__} sees none); use backend='torch' or 'triton' instead"
        )
    from torch.utils.cpp_extension import CUDA_HOME, load as jit_load

    if shutil.which("nvcc") is None and CUDA_HOME is None:
        raise RuntimeError("verispec's CUDA backend is compiled on first use and needs nvcc: set CUDA_HOME or put nvcc on PATH")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    # NOTE: set the arch list so that torch adds no -gencode flags of its own for other GPUs.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _ext = jit_load(
        name="verispec_cuda",
        sources=[str(_SRC / s) for s in _SOURCES],
        extra_cflags=["-O3"],
        # no --use_fast_math: division, expf and logf must round as the reference expects
        extra_cuda_cflags=["-O3", "-lineinfo", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[str(_SRC)],
        build_directory=str(directory),
        verbose=verbose,
    )
    return _ext


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _output(tokens: torch.Tensor, num_accepted: torch.Tensor, num_emitted: torch.Tensor) -> VerifyOutput:
    return VerifyOutput(tokens, num_accepted, num_emitted)


# ---- verification ------------------------------------------------------------------------
def verify_greedy_cuda(batch, variant: str = DEFAULT_GREEDY, argmax_version: int = DEFAULT_ARGMAX) -> VerifyOutput:
    """Greedy verification of a ``verify.VerifyBatch``: row argmax + acceptance scan.

    variant: "naive" (thread per sequence), "ballot" (Opt A, warp per sequence) or "segment"
    (32 / next_pow2(max_k) sequences per warp). argmax_version: 2 or 3 (see verify_greedy.cu).
    """
    if variant not in GREEDY_VARIANTS:
        raise ValueError(f"variant must be one of {tuple(GREEDY_VARIANTS)}, got {variant!r}")
    if argmax_version not in (2, 3):
        raise ValueError(f"argmax_version must be 2 or 3, got {argmax_version!r}")
    ext = load()
    tokens, num_accepted, num_emitted = ext.verify_greedy(
        batch.target_logits, batch.draft_tokens, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, GREEDY_VARIANTS[variant], argmax_version,
    )
    return _output(tokens, num_accepted, num_emitted)


def target_argmax_cuda(target_logits: torch.Tensor, version: int = DEFAULT_ARGMAX) -> torch.Tensor:
    """[R, V] float -> [R] int32 argmax (lowest index on ties), one block per row (no chunking)."""
    _, idx = load().argmax_partial(target_logits, 1, version)
    return idx


def target_argmax_partial_cuda(target_logits: torch.Tensor, version: int = DEFAULT_ARGMAX):
    """(part_val, part_idx) [R * chunks] with the automatic vocabulary split (benchmarks, tests)."""
    return load().argmax_partial(target_logits, 0, version)


def greedy_scan_cuda(target_argmax: torch.Tensor, batch, variant: str = DEFAULT_GREEDY) -> VerifyOutput:
    """The acceptance scan alone, over a precomputed [R] int32 target argmax (benchmarks)."""
    tokens, num_accepted, num_emitted = load().greedy_scan(
        GREEDY_VARIANTS[variant], None, target_argmax, 1, batch.draft_tokens, batch.num_draft,
        batch.cu_num_draft, batch.max_num_draft + 1,
    )
    return _output(tokens, num_accepted, num_emitted)


def verify_sample_cuda(batch) -> VerifyOutput:
    """Rejection-sampling verification of a ``verify.VerifyBatch`` (temperature per sequence).

    top-k / top-p are not implemented here: a batch that uses them raises NotImplementedError
    (checked on the host, which syncs; under CUDA-graph capture the check is impossible and such
    sequences come back with num_accepted = -1 instead).
    """
    vocab = batch.vocab_size
    if not _capturing():
        # NOTE: host sync (two tiny reductions) to refuse filters we do not implement.
        uses_top_k = bool(((batch.top_k > 0) & (batch.top_k < vocab) & (batch.temperature > 0)).any())
        uses_top_p = bool(((batch.top_p < 1) & (batch.temperature > 0)).any())
        if uses_top_k or uses_top_p:
            raise NotImplementedError(
                "backend='cuda' verify_sample does not implement top-k / top-p yet; "
                "use backend='triton' or 'torch' for batches with top_k or top_p set"
            )
    ext = load()
    tokens, num_accepted, num_emitted = ext.verify_sample(
        batch.target_logits, batch.draft_tokens, batch.draft_probs, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, batch.temperature, batch.top_k, batch.top_p, batch.seed, batch.offset,
    )
    return _output(tokens, num_accepted, num_emitted)


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
    if check_values and not _capturing() and bool(((emit32 > rows32) | (emit32 < 0)).any()):
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
    if check_values and not _capturing() and bool((new_lens > cache.shape[1]).any()):
        raise ValueError(f"cache overflow: lengths {new_lens.tolist()} exceed capacity {cache.shape[1]}")
    rows32, emit32 = _counts(num_rows, num_emitted, new_kv.device)
    lens64 = cache_lens.to(device=new_kv.device, dtype=torch.int64).contiguous()
    load().kv_scatter(KV_VARIANTS[variant], cache, lens64, new_kv.contiguous(), rows32, emit32)
    return new_lens


# ---- decode GEMV -------------------------------------------------------------------------
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
    version: int = 0, rows: int = 0, split: int = 0,
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
                    version, rows, split)
    return y.view(out_shape) if out is None else out


def gemv_config(w: torch.Tensor, M: int) -> tuple[int, int, int]:
    """(version, rows, split) that gemv_cuda picks for w [N, K] (its dtype) and M rows of x on this GPU;
    rows is 16 (the MMA tile) for version 2."""
    version, rows, split = load().gemv_config(w, M)
    return version, rows, split


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
    ``runtime.kernels.add_rmsnorm`` followed by a linear: r = x + delta in fp32 rounded to the dtype,
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

    Matches ``runtime.kernels.silu_mul`` followed by a linear: silu(gate) = gate / (1 + exp(-gate)) in fp32,
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
