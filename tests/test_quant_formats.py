"""The GGUF block formats (verispec/runtime/quant/): the torch dequantizer equals gguf-py's ``dequantize`` bit for
bit on every supported type (random blocks with edge scales, and the embedded SmolLM2's real Q4_1 / Q8_0 tensors);
the Q4_0 / Q8_0 quantizers equal gguf-py's ``quantize`` bit for bit; each quantizer's round trip stays within its
format's bound."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from verispec.runtime.quant import dequantize, quantize  # noqa: E402
from verispec.runtime.quant.formats import FORMATS, block_format  # noqa: E402

# f16 bit patterns for the scale / min fields: 0, -0, the smallest subnormal, a subnormal, 1, -1.5, the largest
# finite, its negative, +inf, -inf, NaN
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0xBE00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00]
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}   # byte offsets


def edge_blocks(name: str, n: int = 600, seed: int = 0) -> torch.Tensor:
    """n random blocks of format ``name`` whose f16 fields cycle through EDGE_F16 (the first half) or are random
    finite scales (the second half: random bytes there would be mostly NaN / huge)."""
    fmt = block_format(name)
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, fmt.type_size), dtype=torch.uint8, generator=g)
    for k, at in enumerate(F16_FIELDS[name]):
        edge = torch.tensor(EDGE_F16, dtype=torch.int32).roll(k)[torch.arange(n // 2) % len(EDGE_F16)]
        blocks[:n // 2, at] = (edge & 0xFF).to(torch.uint8)
        blocks[:n // 2, at + 1] = (edge >> 8).to(torch.uint8)
        finite = (torch.rand(n - n // 2, generator=g) - 0.5).half().view(torch.uint8).view(-1, 2)
        blocks[n // 2:, at:at + 2] = finite
    return blocks


def assert_same_bits(got: torch.Tensor, ref: np.ndarray):
    ref = torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))
    assert got.dtype == torch.float32 and got.shape == ref.shape
    nan = ref.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), ref[~nan].view(torch.int32))   # -0 vs 0 counts too


def test_format_table_matches_gguf():
    for fmt in FORMATS.values():
        qtype = gguf.GGMLQuantizationType[fmt.name]
        assert (fmt.ggml_type, fmt.block_size, fmt.type_size) == (qtype.value, *gguf.GGML_QUANT_SIZES[qtype])
        assert block_format(qtype) is block_format(fmt.name) is block_format(fmt.ggml_type) is fmt
    with pytest.raises(ValueError, match="Q5_K is not a block format verispec decodes"):
        block_format(gguf.GGMLQuantizationType.Q5_K)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_dequantize_equals_gguf_bit_for_bit(name):
    blocks = edge_blocks(name)
    with np.errstate(all="ignore"):                     # inf * 0 in the edge blocks
        ref = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[name])
    assert_same_bits(dequantize(blocks, name), ref)
    matrix = blocks[:4 * (blocks.shape[0] // 4)].reshape(4, -1)          # a [4, K] matrix's bytes
    assert dequantize(matrix, name).shape == (4, matrix.shape[1] // blocks.shape[1] * block_format(name).block_size)


def test_dequantize_equals_gguf_on_the_embedded_model():
    """The embedded SmolLM2-135M (Q4_1 matrices, a Q8_0 embedding): every Q8_0 tensor and a few Q4_1 ones."""
    from verispec.runtime.gguf_header import read_header
    from verispec.runtime.loading import embedded_gguf_path

    path = embedded_gguf_path()
    header = read_header(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    picked = [t for t in header.tensors if t.ggml_type == 8] + \
             [t for t in header.tensors if t.ggml_type == 3 and t.name.startswith(("blk.0.", "blk.29."))]
    assert {t.ggml_type for t in picked} == {3, 8} and len(picked) >= 8
    for t in picked:
        fmt = block_format(t.ggml_type)
        n_elems = int(np.prod(t.dims))
        start = header.data_start + t.offset
        data = np.array(raw[start:start + n_elems // fmt.block_size * fmt.type_size]).reshape(t.dims[1], -1)
        ref = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(t.ggml_type))
        assert_same_bits(dequantize(torch.from_numpy(data), t.ggml_type), ref)


def test_dequantize_rejects_bad_input():
    with pytest.raises(ValueError, match="not a whole number of 34-byte blocks"):
        dequantize(torch.zeros(2, 35, dtype=torch.uint8), "Q8_0")
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize(torch.zeros(2, 34), "Q8_0")


def rows_with_edges(K: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, K, generator=g)
    x[0] = 0                                            # all zero
    x[1] = 0.75                                         # constant
    x[2] *= 1e-30                                       # tiny (f16 scales underflow)
    x[3] *= 1e5                                         # huge (f16 scales overflow)
    x[4, ::3] = 0                                       # sparse
    x[5] = torch.randint(-8, 8, (K,), generator=g) * 0.5          # on a grid: rounding ties
    x[6] = -x[6].abs()                                  # one sign
    x[7, 5] = 40.0                                      # one spike
    x[8] = torch.randn(K, generator=g) / torch.randn(K, generator=g).abs()    # heavy tails (Cauchy)
    return x


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_simple_quantizers_equal_gguf_bit_for_bit(name):
    x = rows_with_edges()
    with np.errstate(all="ignore"):
        ref = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType[name])
    got = quantize(x, name)
    assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), ref)


# The bound each format keeps (largest |x - dequantize(quantize(x))| of a block, in quantization steps): Q8_0 half a
# step of amax / 127 (+ the f16 rounding of d, up to 127 * 2^-11 of a step); Q4_0 one step of amax / 8 (the value at
# -amax would need code 16, clipped to 15) + the f16 rounding; the K-quants one step of the super-block's widest
# sub-block (its 6- or 8-bit sub-block scales are relative to that one): Q4_K (max - min(min, 0)) / 15 over its
# 32-weight sub-blocks, Q6_K amax / 32.
def block_step(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "Q4_K":
        s = x.view(-1, 8, 32)
        return (s.amax(2) - s.amin(2).clamp(max=0)).amax(1) / 15
    return x.view(-1, block_format(name).block_size).abs().amax(1) / {"Q8_0": 127, "Q4_0": 8, "Q6_K": 32}[name]


BOUND_STEPS = {"Q8_0": 0.5 + 127 / 2048, "Q4_0": 1 + 8 / 2048, "Q4_K": 1.0, "Q6_K": 1.0}


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_round_trip_within_the_format_bound(name):
    x = rows_with_edges(K=512)[[0, 1, 4, 5, 6, 7, 8, 9, 10, 11]]       # finite f16 scales (no tiny / huge rows)
    x = torch.cat([x, torch.rand(4, 512, generator=torch.Generator().manual_seed(1)) * 2 - 1])
    blocks = quantize(x, name)
    y = dequantize(blocks, name)
    # gguf-py's dequantizer reads the same blocks the same way
    assert_same_bits(y, gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[name]))
    size = 256 if name in ("Q4_K", "Q6_K") else 32
    err = (y - x).abs().view(-1, size).amax(1)
    step = block_step(x, name)
    assert bool((err <= BOUND_STEPS[name] * step + 1e-12).all()), (err / step).max()
    assert torch.equal(y[0], torch.zeros(512))          # zeros stay zeros


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="blk.0.ffn_down.weight: rows of 100 weights are not a whole number of "
                                         "Q4_K blocks of 256"):
        quantize(torch.zeros(2, 100), "Q4_K", name="blk.0.ffn_down.weight")
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize(torch.tensor([[float("nan")] * 32]), "Q8_0")
    with pytest.raises(ValueError, match="does not quantize to Q4_1"):
        quantize(torch.zeros(1, 32), "Q4_1")
