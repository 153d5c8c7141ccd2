"""The feature-level draft head's network (EAGLE-3's shape) and its files; ``FeatureHead`` (feature_head.py) drafts
with it, ``verispec train-head`` (head_training.py) trains it.

One *entry* j of a sequence pairs the target's hidden states at position j (the outputs of C chosen layers: a low,
a middle and a high one) with the token at position j + 1, and predicts the token at position j + 2:

    f_j   = fc(concat of the C states)            [C*E] -> [E]       (the target's features, fused)
    x_j   = concat(RMSNorm(embed(t_{j+1})), RMSNorm(f_j))            [2E]  (the target's embedding, frozen)
    h_j   = f_j + o_proj(attention(q, k, v of x_j))                   one decoder layer, its own KV cache, RoPE at j
    out_j = h_j + MLP(RMSNorm(h_j))                                   [E]
    logits_j = lm_head(RMSNorm(out_j))                                the target's LM head (shared, frozen), or a
                                                                      draft vocabulary of Vd ids with d2t [Vd]

Drafting past the target's last state, entry j + 1 takes out_j in place of f_{j+1} (the head's own output is
the next step's feature): e.g. target states up to position n, history up to t_{n+1}: entry n -> d_1 = t_{n+2};
entry n + 1 = (out_n, d_1) -> d_2; ... Training unrolls those steps on the head's own outputs (``unrolled``:
EAGLE-3's training-time test).

The ``eagle1`` variant is the EAGLE (1/2) head, run for published checkpoints (published_heads.py), not trained
here: it reads the target's last layer output after the target's own final norm (``feature_norm``, the target's,
set by ``FeatureHead.attach``) and has no norms of its own before attention and none before the target's LM head:

    f_j   = RMSNorm_target(state_j)                                   [E]
    x_j   = fc(concat(embed(t_{j+1}), f_j)) + fc_bias                 [2E] -> [E]
    h_j   = x_j + o_proj(attention(q, k, v of x_j))
    out_j = h_j + MLP(RMSNorm(h_j));  logits_j = target lm_head(out_j)

Dimension letters as in verispec/runtime/transformer.py; C = number of captured target layers, Vd = draft vocab.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import ops
from ..runtime.config import ModelConfig
from ..runtime.quant import packed
from ..runtime.transformer import apply_rope, rms_norm, rope_table
from .base import greedy_tokens

FORMAT = "verispec-feature-head-1"
VARIANTS = ("eagle3", "eagle1")
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape, and the target it reads (checked by ``FeatureHead.attach``)."""

    hidden_size: int                 # E: the target's hidden size (the head reads and writes E-wide states)
    num_heads: int                   # H of the head's attention
    num_kv_heads: int                # KV heads of the head's attention
    head_dim: int                    # D
    intermediate_size: int           # I: the head's SwiGLU width
    target_layers: tuple[int, ...]   # the C target layers whose outputs it reads (low, middle, high)
    vocab_size: int                  # V: the target's vocabulary (drafts are target ids)
    draft_vocab: int | None = None   # Vd: its own LM head over Vd target ids (d2t); None = the target's LM head
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)   # the target's RoPE scaling
    target_num_layers: int = 0       # the target's depth when it was trained (0 = unknown): a mismatch is refused
    variant: str = "eagle3"          # "eagle3" (trained here, published EAGLE-3) or "eagle1" (published EAGLE 1/2)
    fc_bias: bool = False            # eagle1: its fc has a bias

    def __post_init__(self):
        object.__setattr__(self, "target_layers", tuple(int(l) for l in self.target_layers))
        if self.variant not in VARIANTS:
            raise ValueError(f"head: variant {self.variant!r} is not one of {VARIANTS}")
        if self.variant == "eagle1" and (len(self.target_layers) != 1 or self.draft_vocab):
            raise ValueError("head: an eagle1 head reads one target layer (the last) and uses the target's LM head")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"head: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.target_layers:
            raise ValueError("head: target_layers is empty (it reads at least one target layer)")

    @staticmethod
    def for_target(cfg: ModelConfig, layers: tuple[int, ...] | None = None, draft_vocab: int | None = None,
                   intermediate_size: int | None = None) -> "HeadConfig":
        """The EAGLE-3 head for a target: its attention shape and width, the target's own layers
        ``default_layers`` unless given."""
        return HeadConfig(
            hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, intermediate_size=intermediate_size or cfg.intermediate_size,
            target_layers=tuple(layers) if layers is not None else default_layers(cfg.num_layers),
            vocab_size=cfg.vocab_size, draft_vocab=draft_vocab, rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, target_num_layers=cfg.num_layers)

    def model_config(self) -> ModelConfig:
        """The head as a one-layer ``ModelConfig``: what the runtime's KV cache and RoPE table are built from."""
        return ModelConfig(vocab_size=self.vocab_size, num_layers=1, hidden_size=self.hidden_size,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           intermediate_size=self.intermediate_size, rope_theta=self.rope_theta,
                           rope_scaling=self.rope_scaling, rms_norm_eps=self.rms_norm_eps)


