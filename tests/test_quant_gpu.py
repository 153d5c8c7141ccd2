"""Packed weights on a GPU (CUDA only; every test skips on the CPU with the reason): packed.cu against the torch
dequantizer + matmul, its batch invariance, its two variants computing the same bits, its dequantizer (the prefill's)
equal to the torch dequantizer, the packed model through the kernels path (decode / verify through packed.cu, the
prefill through the dequantizer and cuBLAS), the embedded SmolLM2 from its blocks, and the quantizer on CUDA equal to
the CPU's bytes."""
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


# v3's own shapes besides SHAPES: K = 768 (3 units of 256 weights, fewer than its 8 slices; Q6_K rows of 630 bytes, so
# every other row is 2 mod 4 aligned) with N = 300 (a partial 16-row tile); SmolLM2's fused q/k/v (960 x 576: a short
# last unit of 2 blocks) and down (576 x 1536)
V3_SHAPES = SHAPES + [(300, 768), (960, 576), (576, 1536)]


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N, K", V3_SHAPES)
def test_packed_v3_matches_the_reference(name, N, K):
    """packed.cu v3 (bf16 x, tensor cores) against the torch dequantizer + fp32 matmul. v3 regroups each chunk's sum
    (Q4_K / Q4_1: scale * sum(q x) + offset * sum(x); Q6_K: per 16-weight scale group), so its terms are bounded by
    |x| @ (|scale q| + |offset|) rather than |x| @ |W| (up to about 4x larger for real blocks): tolerance
    2^-14 * (|x| @ |W|^T) + one bf16 rounding of the output, i.e. the v1 / v2 bound of 2^-16 on that 4x."""
    from verispec.runtime.gemv import packed_matmul

    if K % BY_NAME[name].block_size:
        pytest.skip(f"rows of {K} are not whole {name} blocks")
    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, N, K).cuda()
    W = dequantize(blocks, qtype)
    x = torch.randn(11, K, device="cuda").bfloat16()
    y = packed_matmul(x, blocks, qtype, variant=3).float()
    ref = x.float() @ W.T
    scale = x.float().abs() @ W.abs().T
    assert bool(((y - ref).abs() <= 2.0 ** -14 * scale + ref.abs() * 2.0 ** -8 + 1e-30).all()), (y - ref).abs().max()


def pass_inputs(name: str, N: int, K: int, rows: int):
    """(qtype, CUDA blocks [N, row bytes], (x 16-byte aligned, x misaligned) bf16 [rows, K], a bias [N]) for a
    packed pass's checks; skips where K is not whole blocks of ``name``."""
    if K % BY_NAME[name].block_size:
        pytest.skip(f"rows of {K} are not whole {name} blocks")
    flat = torch.randn(rows * K + 1, device="cuda").bfloat16()
    return (BY_NAME[name].ggml_type, blocks_of(name, N, K).cuda(),
            (flat[:rows * K].view(rows, K), flat[1:].view(rows, K)), torch.randn(N, device="cuda").bfloat16())


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N, K", [(1024, 4096), (4096, 14336), (300, 768), (960, 576)])
def test_packed_v3_is_batch_invariant(name, N, K):
    """v3's promise: row i of a pass of M rows is the same bits as row i alone, for every M = 1..16 (the widths held
    in registers: 8 and 16 tokens a block), 17 and 33 (more blocks along the tokens), x aligned or not, with a bias,
    and the rows of two sequences in one pass (ragged)."""
    from verispec.runtime.gemv import packed_matmul

    qtype, blocks, xs, b = pass_inputs(name, N, K, 33)
    for x in xs:
        alone = torch.cat([packed_matmul(x[i:i + 1], blocks, qtype, b, variant=3) for i in range(33)])
        for M in [*range(1, 17), 17, 33]:
            assert torch.equal(packed_matmul(x[:M], blocks, qtype, b, variant=3), alone[:M]), (M, x.data_ptr() % 16)
        ragged = torch.cat([x[3:8], x[20:29]])                             # rows of two sequences in one pass
        assert torch.equal(packed_matmul(ragged, blocks, qtype, b, variant=3), torch.cat([alone[3:8], alone[20:29]]))


# v4's own shapes besides V3_SHAPES: a tensor of one short row (Q6_K K = 256: 210-byte rows, a unit at 2 mod 16 in
# every other row; the last row's window reaches past the tensor's end, which v4 zero-fills) and N = 17 (a tile of 1
# row); v5's: more row tiles than the GPU holds blocks (each block walks several, the last one short) with a slot of 4
# units (warps 4..7 idle), and a row of 9 units (a full slot, then a slot of one); v5 runs from 2048 rows of W
V4_SHAPES = V3_SHAPES + [(3, 256), (17, 512), (9000, 1024), (2400, 2304)]


