"""Which GGML type each tensor of a quantized GGUF gets: llama.cpp's rule for the three mixes verispec writes.

The rule is ``llama_tensor_get_type`` of llama.cpp's src/llama-quant.cpp (ggml-org/llama.cpp; what
``llama-quantize model-f16.gguf out.gguf Q4_K_M`` does without an importance matrix or overrides), for the dense
Llama-family models verispec runs (no experts, not Falcon):

    tensor                                   Q4_K_M                     Q4_0     Q8_0
    1-D (norms, biases, rope_freqs)          F32 (never quantized)      F32      F32
    output.weight, or token_embd.weight      Q6_K                       Q6_K     Q8_0
      when the embeddings are tied           (Q8_0 if its row length is not a multiple of the default type's block)
    token_embd.weight (untied)               Q4_K                       Q4_0     Q8_0
    blk.i.attn_v.weight                      Q6_K if more_bits(i) else Q4_K
    blk.i.ffn_down.weight                    Q6_K if more_bits(i) else Q4_K
    every other matrix                       Q4_K                       Q4_0     Q8_0

    more_bits(i) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2     (n = layers, integer division: ``use_more_bits``)

Then llama.cpp's shape fallback (``tensor_type_fallback``): a matrix whose row length is not a multiple of the chosen
type's block takes Q5_0 instead of Q4_K and Q8_0 instead of Q6_K, F16 if even that does not divide it (e.g. every
matrix of SmolLM2-135M, whose rows of 576 or 1536 are not multiples of 256, falls back). llama.cpp's one more
Q4_K_M rule, attn_v in Q5_K instead of Q4_K for 70B-class models (80 layers), is refused: verispec does not write
Q5_K.
"""
from __future__ import annotations

from dataclasses import dataclass

from .formats import BY_NAME


@dataclass(frozen=True)
class Mix:
    name: str             # "Q4_K_M"
    file_type: int        # general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_*
    default: str          # the type of every matrix the rule does not single out


MIXES = {"Q4_K_M": Mix("Q4_K_M", 15, "Q4_K"), "Q4_0": Mix("Q4_0", 2, "Q4_0"), "Q8_0": Mix("Q8_0", 7, "Q8_0")}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
_BLOCK = {**{name: f.block_size for name, f in BY_NAME.items()}, "Q5_0": 32, "F16": 1, "F32": 1}


def get_mix(name: str) -> Mix:
    if name not in MIXES:
        raise ValueError(f"unknown quantization type {name!r}; verispec writes {sorted(MIXES)}")
    return MIXES[name]


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, shape: tuple[int, ...], mix: Mix, num_layers: int, tied: bool) -> str:
    """The GGML type name of GGUF tensor ``name`` with ``shape`` (GGUF order: shape[0] = the row length) in ``mix``;
    ``tied``: the file has no output.weight (token_embd serves as the LM head)."""
    if len(shape) < 2 or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return "F32"
    cols, kind = shape[0], name.split(".")[-2]
    qtype = mix.default
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        qtype = "Q8_0" if cols % _BLOCK[qtype] else ("Q6_K" if qtype != "Q8_0" else qtype)
    elif kind in ("attn_v", "ffn_down") and mix.name == "Q4_K_M":
        if more_bits(int(name.split(".")[1]), num_layers):
            qtype = "Q6_K"
        elif kind == "attn_v" and num_layers == 80:
            raise ValueError(f"{name}: llama.cpp's Q4_K_M stores attn_v of 80-layer (70B-class) models as Q5_K, "
                             f"which verispec does not write")
    if cols % _BLOCK[qtype]:
        if qtype not in _FALLBACK:
            raise ValueError(f"{name}: rows of {cols} weights are not a whole number of {qtype} blocks of "
                             f"{_BLOCK[qtype]}, and llama.cpp defines no fallback type for {qtype}")
        qtype = _FALLBACK[qtype]
        if cols % _BLOCK[qtype]:
            qtype = "F16"
    return qtype