def _linear(x: Tensor, w: Tensor, invariant: bool) -> Tensor:
    """x [M, K] @ w.T. ``invariant`` (drafting): the runtime's batch-invariant matmul on CUDA (``ops.linear``: a row's
    result does not depend on M), so a row drafts the same bits in a batch of any size and in a CUDA graph's padded
    bucket as eagerly -- a sampled request's drafts, and so its tokens, must not depend on its batch. Training's
    ``unrolled`` keeps cuBLAS (whole sequences, many rows, gradients)."""
    return ops.linear(x, w, invariant=True) if invariant else F.linear(x, w)


def default_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / middle / high target layers (the outputs of layers 1, N/2 - 1 and N - 4, as SGLang captures
    them), clamped and deduplicated for shallow targets. e.g. 30 layers -> (1, 14, 26); 32 -> (1, 15, 28);
    3 -> (0, 1, 2)."""
    if num_layers <= 4:
        return tuple(range(min(num_layers, 3)))
    return tuple(sorted({1, num_layers // 2 - 1, num_layers - 4}))


class HeadNet(nn.Module):
    """The head's weights and its two forward forms: ``cached`` (drafting, over a KV cache) and ``unrolled``
    (training, whole sequences, several draft steps). The target's embedding and (shared) LM head are passed in,
    never owned."""

    def __init__(self, cfg: HeadConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        E, H, KV, D, I = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        C = len(cfg.target_layers)
        p = lambda *shape: nn.Parameter(torch.empty(*shape, dtype=dtype))  # noqa: E731
        self.eagle1 = cfg.variant == "eagle1"
        self._kernel_shape = ops.supports(cfg.model_config())   # the runtime's attention kernels cover the head
        if self.eagle1:
            self.fc = p(E, 2 * E)                # over [embedding; feature]
            self.fc_bias = p(E) if cfg.fc_bias else None
            self.wqkv = p((H + 2 * KV) * D, E)   # [q; k; v] rows over fc's output
            # the target's final norm weight (copied by FeatureHead.attach: the head reads normed states)
            self.register_buffer("feature_norm", torch.ones(E, dtype=dtype), persistent=False)
            self.feature_norm_eps = cfg.rms_norm_eps     # the target's (set with feature_norm)
        else:
            self.fc = p(E, C * E)                # fuses the C target states
            self.emb_norm = p(E)                 # EAGLE-3's input_layernorm (of the token embedding)
            self.hidden_norm = p(E)              # and hidden_norm (of the feature)
            self.wqkv = p((H + 2 * KV) * D, 2 * E)   # [q; k; v] rows over the 2E-wide input
        self.wo = p(E, H * D)
        self.ffn_norm = p(E)
        self.w13 = p(2 * I, E)                   # [gate; up]
        self.w2 = p(E, I)
        self.norm = None if self.eagle1 else p(E)   # eagle1: none (its output goes to the target's LM head)
        self.lm_head = p(cfg.draft_vocab, E) if cfg.draft_vocab else None
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab or 0, dtype=torch.long))   # draft id -> target id
        self._d2t_ascending: tuple | None = None   # ((d2t's storage, version), whether it ascends): d2t_ascending
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0) -> None:
        """Norms 1, matrices N(0, 1/sqrt(fan_in)) * 0.5 (a fresh head's drafts are noise; training starts here)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, w in self.named_parameters():
                if w.dim() == 1:
                    w.fill_(1.0)
                else:
                    w.copy_(torch.randn(w.shape, generator=g) * (0.5 / math.sqrt(w.shape[1])))

    # ------------------------------------------------------------------------------------ pieces
    def fuse(self, states: Tensor, invariant: bool = False) -> Tensor:
        """The target's states [..., C, E] -> features [..., E] (``invariant``: see ``_linear``); eagle1: the target's
        final norm of its one state."""
        if self.eagle1:
            return rms_norm(states[..., 0, :].to(self.fc.dtype), self.feature_norm, self.feature_norm_eps)
        x = states.flatten(-2).to(self.fc.dtype)
        return _linear(x.reshape(-1, x.shape[-1]), self.fc, invariant).view(*x.shape[:-1], -1)

    def _input(self, feats: Tensor, emb: Tensor, invariant: bool = False,
               kernels: bool = False) -> tuple[Tensor, Tensor]:
        """feats, emb [N, E] -> (the attention's input x [N, 2E] (eagle1: [N, E]), the residual [N, E]).
        ``kernels``: the two norms by the runtime's RMSNorm kernel (CUDA, no autograd: drafting)."""
        if self.eagle1:
            x = _linear(torch.cat([emb, feats], dim=-1), self.fc, invariant)
            if self.fc_bias is not None:
                x = x + self.fc_bias
            return x, x
        x = torch.cat([self._norm(emb, self.emb_norm, kernels), self._norm(feats, self.hidden_norm, kernels)],
                      dim=-1)                                                            # [N, 2E]
        return x, feats

    def _norm(self, x: Tensor, weight: Tensor, kernels: bool) -> Tensor:
        """RMSNorm(x) * weight; ``kernels``: the runtime's RMSNorm kernel (x [N, E] on CUDA, no autograd: drafting)."""
        if kernels:
            return ops.add_rmsnorm(x.contiguous(), None, weight, self.cfg.rms_norm_eps)[1]
        return rms_norm(x, weight, self.cfg.rms_norm_eps)

    def _qkv(self, x: Tensor, rope: Tensor, invariant: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, 2E] (``_input``; eagle1 [N, E]), rope [N, 2, D] -> q [N, H, D], k, v [N, KV, D]."""
        c = self.cfg
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = _linear(x, self.wqkv, invariant).view(-1, H + 2 * KV, D)
        qk = apply_rope(qkv[:, :H + KV], rope[:, None, 0], rope[:, None, 1])
        return qk[:, :H], qk[:, H:], qkv[:, H + KV:]

    def _out(self, residual: Tensor, o: Tensor, invariant: bool = False, kernels: bool = False) -> Tensor:
        """residual [N, E] (``_input``'s), o attention output [N, H*D] -> out [N, E]. ``kernels``: the runtime's
        fused add + RMSNorm and SiLU-multiply (CUDA, no autograd: drafting)."""
        if kernels:
            h, hn = ops.add_rmsnorm(residual.contiguous(), _linear(o, self.wo, invariant), self.ffn_norm,
                                    self.cfg.rms_norm_eps)
            return h + _linear(ops.silu_mul(_linear(hn, self.w13, invariant)), self.w2, invariant)
        h = residual + _linear(o, self.wo, invariant)
        gate, up = _linear(rms_norm(h, self.ffn_norm, self.cfg.rms_norm_eps), self.w13, invariant).chunk(2, dim=-1)
        return h + _linear(F.silu(gate) * up, self.w2, invariant)

    def logits(self, out: Tensor, target_lm_head=None, invariant: bool = False) -> Tensor:
        """out [..., E] -> logits over the target's vocabulary [..., V]: the target's LM head (``target_lm_head``
        [V, E], dense or packed) when the vocabulary is shared; with a draft vocabulary its own [Vd, E] head,
        scattered to the target ids d2t (every other id -inf: never drafted, q = 0 there). ``invariant``: out is
        [B, E] and each row's logits must not depend on B (drafting: see ``_linear``). eagle1: no norm here."""
        logits = self._head_logits(out, target_lm_head, invariant)
        return logits if self.lm_head is None else self._scatter(logits)

    def greedy(self, out: Tensor, target_lm_head=None) -> Tensor:
        """A drafting step's greedy tokens: out [B, E] -> greedy_tokens(logits(out, target_lm_head, invariant=True))
        [B] int64, the same ids. With a draft vocabulary whose d2t ascends (a trained head's always does), the
        argmax runs over the Vd draft logits and maps through d2t, skipping the V-wide scatter: the first maximum
        in draft order is then the first in target order (a row of Vd -inf logits aside: no draft is then right)."""
        if self.lm_head is not None and self.d2t_ascending:
            return greedy_tokens(self._head_logits(out, target_lm_head, invariant=True), self.d2t)
        return greedy_tokens(self.logits(out, target_lm_head, invariant=True))

    def top_children(self, out: Tensor, w: int, target_lm_head=None) -> Tensor:
        """A tree drafting step's w children: out [B, E] -> [B, w] int64 target ids, the top-w of
        logits(out, target_lm_head, invariant=True); w = 1: ``greedy``'s id. With a draft vocabulary of at least w
        ids the top-w run over the Vd draft logits, mapped through d2t (no V-wide scatter): the same ids, in an
        order that may differ among tied values (torch.topk's order among ties is unspecified either way)."""
        if w == 1:
            return self.greedy(out, target_lm_head)[:, None]
        if self.lm_head is not None and self.cfg.draft_vocab >= w:
            return self.d2t[self._head_logits(out, target_lm_head, invariant=True).topk(w, dim=-1).indices]
        return self.logits(out, target_lm_head, invariant=True).topk(w, dim=-1).indices

    @property
    def d2t_ascending(self) -> bool:
        """Whether d2t ascends: read from the device once per (d2t storage, version), so a copy into d2t (loading,
        training) is seen, and kept (``FeatureHead.attach`` reads it afresh before any graph capture, where a
        read-back cannot run)."""
        if self._d2t_ascending is None or self._d2t_ascending[0] != self._d2t_key():
            self.read_d2t_order()
        return self._d2t_ascending[1]

    def read_d2t_order(self) -> bool:
        """``d2t_ascending`` read from the device now (a host sync), whatever was kept."""
        self._d2t_ascending = (self._d2t_key(), bool((self.d2t[1:] > self.d2t[:-1]).all()))
        return self._d2t_ascending[1]

    def _d2t_key(self) -> tuple:
        try:
            return self.d2t.data_ptr(), self.d2t._version
        except RuntimeError:   # a tensor made under torch.inference_mode tracks no version: its storage alone
            return self.d2t.data_ptr(), None

    def _head_logits(self, out: Tensor, target_lm_head, invariant: bool) -> Tensor:
        """``logits`` before the scatter: [..., V] through the target's LM head, or [..., Vd] through the head's."""
        kernels = invariant and out.dim() == 2 and self._runtime_kernels(out)     # drafting: one kernel
        h = out if self.eagle1 else self._norm(out, self.norm, kernels)
        if self.lm_head is None:
            return ops.linear(h, target_lm_head, invariant=True) if invariant else packed.linear(h, target_lm_head)
        return _linear(h, self.lm_head, invariant)                                         # [..., Vd]

    def _scatter(self, small: Tensor) -> Tensor:
        """Draft logits [..., Vd] -> [..., V]: small at the target ids d2t, every other id -inf."""
        full = torch.full((*small.shape[:-1], self.cfg.vocab_size), float("-inf"), dtype=small.dtype,
                          device=small.device)
        return full.index_copy_(-1, self.d2t, small)

    # ------------------------------------------------------------------------------------ forward forms
    def cached(self, feats: Tensor, tokens: Tensor, pos: Tensor, embed, k_cache: Tensor, v_cache: Tensor,
               rope: Tensor, invariant: bool = True, slots: Tensor | None = None,
               visible: Tensor | None = None) -> Tensor:
        """Entries over the head's KV cache (drafting): feats [B, T, E], tokens [B, T] (the token of each entry,
        t_{j+1}), pos [B, T] int64 (entry indices j: the RoPE positions), k_cache / v_cache [B, KV, S, D] (views of
        the B rows), rope [S, 2, D] -> out [B, T, E]. A chain (the default): K/V written at slot pos, entry (b, i)
        attends to slots <= pos[b, i] of row b. A tree (``FeatureHead.propose_tree``): K/V written at ``slots``
        [B, T], entry (b, i) attends to the slots where ``visible`` [B, T, S] (bool) is set: the prefix and its own
        ancestors' entries, not its siblings'.
        ``invariant`` (drafting and commits): row b's outputs do not depend on B (``_linear``); a prompt's admission,
        a pass of its own, may take cuBLAS (faster over hundreds of tokens)."""
        B, T, E = feats.shape
        c = self.cfg
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        G, S = H // KV, k_cache.shape[2]
        emb = packed.embedding(tokens.reshape(-1), embed).to(feats.dtype)                  # [N, E]
        chain = visible is None and slots is None
        kernels = invariant and chain and k_cache.stride(3) == 1 and self._runtime_kernels(feats)
        x, residual = self._input(feats.reshape(B * T, E), emb, invariant, kernels=kernels)
        if kernels:
            # a chain on CUDA (row b's entries at pos[b, 0], pos[b, 0] + 1, ...: the draft loop's and the commits'
            # passes): the runtime's fused RoPE + K/V write and its split-KV decode attention, a query row's result
            # the same bits whatever B and T (ops.decode_attention), instead of SDPA over a mask of the whole cache
            qkv = _linear(x, self.wqkv, invariant)
            q = ops.rope_kv_write(qkv, rope, pos.reshape(-1), k_cache, v_cache, T, H, KV, D)
            o = ops.decode_attention(q, k_cache, v_cache, pos[:, 0].contiguous(), T, D ** -0.5)    # [B*T, H*D]
            return self._out(residual, o, invariant, kernels=True).view(B, T, E)
        q, k, v = self._qkv(x, rope[pos.reshape(-1)], invariant)
        batch = torch.arange(B, device=feats.device)[:, None]
        slots = pos if slots is None else slots
        k_cache[batch, :, slots] = k.view(B, T, KV, D)
        v_cache[batch, :, slots] = v.view(B, T, KV, D)
        mask = (torch.arange(S, device=feats.device)[None, None, :] <= pos[:, :, None] if visible is None
                else visible)                                                              # [B, T, S]
        mask = mask[:, None].expand(B, G, T, S).reshape(B, 1, G * T, S)
        q = q.view(B, T, KV, G, D).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, D)
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)           # [B, KV, G*T, D]
        o = o.view(B, KV, G, T, D).permute(0, 3, 1, 2, 4).reshape(B * T, H * D)
        return self._out(residual, o, invariant).view(B, T, E)

    def _runtime_kernels(self, x: Tensor) -> bool:
        """Whether a drafting pass over ``x`` may take the runtime's kernels (attention, add + RMSNorm, SiLU-multiply):
        CUDA, a head shape they cover (``ops.supports``), and no gradient that could flow through the head (its
        weights frozen, as a FeatureHead's, or grad mode off: the Triton kernels have no backward; training runs
        ``unrolled``)."""
        return x.is_cuda and self._kernel_shape and not (torch.is_grad_enabled() and self.wqkv.requires_grad)

    def unrolled(self, feats: Tensor, tokens: Tensor, embed, steps: int) -> list[Tensor]:
        """Training's forward: ``steps`` draft steps over whole sequences (EAGLE-3's training-time test).

        feats [B, T, E] (fused target features f_j), tokens [B, T] (t_{j+1}) -> out_s [B, T, E] for s < steps.
        Step s, entry j stands for the s-th draft step of a chain started at entry n = j - s: its feature is
        step s - 1's output at j - 1 (the head's own), its token the true t_{j+1}, and it attends to step 0's
        keys at positions <= n and to step t's key at n + t (t = 1..s: the chain's own entries), exactly what
        drafting sees. e.g. s = 2, j = 5: step-0 keys 0..3, step-1 key 4, step-2 key 5. Entries j < s have no
        chain (their outputs are garbage: the loss skips them).
        """
        B, T, E = feats.shape
        c = self.cfg
        if self.eagle1:
            raise ValueError("head: eagle1 heads are loaded from published checkpoints, not trained here")
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        rope = rope_table(c.model_config(), T, feats.device)                              # [T, 2, D]
        rope_n = rope[None].expand(B, T, 2, D).reshape(B * T, 2, D)
        emb = packed.embedding(tokens.reshape(-1), embed).to(feats.dtype)                  # [N, E]
        j = torch.arange(T, device=feats.device)
        keys, values, outs = [], [], []
        f = feats
        for s in range(steps):
            if s:   # the previous step's output at j - 1 is this step's feature at j
                f = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            q, k, v = self._qkv(self._input(f.reshape(B * T, E), emb)[0], rope_n)
            keys.append(k.view(B, T, KV, D).transpose(1, 2))                               # [B, KV, T, D]
            values.append(v.view(B, T, KV, D).transpose(1, 2))
            masks = [j[None, :] <= (j[:, None] - s)]                                       # [T, T] step 0
            masks += [j[None, :] == (j[:, None] - s + t) for t in range(1, s + 1)]
            mask = torch.cat(masks, dim=1)                                                 # [T, (s+1)T]
            mask[:, 0] |= ~mask.any(dim=1)      # rows j < s see nothing; give them a slot (output unused)
            q = q.view(B, T, H, D).transpose(1, 2)                                         # [B, H, T, D]
            o = F.scaled_dot_product_attention(q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                               attn_mask=mask, enable_gqa=(H != KV))      # [B, H, T, D]
            outs.append(self._out(f.reshape(B * T, E), o.transpose(1, 2).reshape(B * T, H * D)).view(B, T, E))
        return outs

    # ------------------------------------------------------------------------------------ files
    def save(self, directory: str | Path, extra: dict | None = None, dtype: torch.dtype | None = None) -> None:
        """``config.json`` (the ``HeadConfig``, the format tag and ``extra``) + ``head.safetensors`` (floating
        tensors in ``dtype``, default their own: bf16 halves a shipped head; it is cast to the target's on load)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, **asdict(self.cfg), **(extra or {})}
        meta["target_layers"] = list(self.cfg.target_layers)
        tensors = {name: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach().contiguous().cpu()
                   for name, t in self.state_dict().items()}
        if not self.cfg.draft_vocab:
            tensors.pop("d2t")
        save_file(tensors, str(directory / WEIGHTS_FILE))
        (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")

    @staticmethod
    def load(directory: str | Path, dtype: torch.dtype = torch.float32) -> tuple["HeadNet", dict]:
        """(the head, the config file's whole dict) from ``save``'s directory; a clear error for anything else."""
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg_path, w_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        from .published_heads import is_published_head

        if is_published_head(directory):
            raise ValueError(f"{directory} holds a published EAGLE head: load it with "
                             f"FeatureHead.from_pretrained(path, target) (it reads the target's layers and shapes)")
        if not cfg_path.is_file() or not w_path.is_file():
            raise FileNotFoundError(f"{directory} is not a feature-head directory: it needs {CONFIG_FILE} and "
                                    f"{WEIGHTS_FILE} (written by `verispec train-head`)")
        meta = json.loads(cfg_path.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{cfg_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        fields = HeadConfig.__dataclass_fields__
        cfg = HeadConfig(**{k: v for k, v in meta.items() if k in fields})
        net = HeadNet(cfg, dtype)
        try:
            state = load_file(str(w_path))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a truncated or bad file
            raise ValueError(f"{w_path}: not a readable safetensors file ({e})") from e
        if not cfg.draft_vocab:
            state["d2t"] = net.d2t
        missing = set(net.state_dict()) - set(state)
        if missing:
            raise ValueError(f"{w_path}: missing tensors {sorted(missing)}")
        try:
            net.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
        except RuntimeError as e:      # shapes that do not match the config
            raise ValueError(f"{w_path}: its tensors do not fit {cfg_path.name}: {e}") from e
        return net, meta
