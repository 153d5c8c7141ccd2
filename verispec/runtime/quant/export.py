"""``verispec quantize``: a model (an HF checkpoint or a random-weight shape) -> a quantized GGUF file that
llama.cpp and verispec both read.

The file is what llama.cpp's ``convert_hf_to_gguf.py`` followed by ``llama-quantize`` (no importance matrix) would
write, up to the metadata neither needs:
  * names: ``token_embd``, ``blk.{i}.attn_{q,k,v,output}``, ``blk.{i}.ffn_{gate,up,down}``, ``blk.{i}.attn_norm`` /
    ``ffn_norm`` / ``attn_{q,k}_norm`` (Qwen3), q/k/v biases (Qwen2), ``output_norm``, ``output`` (absent when tied);
  * the Q/K rows of ``llama`` models (Llama, Mistral, SmolLM2) permuted for llama.cpp's interleaved RoPE, as its
    converter does (``LlamaModel.permute``; ``loading.unpermute_qk`` undoes it), Qwen's left as they are;
  * Llama-3 RoPE scaling as llama.cpp stores it, a ``rope_freqs.weight`` tensor of frequency divisors; linear
    scaling as ``rope.scaling.type`` / ``rope.scaling.factor``;
  * tensors in llama-quantize's order (global tensors by name, then each layer's by name), each matrix in the type
    ``mix.tensor_type`` gives it (llama.cpp's rule), 1-D tensors in F32;
  * no tokenizer: the file loads like a random-weight shape (weights, ``tokenizer = None``).
The weights are quantized from the source's own values widened to fp32 (llama.cpp goes through an F16 or BF16
file first: for a bf16 checkpoint the same values).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..config import NAMED_SHAPES, ModelConfig, named_shape
from .formats import BY_NAME
from .mix import get_mix, tensor_type
from .quantize import quantize

ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}   # model_type -> GGUF arch


@dataclass
class Report:
    """What ``write_quantized_gguf`` wrote."""
    path: Path
    mix: str
    num_tensors: int = 0
    types: dict = field(default_factory=dict)        # GGML type name -> (tensors, bytes)
    file_bytes: int = 0

    def summary(self) -> str:
        parts = ", ".join(f"{n} {t} ({b / 2**20:.1f} MiB)" for t, (n, b) in sorted(self.types.items()))
        return f"wrote {self.path} ({self.mix}, {self.file_bytes / 2**20:.1f} MiB): {self.num_tensors} tensors: {parts}"


def gguf_name(hf: str) -> str:
    """transformers name -> llama.cpp name, e.g. model.layers.3.self_attn.v_proj.weight -> blk.3.attn_v.weight."""
    from ..loading import GGUF_LAYER_NAMES

    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    for kind, ours in GGUF_LAYER_NAMES.items():
        if rest == ours or rest.startswith(ours + "."):
            return f"blk.{i}.{kind}" + (".weight" if rest == ours else rest[len(ours):])
    raise ValueError(f"tensor {hf!r} has no llama.cpp name (is the checkpoint a Llama-family model?)")


def llama_cpp_permute(w: Tensor, n_head: int) -> Tensor:
    """llama.cpp's converter permutation of Q/K rows: each head's [D] rows from HF's halves to interleaved pairs
    (w.reshape(n_head, 2, D/2, ...).swapaxes(1, 2)); ``loading.unpermute_qk`` is its inverse."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: ModelConfig) -> Tensor:
    """The ``rope_freqs.weight`` llama.cpp writes for Llama-3 RoPE scaling: per frequency of the head, the divisor
    of its inverse frequency (1 for short wavelengths, ``factor`` for long ones, a smooth blend between)."""
    rs = cfg.rope_scaling
    D = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def _layer_order(name: str):
    """llama-quantize's tensor order (llama_model_loader's weight_name_comparer): by layer (global tensors first),
    then by name."""
    return (int(name.split(".")[1]) if name.startswith("blk.") else -1, name)


def _source(source, device, dtype, seed):
    """(config, name, {transformers name: (shape, () -> tensor)}, device) of ``source``: an HF checkpoint
    directory, a shape name from NAMED_SHAPES or a ModelConfig (random weights, drawn as ``load_model`` draws them
    on ``device``)."""
    from ...device import apply_cpu_thread_policy
    from ..loading import default_device_dtype, hf_checkpoint, hf_state_dict, random_net

    device, dtype = default_device_dtype(device, dtype)
    if device.type == "cpu":
        apply_cpu_thread_policy()      # as load_model: the quantizer's many small ops collapse on busy cores
    if not isinstance(source, ModelConfig):
        s = os.fspath(source)
        path = Path(s).expanduser()
        if path.is_dir():
            cfg, _, files = hf_checkpoint(path)
            from safetensors import safe_open

            getters = {}
            for f in files:
                with safe_open(str(f), framework="pt", device="cpu") as sf:
                    for name in sf.keys():
                        getters[name] = (tuple(sf.get_slice(name).get_shape()), lambda f=f, name=name: _read(f, name))
            return cfg, path.name, getters, device
        if path.suffix == ".gguf":
            raise ValueError(f"{path}: quantizing a GGUF file again is not supported; pass the HF checkpoint "
                             f"directory it came from")
        if s not in NAMED_SHAPES:
            raise ValueError(f"{s!r} is neither an HF checkpoint directory nor a known shape name; known shapes: "
                             f"{sorted(NAMED_SHAPES)}")
        name, source = s, named_shape(s)
    else:
        name = "random"
    with torch.inference_mode(False), torch.no_grad():
        net = random_net(source, device, dtype, seed)
    tensors = hf_state_dict(net)
    if source.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return source, name, {k: (tuple(t.shape), lambda t=t: t) for k, t in tensors.items()}, device


