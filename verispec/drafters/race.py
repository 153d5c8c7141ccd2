"""The drafters' exponential race in one Triton kernel: token_b = argmax_v q_bv / E_bv, E_bv = -log u_bv, with
u from the DRAFT Philox stream of sequence b at its draft step (``base.draft_uniforms``).

Why a kernel: in torch ops the Philox counter arithmetic is ~120 elementwise passes over [B, V] int64 per
draft step (``verify.rng.philox4x32`` emulates uint32 products in int64). At V = 128256 that is
several hundred microseconds per step even inside a CUDA graph, comparable to a 1B draft model's whole
decode step. Here each element's Philox runs in registers and q is read once.

    launch                      grid     what it does
    _draft_race_partial_kernel  (B, S)   chunk s of row b: best key q / E and the lowest index attaining it
    torch argmax + gather       -        the first split holding the row's best key (splits ascend in v)

Ties resolve to the lowest vocab id, as ``torch.argmax`` does: within a lane a later tile must be strictly
better, across lanes the lowest index of the best key wins, across splits the first. Division is IEEE
(``div_rn``); the log is Triton's, so a near-tie may resolve differently than the torch composition
(``base.race_torch``) does on the same numbers: both are exact samples of q. One device always uses one of
them (``base.race``), so the eager and the captured draft loop draw identical drafts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import sm_count
from ..verify.triton.greedy import split_vocab
from ..verify.triton.rejection import _uniform

_INT32_MAX = tl.constexpr(2**31 - 1)
_DRAFT = tl.constexpr(2)   # base.DRAFT_PURPOSE


@triton.jit
def _draft_race_partial_kernel(
    q_ptr,         # [B, V] float32, row stride `stride_q`, unit stride along V
    seed_ptr,      # [B] int64: each sequence's stream key
    step_ptr,      # [B] int64: each sequence's draft step (the Philox row)
    part_key_ptr,  # [B, S] float32 out: best q / E of chunk s
    part_idx_ptr,  # [B, S] int32 out: the lowest vocab id attaining it
    stride_q,
    vocab,
    chunk,
    num_splits,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    seed = tl.load(seed_ptr + b)
    step = tl.load(step_ptr + b)
    lane = tl.arange(0, BLOCK)
    start = split * chunk
    best_key = tl.full([BLOCK], -1.0, tl.float32)
    best_idx = start + lane
    row_ptr = q_ptr + b.to(tl.int64) * stride_q
    for t in range(0, chunk, BLOCK):
        idx = start + t + lane
        in_row = idx < vocab
        q = tl.load(row_ptr + idx, mask=in_row, other=0.0)
        # counter (col = vocab id, row = step, offset = 0, purpose = DRAFT), as base.draft_uniforms
        exponential = -tl.log(_uniform(seed, step - step, step + tl.zeros_like(idx), idx, _DRAFT))
        key = tl.where(in_row, tl.div_rn(q, exponential), -1.0)
        better = key > best_key
        best_key = tl.where(better, key, best_key)
        best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best_key, axis=0)
    top_idx = tl.min(tl.where(best_key == top, best_idx, _INT32_MAX), axis=0)
    tl.store(part_key_ptr + b * num_splits + split, top)
    tl.store(part_idx_ptr + b * num_splits + split, top_idx)


def race_triton(q: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """argmax_v q_bv / E_bv with E from the DRAFT stream of (seed[b], step[b]): tokens [B] int64.

    q: [B, V] float32 with unit stride along V; seed, step: [B] int64 on q's device. No host sync, no
    host-dependent shapes: CUDA-graph capturable. On a CPU tensor it needs the Triton interpreter."""
    rows, vocab = q.shape
    if q.dtype != torch.float32 or q.stride(1) != 1:
        raise ValueError(f"race_triton: q must be float32 with unit stride along V, got {q.dtype}, "
                         f"strides {q.stride()}")
    on_gpu = q.device.type == "cuda"
    block = block or (1024 if on_gpu else min(triton.next_power_of_2(vocab), 128))
    target = 4 * sm_count(q.device) if on_gpu else 4
    chunk, num_splits = split_vocab(vocab, rows, block, target)
    part_key = torch.empty(rows, num_splits, dtype=torch.float32, device=q.device)
    part_idx = torch.empty(rows, num_splits, dtype=torch.int32, device=q.device)
    if rows:
        _draft_race_partial_kernel[(rows, num_splits)](
            # the kernel reads seed[b] / step[b] at unit stride: a captured loop passes columns of its input buffer
            q, seed.to(torch.int64).contiguous(), step.to(torch.int64).contiguous(), part_key, part_idx, q.stride(0),
            vocab, chunk, num_splits, BLOCK=block, num_warps=4 if on_gpu else 1)
    best = part_key.argmax(dim=1, keepdim=True)                                 # [B, 1]: the first best split
    return part_idx.gather(1, best)[:, 0].to(torch.int64)
