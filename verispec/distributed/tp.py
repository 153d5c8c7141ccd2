"""Tensor-parallel target: a ``Transformer``'s weights hand-sharded over the ranks of a process group.

Per layer (W ranks, rank r):
  wqkv  column-sharded by heads: rank r holds query heads [r H/W, (r+1) H/W) and KV heads [r KV/W, (r+1) KV/W)
        (grouped-query attention stays local: query head h reads KV head h // G on the same rank)
  wo    row-sharded (its input columns of rank r's heads); partial outputs are summed by ONE all-reduce
  w13   column-sharded: rows [r I/W, (r+1) I/W) of gate and of up
  w2    row-sharded (its input columns of rank r's slice of I); ONE all-reduce
The embedding, norms and LM head are replicated, so every rank computes the full logits. The KV cache of
each rank holds its KV/W heads: [B, KV/W, S, D] per layer.

The sharded net is an ordinary ``Transformer`` at the sharded config that sums the o and down projections
over the ranks: on the torch path (CPU, prefill) its post-attention function does the two all-reduces, on the
Triton decode-kernel path (CUDA) ``Transformer.all_reduce`` does them after each projection's matmul, before
the fused add + RMSNorm. So ``verispec.runtime.Model`` runs it unchanged (setup_cache / prefill / verify /
decode / rollback / keep), CUDA graphs included: the all-reduces are captured with the rest of the pass (NCCL
supports capture; the graph's warm-up run, outside the capture, creates the communicator).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..runtime.model import Model
from ..runtime.quant.packed import packed_weights
from ..runtime.transformer import Transformer, rms_norm


def check_divisible(cfg, world_size: int) -> None:
    for name, value in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads),
                        ("intermediate_size", cfg.intermediate_size)):
        if value % world_size:
            raise ValueError(f"tensor parallelism over {world_size} ranks needs {name} divisible by "
                             f"{world_size}, got {value}")


def tp_post_attention(x: Tensor, o: Tensor, wo: Tensor, bo: Tensor | None, ffn_norm: Tensor, w13: Tensor,
                      w2: Tensor, eps: float, *, group) -> Tensor:
    """``post_attention`` with sharded wo / w13 / w2: x [N, E] replicated, o [N, H/W * D] this rank's heads."""
    attn = F.linear(o, wo)
    dist.all_reduce(attn, group=group)
    if bo is not None:
        attn = attn + bo                       # the bias once, after the sum
    x = x + attn
    gate, up = F.linear(rms_norm(x, ffn_norm, eps), w13).chunk(2, dim=-1)
    mlp = F.linear(F.silu(gate) * up, w2)
    dist.all_reduce(mlp, group=group)
    return x + mlp


def _rows(w: Tensor, start: int, size: int) -> Tensor:
    return w[start: start + size].clone()


def shard_transformer(net: Transformer, rank: int, world_size: int, group=None) -> Transformer:
    """Rank ``rank``'s shard of ``net`` (which every rank holds in full): a new Transformer at the sharded
    config; embedding / norms / LM head shared with ``net`` (not copied)."""
    if packed_weights(net):
        raise ValueError("tensor parallelism shards dense weights: load the model with packed=False")
    cfg = net.cfg
    check_divisible(cfg, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    H, KV, D, I = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    h, kv, i_ = H // world_size, KV // world_size, I // world_size
    scfg = cfg.replace(num_heads=h, num_kv_heads=kv, intermediate_size=i_)
    dtype = net.embed.dtype
    with torch.device("meta"):
        out = Transformer(scfg, dtype)
    out.embed, out.norm, out.lm_head = net.embed, net.norm, net.lm_head
    out._post = functools.partial(tp_post_attention, group=group)
    out.all_reduce = functools.partial(dist.all_reduce, group=group)
    q_rows = slice(rank * h * D, (rank + 1) * h * D)
    k_rows = slice(H * D + rank * kv * D, H * D + (rank + 1) * kv * D)
    v_rows = slice((H + KV) * D + rank * kv * D, (H + KV) * D + (rank + 1) * kv * D)
    for full, part in zip(net.layers, out.layers):
        qkv = lambda w: torch.cat([w[q_rows], w[k_rows], w[v_rows]]).clone()  # noqa: E731
        part.wqkv = _param(qkv(full.wqkv))
        part.bqkv = None if full.bqkv is None else _param(qkv(full.bqkv))
        part.wo = _param(full.wo[:, rank * h * D:(rank + 1) * h * D].clone())
        part.bo = full.bo
        part.w13 = _param(torch.cat([_rows(full.w13, rank * i_, i_), _rows(full.w13, I + rank * i_, i_)]))
        part.w2 = _param(full.w2[:, rank * i_:(rank + 1) * i_].clone())
        part.attn_norm, part.ffn_norm, part.q_norm, part.k_norm = full.attn_norm, full.ffn_norm, full.q_norm, full.k_norm
    return out


def _param(t: Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t.contiguous(), requires_grad=False)


def tensor_parallel_model(model: Model, group=None, *, use_graphs: bool = True) -> Model:
    """This rank's tensor-parallel ``Model`` from a full ``model`` (same weights on every rank); on CUDA it
    runs the Triton decode kernels (where ``ops.supports`` the sharded shape) and, with ``use_graphs``, CUDA
    graphs.

    Logits equal the single-process model's up to the order of the all-reduce sums."""
    if not dist.is_initialized():
        raise RuntimeError("tensor_parallel_model needs torch.distributed initialized (init_process_group)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    net = shard_transformer(model.net, rank, world, group)
    return Model(net, model.tokenizer, num_layers=model.num_active_layers, use_graphs=use_graphs)
