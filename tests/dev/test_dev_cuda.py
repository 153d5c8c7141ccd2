"""GPU parity of the dev/ CUDA experiments (dev.cuda_ext): KV compaction / scatter variants against
dev.kv.kv's reference, and the decode GEMV with a fused RMSNorm / SwiGLU prologue against
verispec.runtime.ops followed by a linear layer."""
from __future__ import annotations

import pytest
import torch

from dev.kv.kv import compact_kv, reference_compact_kv, reference_scatter_to_cache, scatter_to_cache
from gemv_reference import assert_gemv_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
KV = ["naive", "scan", "fused"]


# ---- KV compaction -------------------------------------------------------------------------
KV_SHAPES = [((8, 128), torch.bfloat16), ((3,), torch.float16), ((5, 7), torch.float32), ((16,), torch.uint8)]


def _kv_case(batch, shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    num_rows = torch.randint(1, 10, (batch,), generator=g, dtype=torch.int32)
    num_emitted = (torch.rand(batch, generator=g) * num_rows).floor().to(torch.int32) + 1
    total = int(num_rows.sum())
    if dtype == torch.uint8:
        new_kv = torch.randint(0, 255, (total, *shape), generator=g, dtype=torch.uint8)
    else:
        new_kv = torch.randn(total, *shape, generator=g).to(dtype)
    return new_kv.cuda(), num_rows.cuda(), num_emitted.cuda()


@pytest.mark.parametrize("variant", KV)
@pytest.mark.parametrize("shape,dtype", KV_SHAPES)
@pytest.mark.parametrize("batch", [1, 37, 256, 3000])
def test_compact_kv(variant, shape, dtype, batch):
    from dev.cuda_ext import compact_kv_cuda

    new_kv, num_rows, num_emitted = _kv_case(batch, shape, dtype, seed=batch)
    packed, cu = compact_kv_cuda(new_kv, num_rows, num_emitted, variant=variant)
    ref = reference_compact_kv(new_kv.cpu(), num_rows.cpu(), num_emitted.cpu())
    assert cu.cpu().tolist() == [0] + torch.cumsum(num_emitted.cpu(), 0).tolist()
    assert torch.equal(packed[: ref.shape[0]].cpu(), ref)


@pytest.mark.parametrize("variant", KV)
@pytest.mark.parametrize("shape,dtype", KV_SHAPES)
def test_scatter_to_cache(variant, shape, dtype):
    from dev.cuda_ext import scatter_to_cache_cuda

    batch, capacity = 64, 40
    new_kv, num_rows, num_emitted = _kv_case(batch, shape, dtype, seed=1)
    cache_lens = torch.randint(0, capacity - 10, (batch,)).cuda()
    cache = torch.zeros(batch, capacity, *shape, dtype=dtype, device="cuda")
    expected = cache.cpu().clone()
    ref_lens = reference_scatter_to_cache(expected, cache_lens.cpu(), reference_compact_kv(new_kv.cpu(), num_rows.cpu(), num_emitted.cpu()), num_emitted.cpu())
    lens = scatter_to_cache_cuda(cache, cache_lens, new_kv, num_rows, num_emitted, variant=variant)
    assert torch.equal(lens.cpu(), ref_lens)
    assert torch.equal(cache.cpu(), expected)


def test_kv_public_api_and_overflow():
    new_kv, num_rows, num_emitted = _kv_case(8, (4, 64), torch.bfloat16, seed=3)
    packed, cu = compact_kv(new_kv, num_rows, num_emitted, backend="cuda")
    ref = reference_compact_kv(new_kv.cpu(), num_rows.cpu(), num_emitted.cpu())
    assert torch.equal(packed[: ref.shape[0]].cpu(), ref)
    cache = torch.zeros(8, 4, 4, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="overflow"):
        scatter_to_cache(cache, torch.full((8,), 3, device="cuda"), new_kv, num_rows, num_rows, backend="cuda")



# ---- decode GEMV with a fused prologue (gemv.cu gemv_fused_kernel) ---------------------------
# K: the llama-3.2-1b / 3.1-8b hidden sizes, the 8B intermediate size, an odd multiple of 8 (1048 = 8 * 131);
# N ragged (not a multiple of a block's rows).
FUSED_SHAPES = [(3001, 2048), (1037, 4096), (517, 14336), (130, 1048), (7, 40)]


def _fused_inputs(M, N, K, dtype, seed, bias):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, K, device="cuda", generator=g) * 2).to(dtype)
    delta = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    nw = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=g).to(dtype) if bias else None
    return x, delta, nw, w, b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_delta", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_rmsnorm_matches_add_rmsnorm_then_linear(dtype, with_delta, bias):
    from dev.cuda_ext import gemv_rmsnorm_cuda, gemv_rmsnorm_supported
    from verispec.runtime import ops

    for i, (N, K) in enumerate(FUSED_SHAPES):
        for M in (1, 2):
            x, delta, nw, w, b = _fused_inputs(M, N, K, dtype, 10 * i + M, bias)
            d = delta if with_delta else None
            assert gemv_rmsnorm_supported(x, w)
            y, res = gemv_rmsnorm_cuda(x, w, nw, 1e-5, d, b)
            ref_res, h = ops.add_rmsnorm(x, d, nw, 1e-5)
            assert y.shape == (M, N) and y.dtype == dtype and res.shape == (M, K)
            assert torch.equal(res, ref_res), "the residual must equal add_rmsnorm's bit for bit"
            if not with_delta:
                assert res is x
            assert_gemv_close(y, h, w, b)
            assert not bool(y.isnan().any())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_swiglu_matches_silu_mul_then_linear(dtype, bias):
    from dev.cuda_ext import gemv_swiglu_cuda, gemv_swiglu_supported
    from verispec.runtime import ops

    for i, (N, K) in enumerate(FUSED_SHAPES):
        for M in (1, 2):
            g = torch.Generator(device="cuda").manual_seed(100 + 10 * i + M)
            gu = (torch.randn(M, 2 * K, device="cuda", generator=g) * 3).to(dtype)
            w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(dtype)
            b = torch.randn(N, device="cuda", generator=g).to(dtype) if bias else None
            assert gemv_swiglu_supported(gu, w)
            y = gemv_swiglu_cuda(gu, w, b)
            assert y.shape == (M, N) and y.dtype == dtype
            assert_gemv_close(y, ops.silu_mul(gu), w, b)


