"""GPU parity of the runtime's decode GEMV (verispec.runtime.gemv, gemv.cu) against F.linear.

Every launch configuration (versions, rows per block, split-K) on ragged shapes, outputs fully
written (NaN-filled allocator), a fixed reduction order (bit-identical repeats), fallbacks to
F.linear outside the kernel's domain, input errors, CUDA-graph replay.
"""
from __future__ import annotations

import pytest
import torch

from gemv_reference import assert_gemv_close, gemv_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (N, K): N not a multiple of any block's rows, K a multiple of 8 but not of a warp's 256
# elements; the llama-3.2-1b o-projection; a long K (down projection) cut by split-K.
GEMV_SHAPES = [(1, 8), (7, 40), (33, 264), (100, 1000), (257, 2056), (2051, 2048), (130, 8200)]


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_matches_linear(dtype, bias, version):
    from verispec.runtime.gemv import gemv_cuda

    if version == 2 and dtype == torch.float32:
        pytest.skip("version 2 (tensor cores) is bf16/fp16 only")
    for i, (N, K) in enumerate(GEMV_SHAPES):
        for M in range(1, 9):
            x, w, b = gemv_inputs(M, N, K, dtype, bias, seed=100 * i + M)
            y = gemv_cuda(x, w, b, version=version)
            assert y.shape == (M, N) and y.dtype == dtype
            assert_gemv_close(y, x, w, b)


@pytest.mark.parametrize("version,rows", [(1, 1), (1, 2), (1, 4), (2, 0)])
@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_gemv_every_config(version, rows, split):
    from verispec.runtime.gemv import gemv_cuda

    for M in (1, 3, 8):
        x, w, b = gemv_inputs(M, 2051, 2056, torch.bfloat16, True, seed=M)
        assert_gemv_close(gemv_cuda(x, w, b, version=version, rows=rows, split=split), x, w, b)


@pytest.mark.parametrize("version", [1, 2])
def test_gemv_overwrites_nan_output_and_is_deterministic(version):
    from verispec.runtime.gemv import gemv_cuda

    for N, K in [(2051, 2048), (130, 8200), (128256 // 4, 2048)]:
        for M in (1, 5, 8):
            x, w, b = gemv_inputs(M, N, K, torch.bfloat16, False, seed=N + M)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            gemv_cuda(x, w, b, out=out, version=version)
            assert not bool(out.isnan().any()), "an output element was never written"
            # fresh outputs from an allocator whose cached blocks hold NaN
            torch.cuda.synchronize()
            bufs = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(4)]
            del bufs
            again = gemv_cuda(x, w, b, version=version)
            assert not bool(again.isnan().any())
            assert torch.equal(out, again), "two calls differ: the reduction order must be fixed"


def test_gemv_leading_dims_unaligned_x_and_fallbacks():
    from verispec.runtime.gemv import gemv_cuda, gemv_supported

    x, w, b = gemv_inputs(6, 300, 512, torch.float16, True, seed=7)
    y = gemv_cuda(x.view(2, 3, 512), w, b)
    assert y.shape == (2, 3, 300)
    assert_gemv_close(y.view(6, 300), x, w, b)
    flat = torch.cat([torch.zeros(1, dtype=x.dtype, device="cuda"), x.flatten()])
    x_off = flat[1:].view(6, 512)  # 2-byte offset: copied before the launch
    assert torch.equal(gemv_cuda(x_off, w, b), gemv_cuda(x, w, b))
    # fallbacks to F.linear: K % 8 != 0, M > 8, w not contiguous (a column slice)
    w_wide = torch.randn(300, 1024, device="cuda", dtype=x.dtype)
    for xx, ww in [(x[:, :500].contiguous(), w[:, :500].contiguous()), (torch.cat([x, x]), w), (x, w_wide[:, :512])]:
        assert not gemv_supported(xx, ww)
        torch.testing.assert_close(gemv_cuda(xx, ww), torch.nn.functional.linear(xx, ww))


def test_gemv_input_errors():
    from verispec.runtime.gemv import gemv_cuda

    x, w, b = gemv_inputs(2, 64, 128, torch.bfloat16, True, seed=1)
    with pytest.raises(ValueError, match="x .* @ w"):
        gemv_cuda(x, w[:, :64])
    with pytest.raises(ValueError, match="dtype"):
        gemv_cuda(x, w.float())
    with pytest.raises(ValueError, match="CUDA device"):
        gemv_cuda(x.cpu(), w)
    with pytest.raises(ValueError, match="b must be"):
        gemv_cuda(x, w, b[:10])
    with pytest.raises(ValueError, match="out must be"):
        gemv_cuda(x, w, out=torch.empty(2, 63, dtype=x.dtype, device="cuda"))
    with pytest.raises(ValueError, match="split"):
        gemv_cuda(x, w, split=3)
    with pytest.raises(ValueError, match="version 2"):
        gemv_cuda(x.float(), w.float(), version=2)


def test_gemv_cuda_graph_replay():
    from verispec.runtime.gemv import gemv_cuda

    x, w, b = gemv_inputs(4, 4097, 4096, torch.bfloat16, True, seed=3)
    out = torch.empty(4, 4097, dtype=x.dtype, device="cuda")
    gemv_cuda(x, w, b, out=out)  # warm up (builds the extension) outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemv_cuda(x, w, b, out=out)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gemv_cuda(x, w, b))
