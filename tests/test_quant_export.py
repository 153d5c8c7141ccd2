"""``verispec quantize`` (verispec/runtime/quant/export.py, mix.py): a tiny model written as a quantized GGUF reads back
through gguf-py's reader and verispec's loader; the loaded model is exactly the original with each weight
quantized and dequantized (every weight bit for bit; the logits to fp32 rounding), and its logits are within a
stated distance of the fp32 original. Tensor types follow llama.cpp's Q4_K_M / Q4_0 / Q8_0 rule."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from verispec.runtime import ModelConfig, load_model  # noqa: E402
from verispec.runtime.loading import hf_state_dict, peek_config  # noqa: E402
from verispec.runtime.model import Model  # noqa: E402
from verispec.runtime.quant import dequantize, quantize  # noqa: E402
from verispec.runtime.quant.export import gguf_name, write_quantized_gguf  # noqa: E402
from verispec.runtime.quant.mix import get_mix, more_bits, tensor_type  # noqa: E402

# K = 256 and 512: every matrix holds whole K-quant super-blocks; 2 layers: layer 1's attn_v / ffn_down get Q6_K
TINY = dict(vocab_size=320, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
            intermediate_size=512)
SEED = 3
IDS = torch.randint(0, 320, (24,), generator=torch.Generator().manual_seed(1)).tolist()


def logits(model) -> torch.Tensor:
    """A prefill of 20 tokens, then a 4-token pass: [5, V] fp32."""
    model.setup_cache(1, 32)
    return torch.cat([model.prefill([IDS[:20]]), model.append(torch.tensor([IDS[20:]]))[0]])


def fake_quantized(cfg: ModelConfig, path) -> Model:
    """The random fp32 model of ``cfg`` (seed SEED) with each weight replaced by dequantize(quantize(w)) in the type
    the GGUF file at ``path`` stores it in, and eps in fp32 as the file stores it."""
    from verispec.runtime.gguf_header import read_header
    from verispec.runtime.quant.formats import FORMATS

    types = {t.name: t.ggml_type for t in read_header(path).tensors}
    model = load_model(cfg.replace(rms_norm_eps=float(np.float32(cfg.rms_norm_eps))), device="cpu", seed=SEED)
    with torch.no_grad():
        for name, w in hf_state_dict(model.net).items():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            qtype = types[gguf_name(name)]
            if qtype in FORMATS:
                w.copy_(dequantize(quantize(w, qtype), qtype))
            else:
                assert qtype == 0, (name, qtype)          # F32: stored as is
    return model


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{(model_type, mix): (cfg, path)}: an untied llama (Q/K permuted) and a tied qwen3 (q/k norm), each mix."""
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for model_type, extra in (("llama", dict(tie_word_embeddings=False)),
                              ("qwen3", dict(tie_word_embeddings=True, qk_norm=True))):
        cfg = ModelConfig(**TINY, **extra, model_type=model_type)
        for mix in ("Q4_K_M", "Q4_0", "Q8_0"):
            path = root / f"{model_type}-{mix}.gguf"
            write_quantized_gguf(cfg, path, mix, device="cpu", seed=SEED)
            out[model_type, mix] = cfg, path
    return out


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q4_0", "Q8_0"])
def test_loaded_model_is_the_quantized_original(written, model_type, mix):
    cfg, path = written[model_type, mix]
    model = load_model(path, device="cpu")
    # (the file stores eps in fp32, as llama.cpp does; the norm computes in fp32 either way)
    assert model.tokenizer is None and model.config == cfg.replace(max_position_embeddings=4096,
                                                                    rms_norm_eps=model.config.rms_norm_eps)
    assert model.config.rms_norm_eps == float(np.float32(cfg.rms_norm_eps))
    reference = fake_quantized(cfg, path)
    assert model.config == reference.config
    mine, theirs = dict(model.net.named_parameters()), dict(reference.net.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, w in mine.items():                       # every weight bit for bit
        assert torch.equal(w, theirs[name]), name
    # the same weights through the same code: the logits agree to fp32 rounding (not always bit for bit: MKL's CPU
    # kernels can take another path for another memory alignment; the 16-core H200 host's torch 2.11 did)
    torch.testing.assert_close(logits(model), logits(reference), rtol=1e-5, atol=1e-5)


# Distance of the quantized model's logits from the fp32 original's (relative RMS over 5 positions x 320 tokens) on
# this random model, measured 0.013 / 0.15 / 0.16-0.22 (Q8_0 / Q4_K_M / Q4_0), bounded with a 1.5x margin.
LOGIT_BOUND = {"Q8_0": 0.02, "Q4_K_M": 0.23, "Q4_0": 0.33}


def test_logits_close_to_the_original(written):
    errors = {}
    for (model_type, mix), (cfg, path) in written.items():
        ref = logits(load_model(cfg, device="cpu", seed=SEED))
        got = logits(load_model(path, device="cpu"))
        errors[model_type, mix] = ((got - ref).norm() / ref.norm()).item()
        assert errors[model_type, mix] <= LOGIT_BOUND[mix], errors
    for model_type in ("llama", "qwen3"):         # 4.5 bits a weight beat 4.5 bits a weight without the search
        assert errors[model_type, "Q4_K_M"] < errors[model_type, "Q4_0"], errors


def test_gguf_library_reads_the_file(written):
    """gguf-py's reader: llama.cpp's names in llama-quantize's order, the mix's types, the metadata; its dequantizer
    reads every quantized tensor as verispec's does."""
    cfg, path = written["llama", "Q4_K_M"]
    reader = gguf.GGUFReader(str(path))
    names = [t.name for t in reader.tensors]
    assert names == ["output.weight", "output_norm.weight", "token_embd.weight"] + [
        f"blk.{i}.{n}.weight" for i in range(2) for n in
        ("attn_k", "attn_norm", "attn_output", "attn_q", "attn_v", "ffn_down", "ffn_gate", "ffn_norm", "ffn_up")]
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert (types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]) == ("Q4_K", "Q6_K")
    assert (types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]) == ("Q4_K", "Q6_K")
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    field = lambda k: reader.fields[k].contents()   # noqa: E731
    assert field("general.architecture") == "llama" and field("general.file_type") == 15
    assert field("general.quantization_version") == 2 and field("llama.vocab_size") == 320
    assert field("llama.attention.head_count_kv") == 2 and field("llama.rope.dimension_count") == 64
    for t in reader.tensors:
        if t.tensor_type.name in ("Q4_K", "Q6_K"):
            ref = gguf.quants.dequantize(t.data, t.tensor_type)
            got = dequantize(torch.from_numpy(np.array(t.data)), t.tensor_type.value)
            assert np.array_equal(got.numpy(), ref) and ref.shape == tuple(reversed(t.shape.tolist()))


