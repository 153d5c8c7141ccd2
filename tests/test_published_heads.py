"""Published EAGLE-3 and EAGLE (1/2) heads (``FeatureHead.from_pretrained``): random weights saved under the
published tensor names and config keys load into a head whose logits match a small independent re-implementation of
each published forward (below, written from the authors' description, not from HeadNet), greedy decoding with it
equals plain decoding, and every malformed directory is refused with an error naming the file and the tensor.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from verispec.drafters import FeatureHead
from verispec.drafters.head_net import default_layers
from verispec.engine import generate
from verispec.runtime import ModelConfig, load_model
from verispec.runtime.cache import StaticKVCache
from verispec.runtime.transformer import rope_table

CFG = ModelConfig(vocab_size=48, num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
PROMPTS = [[3, 4, 5, 6, 7], [9, 1], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
VD = 20                                     # the draft vocabulary
E, H, KV, D, I, V = 32, 4, 2, 8, 64, 48


def published_config(**changes) -> dict:
    """config.json as the authors write it for an EAGLE-3 head of this tiny Llama target."""
    meta = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": E,
            "num_attention_heads": H, "num_key_value_heads": KV, "num_hidden_layers": 1, "intermediate_size": I,
            "vocab_size": V, "draft_vocab_size": VD, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": None, "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "float32"}
    meta.update(changes)
    return meta


def published_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the published names; d2t as offsets (target id = draft id + d2t), t2d a bool mask."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):   # matrices N(0, 1/fan_in); norms near 1
        x = torch.randn(*shape, generator=g)
        return x / shape[-1] ** 0.5 if len(shape) > 1 else 1 + 0.1 * x

    w = {"fc.weight": r(E, 3 * E), "norm.weight": r(E), "lm_head.weight": r(VD, E) * 4,
         "midlayer.input_layernorm.weight": r(E), "midlayer.hidden_norm.weight": r(E),
         "midlayer.post_attention_layernorm.weight": r(E),
         "midlayer.self_attn.q_proj.weight": r(H * D, 2 * E), "midlayer.self_attn.k_proj.weight": r(KV * D, 2 * E),
         "midlayer.self_attn.v_proj.weight": r(KV * D, 2 * E), "midlayer.self_attn.o_proj.weight": r(E, H * D),
         "midlayer.mlp.gate_proj.weight": r(I, E), "midlayer.mlp.up_proj.weight": r(I, E),
         "midlayer.mlp.down_proj.weight": r(E, I)}
    ids = torch.sort(torch.randperm(V, generator=g)[:VD]).values         # the authors keep the ids sorted
    w["d2t"] = ids - torch.arange(VD)
    w["t2d"] = torch.zeros(V, dtype=torch.bool)
    w["t2d"][ids] = True
    return w


def write_head(directory, weights=None, config=None):
    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights if weights is not None else published_weights(), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config or published_config()))
    return directory


# --------------------------------------------------------------------------------------- the reference
def _norm(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos):
    """x [T, heads, D] rotated at positions pos [T] (Llama's rotate-half form, theta 10000)."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2).float() / D)
    ang = torch.cat([pos[:, None].float() * inv] * 2, dim=-1)[:, None]       # [T, 1, D]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


def reference_eagle3(w, embed, states, tokens, steps):
    """The published EAGLE-3 head over a whole sequence, then ``steps`` greedy draft steps on its own outputs.

    states [T, 3, E] (the target's low/middle/high layer outputs at positions 0..T-1), tokens [T] (the token after
    each position) -> logits over the target vocabulary [T + steps, V] (-inf off the draft vocabulary). Entry j:
    feature = fc(states_j) (or the previous entry's output once drafting), input [norm(embed(token)); norm(feature)]
    to q/k/v, causal attention at position j, residual on the feature, SwiGLU MLP, final norm, own LM head.
    """
    feats = list(states.reshape(len(states), 3 * E) @ w["fc.weight"].T)
    toks = list(tokens)
    ids = torch.arange(VD) + w["d2t"]
    out_logits = []
    for step in range(steps + 1):
        T = len(feats)
        f, t = torch.stack(feats), torch.stack(toks)
        x = torch.cat([_norm(embed[t], w["midlayer.input_layernorm.weight"]),
                       _norm(f, w["midlayer.hidden_norm.weight"])], dim=-1)
        q = _rope((x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, H, D), torch.arange(T))
        k = _rope((x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, KV, D), torch.arange(T))
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, KV, D)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = (q.transpose(0, 1) @ k.transpose(0, 1).transpose(1, 2)) / D ** 0.5            # [H, T, T]
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        o = (att @ v.transpose(0, 1)).transpose(0, 1).reshape(T, H * D)
        h = f + o @ w["midlayer.self_attn.o_proj.weight"].T
        m = _norm(h, w["midlayer.post_attention_layernorm.weight"])
        out = h + (F.silu(m @ w["midlayer.mlp.gate_proj.weight"].T) * (m @ w["midlayer.mlp.up_proj.weight"].T)) \
            @ w["midlayer.mlp.down_proj.weight"].T
        small = _norm(out, w["norm.weight"]) @ w["lm_head.weight"].T                            # [T, VD]
        full = torch.full((T, V), float("-inf"))
        full[:, ids] = small
        if step == 0:
            out_logits += list(full)
        else:
            out_logits.append(full[-1])
        feats.append(out[-1])
        toks.append(ids[small[-1].argmax()])
    return torch.stack(out_logits[:len(tokens) + steps])