@pytest.mark.parametrize("variant", [4, 5])
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N, K", V4_SHAPES)
def test_packed_v4_and_v5_equal_v3(name, N, K, variant):
    """v4 stages the weights through shared memory, v5 has a producer warp bulk-copy them for 8 computing warps; both
    compute v3's arithmetic: the same bits as v3 for every M (1..17, 33, and 40 / 97: 32 tokens a block past 16), x
    aligned or not, with a bias, launched with and without PDL, and inside a CUDA graph (PDL edges)."""
    from verispec.runtime.gemv import packed_matmul

    qtype, blocks, xs, b = pass_inputs(name, N, K, 97)
    for x in xs:
        for M in [*range(1, 18), 33, 40, 97]:
            want = packed_matmul(x[:M], blocks, qtype, b, variant=3)
            for pdl in (False, True):
                assert torch.equal(packed_matmul(x[:M], blocks, qtype, b, variant=variant, pdl=pdl), want), (M, pdl)
    x = xs[0][:5]
    want = packed_matmul(x, blocks, qtype, variant=3)
    out = torch.empty_like(want)
    packed_matmul(x, blocks, qtype, out=out, variant=variant, pdl=True)  # the launch's one-time set-up, outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mid = packed_matmul(x, blocks, qtype, variant=variant, pdl=True)
        packed_matmul(x, blocks, qtype, out=out, variant=variant, pdl=True)
        mid.add_(0)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(mid, want)


@pytest.mark.parametrize("name", TYPES)
def test_packed_v3_runs_v1_for_fp32_and_fp16(name):
    """v3 is built for bf16 x only (the GPU models' dtype): fp32 and fp16 x run v1 under variant 3, bit for bit. (With
    bf16 x v3 does NOT equal v1 / v2's bits: its order regroups the sum; the tests above bound it against the
    reference and check its own batch invariance.)"""
    from verispec.runtime.gemv import packed_matmul

    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, 1024, 4096).cuda()
    x = torch.randn(9, 4096, device="cuda")
    for dtype in (torch.float32, torch.float16):
        for M in (1, 5, 9):
            assert torch.equal(packed_matmul(x[:M].to(dtype), blocks, qtype, variant=3),
                               packed_matmul(x[:M].to(dtype), blocks, qtype, variant=1)), (dtype, M)


def test_quantize_on_cuda_equals_the_cpu():
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(2))
    w[0] = 0
    w[1, ::7] *= 40
    for name in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
        assert torch.equal(quantize(w.cuda(), name).cpu(), quantize(w, name)), name


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N, K", [(1024, 4096), (4096, 14336), (960, 576), (300, 1536)])
def test_packed_variants_compute_the_same_bits(name, N, K):
    """packed.cu's v2 (word loads, exact int -> float by the 2^23 trick, 1 / 2 / 4 / 8 tokens a block; bf16 only, fp32
    and fp16 run v1) equals v1 bit for bit at every width, x aligned or not (the wrapper copies a misaligned x for v2's
    vector loads), with a bias too."""
    dtype = torch.bfloat16
    from verispec.runtime.gemv import packed_matmul

    if K % BY_NAME[name].block_size:
        pytest.skip(f"rows of {K} are not whole {name} blocks")
    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, N, K).cuda()                # seed 0: the shapes of SHAPES are quantized once
    flat = torch.randn(17 * K + 1, device="cuda").to(dtype)
    for x in (flat[:17 * K].view(17, K), flat[1:].view(17, K)):          # 16-byte aligned, then misaligned
        for M in (1, 2, 3, 4, 5, 8, 9, 16, 17):
            assert torch.equal(packed_matmul(x[:M], blocks, qtype, variant=2), packed_matmul(x[:M], blocks, qtype,
                                                                                              variant=1)), (M, x.data_ptr() % 16)
    b = torch.randn(N, device="cuda").to(dtype)
    assert torch.equal(packed_matmul(x[:3], blocks, qtype, b, variant=2), packed_matmul(x[:3], blocks, qtype, b, variant=1))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("variant", [1, 2])