def test_llama3_rope_scaling_round_trips_as_rope_freqs(tmp_path):
    """Llama-3 RoPE scaling is stored as llama.cpp stores it (rope_freqs.weight); the loader divides the inverse
    frequencies by it, which equals transformers' formula up to fp32 rounding."""
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    cfg = ModelConfig(**TINY, rope_theta=500000.0, rope_scaling=rope)
    path = tmp_path / "llama3.gguf"
    write_quantized_gguf(cfg, path, "Q8_0", device="cpu", seed=SEED)
    loaded = peek_config(path)
    assert loaded.rope_scaling["rope_type"] == "freq_factors" and len(loaded.rope_scaling["factors"]) == 32
    factors = loaded.rope_scaling["factors"]
    assert factors[0] == 1.0 and factors[-1] == 8.0 and len(set(factors)) > 2
    from verispec.runtime.transformer import rope_inv_freq

    assert torch.allclose(rope_inv_freq(loaded), rope_inv_freq(cfg), rtol=1e-6, atol=0)
    got, ref = logits(load_model(path, device="cpu")), logits(fake_quantized(cfg, path))
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-4


def test_mix_rule_for_an_8b_shape():
    """llama.cpp's Q4_K_M on 32 layers: attn_v and ffn_down in Q6_K in 16 of them (more_bits), the LM head Q6_K."""
    m, n = get_mix("Q4_K_M"), 32
    six = [i for i in range(n) if tensor_type(f"blk.{i}.attn_v.weight", (4096, 1024), m, n, False) == "Q6_K"]
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31] == \
        [i for i in range(n) if more_bits(i, n)]
    assert [tensor_type(f"blk.{i}.ffn_down.weight", (14336, 4096), m, n, False) for i in (0, 4, 6)] == \
        ["Q6_K", "Q4_K", "Q6_K"]
    assert tensor_type("blk.5.attn_q.weight", (4096, 4096), m, n, False) == "Q4_K"
    assert tensor_type("output.weight", (4096, 128256), m, n, False) == "Q6_K"
    assert tensor_type("token_embd.weight", (4096, 128256), m, n, False) == "Q4_K"
    assert tensor_type("token_embd.weight", (2048, 128256), m, 16, True) == "Q6_K"        # tied: the head's type
    assert tensor_type("blk.0.attn_norm.weight", (4096,), m, n, False) == "F32"
    assert tensor_type("output.weight", (4096, 128256), get_mix("Q4_0"), n, False) == "Q6_K"
    assert tensor_type("output.weight", (4096, 128256), get_mix("Q8_0"), n, False) == "Q8_0"


