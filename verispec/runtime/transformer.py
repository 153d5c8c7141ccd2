"""A compact Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2) over a static KV cache.

Dimension letters used in shape comments:
  B  batch (sequences in the cache)         T  new tokens in this pass (prefill: padded prompt length; verify: k)
  S  cache capacity (max_seq_len)           V  vocab size
  H  query heads   KV  key/value heads      G  = H // KV (queries per KV head)     D  head_dim
  E  hidden size   I  intermediate size

Weights are stored fused, gpt-fast style: ``wqkv`` = [q; k; v] rows and ``w13`` = [gate; up] rows, so one
decode step is 4 matmuls per layer. ``hf_state_dict`` / ``to_transformers`` in ``loading.py`` map them
to transformers' names (q_proj, gate_proj, ...) as views, so a transformers model can share our storage
for reference checks.

Two attention modes:
  * ``prefill``: right-padded prompts from position 0, causal SDPA (flash on CUDA); K/V go to cache[:, :, :T].
    On CUDA through the fused kernels (``prefill_kernels``: ops.py's norms, RoPE + KV write and SwiGLU, cuBLAS
    matmuls, SDPA over the prompts' own K/V), graph-capturable; elsewhere in plain torch (``_prefill_torch``).
  * ``append`` (decode / verify): token i of sequence b sits at position lengths[b] + i; its K/V are written
    there and it attends to every cache slot j with j <= lengths[b] + i. Positions and the mask are computed
    on the device from ``lengths``, so the pass can be captured in a CUDA graph (no host sync). On CUDA it
    runs through the Triton kernels of ops.py (``append_kernels``: fused add+RMSNorm, RoPE + KV write,
    split-KV attention over the live slots only, SwiGLU); elsewhere, or with ``use_kernels = False``, in plain
    torch (``_append_torch``: index_put + SDPA with a mask over the whole cache).

Hidden states (feature-level draft heads): every pass takes an optional ``hidden`` buffer [N, C, E] and the
``hidden_layers`` (C layer indices) whose outputs it writes there: row n, slot j = the residual stream after
layer ``hidden_layers[j]`` for token n (HF's ``hidden_states[l + 1]``), written by the same pass that computes
the logits. With ``hidden`` None (the default) nothing is written and the pass is unchanged.

References: HF transformers modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py (the semantics we
match to 1e-4 in fp32), gpt-fast model.py (layout), Meta's Llama 3 RoPE scaling.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device import to_device
from . import ops
from .config import ModelConfig
from .quant import packed


# ----------------------------------------------------------------------------------------- RoPE
def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Inverse frequencies [D/2] in fp32, including Llama-3 / linear scaling (as transformers computes them)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = cfg.rope_scaling or {}
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type == "linear":
        inv_freq = inv_freq / rs["factor"]
    elif rope_type == "freq_factors":              # llama.cpp's rope_freqs.weight: theta_i / factor_i
        inv_freq = inv_freq / torch.tensor(rs["factors"], dtype=torch.float32)
    elif rope_type == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are divided by factor, short ones kept, the band between interpolated smoothly
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_table(cfg: ModelConfig, num_positions: int, device) -> Tensor:
    """cos/sin table [num_positions, 2, D] in fp32 (HF's rotate_half layout: freqs repeated twice)."""
    inv_freq = rope_inv_freq(cfg).to(device)
    pos = torch.arange(num_positions, device=device, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)                       # [P, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)                  # [P, D]
    return torch.stack([emb.cos(), emb.sin()], dim=1)        # [P, 2, D]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [N, nh, D]; cos/sin: [N, 1, D] fp32. Computed in fp32, returned in x's dtype.
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # F.rms_norm is one fused kernel on CUDA (statistics in fp32); transformers computes
    # weight * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype): equal in fp32, one rounding apart in bf16.
    return F.rms_norm(x, weight.shape, weight, eps)


def _write_hidden(hidden: Tensor | None, hidden_layers: tuple[int, ...], layer: int, x: Tensor) -> None:
    """hidden[:, j] = x [N, E] where hidden_layers[j] == layer (device copies only: capturable); nothing when
    ``hidden`` is None or the layer is not captured. A layer named twice is written twice."""
    if hidden is None:
        return
    for j, captured in enumerate(hidden_layers):
        if captured == layer:
            hidden[: x.shape[0], j].copy_(x)


# ----------------------------------------------------------------------------------------- modules
def _empty(*shape, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def pre_attention(x: Tensor, rope: Tensor, attn_norm: Tensor, wqkv: Tensor, bqkv: Tensor | None,
                  q_norm: Tensor | None, k_norm: Tensor | None, eps: float, H: int, KV: int, D: int):
    """x [N, E], rope [N, 2, D] -> q [N, H, D], k [N, KV, D], v [N, KV, D] (RMSNorm, fused QKV, qk-norm, RoPE).

    A free function of tensors (no module) so that one ``torch.compile`` serves every layer and both models
    of a (target, truncated draft) pair.
    """
    N = x.shape[0]
    qkv = packed.linear(rms_norm(x, attn_norm, eps), wqkv, bqkv).view(N, H + 2 * KV, D)
    qk, v = qkv[:, : H + KV], qkv[:, H + KV:]              # q and k heads side by side: one RoPE for both
    if q_norm is not None:
        qk = torch.cat([rms_norm(qk[:, :H], q_norm, eps), rms_norm(qk[:, H:], k_norm, eps)], dim=1)
    qk = apply_rope(qk, rope[:, None, 0], rope[:, None, 1])
    return qk[:, :H], qk[:, H:], v


def post_attention(x: Tensor, o: Tensor, wo: Tensor, bo: Tensor | None, ffn_norm: Tensor, w13: Tensor,
                   w2: Tensor, eps: float) -> Tensor:
    """x residual [N, E], o attention output [N, H*D] -> x + o_proj(o) + SwiGLU MLP of that: [N, E]."""
    x = x + packed.linear(o, wo, bo)
    gate, up = packed.linear(rms_norm(x, ffn_norm, eps), w13).chunk(2, dim=-1)
    return x + packed.linear(F.silu(gate) * up, w2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        E, H, KV, D, I = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        self.cfg = cfg
        self.attn_norm = _empty(E, dtype=dtype)
        self.wqkv = _empty((H + 2 * KV) * D, E, dtype=dtype)
        self.bqkv = _empty((H + 2 * KV) * D, dtype=dtype) if cfg.attention_bias else None
        self.wo = _empty(E, H * D, dtype=dtype)
        self.bo = _empty(E, dtype=dtype) if cfg.attention_out_bias else None
        self.q_norm = _empty(D, dtype=dtype) if cfg.qk_norm else None
        self.k_norm = _empty(D, dtype=dtype) if cfg.qk_norm else None
        self.ffn_norm = _empty(E, dtype=dtype)
        self.w13 = _empty(2 * I, E, dtype=dtype)
        self.w2 = _empty(E, I, dtype=dtype)


class Transformer(nn.Module):
    """The weights plus two pure forward functions; the cache is passed in (see cache.py)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.embed = _empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(Block(cfg, dtype) for _ in range(cfg.num_layers))
        self.norm = _empty(cfg.hidden_size, dtype=dtype)
        self.lm_head = None if cfg.tie_word_embeddings else _empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self._pre, self._post = pre_attention, post_attention
        # decode/verify on CUDA through the Triton kernels of ops.py (False: the torch path, as on the CPU)
        self.use_kernels = ops.supports(cfg)
        # tensor parallelism (distributed/tp.py): sums the partial [N, E] outputs of the row-sharded o and down
        # projections over the ranks, in place; None on one device
        self.all_reduce: Callable[[Tensor], None] | None = None

    def compile(self, **kwargs) -> None:
        """torch.compile the per-layer functions (fuses norms / RoPE / SwiGLU; matmuls stay cuBLAS).

        dynamic=True: one graph serves every token count N = B*T (N=1 gets its own). Inductor's own CUDA
        graphs stay off (default mode); our graphs capture the compiled ops.
        """
        kwargs.setdefault("dynamic", True)
        self._pre = torch.compile(pre_attention, **kwargs)
        self._post = torch.compile(post_attention, **kwargs)

    def layer_qkv(self, i: int, x: Tensor, rope: Tensor):
        L, c = self.layers[i], self.cfg
        return self._pre(x, rope, L.attn_norm, L.wqkv, L.bqkv, L.q_norm, L.k_norm, c.rms_norm_eps,
                         c.num_heads, c.num_kv_heads, c.head_dim)

    def layer_out(self, i: int, x: Tensor, o: Tensor) -> Tensor:
        L = self.layers[i]
        return self._post(x, o, L.wo, L.bo, L.ffn_norm, L.w13, L.w2, self.cfg.rms_norm_eps)

    @property
    def lm_head_weight(self) -> Tensor:   # (or a quant.packed.PackedWeight, like every matrix of a packed model)
        return self.embed if self.lm_head is None else self.lm_head

    def logits(self, x: Tensor) -> Tensor:
        # x: [..., E] -> [..., V]
        return packed.linear(rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.lm_head_weight)

    def prefill(self, tokens: Tensor, last: Tensor, rope: Tensor, cache, num_layers: int, first_row: int = 0,
                hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """Right-padded prompts, all starting at position 0, into cache rows [first_row, first_row + B).

        tokens: [B, T] (padding arbitrary); last: [B] index of each prompt's last token; rope: [>= T, 2, D].
        Writes K/V of all T positions into cache[first_row:first_row + B, :, :T] (slots past a prompt's length
        are dead); other rows are untouched, so sequences can be admitted while others are mid-generation.
        Returns logits [B, V] at ``last``. On CUDA through the fused kernels (``prefill_kernels``), elsewhere, or
        with ``use_kernels = False``, in plain torch (``_prefill_torch``). ``hidden`` [B*T, C, E]: see the module
        docstring (every position, padding included).
        """
        if self.use_kernels and tokens.is_cuda:
            row = to_device([first_row], tokens.device, torch.long)
            return self.prefill_kernels(tokens, last, rope, cache, num_layers, row, hidden, hidden_layers)
        return self._prefill_torch(tokens, last, rope, cache, num_layers, first_row, hidden, hidden_layers)

    def _prefill_torch(self, tokens: Tensor, last: Tensor, rope: Tensor, cache, num_layers: int,
                       first_row: int, hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """``prefill`` in plain torch: per-layer ``pre_attention`` / ``post_attention``, K/V copied into the cache
        slices, causal SDPA."""
        B, T = tokens.shape
        H, KV, D = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        x = packed.embedding(tokens, self.embed).view(B * T, -1)   # [N=B*T, E]
        rope = rope[None, :T].expand(B, T, 2, D).reshape(B * T, 2, D)
        for i in range(num_layers):
            q, k, v = self.layer_qkv(i, x, rope)              # [N, H|KV, D]
            q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))  # [B, H|KV, T, D]
            cache.k[i][first_row:first_row + B, :, :T] = k
            cache.v[i][first_row:first_row + B, :, :T] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(H != KV))  # [B, H, T, D]
            x = self.layer_out(i, x, o.transpose(1, 2).reshape(B * T, H * D))
            _write_hidden(hidden, hidden_layers, i, x)
        x_last = x.view(B, T, -1)[torch.arange(B, device=x.device), last]  # [B, E]
        return self.logits(x_last)

    def prefill_kernels(self, tokens: Tensor, last: Tensor, rope: Tensor, cache, num_layers: int,
                        first_row: Tensor, hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """``prefill`` through the fused kernels, 9 launches per layer: add+RMSNorm (the previous layer's down
        output added to the residual), QKV matmul (cuBLAS), ``ops.prefill_rope_kv_write`` (q, k, v for SDPA in
        contiguous buffers; k, v also into cache rows first_row + b), causal attention over the prompts' own K/V
        (``ops.prefill_attention``: SDPA, flash on CUDA, GQA without repeating K/V), o matmul, add+RMSNorm,
        gate/up matmul, SwiGLU, down matmul; the final norm and LM head on the last tokens only.
        first_row: [1] int64 on the device. Nothing is read back on the host, so a fixed (B, T) can be captured
        in a CUDA graph that serves every first_row (``Model.admit``). Same semantics as ``_prefill_torch`` (the
        tests compare them); on the CPU only under TRITON_INTERPRET=1 (tests)."""
        B, T = tokens.shape
        c = self.cfg
        H, KV, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        x = ops.embedding(tokens.reshape(-1), self.embed)                              # [N=B*T, E]
        delta = None
        for i in range(num_layers):
            L = self.layers[i]
            x, h = ops.add_rmsnorm(x, delta, L.attn_norm, eps)
            _write_hidden(hidden, hidden_layers, i - 1, x)                               # layer i - 1's output
            qkv = self._qk_norm(L, ops.linear(h, L.wqkv, L.bqkv))                     # [N, (H+2KV)*D]
            q, k, v = ops.prefill_rope_kv_write(qkv, rope, first_row, cache.k[i], cache.v[i], B, T, H, KV, D)
            o = ops.prefill_attention(q, k, v).transpose(1, 2).reshape(B * T, H * D)
            x, h = ops.add_rmsnorm(x, self._out_proj(o, L.wo, L.bo), L.ffn_norm, eps)
            delta = self._out_proj(ops.silu_mul(ops.linear(h, L.w13)), L.w2, None)
        if hidden is not None and num_layers - 1 in hidden_layers:   # the last layer's output, at every position
            _write_hidden(hidden, hidden_layers, num_layers - 1, x + delta)
        rows = torch.arange(B, device=x.device) * T + last                             # [B] last tokens in x
        _, h = ops.add_rmsnorm(x.index_select(0, rows), delta.index_select(0, rows), self.norm, eps)
        return ops.linear(h, self.lm_head_weight)                                      # [B, V]

    def _qk_norm(self, L: Block, qkv: Tensor) -> Tensor:
        """Qwen3's RMSNorm of every q and k head of the fused QKV output qkv [N, (H+2KV)*D]; qkv itself for
        models without it."""
        if L.q_norm is None:
            return qkv
        H, KV, D, eps = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.rms_norm_eps
        q_, k_, v_ = qkv.view(-1, H + 2 * KV, D).split([H, KV, KV], dim=1)
        qkv = torch.cat([rms_norm(q_, L.q_norm, eps), rms_norm(k_, L.k_norm, eps), v_], dim=1)
        return qkv.view(-1, (H + 2 * KV) * D)

    def append(self, tokens: Tensor, lengths: Tensor, rope: Tensor, cache, num_layers: int,
               hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """Decode (T=1) / verify (T=k) over the static cache, host-sync free.

        tokens: [B, T]; lengths: [B] int64 (tokens already cached); rope: [S, 2, D] full table.
        Token i of sequence b sits at position lengths[b] + i, e.g. lengths=[5, 2], T=2 -> positions
        [[5, 6], [2, 3]]; it sees cache slots j <= its position (older tokens + itself + earlier block tokens).
        Returns logits [B, T, V]. Does not advance ``lengths`` (the caller does, inside the same graph).
        ``hidden`` [B*T, C, E]: the chosen layers' outputs (module docstring), rows in (b, i) order.
        """
        if self.use_kernels and tokens.is_cuda:
            return self.append_kernels(tokens, lengths, rope, cache, num_layers, hidden, hidden_layers)
        return self._append_torch(tokens, lengths, rope, cache, num_layers, hidden, hidden_layers)

    def _out_proj(self, x: Tensor, w: Tensor, bias: Tensor | None, **how) -> Tensor:
        """x @ w.T (+ bias) for the o and down projections (``how``: ``ops.linear``'s keywords); under tensor
        parallelism each rank holds a slice of w's input columns, so the partial products are summed over the
        ranks and the bias added once after."""
        if self.all_reduce is None:
            return ops.linear(x, w, bias, **how)
        out = ops.linear(x, w, None, **how)
        self.all_reduce(out)
        return out if bias is None else out + bias

    def layer_torch(self, i: int, x: Tensor, rope: Tensor, cache, batch: Tensor, slots: Tensor,
                    mask: Tensor) -> Tensor:
        """Layer i of a pass in plain torch, shared by ``_append_torch`` and ``tree.tree_pass_torch``: x [N=B*T, E],
        rope [N, 2, D] (each token's rows), batch [B, 1] arange, slots [B, T] the cache slots K/V are written at,
        mask [B, 1, G*T, S] the slots each query row (g, i) -> g*T + i sees -> the layer's output [N, E]."""
        B, T = slots.shape
        H, KV, D = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        G = H // KV
        q, k, v = self.layer_qkv(i, x, rope)                                          # [N, H|KV, D]
        k_cache, v_cache = cache.k[i][:B], cache.v[i][:B]                             # [B, KV, S, D]
        # advanced indices on dims 0 and 2 around a slice: the indexed view is [B, T, KV, D]
        k_cache[batch, :, slots] = k.view(B, T, KV, D)
        v_cache[batch, :, slots] = v.view(B, T, KV, D)
        # GQA without repeating K/V: fold the G query heads of each KV head into the query rows
        q = q.view(B, T, KV, G, D).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, D)
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)        # [B, KV, G*T, D]
        o = o.view(B, KV, G, T, D).permute(0, 3, 1, 2, 4).reshape(B * T, H * D)
        return self.layer_out(i, x, o)

    def _append_torch(self, tokens: Tensor, lengths: Tensor, rope: Tensor, cache, num_layers: int,
                      hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """``append`` in plain torch (CPU; CUDA with ``use_kernels = False``): SDPA over the whole static cache
        with a boolean mask, K/V written by index_put."""
        B, T = tokens.shape
        H, KV, D = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        G, S = H // KV, cache.k[0].shape[2]
        pos = lengths[:, None] + torch.arange(T, device=tokens.device)                # [B, T]
        # mask [B, 1, G*T, S]: queries of one KV head are packed as rows (g, i) -> g*T + i
        mask = torch.arange(S, device=tokens.device)[None, None, :] <= pos[:, :, None]  # [B, T, S]
        mask = mask[:, None].expand(B, G, T, S).reshape(B, 1, G * T, S)
        rope = rope[pos.view(-1)]                                                     # [N=B*T, 2, D]
        batch = torch.arange(B, device=tokens.device)[:, None]                        # [B, 1]
        x = packed.embedding(tokens.reshape(-1), self.embed)                            # [N, E]
        for i in range(num_layers):
            x = self.layer_torch(i, x, rope, cache, batch, pos, mask)
            _write_hidden(hidden, hidden_layers, i, x)
        return self.logits(x).view(B, T, -1)

    def layer_kernels(self, i: int, x: Tensor, delta: Tensor | None, how: dict,
                      attend: Callable[[int, Tensor], Tensor], hidden: Tensor | None = None,
                      hidden_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor]:
        """Layer i of a pass through the kernels, shared by ``append_kernels`` and ``tree.tree_pass_kernels`` so
        that a tree node's layer is the chain's launch for launch (its logits are a chain pass's bits).

        x [N, E]: the residual stream; delta [N, E]: the previous layer's down-projection output, not yet added
        (the add is fused into this layer's first norm; None for layer 0); how: ``ops.linear``'s keywords;
        attend(i, qkv [N, (H+2KV)*D]) -> o [N, H*D]: RoPE, the K/V write and the attention, the part in which the
        chain and the tree differ. Writes layer i - 1's output to ``hidden`` (``_write_hidden``). Returns the new
        (x, delta)."""
        L = self.layers[i]
        eps = self.cfg.rms_norm_eps
        x, h = ops.add_rmsnorm(x, delta, L.attn_norm, eps)
        _write_hidden(hidden, hidden_layers, i - 1, x)                                       # layer i - 1's output
        qkv = self._qk_norm(L, ops.linear(h, L.wqkv, L.bqkv, **how))                          # [N, (H+2KV)*D]
        o = attend(i, qkv)                                                                 # [N, H*D]
        x, h = ops.add_rmsnorm(x, self._out_proj(o, L.wo, L.bo, **how), L.ffn_norm, eps)
        delta = self._out_proj(ops.silu_mul(ops.linear(h, L.w13, None, **how)), L.w2, None, **how)
        return x, delta

    def append_kernels(self, tokens: Tensor, lengths: Tensor, rope: Tensor, cache, num_layers: int,
                       hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
        """``append`` through the Triton kernels (ops.py): per layer RMSNorm(+residual add), QKV matmul,
        RoPE + KV write, split-KV attention (+ combine), o matmul, add + RMSNorm, gate/up matmul, SwiGLU,
        down matmul; the down matmul's output is added by the next layer's norm kernel. Same semantics as
        ``append`` (the GPU tests compare the two); on the CPU only under TRITON_INTERPRET=1 (tests)."""
        B, T = tokens.shape
        c = self.cfg
        H, KV, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        pos = (lengths[:, None] + torch.arange(T, device=tokens.device)).view(-1)          # [N]
        x = ops.embedding(tokens.reshape(-1), self.embed)                                 # [N, E]
        delta = None
        scale = 1.0 / math.sqrt(D)
        # every matmul batch-invariant (ops.matmul_path): a row's result does not depend on B or T
        how = dict(invariant=True, batch_size=B, config=ops.gemv_config(c.hidden_size))

        def attend(i: int, qkv: Tensor) -> Tensor:
            q = ops.rope_kv_write(qkv, rope, pos, cache.k[i], cache.v[i], T, H, KV, D)  # [N, H, D]
            return ops.decode_attention(q, cache.k[i], cache.v[i], lengths, T, scale)   # [N, H*D]

        for i in range(num_layers):
            x, delta = self.layer_kernels(i, x, delta, how, attend, hidden, hidden_layers)
        x, h = ops.add_rmsnorm(x, delta, self.norm, eps)
        _write_hidden(hidden, hidden_layers, num_layers - 1, x)
        return ops.linear(h, self.lm_head_weight, None, **how).view(B, T, -1)
