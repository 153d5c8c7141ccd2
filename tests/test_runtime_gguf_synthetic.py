"""GGUF loading beyond the embedded model: tiny llama (Q/K permuted by llama.cpp's convention), qwen2 (q/k/v
bias) and qwen3 (q/k norm) models written with gguf.GGUFWriter from random transformers models; logits must
match transformers (fp32, 1e-4)."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from verispec.runtime import load_model  # noqa: E402

V = 101
TINY = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
HF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
            "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:  # convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    for k, v in HF_NAMES.items():
        if rest.startswith(k):
            return f"blk.{i}.{v}{rest[len(k):]}" if not v.endswith(".weight") else f"blk.{i}.{v}"
    raise KeyError(hf)


def write_gguf(hf_model, arch: str, path):
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens = ["<|endoftext|>", "<|im_end|>", "a", "b", "ab"] + [f"t{i}" for i in range(V - 5)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (V - 2))
    w.add_token_merges(["a b"])
    w.add_eos_token_id(1)
    tied = c.tie_word_embeddings
    for name, t in hf_model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        a = t.detach().float().numpy().copy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            a = llama_cpp_permute(a, c.num_attention_heads if "q_proj" in name else c.num_key_value_heads)
        w.add_tensor(gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CASES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
         "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
         "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True))}


@pytest.mark.parametrize("arch", list(CASES))
def test_gguf_logits_match_transformers(arch, tmp_path):
    cfg_cls, model_cls, extra = CASES[arch]
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**TINY, **extra)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.1)
    path = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(hf, arch, path)
    model = load_model(path, device="cpu")
    assert model.config.attention_bias == (arch == "qwen2") and model.config.qk_norm == (arch == "qwen3")
    assert model.tokenizer.eos_token_ids == [1] and model.tokenizer.encode("ab") == [4]
    ids = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0, 19:]
    model.setup_cache(1, 32)
    got = torch.cat([model.prefill([ids[0, :20].tolist()]), model.append(ids[:, 20:24])[0]])
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4
