"""A truncated or inconsistent .gguf fails with a message that says so (which tensor, expected vs actual bytes)."""
import os

import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from test_runtime_gguf_synthetic import TINY, write_gguf  # noqa: E402
from verispec.runtime import load_model  # noqa: E402
from verispec.runtime.loading import GGUFFileError, peek_config  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model, "llama", path)
    return path


def _cut(src, dst, size):
    dst.write_bytes(src.read_bytes()[:size])
    return dst


def test_whole_file_loads(tiny_gguf):
    assert load_model(tiny_gguf, device="cpu").config.vocab_size == TINY["vocab_size"]


@pytest.mark.parametrize("missing", [1, 1000, 150_000])
def test_truncated_tensor_data_names_the_tensor(tiny_gguf, tmp_path, missing):
    size = os.path.getsize(tiny_gguf) - missing
    path = _cut(tiny_gguf, tmp_path / "cut.gguf", size)
    with pytest.raises(GGUFFileError, match=rf"the file is truncated: tensor '[\w.]+' expects \d+ bytes at "
                                            rf"offset \d+, file has {size} bytes"):
        load_model(path, device="cpu")
    with pytest.raises(GGUFFileError, match="the file is truncated"):   # the CLI's pre-load check says it too
        peek_config(path)


@pytest.mark.parametrize("size", [0, 3, 100, 2000])
def test_truncated_header(tiny_gguf, tmp_path, size):
    path = _cut(tiny_gguf, tmp_path / "head.gguf", size)
    with pytest.raises(ValueError, match=rf"\({size} bytes\) is not a readable GGUF file: the file is truncated"):
        load_model(path, device="cpu")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable GGUF file.*magic"):
        load_model(path, device="cpu")


def test_fast_header_reads_what_ggufs_reader_reads(tiny_gguf):
    """runtime/gguf_header.py (the loader, peek_config, load_tokenizer) against gguf's own GGUFReader: the same
    metadata values, tensor names, shapes, types, data offsets and bytes."""
    import gguf

    from verispec.runtime.gguf_header import read_header, tensor_data

    header, reader = read_header(tiny_gguf), gguf.GGUFReader(str(tiny_gguf))
    assert header.meta == {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert [(t.name, t.dims, t.ggml_type, header.data_start + t.offset) for t in header.tensors] == \
        [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reader.tensors]
    data = tensor_data(tiny_gguf, header)       # the loader's views of the tensors' bytes: gguf's, as bytes
    for t in reader.tensors:
        assert data[t.name].tobytes() == t.data.tobytes() and data[t.name].shape[:-1] == t.data.shape[:-1]
