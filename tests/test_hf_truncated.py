"""``to_transformers(net, num_layers=L)`` (an HF self-speculative assistant) == ``Model.truncated(L)`` (fp32, CPU)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from verispec.runtime import load_model  # noqa: E402
from verispec.runtime.config import ModelConfig  # noqa: E402
from verispec.runtime.loading import to_transformers  # noqa: E402

TINY = dict(vocab_size=101, num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=512)


@pytest.mark.parametrize("extra", [dict(), dict(tie_word_embeddings=True),
                                   dict(qk_norm=True, tie_word_embeddings=True, model_type="qwen3")],
                         ids=["llama", "llama-tied", "qwen3"])
@pytest.mark.parametrize("layers", [1, 2])
def test_truncated_transformers_matches_truncated_model(extra, layers):
    model = load_model(ModelConfig(**TINY, **extra), device="cpu", dtype=torch.float32, seed=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # non-unit norms and larger weights, so that every term matters
        for name, p in model.net.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name
                    else 0.1 * torch.randn(p.shape, generator=g))
    hf = to_transformers(model.net, num_layers=layers)
    assert hf.config.num_hidden_layers == layers and len(hf.model.layers) == layers
    # views of the runtime's storage, no copies
    assert hf.model.embed_tokens.weight.data_ptr() == model.net.embed.data_ptr()
    assert hf.lm_head.weight.data_ptr() == model.net.lm_head_weight.data_ptr()
    assert hf.model.norm.weight.data_ptr() == model.net.norm.data_ptr()
    assert hf.model.layers[-1].mlp.down_proj.weight.data_ptr() == model.net.layers[layers - 1].w2.data_ptr()
    assert not hf.training

    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]                                   # [T, V]
    draft = model.truncated(layers)
    draft.setup_cache(1, 32)
    got = torch.cat([draft.prefill([ids[0, :12].tolist()]), draft.append(ids[:, 12:])[0]])  # positions 11..19
    torch.testing.assert_close(got, ref[11:], rtol=1e-4, atol=1e-4)
    # and it really is shorter than the full model
    full = to_transformers(model.net)
    with torch.no_grad():
        assert not torch.allclose(full(ids).logits[0], ref, atol=1e-3)


def test_num_layers_out_of_range():
    model = load_model(ModelConfig(**TINY), device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="num_layers"):
        to_transformers(model.net, num_layers=4)
    with pytest.raises(ValueError, match="num_layers"):
        to_transformers(model.net, num_layers=0)
