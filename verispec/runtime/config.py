"""Model shape and hyper-parameters for the Llama family (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2).

One frozen dataclass, ``ModelConfig``, describes every supported model; ``NAMED_SHAPES`` holds the
public configurations of a few real models so that benchmarks can run at real sizes with random
weights (``load_model("llama-3.1-8b")``); ``random_weights_note`` says so to users.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# model_type values (HF config.json) and the architectures that map to this decoder.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# rope_scaling["rope_type"] values we implement (see transformer.rope_inv_freq); "freq_factors" is llama.cpp's
# rope_freqs.weight from a GGUF file ({"rope_type": "freq_factors", "factors": [D/2 divisors of the inverse
# frequencies]}: how llama.cpp stores Llama-3 scaling).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int                 # V: rows of the embedding / LM head
    num_layers: int                 # decoder blocks
    hidden_size: int                # model width
    num_heads: int                  # H: query heads
    num_kv_heads: int               # KV heads (GQA: num_heads % num_kv_heads == 0)
    head_dim: int                   # D: per-head width (Qwen3: != hidden_size // num_heads)
    intermediate_size: int          # SwiGLU inner width
    rope_theta: float = 10000.0     # RoPE base
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)  # None | {"rope_type": "llama3"|"linear"|"freq_factors", ...}
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False   # LM head shares the embedding matrix
    attention_bias: bool = False        # bias on q/k/v projections (Qwen2)
    attention_out_bias: bool = False    # bias on o_proj (Llama with attention_bias=True only)
    qk_norm: bool = False               # per-head RMSNorm on q and k before RoPE (Qwen3)
    max_position_embeddings: int = 4096
    sliding_window: int | None = None   # Mistral v0.1; we refuse caches longer than this (not implemented)
    model_type: str = "llama"           # informative only; nothing branches on it at run time

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_scaling type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")

    @property
    def num_params(self) -> int:
        """Parameter count (the LM head counted once when tied)."""
        d, hd = self.hidden_size, self.head_dim
        qkv = d * hd * (self.num_heads + 2 * self.num_kv_heads)
        attn = qkv + self.num_heads * hd * d
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d
        return emb * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + d

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """Build from a parsed HF ``config.json``; ValueError for architectures outside the family."""
        model_type = cfg.get("model_type")
        archs = cfg.get("architectures") or []
        if model_type not in SUPPORTED_MODEL_TYPES or (archs and not set(archs) & set(SUPPORTED_ARCHITECTURES)):
            raise ValueError(
                f"unsupported architecture: model_type={model_type!r}, architectures={archs}; verispec's runtime "
                f"supports model_type in {SUPPORTED_MODEL_TYPES}. Wrap other models with "
                f"verispec.runtime.HFModel(path_or_model) (slower, any transformers causal LM)."
            )
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported by verispec's runtime; use verispec.runtime.HFModel")
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        attention_bias = bool(cfg.get("attention_bias", False))
        sliding = cfg.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            sliding = None
        return cls(
            vocab_size=cfg["vocab_size"],
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            intermediate_size=cfg["intermediate_size"],
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rope_scaling=_rope_scaling(cfg),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=(model_type == "qwen2") or attention_bias,
            attention_out_bias=(model_type in ("llama", "qwen3")) and attention_bias,
            qk_norm=(model_type == "qwen3"),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            sliding_window=sliding,
            model_type=model_type,
        )


def _rope_scaling(cfg: dict) -> dict | None:
    # transformers < 5 writes "rope_scaling"; 5.x writes "rope_parameters" (with rope_theta inside).
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not rs:
        return None
    rs = dict(rs)
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type == "default":
        return None
    rs["rope_type"] = rope_type
    return rs


_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)

# Public config.json values of real models (weights not included: use for random-weight benchmarks).
NAMED_SHAPES: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=131072),
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256, num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8, head_dim=64,
        intermediate_size=8192, rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE, factor=32.0),
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064, num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4, head_dim=128,
        intermediate_size=18944, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=True, max_position_embeddings=32768, model_type="qwen2"),
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151936, num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
        intermediate_size=4864, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=True, max_position_embeddings=32768, model_type="qwen2"),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151936, num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8, head_dim=128,
        intermediate_size=3072, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        qk_norm=True, max_position_embeddings=40960, model_type="qwen3"),
    "mistral-7b": ModelConfig(  # v0.3
        vocab_size=32768, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, rope_theta=1000000.0, rms_norm_eps=1e-5, max_position_embeddings=32768,
        model_type="mistral"),
    "smollm2-135m": ModelConfig(
        vocab_size=49152, num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
        intermediate_size=1536, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=8192),
}


def random_weights_note(name: str) -> str | None:
    """The one-line note to show when ``name`` loads random weights (a ``NAMED_SHAPES`` name), else None.

    Such a model has the real model's shape only: its output is random tokens, fine for speed
    measurements and useless as text; ``smollm2-135m`` is not the embedded (trained) SmolLM2."""
    if name not in NAMED_SHAPES:
        return None
    note = (f"{name!r} is a shape name: the weights are random (output is random tokens; use it to "
            f"measure speed, or pass an HF checkpoint directory / .gguf file for real text)")
    if name == "smollm2-135m":
        note += "; the embedded trained SmolLM2-135M-Instruct is what you get without --model"
    return note


def named_shape(name: str) -> ModelConfig:
    try:
        return NAMED_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known shapes: {sorted(NAMED_SHAPES)}") from None