def eagle1_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random EAGLE (1/2) weights under the published names (layers.0.*, fc with a bias, no norm, no LM head)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) / shape[-1] ** 0.5  # noqa: E731
    return {"fc.weight": r(E, 2 * E), "fc.bias": 0.1 * torch.randn(E, generator=g),
            "layers.0.self_attn.q_proj.weight": r(H * D, E), "layers.0.self_attn.k_proj.weight": r(KV * D, E),
            "layers.0.self_attn.v_proj.weight": r(KV * D, E), "layers.0.self_attn.o_proj.weight": r(E, H * D),
            "layers.0.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(E, generator=g),
            "layers.0.mlp.gate_proj.weight": r(I, E), "layers.0.mlp.up_proj.weight": r(I, E),
            "layers.0.mlp.down_proj.weight": r(E, I)}


def eagle1_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": E, "num_attention_heads": H,
            "num_key_value_heads": KV, "num_hidden_layers": 1, "intermediate_size": I, "vocab_size": V,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bias": True}


def reference_eagle1(w, embed, target_norm, lm_head, states, tokens, steps):
    """The published EAGLE (1/2) head: states [T, E] (the target's last layer outputs), tokens [T] -> logits [T +
    steps, V]. Entry j: feature = the target's final norm of its state (the head's own previous output once
    drafting), x = fc([embed(token); feature]) + bias, attention over x with no norm first, residual x, SwiGLU MLP
    after post_attention_layernorm, the target's LM head on the output with no norm."""
    feats = list(_norm(states, target_norm))
    toks = list(tokens)
    logits = []
    for step in range(steps + 1):
        T = len(feats)
        x = torch.cat([embed[torch.stack(toks)], torch.stack(feats)], dim=-1) @ w["fc.weight"].T + w["fc.bias"]
        q = _rope((x @ w["layers.0.self_attn.q_proj.weight"].T).view(T, H, D), torch.arange(T))
        k = _rope((x @ w["layers.0.self_attn.k_proj.weight"].T).view(T, KV, D), torch.arange(T))
        v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(T, KV, D)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                           enable_gqa=True).transpose(0, 1).reshape(T, H * D)
        h = x + o @ w["layers.0.self_attn.o_proj.weight"].T
        m = _norm(h, w["layers.0.post_attention_layernorm.weight"])
        out = h + (F.silu(m @ w["layers.0.mlp.gate_proj.weight"].T) * (m @ w["layers.0.mlp.up_proj.weight"].T)) \
            @ w["layers.0.mlp.down_proj.weight"].T
        full = out @ lm_head.T
        logits += list(full) if step == 0 else [full[-1]]
        feats.append(out[-1])
        toks.append(full[-1].argmax())
    return torch.stack(logits[:len(tokens) + steps])


def _head_logits(net, embed, lm_head, states, tokens, steps):
    """HeadNet's logits over the prompt entries and ``steps`` greedy draft steps, through its KV-cache form
    (``lm_head``: the target's, for a head without its own)."""
    T = len(tokens)
    cache = StaticKVCache(net.cfg.model_config(), 1, 32, "cpu", torch.float32)
    rope = rope_table(net.cfg.model_config(), cache.capacity, "cpu")
    k, v = cache.k[0][:1], cache.v[0][:1]
    with torch.no_grad():
        out = net.cached(net.fuse(states[None]), tokens[None], torch.arange(T)[None], embed, k, v, rope)[0]
        got = list(net.logits(out, lm_head))
        last, pos = out[-1], T
        for _ in range(steps):            # drafting: the head's own output is the next entry's feature
            token = got[-1].argmax()
            last = net.cached(last[None, None], token.view(1, 1), torch.tensor([[pos]]), embed, k, v, rope)[0, 0]
            got.append(net.logits(last[None], lm_head)[0])
            pos += 1
    return torch.stack(got)


def test_a_published_eagle3_head_computes_the_published_forward(tmp_path):
    model = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    w = published_weights()
    head = FeatureHead.from_pretrained(write_head(tmp_path / "eagle3"), model)
    net = head.net
    assert net.cfg.target_layers == default_layers(CFG.num_layers) and net.cfg.draft_vocab == VD
    g = torch.Generator().manual_seed(5)
    T, steps = 6, 3
    states = torch.randn(T, 3, E, generator=g)
    tokens = torch.randint(0, V, (T,), generator=g)
    want = reference_eagle3(w, model.net.embed, states, tokens, steps)
    got = _head_logits(net, model.net.embed, None, states, tokens, steps)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=1e-5)