def test_gemv_fused_nan_outputs_tiles_determinism_and_graphs():
    """Outputs from a NaN-filled allocator are fully written; every tiles setting (rows per block) and a
    second call give the same bits; a CUDA graph replay equals an eager call."""
    from dev.cuda_ext import gemv_rmsnorm_cuda, gemv_swiglu_cuda

    for N, K in [(6144, 4096), (2051, 2048), (4096, 14336)]:
        for M in (1, 2):
            x, delta, nw, w, _ = _fused_inputs(M, N, K, torch.bfloat16, N + M, False)
            gu = torch.randn(M, 2 * K, device="cuda", dtype=torch.bfloat16)
            w2 = w[:, : K // 2].contiguous()
            ref = gemv_rmsnorm_cuda(x, w, nw, 1e-6, delta)
            ref_s = gemv_swiglu_cuda(gu[:, : K], w2)
            for tiles in (1, 2, 3, 0):
                torch.cuda.synchronize()
                bufs = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(4)]
                del bufs
                y, res = gemv_rmsnorm_cuda(x, w, nw, 1e-6, delta, tiles=tiles)
                ys = gemv_swiglu_cuda(gu[:, : K], w2, tiles=tiles)
                assert not bool(y.isnan().any()) and not bool(res.isnan().any()) and not bool(ys.isnan().any())
                assert torch.equal(y, ref[0]) and torch.equal(res, ref[1]) and torch.equal(ys, ref_s)
    # graph capture / replay with fresh inputs
    x, delta, nw, w, b = _fused_inputs(2, 3000, 2048, torch.bfloat16, 5, True)
    gu = torch.randn(2, 2 * 2048, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(1000, 2048, device="cuda", dtype=torch.bfloat16) * 0.02
    gemv_rmsnorm_cuda(x, w, nw, 1e-5, delta, b)
    gemv_swiglu_cuda(gu, w2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, res = gemv_rmsnorm_cuda(x, w, nw, 1e-5, delta, b)
        ys = gemv_swiglu_cuda(gu, w2)
    x.copy_(torch.randn_like(x))
    gu.copy_(torch.randn_like(gu))
    graph.replay()
    torch.cuda.synchronize()
    y2, res2 = gemv_rmsnorm_cuda(x, w, nw, 1e-5, delta, b)
    assert torch.equal(y, y2) and torch.equal(res, res2) and torch.equal(ys, gemv_swiglu_cuda(gu, w2))


def test_gemv_fused_supported_and_errors():
    from dev.cuda_ext import gemv_rmsnorm_cuda, gemv_rmsnorm_supported, gemv_swiglu_cuda, gemv_swiglu_supported

    x, delta, nw, w, b = _fused_inputs(2, 64, 128, torch.bfloat16, 1, True)
    gu = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
    # leading dims and an unaligned x are accepted (x is copied)
    y, res = gemv_rmsnorm_cuda(x.view(1, 2, 128), w, nw, 1e-5, delta.view(1, 2, 128))
    assert y.shape == (1, 2, 64) and res.shape == (1, 2, 128)
    flat = torch.cat([torch.zeros(1, dtype=x.dtype, device="cuda"), x.flatten()])
    assert torch.equal(gemv_rmsnorm_cuda(flat[1:].view(2, 128), w, nw, 1e-5)[0], gemv_rmsnorm_cuda(x, w, nw, 1e-5)[0])
    # outside the fused kernel: M > 2, K % 8 != 0, w not contiguous, CPU tensors
    x3 = torch.randn(3, 128, device="cuda", dtype=x.dtype)
    w_odd = torch.randn(64, 100, device="cuda", dtype=x.dtype)
    for xx, ww in [(x3, w), (x[:, :100].contiguous(), w_odd), (x, torch.randn(64, 256, device="cuda",
                                                                              dtype=x.dtype)[:, :128]), (x.cpu(), w.cpu())]:
        assert not gemv_rmsnorm_supported(xx, ww)
    assert not gemv_swiglu_supported(torch.randn(3, 256, device="cuda", dtype=x.dtype), w)
    with pytest.raises(ValueError, match="outside the fused"):
        gemv_rmsnorm_cuda(x3, w, nw, 1e-5)
    with pytest.raises(ValueError, match="outside the fused"):
        gemv_swiglu_cuda(torch.randn(3, 256, device="cuda", dtype=x.dtype), w)
    with pytest.raises(ValueError, match="w must be"):
        gemv_rmsnorm_cuda(x, w[:, :64], nw, 1e-5)
    with pytest.raises(ValueError, match="norm_weight"):
        gemv_rmsnorm_cuda(x, w, nw[:64], 1e-5)
    with pytest.raises(ValueError, match="delta"):
        gemv_rmsnorm_cuda(x, w, nw, 1e-5, delta.float())
    with pytest.raises(ValueError, match="dtype"):
        gemv_rmsnorm_cuda(x, w.float(), nw, 1e-5)
    with pytest.raises(ValueError, match="b must be"):
        gemv_swiglu_cuda(gu, w, b[:10])
    with pytest.raises(ValueError, match=r"\[\.\.\., 2I\]"):
        gemv_swiglu_cuda(gu[:, :255], w)
