"""Packed weights (verispec/runtime/quant/packed.py, ``load_model(..., packed=True)``): GGUF matrices kept as their
blocks run the whole model on the CPU with logits bit-identical to the dense (dequantized) model's, mixed-type
fused matrices included; types without a packed path are dequantized with a note; ``Model.weight_bytes`` counts
what is held."""
import warnings

import pytest
import torch

gguf = pytest.importorskip("gguf")

from verispec.runtime import ModelConfig, load_model  # noqa: E402
from verispec.runtime.loading import to_transformers  # noqa: E402
from verispec.runtime.quant import dequantize, quantize  # noqa: E402
from verispec.runtime.quant.export import write_quantized_gguf  # noqa: E402
from verispec.runtime.quant.packed import PackedWeight, packed_weights  # noqa: E402

TINY = dict(vocab_size=320, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
            intermediate_size=512)
IDS = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(2))


def passes(model) -> torch.Tensor:
    """A ragged prefill of 2 prompts, a 3-token pass, then a 1-token pass: [2, 1 + 3 + 1, V] logits."""
    model.setup_cache(2, 32)
    first = model.prefill([IDS[0, :7].tolist(), IDS[1, :4].tolist()])
    return torch.cat([first[:, None], model.append(IDS[:, 7:10]), model.append(IDS[:, 10:11])], dim=1)