def _read(file: Path, name: str) -> Tensor:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt", device="cpu") as sf:
        return sf.get_tensor(name)


def _metadata(w, cfg: ModelConfig, arch: str, name: str, file_type: int) -> None:
    import gguf

    w.add_type("model")
    w.add_name(name)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rs["factor"]))
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_quantized_gguf(source, out, mix: str = "Q4_K_M", *, device=None, dtype=None, seed: int = 0,
                         log=None) -> Report:
    """Write ``source`` quantized with ``mix`` ("Q4_K_M", "Q4_0", "Q8_0") to the GGUF file ``out``.

    source: an HF checkpoint directory, a shape name from ``NAMED_SHAPES`` or a ``ModelConfig`` (random weights:
    the same ones ``load_model(source, device=device, dtype=dtype, seed=seed)`` draws).
    device: where the weights are drawn and quantized (default: cuda if available; the K-quant search costs
    ~2 M weights/s on a small CPU, so use a GPU for 1B+ models). log: a callable given one line per tensor.
    Returns a ``Report``; ValueError for a model or mix this cannot write (before anything is written).
    """
    import gguf

    m = get_mix(mix)
    cfg, name, getters, device = _source(source, device, dtype, seed)
    arch = ARCHITECTURES.get(cfg.model_type)
    if arch is None:
        raise ValueError(f"model_type {cfg.model_type!r} has no llama.cpp architecture here ({sorted(ARCHITECTURES)})")
    if cfg.sliding_window is not None:
        raise ValueError("sliding-window attention is not written to GGUF here (llama.cpp's llama ignores it)")
    rope_type = (cfg.rope_scaling or {}).get("rope_type", "default")
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"rope_scaling {rope_type!r} cannot be written to GGUF here")
    names = {gguf_name(hf): hf for hf in getters}
    tied = "output.weight" not in names
    tensors = {n: None for n in names}
    if rope_type == "llama3":
        tensors["rope_freqs.weight"] = None
    order = sorted(tensors, key=_layer_order)
    # every type is decided before anything is written, so a refusal leaves no partial file
    shapes = {}
    for n in order:
        if n == "rope_freqs.weight":
            shapes[n] = (cfg.head_dim // 2,)
        else:
            shapes[n] = tuple(reversed(getters[names[n]][0]))             # GGUF order: the row length first
    types = {n: tensor_type(n, shapes[n], m, cfg.num_layers, tied) for n in order}
    report = Report(Path(out), m.name)
    out = Path(out)
    writer = gguf.GGUFWriter(str(out), arch, use_temp_file=True)
    try:
        _metadata(writer, cfg, arch, name, m.file_type)
        for n in order:
            t = llama3_rope_factors(cfg) if n == "rope_freqs.weight" else getters[names[n]][1]()
            data, qtype = _encode(n, t.to(device), types[n], cfg, arch)
            writer.add_tensor(n, data, raw_dtype=qtype)
            count, nbytes = report.types.get(types[n], (0, 0))
            report.types[types[n]] = (count + 1, nbytes + data.nbytes)
            report.num_tensors += 1
            if log is not None:
                log(f"{n:<32} {str(tuple(shapes[n])):<16} {types[n]}")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        out.unlink(missing_ok=True)
        raise
    writer.close()
    report.file_bytes = out.stat().st_size
    return report


def _encode(name: str, t: Tensor, qtype: str, cfg: ModelConfig, arch: str):
    """The bytes (numpy) and gguf type of tensor ``name`` in ``qtype``."""
    import gguf

    w = t.detach().float()
    if arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
        w = llama_cpp_permute(w, cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads)
    if qtype == "F32":
        return w.cpu().numpy(), None
    if qtype == "F16":
        return w.half().cpu().numpy(), None
    if qtype in BY_NAME:
        return quantize(w, qtype, name=name).cpu().numpy(), gguf.GGMLQuantizationType[qtype]
    return gguf.quants.quantize(w.cpu().numpy(), gguf.GGMLQuantizationType[qtype]), gguf.GGMLQuantizationType[qtype]
