"""Published EAGLE-3 and EAGLE (1/2) heads (the layouts of SafeAILab's EAGLE repository, which SGLang and vLLM also
load) as a ``HeadNet``: ``load_published_head(directory, target)``; ``FeatureHead.from_pretrained`` drafts with it.

A published EAGLE-3 directory holds ``config.json`` (a Llama config of one layer: hidden_size, num_attention_heads,
num_key_value_heads, intermediate_size, vocab_size = the target's V, draft_vocab_size = Vd, rope_theta,
rope_scaling, rms_norm_eps; optionally head_dim, target_hidden_size, and SpecForge's
eagle_config.eagle_aux_hidden_state_layer_ids) and ``model.safetensors`` with

    fc.weight                                   [E, 3E]   the three target states, low/middle/high, concatenated
    midlayer.input_layernorm.weight             [E]       norm of the token embedding   -> HeadNet.emb_norm
    midlayer.hidden_norm.weight                 [E]       norm of the feature           -> HeadNet.hidden_norm
    midlayer.self_attn.{q,k,v}_proj.weight      [H*D | KV*D, 2E]  over [embedding; feature] -> HeadNet.wqkv
    midlayer.self_attn.o_proj.weight            [E, H*D]                                -> HeadNet.wo
    midlayer.post_attention_layernorm.weight    [E]                                     -> HeadNet.ffn_norm
    midlayer.mlp.{gate,up}_proj.weight          [I, E]                                  -> HeadNet.w13
    midlayer.mlp.down_proj.weight               [E, I]                                  -> HeadNet.w2
    norm.weight                                 [E]                                     -> HeadNet.norm
    lm_head.weight                              [Vd, E]   the head's own LM head        -> HeadNet.lm_head
    d2t                                         [Vd] int64: target id = draft id + d2t[draft id] (an offset)
    t2d                                         [V] bool: whether a target id is in the draft vocabulary

(``layers.0.`` in place of ``midlayer.`` is accepted too; d2t / t2d may be absent when Vd == V; an
``embed_tokens.weight`` is ignored: the head embeds with the target's own embedding, as the authors' code does.)
That is exactly HeadNet's computation (head_net.py); the only conversion is d2t's offsets to HeadNet's absolute ids.
The published files do not name the target layers they read: the authors capture the inputs of layers 2, N/2 and
N - 3, i.e. the outputs of 1, N/2 - 1 and N - 4 (``default_layers`` of the target's depth), unless the config
names them (eagle_aux_hidden_state_layer_ids, outputs of those layers).

EAGLE (1/2) heads (the authors' ``cnets1.py``; HeadNet's ``eagle1`` variant) have a config.json of a one-layer Llama
(optionally ``bias``, default true: fc has a bias) and

    fc.weight [E, 2E], fc.bias [E]              over [embedding; feature]; the feature is the target's last layer
                                                output after the target's final norm
    layers.0.self_attn.{q,k,v}_proj.weight      [H*D | KV*D, E]  (no input norm: the authors' layer 0 skips it)
    layers.0.self_attn.o_proj.weight, layers.0.post_attention_layernorm.weight, layers.0.mlp.*
    (no norm.weight, no lm_head: the output goes to the target's LM head unnormed)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ..runtime.config import ModelConfig
from .head_net import HeadConfig, HeadNet, default_layers

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
BIN_FILE = "pytorch_model.bin"
LAYER_PREFIXES = ("midlayer.", "layers.0.")
IGNORED = ("embed_tokens.weight",)


def is_published_head(directory: str | Path) -> bool:
    """Whether ``directory`` looks like a published EAGLE head (a config.json without verispec's format tag, beside
    model.safetensors or pytorch_model.bin, or naming a draft vocabulary or an Eagle architecture), not a
    ``verispec train-head`` directory. (EAGLE-1 configs are plain Llama configs: the tensors tell the layouts apart.)"""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    archs = " ".join(meta.get("architectures") or [])
    weights = any((Path(directory) / f).is_file() for f in (SAFETENSORS_FILE, BIN_FILE))
    return "format" not in meta and (weights or "draft_vocab_size" in meta or "eagle" in archs.lower())


def load_published_head(directory: str | Path, target) -> HeadNet:
    """The EAGLE-3 or EAGLE (1/2) head in ``directory`` (layouts above) as an fp32 ``HeadNet`` for ``target`` (a
    runtime Model or its ``ModelConfig``); ValueError naming the file and tensor for anything that does not fit."""
    directory = Path(directory)
    tcfg: ModelConfig = target if isinstance(target, ModelConfig) else target.config
    cfg_path = directory / CONFIG_FILE
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{directory} is not a published EAGLE head directory: no {CONFIG_FILE}")
    w_path = directory / SAFETENSORS_FILE
    if not w_path.is_file():
        if (directory / BIN_FILE).is_file():
            raise ValueError(f"{directory / BIN_FILE}: only a pickled PyTorch checkpoint; reading it means unpickling "
                             f"(torch.load), so verispec reads {SAFETENSORS_FILE} only. Convert it once where you "
                             f"trust the file (safetensors.torch.save_file(torch.load(p, weights_only=True), "
                             f"'{SAFETENSORS_FILE}')) and load again")
        raise FileNotFoundError(f"{directory}: no {SAFETENSORS_FILE}")
    try:
        meta = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from e
    state = _read(w_path)
    state = {k: v for k, v in state.items() if k not in IGNORED}
    prefix = next((p for p in LAYER_PREFIXES if p + "self_attn.q_proj.weight" in state), None)
    if prefix is None:
        raise ValueError(f"{w_path}: not an EAGLE head: no midlayer.self_attn.q_proj.weight (nor "
                         f"layers.0.self_attn.q_proj.weight); tensors: {sorted(state)[:12]}")
    E = _int(meta, "hidden_size", cfg_path)
    if state[prefix + "self_attn.q_proj.weight"].shape[-1] != 2 * E:
        return _load_eagle1(meta, state, prefix, cfg_path, w_path, tcfg)
    hcfg = _head_config(meta, cfg_path, tcfg)
    expected = _expected_shapes(hcfg, prefix)
    _check_tensors(state, expected, {"d2t", "t2d"}, "EAGLE-3", cfg_path, w_path)
    net = HeadNet(hcfg)
    p = lambda name: state[prefix + name].float()  # noqa: E731
    with torch.no_grad():
        net.fc.copy_(state["fc.weight"].float())
        net.emb_norm.copy_(p("input_layernorm.weight"))
        net.hidden_norm.copy_(p("hidden_norm.weight"))
        _copy_decoder_layer(net, p)
        net.norm.copy_(state["norm.weight"].float())
        net.lm_head.copy_(state["lm_head.weight"].float())
        net.d2t.copy_(_draft_to_target(state, hcfg, w_path))
    return net


def _load_eagle1(meta: dict, state: dict[str, Tensor], prefix: str, cfg_path: Path, w_path: Path,
                 t: ModelConfig) -> HeadNet:
    """An EAGLE (1/2) head (module docstring) as an ``eagle1`` HeadNet reading the target's last layer."""
    if meta.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"{cfg_path}: num_hidden_layers {meta['num_hidden_layers']}: verispec runs one-layer heads")
    if meta.get("qkv_bias"):
        raise ValueError(f"{cfg_path}: qkv_bias heads are not supported")
    E, H = _int(meta, "hidden_size", cfg_path), _int(meta, "num_attention_heads", cfg_path)
    V = _int(meta, "vocab_size", cfg_path)
    problems = []
    if E != t.hidden_size:
        problems.append(f"hidden_size {E} != the target's {t.hidden_size}")
    if V != t.vocab_size:
        problems.append(f"vocab_size {V} != the target's {t.vocab_size}")
    if problems:
        raise ValueError(f"{cfg_path}: does not fit the target: " + "; ".join(problems))
    bias = bool(meta.get("bias", True))
    hcfg = HeadConfig(
        hidden_size=E, num_heads=H, num_kv_heads=meta.get("num_key_value_heads") or H,
        head_dim=meta.get("head_dim") or E // H, intermediate_size=_int(meta, "intermediate_size", cfg_path),
        target_layers=(t.num_layers - 1,), vocab_size=V, rms_norm_eps=float(meta.get("rms_norm_eps", 1e-6)),
        rope_theta=float(meta.get("rope_theta", 10000.0)), rope_scaling=_rope_scaling(meta),
        target_num_layers=t.num_layers, variant="eagle1", fc_bias=bias)
    Hd, KV, I = hcfg.num_heads * hcfg.head_dim, hcfg.num_kv_heads * hcfg.head_dim, hcfg.intermediate_size
    expected = {"fc.weight": (E, 2 * E), **({"fc.bias": (E,)} if bias else {})}
    expected.update({prefix + k: s for k, s in {
        "self_attn.q_proj.weight": (Hd, E), "self_attn.k_proj.weight": (KV, E), "self_attn.v_proj.weight": (KV, E),
        "self_attn.o_proj.weight": (E, Hd), "post_attention_layernorm.weight": (E,),
        "mlp.gate_proj.weight": (I, E), "mlp.up_proj.weight": (I, E), "mlp.down_proj.weight": (E, I)}.items()})
    # layer 0's input_layernorm exists in some files but the authors' layer 0 never applies it
    _check_tensors(state, expected, {prefix + "input_layernorm.weight"}, "EAGLE (1/2)", cfg_path, w_path)
    net = HeadNet(hcfg)
    p = lambda name: state[prefix + name].float()  # noqa: E731
    with torch.no_grad():
        net.fc.copy_(state["fc.weight"].float())
        if bias:
            net.fc_bias.copy_(state["fc.bias"].float())
        _copy_decoder_layer(net, p)
    return net