def load_packed(path, **kw):
    """(the model loaded with packed=True, its note or None: a warning only when some matrix stays dense)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(path, device="cpu", packed=True, **kw)
    notes = [str(w.message) for w in caught if path.name in str(w.message)]
    assert len(notes) <= 1, notes
    return model, (notes[0] if notes else None)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    out = {}
    # llama, untied, Q4_K_M: layer 1's wqkv is [q Q4_K; k Q4_K; v Q6_K] (one matrix, mixed parts), the head Q6_K
    out["llama-Q4_K_M"] = root / "llama-Q4_K_M.gguf"
    write_quantized_gguf(ModelConfig(**TINY), out["llama-Q4_K_M"], "Q4_K_M", device="cpu", seed=5)
    # qwen3, tied, Q4_0: the embedding is the LM head, in Q6_K
    out["qwen3-Q4_0"] = root / "qwen3-Q4_0.gguf"
    write_quantized_gguf(ModelConfig(**TINY, tie_word_embeddings=True, qk_norm=True, model_type="qwen3"),
                         out["qwen3-Q4_0"], "Q4_0", device="cpu", seed=5)
    # ffn_down rows of 160 weights are no K-quant super-block: llama.cpp falls back to Q5_0 (no packed path here)
    out["fallback"] = root / "fallback.gguf"
    write_quantized_gguf(ModelConfig(**{**TINY, "intermediate_size": 160}), out["fallback"], "Q4_K_M",
                         device="cpu", seed=5)
    return out


@pytest.mark.parametrize("name", ["llama-Q4_K_M", "qwen3-Q4_0"])
def test_packed_model_equals_the_dense_model(files, name):
    path = files[name]
    dense = load_model(path, device="cpu")
    model, note = load_packed(path)
    held = packed_weights(model.net)
    expected = {"embed", *(f"layers.{i}.{w}" for i in range(2) for w in ("wqkv", "wo", "w13", "w2"))}
    assert set(held) == expected | ({"lm_head"} if name.startswith("llama") else set())
    assert note is None                                  # every matrix kept: nothing to say
    if name == "llama-Q4_K_M":
        assert held["layers.1.wqkv"].type_names == ("Q4_K", "Q6_K")          # q and k joined: one Q4_K part
        assert held["layers.0.wqkv"].type_names == ("Q4_K",) and held["layers.0.w13"].type_names == ("Q4_K",)
    assert torch.equal(passes(model), passes(dense))
    # what is held: the file's matrix bytes + the fp32 norms
    reader = gguf.GGUFReader(str(path))
    matrices = sum(int(t.n_bytes) for t in reader.tensors if len(t.shape) == 2)
    norms = sum(int(t.n_elements) * 4 for t in reader.tensors if len(t.shape) == 1)
    assert model.weight_bytes == matrices + norms
    assert dense.weight_bytes == (sum(int(t.n_elements) for t in reader.tensors) + (0 if name == "qwen3-Q4_0" else 0)) * 4
    assert model.truncated(1).weight_bytes < model.weight_bytes


def test_types_without_a_packed_path_are_dequantized_with_a_note(files):
    model, note = load_packed(files["fallback"])
    assert "layers.0.w2" not in packed_weights(model.net) and isinstance(model.net.layers[0].w2, torch.Tensor)
    assert note == ("fallback.gguf: 9 matrices kept as GGUF blocks (Q4_K, Q6_K, Q8_0); dequantized to float32 (no "
                    "packed matmul for the type): 1 Q5_0 (blk.0.ffn_down.weight)")
    # within fp32 rounding, not bitwise: the fallback matrix is dequantized at load in one model and stored dense
    # in the other, and the CPU BLAS may reduce the two layouts in different orders (seen under xdist, 1 thread)
    torch.testing.assert_close(passes(model), passes(load_model(files["fallback"], device="cpu")), rtol=1e-5, atol=1e-5)


def test_embedded_model_runs_from_its_blocks():
    """The embedded SmolLM2-135M (Q4_1 matrices, a Q8_0 embedding that is also the LM head) runs packed on the CPU:
    its logits are those of the same blocks dequantized into a dense model."""
    from verispec.runtime.loading import embedded_gguf_path

    try:
        path = embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model, note = load_packed(path)
    held = packed_weights(model.net)
    assert len(held) == 1 + 30 * 4 and {t for w in held.values() for t in w.type_names} == {"Q4_1", "Q8_0"}
    assert held["embed"].type_names == ("Q8_0",) and model.net.lm_head is None
    assert model.weight_bytes < 100e6 and note is None
    twin = load_model(model.config, device="cpu")                   # the same shape, dense, filled from the blocks
    with torch.no_grad():
        for attr, w in held.items():
            owner, _, name = attr.rpartition(".")
            getattr(twin.net.get_submodule(owner) if owner else twin.net, name).copy_(w.dequantize())
        for name, p in model.net.named_parameters():                # the norms: all that is dense here
            twin.net.get_parameter(name).copy_(p)
    model.tokenizer, twin.tokenizer = None, None
    ids = [1, 9690, 198, 2683, 314, 253, 5356, 30]
    for m in (model, twin):
        m.setup_cache(1, 16)
    assert torch.equal(model.prefill([ids]), twin.prefill([ids]))
    assert torch.equal(model.append(torch.tensor([[28, 29]])), twin.append(torch.tensor([[28, 29]])))


def test_packed_weight_rows_and_errors():
    w = torch.randn(6, 256, generator=torch.Generator().manual_seed(0))
    parts = [(12, quantize(w[:4], "Q4_K")), (8, quantize(w[4:], "Q8_0"))]
    p = PackedWeight(parts, 256, torch.float32)
    dense = torch.cat([dequantize(parts[0][1], 12), dequantize(parts[1][1], 8)])
    assert p.shape == (6, 256) and p.nbytes == 4 * 144 + 2 * 8 * 34 and torch.equal(p.dequantize(), dense)
    assert "[6, 256] = 4 Q4_K + 2 Q8_0 rows" in repr(p)
    ids = torch.tensor([[3, 0], [1, 1]])
    single = PackedWeight(parts[:1], 256, torch.float32)
    assert torch.equal(single.embedding(ids), dense[:4][ids]) and torch.equal(p.embedding(ids), dense[ids])
    assert torch.equal(PackedWeight(parts, 256, torch.bfloat16).dequantize(), dense.bfloat16())
    joined = PackedWeight([parts[0], (12, parts[0][1][:2]), parts[1]], 256, torch.float32)   # Q4_K, Q4_K, Q8_0
    assert joined.type_names == ("Q4_K", "Q8_0") and joined.shape == (8, 256)
    assert torch.equal(joined.dequantize(), torch.cat([dense[:4], dense[:2], dense[4:]]))
    with pytest.raises(ValueError, match=r"a Q4_K part of rows of 512 weights must be uint8 \[n, 288\]"):
        PackedWeight(parts[:1], 512, torch.float32)


def test_packed_refusals(files):
    with pytest.raises(ValueError, match="packed=True keeps GGUF blocks: it needs a .gguf file"):
        load_model(ModelConfig(**TINY), device="cpu", packed=True)
    model, _ = load_packed(files["qwen3-Q4_0"])
    with pytest.raises(ValueError, match="to_transformers needs dense weights"):
        to_transformers(model.net)
    from verispec.drafters.oracle import make_peaked

    with pytest.raises(ValueError, match="make_peaked needs an untied LM head"):
        make_peaked(model)


def test_make_peaked_on_packed_weights(files):
    """make_peaked on a packed model: the LM head keeps its blocks (what a step reads), the embedding becomes a dense
    table, and greedy decoding follows the returned successor; a packed table beside a dense head is made dense and
    the dense rule applies."""
    from verispec import generate
    from verispec.drafters.oracle import make_peaked

    model, _ = load_packed(files["llama-Q4_K_M"])
    head = model.net.lm_head
    successor = make_peaked(model, seed=3)
    assert model.net.lm_head is head and set(packed_weights(model.net)) >= {"lm_head"}
    assert "embed" not in packed_weights(model.net) and sorted(successor) == list(range(320))
    for g in generate(model, [[5, 6, 7], [300, 1]], max_new_tokens=12):
        assert all(b == successor[a] for a, b in zip(g.tokens, g.tokens[1:]))
    model, _ = load_packed(files["llama-Q4_K_M"])
    model.net.lm_head = torch.nn.Parameter(model.net.lm_head.dequantize(), requires_grad=False)   # a dense head
    successor = make_peaked(model, seed=3)
    assert "embed" not in packed_weights(model.net)
    tokens = generate(model, [5, 6, 7], max_new_tokens=12).tokens
    assert all(b == successor[a] for a, b in zip(tokens, tokens[1:]))


def test_packed_kernel_arguments_are_checked_before_any_launch():
    """packed_matmul / packed_dequantize name what is wrong before they build or launch anything (so on a CPU too)."""
    from verispec.runtime.gemv import packed_dequantize, packed_matmul

    blocks = quantize(torch.randn(4, 256), "Q4_K")                  # [4, 144]
    x = torch.randn(2, 256)
    with pytest.raises(ValueError, match=r"GGML type Q5_0 \(6\) is not a block format verispec decodes"):
        packed_matmul(x, blocks, 6)
    with pytest.raises(ValueError, match=r"rows of 288 weights are not a whole number of Q4_K blocks of 256"):
        packed_matmul(torch.randn(2, 288), blocks, "Q4_K")
    with pytest.raises(ValueError, match=r"rows of 512 weights need Q4_K blocks uint8 \[N, 288\], got torch.uint8 "
                                         r"\(4, 144\)"):
        packed_dequantize(blocks, 12, 512, torch.bfloat16)
    with pytest.raises(ValueError, match=r"variant must be 0 \(the default\) or one of \(1, 2, 3, 4, 5\), got 6"):
        packed_matmul(x, blocks, 12, variant=6)
    with pytest.raises(ValueError, match=r"x must be float32/bfloat16/float16, got torch.int64"):
        packed_matmul(x.long(), blocks, 12)
    with pytest.raises(ValueError, match=r"x and blocks must be on one CUDA device, got cpu, cpu"):
        packed_matmul(x, blocks, 12)
    with pytest.raises(ValueError, match=r"blocks must be on a CUDA device, got cpu"):
        packed_dequantize(blocks, 12, 256, torch.bfloat16)
