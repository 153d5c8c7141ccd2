"""Packed weights on a GPU (CUDA only; every test skips on the CPU with the reason): packed.cu against the torch
dequantizer + matmul, its batch invariance, the packed model through the kernels path, and the quantizer on CUDA
equal to the CPU's bytes. Not yet run on a device: these are the checks that gate VERISPEC_PACKED_GEMV=1."""
import functools

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (packed.cu, the kernels path)")

from verispec.runtime.quant import dequantize, quantize  # noqa: E402
from verispec.runtime.quant.formats import BY_NAME  # noqa: E402

# (N, K) shape classes of the 8B and 1B models: q / o, k / v, gate+up, down, the LM head (a slice of its rows)
SHAPES = [(4096, 4096), (1024, 4096), (2 * 14336, 4096), (4096, 14336), (2048, 2048), (512, 2048), (2048, 8192),
          (8000, 4096)]
TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"]


@functools.lru_cache(maxsize=None)
def blocks_of(name: str, N: int, K: int, seed: int = 0) -> torch.Tensor:
    """[N, row bytes] CUDA blocks of N(0, 0.02) weights quantized to ``name`` (quantized once per shape)."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.02
    if name == "Q4_1":     # verispec does not quantize to Q4_1: random blocks with finite scales
        fmt = BY_NAME[name]
        b = torch.randint(0, 256, (N * K // 32, fmt.type_size), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(seed))
        b[:, 0:4] = (torch.rand(N * K // 32, 2) * 0.01).half().view(torch.uint8).view(-1, 4)
        return b.view(N, -1).cuda()
    return quantize(w.cuda(), name)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_matmul_matches_the_reference(name, N, K, dtype):
    """Tolerance: the kernel and the reference differ only in summation order and the output's rounding, so
    |y - ref| <= 2^-16 * (|x| @ |W|^T) + one rounding of the output dtype."""
    from verispec.runtime.gemv import packed_matmul

    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, N, K).cuda()
    W = dequantize(blocks, qtype)                                       # fp32 [N, K]: the reference's weights
    x = torch.randn(5, K, device="cuda").to(dtype)
    y = packed_matmul(x, blocks, qtype).float()
    ref = x.float() @ W.T
    scale = x.float().abs() @ W.abs().T
    out_ulp = ref.abs() * (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -23)
    assert bool(((y - ref).abs() <= 2.0 ** -16 * scale + out_ulp + 1e-30).all()), (y - ref).abs().max()


@pytest.mark.parametrize("name", TYPES)
def test_packed_matmul_is_batch_invariant(name):
    """Row i of a pass of M rows is the same bits as that row alone, for M = 1..33 (the verify widths and beyond)."""
    from verispec.runtime.gemv import packed_matmul

    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, 1024, 4096, seed=1).cuda()
    x = torch.randn(33, 4096, device="cuda", dtype=torch.bfloat16)
    alone = torch.cat([packed_matmul(x[i:i + 1], blocks, qtype) for i in range(33)])
    for M in (1, 2, 3, 5, 8, 9, 17, 33):
        assert torch.equal(packed_matmul(x[:M], blocks, qtype), alone[:M]), M


def test_quantize_on_cuda_equals_the_cpu():
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(2))
    w[0] = 0
    w[1, ::7] *= 40
    for name in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
        assert torch.equal(quantize(w.cuda(), name).cpu(), quantize(w, name)), name


@pytest.mark.parametrize("gemv", [False, True])
def test_packed_model_on_the_gpu(tmp_path, monkeypatch, gemv):
    """A tiny Q4_K_M model loaded packed on CUDA (bf16, the kernels path): its logits within bf16 rounding of the
    dense-loaded model's, and a 4-token verify pass bit-identical to 4 decode steps (with packed.cu: its batch
    invariance; without: the dequantized weights through invariant.cu)."""
    import verispec.runtime.ops as ops
    from verispec.runtime import ModelConfig, load_model
    from verispec.runtime.quant.export import write_quantized_gguf

    monkeypatch.setattr(ops, "PACKED_GEMV", gemv)
    cfg = ModelConfig(vocab_size=512, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                      intermediate_size=512)
    path = tmp_path / "tiny.gguf"
    write_quantized_gguf(cfg, path, "Q4_K_M", device="cuda", seed=1)
    packed, dense = load_model(path, device="cuda", packed=True), load_model(path, device="cuda")
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    out = []
    for m in (packed, dense):
        m.setup_cache(1, 32)
        m.prefill([ids[0, :8].tolist()])
        out.append(m.append(ids[:, 8:12].cuda()).float())
    assert ((out[0] - out[1]).abs().max() / out[1].abs().max()).item() < 2e-2
    packed.setup_cache(1, 32)
    packed.prefill([ids[0, :8].tolist()])
    steps = torch.cat([packed.append(ids[:, 8 + i:9 + i].cuda()) for i in range(4)], dim=1)
    assert torch.equal(steps.float(), out[0])
