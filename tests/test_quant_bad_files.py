"""Bad quantized GGUF files fail with an error that names the tensor: a truncated block, a type that cannot be
dequantized or is unknown, rows that are not whole blocks (dense and packed loading, and the pre-load check)."""
import struct

import pytest
import torch

pytest.importorskip("gguf")

from verispec.runtime import ModelConfig, load_model  # noqa: E402
from verispec.runtime.gguf_header import GGUFFileError, read_header  # noqa: E402
from verispec.runtime.loading import peek_config  # noqa: E402
from verispec.runtime.quant.export import write_quantized_gguf  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A tiny Q4_0 file: Q4_0 matrices and the LM head output.weight in Q6_K (256-weight blocks)."""
    path = tmp_path_factory.mktemp("bad") / "good.gguf"
    cfg = ModelConfig(vocab_size=320, num_layers=1, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                      intermediate_size=256)
    write_quantized_gguf(cfg, path, "Q4_0", device="cpu")
    return path


def patched(src, dst, name: str, dims=None, ggml_type=None):
    """A copy of the GGUF file ``src`` whose tensor ``name`` says other dims (same count) or another type."""
    data = bytearray(src.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)                      # the tensor table entry: n_dims u32, dims u64[], type u32
    (n_dims,) = struct.unpack_from("<I", data, at)
    if dims is not None:
        assert len(dims) == n_dims
        struct.pack_into(f"<{n_dims}Q", data, at + 4, *dims)
    if ggml_type is not None:
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, ggml_type)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("packed", [False, True])
def test_truncated_block_names_the_tensor(good, tmp_path, packed):
    size = good.stat().st_size - 50                       # the last tensor's last blocks are cut
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:size])
    last = max(read_header(good).tensors, key=lambda t: t.offset).name
    with pytest.raises(GGUFFileError, match=rf"the file is truncated: tensor '{last}' expects \d+ bytes at offset "
                                            rf"\d+, file has {size} bytes"):
        load_model(cut, device="cpu", packed=packed)


@pytest.mark.parametrize("packed", [False, True])
def test_rows_that_are_not_whole_blocks(good, tmp_path, packed):
    """output.weight's Q6_K [320 rows of 256] relabelled [640 rows of 128]: the same bytes, half-block rows."""
    bad = patched(good, tmp_path / "rows.gguf", "output.weight", dims=(128, 640))
    message = (r"tensor 'output.weight' \[128, 640\] has rows of 128 weights, not a multiple of Q6_K's block "
               r"of 256")
    with pytest.raises(GGUFFileError, match=message):
        load_model(bad, device="cpu", packed=packed)
    with pytest.raises(GGUFFileError, match=message):
        peek_config(bad)


def test_unknown_type_names_the_tensor(good, tmp_path):
    bad = patched(good, tmp_path / "unknown.gguf", "blk.0.ffn_up.weight", ggml_type=99)
    with pytest.raises(GGUFFileError, match="tensor 'blk.0.ffn_up.weight' has unknown type 99"):
        load_model(bad, device="cpu", packed=True)


def test_type_that_cannot_be_dequantized_names_the_tensor(good, tmp_path):
    """A norm (F32, 4 bytes a value) relabelled I32: the sizes agree, but integers are no weights."""
    bad = patched(good, tmp_path / "int.gguf", "blk.0.ffn_norm.weight", ggml_type=26)
    with pytest.raises(ValueError, match="tensor 'blk.0.ffn_norm.weight' is stored as I32, which cannot be "
                                         "dequantized"):
        load_model(bad, device="cpu")


def test_the_good_file_loads_both_ways(good):
    ids = [[1, 2, 3, 4]]
    a, b = load_model(good, device="cpu"), load_model(good, device="cpu", packed=True)
    a.setup_cache(1, 8)
    b.setup_cache(1, 8)
    assert torch.equal(a.prefill(ids), b.prefill(ids))