def _check_tensors(state: dict[str, Tensor], expected: dict[str, tuple[int, ...]], optional: set[str], kind: str,
                   cfg_path: Path, w_path: Path) -> None:
    """ValueError naming the first missing tensor, a wrong shape, or tensors the layout does not have."""
    for name, shape in expected.items():
        if name not in state:
            raise ValueError(f"{w_path}: missing tensor {name!r} (an {kind} head has {sorted(expected)})")
        if tuple(state[name].shape) != shape:
            raise ValueError(f"{w_path}: tensor {name!r} has shape {list(state[name].shape)}, expected {list(shape)} "
                             f"from {cfg_path.name} and the target")
    extra = set(state) - set(expected) - optional
    if extra:
        raise ValueError(f"{w_path}: tensors an {kind} head does not have: {sorted(extra)}")


def _rope_scaling(meta: dict) -> dict | None:
    rs = meta.get("rope_scaling") or None
    if rs:
        rs = dict(rs)
        rs["rope_type"] = rs.get("rope_type", rs.get("type", "default"))
        if rs["rope_type"] == "default":
            rs = None
    return rs


def _read(w_path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(w_path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a truncated or bad file
        raise ValueError(f"{w_path}: not a readable safetensors file ({e})") from e


def _int(meta: dict, key: str, cfg_path: Path) -> int:
    if not isinstance(meta.get(key), int):
        raise ValueError(f"{cfg_path}: {key!r} missing or not an integer (got {meta.get(key)!r})")
    return meta[key]


def _head_config(meta: dict, cfg_path: Path, t: ModelConfig) -> HeadConfig:
    """The HeadConfig of a published config.json, checked against the target ``t``."""
    E, H = _int(meta, "hidden_size", cfg_path), _int(meta, "num_attention_heads", cfg_path)
    V = _int(meta, "vocab_size", cfg_path)
    Vd = meta.get("draft_vocab_size") or V
    problems = []
    if E != t.hidden_size:
        problems.append(f"hidden_size {E} != the target's {t.hidden_size}")
    if meta.get("target_hidden_size") not in (None, E):
        problems.append(f"target_hidden_size {meta['target_hidden_size']} != hidden_size {E} (a head narrower than "
                        f"its target is not supported)")
    if V != t.vocab_size:
        problems.append(f"vocab_size {V} != the target's {t.vocab_size}")
    if not isinstance(Vd, int) or not 0 < Vd <= V:
        problems.append(f"draft_vocab_size {Vd!r} is not in 1..vocab_size ({V})")
    layers = (meta.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(layers) if layers else default_layers(t.num_layers)
    if len(layers) != 3 or max(layers) >= t.num_layers or min(layers) < 0:
        problems.append(f"reads target layers {list(layers)}: an EAGLE-3 head reads 3 of the target's "
                        f"{t.num_layers}")
    if problems:
        raise ValueError(f"{cfg_path}: does not fit the target: " + "; ".join(problems))
    return HeadConfig(
        hidden_size=E, num_heads=H, num_kv_heads=meta.get("num_key_value_heads") or H,
        head_dim=meta.get("head_dim") or E // H, intermediate_size=_int(meta, "intermediate_size", cfg_path),
        target_layers=layers, vocab_size=V, draft_vocab=Vd, rms_norm_eps=float(meta.get("rms_norm_eps", 1e-6)),
        rope_theta=float(meta.get("rope_theta", 10000.0)), rope_scaling=_rope_scaling(meta),
        target_num_layers=t.num_layers)


def _expected_shapes(c: HeadConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    E, H, KV, D, I = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    shapes = {"fc.weight": (E, 3 * E), "norm.weight": (E,), "lm_head.weight": (c.draft_vocab, E)}
    shapes.update({prefix + k: s for k, s in {
        "input_layernorm.weight": (E,), "hidden_norm.weight": (E,), "post_attention_layernorm.weight": (E,),
        "self_attn.q_proj.weight": (H * D, 2 * E), "self_attn.k_proj.weight": (KV * D, 2 * E),
        "self_attn.v_proj.weight": (KV * D, 2 * E), "self_attn.o_proj.weight": (E, H * D),
        "mlp.gate_proj.weight": (I, E), "mlp.up_proj.weight": (I, E), "mlp.down_proj.weight": (E, I)}.items()})
    return shapes


def _draft_to_target(state: dict[str, Tensor], c: HeadConfig, w_path: Path) -> Tensor:
    """HeadNet's d2t [Vd] (absolute target ids) from the published offsets, checked: every id inside the target's
    vocabulary, no id twice, and t2d (when present) marking exactly those ids."""
    Vd, V = c.draft_vocab, c.vocab_size
    if "d2t" not in state:
        if Vd != V:
            raise ValueError(f"{w_path}: missing tensor 'd2t' (draft_vocab_size {Vd} < vocab_size {V} needs the map)")
        return torch.arange(V)
    d2t = state["d2t"]
    if tuple(d2t.shape) != (Vd,) or d2t.is_floating_point():
        raise ValueError(f"{w_path}: tensor 'd2t' is {d2t.dtype} {list(d2t.shape)}, expected integer [{Vd}]")
    ids = torch.arange(Vd) + d2t.long()
    bad = ((ids < 0) | (ids >= V)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{w_path}: tensor 'd2t' maps draft id {i} to target id {int(ids[i])}, outside the target's "
                         f"vocabulary 0..{V - 1} ({len(bad)} such ids)")
    if len(torch.unique(ids)) != Vd:
        raise ValueError(f"{w_path}: tensor 'd2t' maps two draft ids to one target id")
    if "t2d" in state:
        t2d = state["t2d"]
        marked = torch.zeros(V, dtype=torch.bool)
        marked[ids] = True
        if tuple(t2d.shape) != (V,) or not torch.equal(t2d.bool(), marked):
            raise ValueError(f"{w_path}: tensor 't2d' does not mark exactly the target ids d2t maps to")
    return ids


def _copy_decoder_layer(net, p) -> None:
    """The decoder layer both layouts share (Llama's names under the layer's prefix; ``p(name)`` reads one as fp32):
    q/k/v stacked into ``wqkv``, gate/up into ``w13``."""
    net.wqkv.copy_(torch.cat([p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"),
                              p("self_attn.v_proj.weight")]))
    net.wo.copy_(p("self_attn.o_proj.weight"))
    net.ffn_norm.copy_(p("post_attention_layernorm.weight"))
    net.w13.copy_(torch.cat([p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")]))
    net.w2.copy_(p("mlp.down_proj.weight"))