def test_mix_rule_fallbacks_and_refusals():
    m = get_mix("Q4_K_M")
    # SmolLM2-135M: rows of 576 are not whole 256-weight super-blocks: Q4_K -> Q5_0, Q6_K -> Q8_0, like its GGUFs
    assert tensor_type("blk.3.attn_q.weight", (576, 576), m, 30, True) == "Q5_0"
    assert tensor_type("blk.0.attn_v.weight", (576, 192), m, 30, True) == "Q8_0"
    assert tensor_type("token_embd.weight", (576, 49152), m, 30, True) == "Q8_0"
    assert tensor_type("blk.3.ffn_down.weight", (1536, 576), m, 30, True) == "Q4_K"
    assert tensor_type("blk.3.attn_q.weight", (100, 64), m, 4, True) == "F16"          # not even 32-weight blocks
    with pytest.raises(ValueError, match="Q4_0 blocks of 32, and llama.cpp defines no fallback"):
        tensor_type("blk.3.attn_q.weight", (100, 64), get_mix("Q4_0"), 4, True)
    with pytest.raises(ValueError, match="Q5_K"):
        tensor_type("blk.10.attn_v.weight", (8192, 1024), m, 80, False)
    with pytest.raises(ValueError, match="unknown quantization type 'Q5_K_M'"):
        get_mix("Q5_K_M")


def test_cli_quantizes_an_hf_checkpoint(tmp_path, capsys):
    """``verispec quantize --model DIR``: a transformers checkpoint (safetensors) -> a GGUF the runtime loads as the
    checkpoint's model with each weight quantized; the arguments checked before any weight is read."""
    transformers = pytest.importorskip("transformers")
    import verispec.cli as cli

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))
    hf.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    out = tmp_path / "model.gguf"
    assert cli.main(["quantize", "--model", str(tmp_path / "ckpt"), "--type", "Q8_0", "--out", str(out),
                     "--device", "cpu"]) == 0
    assert f"wrote {out} (Q8_0" in capsys.readouterr().out
    original = load_model(tmp_path / "ckpt", device="cpu")
    with torch.no_grad():
        for name, w in hf_state_dict(original.net).items():
            if w.dim() == 2:
                w.copy_(dequantize(quantize(w, "Q8_0"), "Q8_0"))
    assert torch.equal(logits(load_model(out, device="cpu")), logits(original))
    for argv, message in (
            (["--model", str(tmp_path / "ckpt"), "--type", "Q8_0", "--out", str(out)], "exists; pass --force"),
            (["--model", "nope", "--type", "Q8_0", "--out", str(tmp_path / "x.gguf")], "neither an HF checkpoint"),
            (["--model", "llama-3.2-1b", "--type", "Q8_0", "--out", str(tmp_path / "x.bin")], "must name a .gguf"),
            (["--model", "llama-3.2-1b", "--type", "Q4_K_S", "--out", str(tmp_path / "x.gguf")], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            cli.main(["quantize", *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
    from verispec.runtime.quant.mix import MIXES

    assert cli.QUANT_TYPES == tuple(sorted(MIXES))
