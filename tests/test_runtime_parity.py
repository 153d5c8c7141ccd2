"""Logit parity of verispec.runtime against transformers' own implementations (fp32, CPU).

Each case writes a tiny random transformers model with save_pretrained, loads it through our HF loader,
and compares prefill + verify + decode logits against one full forward of the transformers model.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from verispec.runtime import HFModel, load_model  # noqa: E402

TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "llama3-rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3_ROPE)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2-bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "qwen3-qknorm": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True)),
}


def make_hf(case: str, seed: int = 0, **overrides):
    cfg_cls, model_cls, extra = CASES[case]
    cfg = getattr(transformers, cfg_cls)(**{**TINY, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # random everything, norms near 1 and biases non-zero, so every term matters
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity_vs_transformers(case, tmp_path):
    hf = make_hf(case)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, device="cpu", dtype=torch.float32)
    assert model.config.tie_word_embeddings == bool(hf.config.tie_word_embeddings)
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]                                   # [T, V]
    model.setup_cache(1, 64)
    got = [model.prefill([ids[0, :30].tolist()])]                 # position 29
    got.append(model.append(ids[:, 30:36])[0])                    # positions 30..35
    for t in range(36, 40):
        got.append(model.decode(ids[:, t:t + 1])[0])
    got = torch.cat([got[0][None] if got[0].dim() == 1 else got[0]] + got[1:])
    assert got.dtype == torch.float32
    assert rel_err(got, ref[29:40]) <= 1e-4
    assert model.lengths.tolist() == [40]


def test_hf_adapter_matches_transformers(tmp_path):
    """HFModel (DynamicCache + valid-slot mask) gives the reference logits under ragged batching + rollback."""
    hf = make_hf("llama")
    hf.save_pretrained(tmp_path)
    ad = HFModel(hf)
    ours = load_model(tmp_path, device="cpu")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (5, 9)]
    for m in (ad, ours):
        m.setup_cache(2, 64)
    torch.testing.assert_close(ad.prefill(prompts), ours.prefill(prompts), rtol=1e-4, atol=1e-4)
    block = torch.randint(0, 101, (2, 4), generator=g)
    torch.testing.assert_close(ad.append(block), ours.append(block), rtol=1e-4, atol=1e-4)
    new_len = torch.tensor([6, 12])                                # reject 3 and 1 tokens
    for m in (ad, ours):
        m.rollback(new_len)
    nxt = torch.randint(0, 101, (2, 3), generator=g)
    torch.testing.assert_close(ad.append(nxt), ours.append(nxt), rtol=1e-4, atol=1e-4)
    for m in (ad, ours):
        m.keep(torch.tensor([1]))
    one = torch.randint(0, 101, (1, 1), generator=g)
    torch.testing.assert_close(ad.decode(one), ours.decode(one), rtol=1e-4, atol=1e-4)
    assert ad.lengths.tolist() == ours.lengths.tolist() == [16]


def test_hf_adapter_from_path(tmp_path):
    hf = make_hf("qwen3-qknorm")
    hf.save_pretrained(tmp_path)
    ad = HFModel(tmp_path, device="cpu", dtype=torch.float32)
    ad.setup_cache(1, 16)
    ids = [3, 1, 4, 1, 5]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(ad.prefill([ids])[0], ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(NotImplementedError, match="load_model"):
        ad.truncated(1)