def test_packed_dequantize_equals_the_reference(name, variant):
    """The prefill's dequantizer: every weight the torch dequantizer's fp32 value (gguf-py's bit for bit), rounded
    once to the dtype; row slices of a fused matrix's copy written in place."""
    from verispec.runtime.gemv import packed_dequantize

    qtype = BY_NAME[name].ggml_type
    blocks = blocks_of(name, 4096, 4096).cuda()
    ref = dequantize(blocks, qtype)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(packed_dequantize(blocks, qtype, 4096, dtype, variant=variant), ref.to(dtype)), dtype
    out = torch.full((6144, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    packed_dequantize(blocks, qtype, 4096, torch.bfloat16, out=out[1024:5120], variant=variant)
    assert torch.equal(out[1024:5120], ref.bfloat16()) and bool(out[:1024].isnan().all() and out[5120:].isnan().all())


def test_packed_prefill_is_the_dense_models(tmp_path):
    """The prefill on packed weights (each matrix dequantized to bf16, then cuBLAS; the LM head on the last token
    through packed.cu) writes the K/V of the dense-loaded model bit for bit (the same bf16 weights, the same GEMMs);
    its logits are within bf16 rounding of the dense model's (the head's weights are exact there, rounded to bf16 in
    the dense model)."""
    from verispec.runtime import ModelConfig, load_model
    from verispec.runtime.quant.export import write_quantized_gguf

    cfg = ModelConfig(vocab_size=512, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                      intermediate_size=512)
    path = tmp_path / "tiny.gguf"
    write_quantized_gguf(cfg, path, "Q4_K_M", device="cuda", seed=2)
    packed, dense = load_model(path, device="cuda", packed=True), load_model(path, device="cuda")
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (40, 700)]
    for prompt in prompts:                                # a graph bucket (<= 512 tokens), then an eager prefill
        logits = []
        for m in (packed, dense):
            m.setup_cache(1, 768)
            logits.append(m.prefill([prompt]).float())
        for i in range(cfg.num_layers):
            assert torch.equal(packed.cache.k[i][:, :, :len(prompt)], dense.cache.k[i][:, :, :len(prompt)]), i
            assert torch.equal(packed.cache.v[i][:, :, :len(prompt)], dense.cache.v[i][:, :, :len(prompt)]), i
        assert ((logits[0] - logits[1]).abs().max() / logits[1].abs().max()).item() < 2e-2


@pytest.mark.parametrize("variant", [0, 3], ids=["default", "v3"])
def test_embedded_smollm2_runs_from_its_blocks_on_the_gpu(monkeypatch, variant):
    """The embedded SmolLM2-135M (Q4_1 matrices, a Q8_0 embedding that is also the LM head) packed on CUDA, every
    matmul through packed.cu or its dequantizer:
      * its logits (teacher-forced, prefill then 24 decode steps) are within 5% (of the largest logit) of the dense
        bf16 load's, i.e. the same model up to rounding (a wrong decoding is off by the logits' whole size). Not bit
        for bit: the dense model's weights are rounded to bf16, packed.cu multiplies by the exact fp32 ones, so greedy
        texts agree until a near-tie flips a token, which is not asserted;
      * speculative greedy output equals plain greedy output on the packed model, bit for bit, for every drafter
        (the product's promise: packed.cu is batch-invariant), with packed.cu's default variant and with v3."""
    import verispec.runtime.ops as ops
    from verispec import DraftModel, PromptLookup, SelfSpeculative, generate
    from verispec.runtime import load_model
    from verispec.runtime.loading import embedded_gguf_path
    from verispec.runtime.quant.packed import packed_weights

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    monkeypatch.setattr(ops, "PACKED_VARIANT", variant)
    packed, dense = load_model(device="cuda", packed=True), load_model(device="cuda")
    assert len(packed_weights(packed.net)) == 1 + 30 * 4 and packed.weight_bytes < 100e6
    ids = packed.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}])
    steps = torch.randint(0, packed.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    out = []
    for m in (packed, dense):
        m.setup_cache(1, 256)
        first = m.prefill([ids])[:, None]
        out.append(torch.cat([first, *(m.append(steps[:, i:i + 1].cuda()) for i in range(24))], dim=1).float())
    assert ((out[0] - out[1]).abs().max() / out[1].abs().max()).item() < 5e-2
    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog.", "Write a haiku about the sea.",
               "List three fruits."]
    plain = [g.tokens for g in generate(packed, prompts, max_new_tokens=48, chat=True)]
    assert plain == [generate(packed, p, max_new_tokens=48, chat=True).tokens for p in prompts]
    drafters = {"lookup": PromptLookup, "self": lambda: SelfSpeculative(layers=20),
                "draft": lambda: DraftModel(packed.truncated(10))}
    for kind, make in drafters.items():
        for k in (1, 4):
            got = [g.tokens for g in generate(packed, prompts, drafter=make(), k=k, max_new_tokens=48, chat=True)]
            assert got == plain, (kind, k)


@pytest.mark.parametrize("gemv, variant", [(False, 0), (True, 0), (True, 1), (True, 2), (True, 3), (True, 4)])
def test_packed_model_on_the_gpu(tmp_path, monkeypatch, gemv, variant):
    """A tiny Q4_K_M model loaded packed on CUDA (bf16, the kernels path): its logits within bf16 rounding of the
    dense-loaded model's, and a 4-token verify pass bit-identical to 4 decode steps (with packed.cu: its batch
    invariance, any variant; without: the dequantized weights through invariant.cu)."""
    import verispec.runtime.ops as ops
    from verispec.runtime import ModelConfig, load_model
    from verispec.runtime.quant.export import write_quantized_gguf

    monkeypatch.setattr(ops, "PACKED_GEMV", gemv)
    monkeypatch.setattr(ops, "PACKED_VARIANT", variant)
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