def test_a_published_eagle1_head_computes_the_published_forward(tmp_path):
    model = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    g = torch.Generator().manual_seed(6)
    model.net.norm.copy_(1 + 0.3 * torch.randn(E, generator=g))    # not ones: the head must take the target's
    w = eagle1_weights()
    write_head(tmp_path / "eagle1", w, eagle1_config())
    head = FeatureHead.from_pretrained(tmp_path / "eagle1", model)
    head.attach(model)                    # takes the target's final norm
    net = head.net
    assert net.cfg.variant == "eagle1" and net.cfg.target_layers == (CFG.num_layers - 1,)
    T, steps = 6, 3
    states = torch.randn(T, E, generator=g)
    tokens = torch.randint(0, V, (T,), generator=g)
    want = reference_eagle1(w, model.net.embed, model.net.norm, model.net.lm_head_weight, states, tokens, steps)
    got = _head_logits(net, model.net.embed, model.net.lm_head_weight, states[:, None], tokens, steps)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU: the kernel passes and the captured draft loop"))])
@pytest.mark.parametrize("layout", ["eagle3", "eagle1"])
def test_greedy_with_a_published_head_equals_plain_decoding(tmp_path, layout, device):
    model = load_model(CFG, device=device, dtype=torch.float32, seed=0)
    model.use_graphs = device == "cuda"
    if layout == "eagle3":
        head = FeatureHead.from_pretrained(write_head(tmp_path / "eagle3"), model)
    else:
        head = FeatureHead.from_pretrained(write_head(tmp_path / "eagle1", eagle1_weights(), eagle1_config()), model)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=16)]
    for k in (1, 4):
        out = generate(model, PROMPTS, drafter=head, k=k, max_new_tokens=16)
        assert [g.tokens for g in out] == plain, k
    if device == "cpu":
        # these random weights (seed 0) get drafts accepted at k = 4 on the CPU target (a CUDA target's random
        # weights are another draw), so rounds that commit accepted drafts run too
        assert sum(g.stats.accepted for g in out) > 0, layout


def test_a_full_vocabulary_head_without_d2t_and_the_layers_line_load(tmp_path):
    w = published_weights()
    w["lm_head.weight"] = torch.randn(V, E)
    del w["d2t"], w["t2d"]
    w = {k.replace("midlayer.", "layers.0."): x for k, x in w.items()}
    w["embed_tokens.weight"] = torch.zeros(V, E)          # some checkpoints carry it; the target's is used
    cfg = published_config(draft_vocab_size=V, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 3]})
    head = FeatureHead.from_pretrained(write_head(tmp_path / "full", w, cfg), CFG)
    assert torch.equal(head.net.d2t, torch.arange(V)) and head.net.cfg.target_layers == (0, 1, 3)


def _bad(tmp_path, name, weights=None, config=None, target=CFG):
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        FeatureHead.from_pretrained(write_head(tmp_path / name, weights, config), target)
    return str(e.value)


def test_malformed_published_heads_are_refused_by_name(tmp_path):
    w = published_weights()
    del w["midlayer.self_attn.o_proj.weight"]
    msg = _bad(tmp_path, "missing", w)
    assert "missing tensor 'midlayer.self_attn.o_proj.weight'" in msg and "model.safetensors" in msg

    w = published_weights()
    w["fc.weight"] = torch.zeros(E, 2 * E)
    assert "'fc.weight' has shape [32, 64], expected [32, 96]" in _bad(tmp_path, "shape", w)

    w = published_weights()
    w["d2t"][-1] = 100
    assert "'d2t' maps draft id 19 to target id" in _bad(tmp_path, "d2t", w)

    w = published_weights()
    w["t2d"][:] = False
    assert "'t2d' does not mark exactly" in _bad(tmp_path, "t2d", w)

    assert "hidden_size 32 != the target's 64" in _bad(tmp_path, "target", target=CFG.replace(hidden_size=64))
    assert "vocab_size 48 != the target's 50" in _bad(tmp_path, "vocab", target=CFG.replace(vocab_size=50))

    w = eagle1_weights()
    del w["fc.bias"]                      # its config says bias (the authors' default)
    assert "missing tensor 'fc.bias' (an EAGLE (1/2) head has" in _bad(tmp_path, "eagle1", w, eagle1_config())

    only_bin = tmp_path / "bin"
    only_bin.mkdir()
    (only_bin / "config.json").write_text(json.dumps(published_config()))
    (only_bin / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pytorch_model.bin: only a pickled PyTorch checkpoint"):
        FeatureHead.from_pretrained(only_bin, CFG)

    with pytest.raises(ValueError, match="published EAGLE head: load it with FeatureHead.from_pretrained"):
        FeatureHead(write_head(tmp_path / "plain"))


def test_from_pretrained_takes_a_train_head_directory_and_checks_it(tmp_path):
    from verispec.drafters.head_net import HeadConfig, HeadNet

    HeadNet(HeadConfig.for_target(CFG)).save(tmp_path / "mine")
    assert FeatureHead.from_pretrained(tmp_path / "mine", CFG).cfg == HeadConfig.for_target(CFG)
    with pytest.raises(ValueError, match="hidden size 32 != the target's 64"):
        FeatureHead.from_pretrained(tmp_path / "mine", CFG.replace(hidden_size=64))
