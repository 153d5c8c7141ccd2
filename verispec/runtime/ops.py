"""Triton kernels for the decode / verify pass (CUDA only in the model; the tests also run them on the CPU
under ``TRITON_INTERPRET=1``).

Without them a B=1 decode step of an 8B model spends ~76 us per layer outside the weight matmuls in ~22 small
PyTorch kernels (the torch path's profile in benchmarks/results/decode.md). These replace them with six launches
of five kernels per layer (add_rmsnorm twice, rope_kv_write, the attention split and combine, silu_mul), beside
the four weight matmuls:

  * ``add_rmsnorm``   x += delta (the previous sublayer's output) and h = RMSNorm(x) * w, one pass;
  * ``rope_kv_write`` RoPE on the q and k heads of the fused QKV output, q to a buffer, k and v straight into
                      the cache slot ``pos`` (no index_put, no cat / neg / copies);
  * ``decode_attention`` split-KV ("flash-decoding") attention of q [N=B*T, H, D] against the cache:
                      grid (B*KV, splits), each program holds the G*T query rows of one KV head (GQA without
                      repeating K/V), reads only slots < lengths[b] + T, causal within the T-block; then a
                      combine kernel merges the splits and writes o as [N, H*D] (no permute copies);
  * ``silu_mul``      SwiGLU activation of the fused [gate; up] output.
All arithmetic in fp32; dots of fp32 inputs in IEEE precision (so fp32 models stay within 1e-4 of the torch
path). The weight matmuls go through ``linear``: verispec/runtime/gemv/invariant.cu (bf16/fp16) or gemv.cu v1 in
8-row chunks (fp32), both batch-invariant: a token's logits do not depend on how many rows the pass has (see
``matmul_path``). The attention is batch-invariant too (``ATTN_SPLIT``).

The drafters' greedy choice has one kernel here too (``argmax_rows``: torch.argmax's index, one program a row,
optionally through a draft vocabulary's id map; verification's argmax, verify/triton/greedy.py, reports NaN as a
fault where this one, like torch, takes it as the maximum).

The prefill (``Transformer.prefill_kernels``) reuses ``add_rmsnorm`` and ``silu_mul``, runs its matmuls on
cuBLAS and its attention in torch's SDPA (``prefill_attention``), and has one kernel of its own:
  * ``prefill_rope_kv_write`` RoPE on the q and k heads of B prompts' fused QKV output, token t at position t;
                      q, k, v to contiguous [B, heads, T, D] buffers for SDPA, k and v also to cache rows
                      first_row + b (first_row read on the device, so one CUDA graph serves every row).
"""
from __future__ import annotations

import os
import sys
import warnings

import torch
from torch import Tensor

from ..device import sm_count
from .quant.packed import PackedWeight
from .quant.packed import embedding as packed_embedding

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    AVAILABLE = True
except ImportError:  # pragma: no cover - triton ships with CUDA torch
    AVAILABLE = False

# Programmatic dependent launch (PDL, sm_90+): every kernel of the pass is launched so that it may start while
# the previous one finishes. Each kernel first lets its own dependents launch, then waits for its predecessor's
# completion before reading anything (``_pdl_prologue``), so a pass stays ordered kernel by kernel; what is
# gained is the launch latency and, in gemv.cu, the first weight loads (prefetched into L2 before the wait).
# The results are the same bit for bit. VERISPEC_PDL=0 turns it off.
PDL = os.environ.get("VERISPEC_PDL", "1") != "0"
_capability: dict[int, tuple[int, int]] = {}


def use_pdl(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: CUDA, compute capability 9.0 or newer, ``PDL`` on."""
    if not PDL or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capability:
        _capability[index] = torch.cuda.get_device_capability(index)
    return _capability[index] >= (9, 0)


def _launch_options(device: torch.device) -> dict:
    """Keyword arguments of a Triton launch: the PDL constexpr and, when on, the launch attribute."""
    return dict(PDL=True, launch_pdl=True) if use_pdl(device) else dict(PDL=False)


ARGMAX_BLOCK = 8192   # argmax_rows: ids a program reads per step (16 warps x 512)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


if AVAILABLE:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, d_ptr, xo_ptr, h_ptr, w_ptr, E, eps,
                            HAS_ADD: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        msk = offs < E
        x = tl.load(x_ptr + row * E + offs, mask=msk, other=0.0).to(tl.float32)
        if HAS_ADD:
            x = x + tl.load(d_ptr + row * E + offs, mask=msk, other=0.0).to(tl.float32)
            xr = x.to(xo_ptr.dtype.element_ty)
            tl.store(xo_ptr + row * E + offs, xr, mask=msk)
            x = xr.to(tl.float32)                      # normalize the stored (rounded) residual
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / E + eps)
        w = tl.load(w_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * E + offs, (x * rstd * w).to(h_ptr.dtype.element_ty), mask=msk)

    @triton.jit
    def _rope_kv_kernel(qkv_ptr, rope_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, T, H, KV,
                        s_qkv, s_cb, s_ch, s_cs, D: tl.constexpr, HALF: tl.constexpr, HAS_SLOT: tl.constexpr,
                        PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        n = tl.program_id(0)                           # token b*T + i
        h = tl.program_id(1)                           # head: [0, H) q, [H, H+KV) k, [H+KV, H+2KV) v
        b = (n // T).to(tl.int64)
        p = tl.load(pos_ptr + n).to(tl.int64)
        if HAS_SLOT:                                   # a tree pass: the cache slot is not the RoPE position
            slot = tl.load(slot_ptr + n).to(tl.int64)
        else:
            slot = p
        offs = tl.arange(0, HALF)
        src = qkv_ptr + n.to(tl.int64) * s_qkv + h * D
        if h < H + KV:
            x1 = tl.load(src + offs).to(tl.float32)
            x2 = tl.load(src + HALF + offs).to(tl.float32)
            r = rope_ptr + p * (2 * D)                 # rope table [P, 2, D]: cos row then sin row
            c1 = tl.load(r + offs)
            c2 = tl.load(r + HALF + offs)
            s1 = tl.load(r + D + offs)
            s2 = tl.load(r + D + HALF + offs)
            o1 = x1 * c1 - x2 * s1                     # rotate_half: [x1, x2] -> [-x2, x1]
            o2 = x2 * c2 + x1 * s2
            if h < H:
                dst = q_ptr + (n.to(tl.int64) * H + h) * D
            else:
                dst = k_ptr + b * s_cb + (h - H) * s_ch + slot * s_cs
            tl.store(dst + offs, o1.to(k_ptr.dtype.element_ty))
            tl.store(dst + HALF + offs, o2.to(k_ptr.dtype.element_ty))
        else:
            offs_d = tl.arange(0, D)
            dst = v_ptr + b * s_cb + (h - H - KV) * s_ch + slot * s_cs
            tl.store(dst + offs_d, tl.load(src + offs_d))

    @triton.jit
    def _prefill_rope_kv_kernel(qkv_ptr, rope_ptr, row0_ptr, q_ptr, ks_ptr, vs_ptr, kc_ptr, vc_ptr, T, H, KV,
                                s_qkv, s_cb, s_ch, s_cs, D: tl.constexpr, HALF: tl.constexpr,
                                BLOCK_T: tl.constexpr):
        tb = tl.program_id(0)                          # block of BLOCK_T tokens of one prompt
        h = tl.program_id(1)                           # head: [0, H) q, [H, H+KV) k, [H+KV, H+2KV) v
        b = tl.program_id(2).to(tl.int64)              # prompt
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)       # position = token index (prompts start at 0)
        t_ok = t < T
        t64 = t.to(tl.int64)
        row = tl.load(row0_ptr).to(tl.int64) + b       # cache row of this prompt
        src = qkv_ptr + ((b * T + t64) * s_qkv + h * D)[:, None]
        if h < H + KV:
            offs = tl.arange(0, HALF)[None, :]
            x1 = tl.load(src + offs, mask=t_ok[:, None], other=0.0).to(tl.float32)
            x2 = tl.load(src + HALF + offs, mask=t_ok[:, None], other=0.0).to(tl.float32)
            r = rope_ptr + (t64 * (2 * D))[:, None]    # rope table [P, 2, D]: cos row then sin row
            c1 = tl.load(r + offs, mask=t_ok[:, None], other=0.0)
            c2 = tl.load(r + HALF + offs, mask=t_ok[:, None], other=0.0)
            s1 = tl.load(r + D + offs, mask=t_ok[:, None], other=0.0)
            s2 = tl.load(r + D + HALF + offs, mask=t_ok[:, None], other=0.0)
            o1 = (x1 * c1 - x2 * s1).to(kc_ptr.dtype.element_ty)    # rotate_half: [x1, x2] -> [-x2, x1]
            o2 = (x2 * c2 + x1 * s2).to(kc_ptr.dtype.element_ty)
            if h < H:
                dst = q_ptr + (((b * H + h) * T + t64) * D)[:, None]
                tl.store(dst + offs, o1, mask=t_ok[:, None])
                tl.store(dst + HALF + offs, o2, mask=t_ok[:, None])
            else:
                kvh = h - H
                scratch = ks_ptr + (((b * KV + kvh) * T + t64) * D)[:, None]
                cache = kc_ptr + (row * s_cb + kvh * s_ch + t64 * s_cs)[:, None]
                tl.store(scratch + offs, o1, mask=t_ok[:, None])
                tl.store(scratch + HALF + offs, o2, mask=t_ok[:, None])
                tl.store(cache + offs, o1, mask=t_ok[:, None])
                tl.store(cache + HALF + offs, o2, mask=t_ok[:, None])
        else:
            offs_d = tl.arange(0, D)[None, :]
            kvh = h - H - KV
            v = tl.load(src + offs_d, mask=t_ok[:, None], other=0.0).to(vc_ptr.dtype.element_ty)
            tl.store(vs_ptr + (((b * KV + kvh) * T + t64) * D)[:, None] + offs_d, v, mask=t_ok[:, None])
            tl.store(vc_ptr + (row * s_cb + kvh * s_ch + t64 * s_cs)[:, None] + offs_d, v, mask=t_ok[:, None])

    # The two helpers below are the chain kernel's key-block step, called by _attn_split_kernel and by the tree
    # kernel (tree_attention.py): one source for both, so a tree node's softmax is the chain's arithmetic (Triton
    # inlines them; the compiled chain kernel is the same as with the body written in place).
    @triton.jit
    def _attn_softmax_step(s, slots, smask, qpos, m_i, l_i):
        """Online-softmax step over one key block: s [BLOCK_M, BLOCK_N] scores (log2 scale), slots [BLOCK_N] their
        cache slots (smask: live), qpos [BLOCK_M] each row's position (causal: slot <= qpos), m_i / l_i [BLOCK_M]
        the running max and sum -> (pr the block's weights, alpha the rescale of what came before, m_i, l_i)."""
        ok = (slots[None, :] <= qpos[:, None]) & smask[None, :]
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        return pr, alpha, m_new, l_i

    @triton.jit
    def _attn_block(q, kbase, vbase, offs_d, j0, end, qpos, s_cs, scale_log2, m_i, l_i, acc,
                    BLOCK_N: tl.constexpr, PREC: tl.constexpr):
        """One block of BLOCK_N cache slots from j0 (slots >= end masked), every query row against the same keys:
        -> the updated (m_i, l_i, acc)."""
        slots = j0 + tl.arange(0, BLOCK_N)
        smask = slots < end
        koff = slots.to(tl.int64)[:, None] * s_cs + offs_d[None, :]
        k = tl.load(kbase + koff, mask=smask[:, None], other=0.0)
        v = tl.load(vbase + koff, mask=smask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2
        pr, alpha, m_i, l_i = _attn_softmax_step(s, slots, smask, qpos, m_i, l_i)
        acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v, input_precision=PREC)
        return m_i, l_i, acc

    @triton.jit
    def _attn_split_kernel(q_ptr, k_ptr, v_ptr, len_ptr, acc_ptr, ml_ptr, T, H, KV, G, NSPLIT, NPROG, ROWS,
                           s_cb, s_ch, s_cs, scale_log2,
                           D: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           PREC: tl.constexpr, PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        bk = tl.program_id(0)                          # b * KV + kv head
        prog = tl.program_id(1)                        # computes splits prog, prog + NPROG, ... of the live ones
        rt = tl.program_id(2)                          # tile of BLOCK_M query rows
        b = bk // KV
        kvh = bk % KV
        rows = rt * BLOCK_M + tl.arange(0, BLOCK_M)    # row r = g * T + i (query head kvh*G + g, token i)
        g = rows // T
        i = rows % T
        row_ok = rows < G * T
        L = tl.load(len_ptr + b).to(tl.int32)          # tokens cached before this pass
        qpos = L + i                                   # [BLOCK_M] position of each row's token
        offs_d = tl.arange(0, D)
        n_tok = (b * T + i).to(tl.int64)
        # only splits that hold live slots are computed and stored (the combine reads those alone): a cache of S
        # slots has S / SPLIT splits, most of them dead for short sequences, and the grid's NPROG programs per
        # (sequence, head) walk the live ones. Each split's partial is the same whatever program computes it.
        nlive = tl.minimum((L + T + SPLIT - 1) // SPLIT, NSPLIT)
        q = tl.load(q_ptr + ((n_tok * H + kvh * G + g) * D)[:, None] + offs_d[None, :],
                    mask=row_ok[:, None] & (prog < nlive), other=0.0)
        kbase = k_ptr + b.to(tl.int64) * s_cb + kvh.to(tl.int64) * s_ch
        vbase = v_ptr + b.to(tl.int64) * s_cb + kvh.to(tl.int64) * s_ch
        for sp in range(prog, nlive, NPROG):
            start = sp * SPLIT
            end = tl.minimum(start + SPLIT, L + T)     # live slots only
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            for j0 in range(start, end, BLOCK_N):
                m_i, l_i, acc = _attn_block(q, kbase, vbase, offs_d, j0, end, qpos, s_cs, scale_log2, m_i, l_i,
                                            acc, BLOCK_N, PREC)
            part = (bk * NSPLIT + sp).to(tl.int64) * ROWS + rows
            tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc)
            tl.store(ml_ptr + part * 2, m_i)
            tl.store(ml_ptr + part * 2 + 1, l_i)

    @triton.jit
    def _attn_combine_kernel(acc_ptr, ml_ptr, o_ptr, live_ptr, LIVE_ADD, T, H, KV, G, NSPLIT, ROWS,
                             D: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        bk = tl.program_id(0)
        r = tl.program_id(1)                           # row g * T + i, < G * T
        b = bk // KV
        kvh = bk % KV
        g = r // T
        i = r % T
        base = (bk * NSPLIT).to(tl.int64) * ROWS + r
        # NOTE: splits are merged one at a time in split order (not a tree over a power-of-two block), and only the
        # splits that hold live slots (the live ones of sequence b end at slot live_ptr[b] + LIVE_ADD; the split
        # kernels store nothing past them), so the result does not depend on how many splits the cache capacity has
        # (a sequence's logits then do not depend on its batch's max_seq_len).
        nlive = tl.minimum((tl.load(live_ptr + b).to(tl.int32) + LIVE_ADD + SPLIT - 1) // SPLIT, NSPLIT)
        m_max = tl.load(ml_ptr + base * 2)             # split 0 always holds slot 0: finite
        for s in range(1, nlive):
            m_max = tl.maximum(m_max, tl.load(ml_ptr + (base + s * ROWS) * 2))
        offs_d = tl.arange(0, D)
        w0 = tl.exp2(tl.load(ml_ptr + base * 2) - m_max)
        num = tl.load(acc_ptr + base * D + offs_d) * w0
        den = tl.load(ml_ptr + base * 2 + 1) * w0
        for s in range(1, nlive):
            part = base + s * ROWS
            m = tl.load(ml_ptr + part * 2)
            w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
            num += tl.load(acc_ptr + part * D + offs_d) * w
            den += tl.load(ml_ptr + part * 2 + 1) * w
        n = (b * T + i).to(tl.int64)
        tl.store(o_ptr + (n * H + kvh * G + g) * D + offs_d, (num / den).to(o_ptr.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, o_ptr, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        msk = offs < I
        gate = tl.load(gu_ptr + row * 2 * I + offs, mask=msk, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * 2 * I + I + offs, mask=msk, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(o_ptr + row * I + offs, y.to(o_ptr.dtype.element_ty), mask=msk)

    @triton.jit
    def _argmax_kernel(x_ptr, map_ptr, out_ptr, V, stride, HAS_MAP: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
        if PDL:                                        # see use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        # each lane keeps its own first maximum and first NaN over the blocks (ascending ids, strict >: the
        # earlier wins a tie); one reduction across lanes at the end
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = offs
        nan_i = tl.full([BLOCK], 0, tl.int32) + V
        for start in range(0, V, BLOCK):
            idx = start + offs
            msk = idx < V
            x = tl.load(x_ptr + row * stride + idx, mask=msk, other=float("-inf")).to(tl.float32)
            isnan = x != x
            nan_i = tl.where(isnan & (nan_i == V), idx, nan_i)
            better = (x > best) & msk
            best_i = tl.where(better, idx, best_i)
            best = tl.where(better, x, best)
        first_nan = tl.min(nan_i, axis=0)
        m = tl.max(best, axis=0)
        res = tl.where(first_nan < V, first_nan, tl.min(tl.where(best == m, best_i, V), axis=0))
        if HAS_MAP:
            res = tl.load(map_ptr + res)
        tl.store(out_ptr + row, res.to(tl.int64))


# --------------------------------------------------------------------------------------------- wrappers
def supports(cfg) -> bool:
    """Whether the kernels cover this model: head_dim a power of two in [16, 256]."""
    D = cfg.head_dim
    return AVAILABLE and 16 <= D <= 256 and D == _pow2(D) and cfg.num_heads % cfg.num_kv_heads == 0


def add_rmsnorm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x [N, E] (+ delta [N, E]) -> (x + delta, RMSNorm(x + delta) * weight); with delta None, (x, RMSNorm(x))."""
    N, E = x.shape
    h = torch.empty_like(x)
    xo = torch.empty_like(x) if delta is not None else x
    BLOCK = _pow2(E)
    _add_rmsnorm_kernel[(N,)](x, delta if delta is not None else x, xo, h, weight, E, eps,
                              HAS_ADD=delta is not None, BLOCK=BLOCK, num_warps=8 if BLOCK >= 4096 else 4,
                              **_launch_options(x.device))
    return xo, h


def argmax_rows(x: Tensor, index_map: Tensor | None = None) -> Tensor:
    """x [R, V] -> [R] int64: x.argmax(-1) (the first maximum; NaN counts as the maximum, as in torch), one program a
    row; with ``index_map`` [V] int64, index_map[argmax] (a draft vocabulary's ids to the target's)."""
    R, V = x.shape
    if index_map is not None and (index_map.shape != (V,) or index_map.dtype != torch.int64
                                  or index_map.device != x.device):
        # the kernel reads index_map[argmax] unchecked: a short or foreign map would be read out of bounds
        raise ValueError(f"argmax_rows: index_map must be [{V}] int64 on {x.device}, got "
                         f"{list(index_map.shape)} {index_map.dtype} on {index_map.device}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(R, dtype=torch.int64, device=x.device)
    if R == 0:
        return out
    BLOCK = min(_pow2(V), ARGMAX_BLOCK)
    _argmax_kernel[(R,)](x, index_map if index_map is not None else out, out, V, x.stride(0),
                         HAS_MAP=index_map is not None, BLOCK=BLOCK, num_warps=max(1, min(16, BLOCK // 256)),
                         **_launch_options(x.device))
    return out


def rope_kv_write(qkv: Tensor, rope: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, T: int,
                  H: int, KV: int, D: int, slots: Tensor | None = None) -> Tensor:
    """qkv [N, (H+2KV)*D] (rows [q; k; v] heads), rope [P, 2, D] fp32, pos [N] -> q [N, H, D] with RoPE;
    k (with RoPE) and v written to k_cache/v_cache [B_max, KV, S, D] at [n // T, :, pos[n]], or at
    [n // T, :, slots[n]] when ``slots`` [N] is given (a tree pass: siblings share a position, not a slot)."""
    N = qkv.shape[0]
    assert qkv.stride(1) == 1 and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride()
    assert rope.is_contiguous() and rope.dtype == torch.float32 and D % 2 == 0
    q = torch.empty(N, H, D, device=qkv.device, dtype=k_cache.dtype)
    _rope_kv_kernel[(N, H + 2 * KV)](qkv, rope, pos, pos if slots is None else slots, q, k_cache, v_cache, T, H,
                                     KV, qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                     D=D, HALF=D // 2, HAS_SLOT=slots is not None, num_warps=1,
                                     **_launch_options(qkv.device))
    return q


def prefill_rope_kv_write(qkv: Tensor, rope: Tensor, first_row: Tensor, k_cache: Tensor, v_cache: Tensor,
                          B: int, T: int, H: int, KV: int, D: int) -> tuple[Tensor, Tensor, Tensor]:
    """The prefill's RoPE + KV write: B right-padded prompts of T tokens, token t at position t.

    qkv [B*T, (H+2KV)*D] (rows [q; k; v] heads), rope [P >= T, 2, D] fp32, first_row [1] int64 on the device
    (the cache row of prompt 0: a device value, so one captured graph serves every admission row)
    -> q [B, H, T, D], k [B, KV, T, D], v [B, KV, T, D], contiguous (SDPA's layout, the prompt's own K/V);
    k and v are also written to k_cache/v_cache [B_max, KV, S, D] at [first_row + b, :, t].
    e.g. first_row = [3], B = 2, T = 5: the prompts' K/V land in cache rows 3 and 4, slots 0..4.
    """
    N = qkv.shape[0]
    assert N == B * T and qkv.stride(1) == 1 and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride()
    assert rope.is_contiguous() and rope.dtype == torch.float32 and rope.shape[0] >= T and D % 2 == 0
    assert first_row.dtype == torch.int64 and first_row.numel() == 1 and first_row.device == qkv.device
    assert T <= k_cache.shape[2], f"{T} prompt tokens exceed the cache's {k_cache.shape[2]} slots"
    q = torch.empty(B, H, T, D, device=qkv.device, dtype=k_cache.dtype)
    k = torch.empty(B, KV, T, D, device=qkv.device, dtype=k_cache.dtype)
    v = torch.empty(B, KV, T, D, device=qkv.device, dtype=k_cache.dtype)
    BLOCK_T = min(32, max(16, _pow2(T)))
    _prefill_rope_kv_kernel[(-(-T // BLOCK_T), H + 2 * KV, B)](
        qkv, rope, first_row, q, k, v, k_cache, v_cache, T, H, KV, qkv.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), D=D, HALF=D // 2, BLOCK_T=BLOCK_T, num_warps=4)
    return q, k, v


# The prefill's attention is torch's SDPA, causal, over the prompts' own K/V. Its default dispatch takes GQA
# natively (enable_gqa: flash-attention 2 on an H100). Prompts of at least PREFILL_CUDNN_MIN_TOKENS tokens use
# SDPA's cuDNN backend instead, with K/V repeated to H heads: off (None) unless benchmarks/prefill.py measures
# it faster on the device ("attention alone" and "new, cuDNN" columns); VERISPEC_PREFILL_CUDNN_MIN_TOKENS=n sets it.
PREFILL_CUDNN_MIN_TOKENS: int | None = int(os.environ.get("VERISPEC_PREFILL_CUDNN_MIN_TOKENS", "0")) or None


def prefill_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q [B, H, T, D], k and v [B, KV, T, D] -> causal softmax(q k^T / sqrt(D)) v [B, H, T, D] (query head h
    reads KV head h // (H / KV))."""
    H, KV, T = q.shape[1], k.shape[1], q.shape[2]
    if PREFILL_CUDNN_MIN_TOKENS is not None and T >= PREFILL_CUDNN_MIN_TOKENS and q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if H != KV:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != KV)


# Batch invariance of the decode / verify attention: a query row's result must not depend on the batch, on how
# many tokens the pass scores, or on the cache's capacity. So every choice below is a function of the dtype and
# head_dim alone: query rows in tiles of ATTN_BLOCK_M = 16 (the same MMA shape for 1 or 64 tokens), key blocks of
# attention_block_n(...) slots, splits of ATTN_SPLIT slots from slot 0 (the online softmax meets the same blocks
# in the same order), and the combine merges splits in order (see _attn_combine_kernel).
ATTN_BLOCK_M = 16
ATTN_SPLIT = 256


def attention_block_n(dtype: torch.dtype, head_dim: int) -> int:
    """Key slots per block of the split kernel: 64 for 16-bit models with head_dim <= 128, else 32."""
    return 32 if (dtype == torch.float32 or head_dim > 128) else 64


def attention_splits(S: int) -> int:
    """Number of ATTN_SPLIT-slot splits of a cache of S slots (splits past a sequence's live slots do nothing)."""
    return -(-S // ATTN_SPLIT)


SPLIT_CTAS_PER_SM = 4   # split_programs: programs of a split kernel per SM that the grid aims for


def split_programs(nsplit: int, groups: int, device: torch.device, programs: int | None = None) -> int:
    """Programs per (sequence, KV head, row tile) of a split kernel: enough for ~SPLIT_CTAS_PER_SM programs an SM
    over the ``groups`` of the grid, at most one per split. Each walks the live splits prog, prog + n, ...; dead
    programs exit. The choice changes no result (each split's partial is computed alone), only the grid: a long
    cache at a small batch keeps its splits in parallel, a large batch does not launch a program per dead split.
    ``programs``: the caller's count instead (at most nsplit; >= 1: with none, no partial would be written)."""
    if programs is not None:
        if programs < 1:
            raise ValueError(f"split kernel programs must be >= 1, got {programs}")
        return min(programs, nsplit)
    sms = sm_count(device) if device.type == "cuda" else 1
    return max(1, min(nsplit, -(-SPLIT_CTAS_PER_SM * sms // groups)))


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor, T: int, scale: float,
                     programs: int | None = None) -> Tensor:
    """q [N=B*T, H, D] (token i of sequence b at position lengths[b] + i, already in the cache) ->
    o [N, H*D]: softmax(q K^T * scale) V over cache slots j <= lengths[b] + i. Each query row's result is the
    same bits whatever B, T and the cache capacity are (see ATTN_SPLIT), and whatever ``programs`` (the split
    kernel's programs per sequence and head; None: ``split_programs``)."""
    N, H, D = q.shape
    B = N // T
    KV, S = k_cache.shape[1], k_cache.shape[2]
    G = H // KV
    assert q.is_contiguous() and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride()
    assert D == _pow2(D) and D >= 16, "head_dim must be a power of two >= 16"
    fp32 = q.dtype == torch.float32
    block_n = attention_block_n(q.dtype, D)
    nsplit, tiles, rows, acc, ml = _attn_partials(q, B, KV, G, T, S)
    nprog = split_programs(nsplit, B * KV * tiles, q.device, programs)
    _attn_split_kernel[(B * KV, nprog, tiles)](
        q, k_cache, v_cache, lengths, acc, ml, T, H, KV, G, nsplit, nprog, rows,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale * 1.4426950408889634,
        D=D, SPLIT=ATTN_SPLIT, BLOCK_M=ATTN_BLOCK_M, BLOCK_N=block_n, PREC="ieee" if fp32 else "tf32", num_warps=4,
        **_launch_options(q.device))
    return _attn_combine(q, acc, ml, B, T, KV, G, nsplit, rows, lengths, T)


# The split kernels' partials and their combine, shared by decode_attention and tree_attention.tree_attention
# (same splits, tiles and row layout, so one combine serves both).
def _attn_partials(q: Tensor, B: int, KV: int, G: int, T: int, S: int) -> tuple[int, int, int, Tensor, Tensor]:
    """-> (splits of a cache of S slots, tiles of ATTN_BLOCK_M query rows, rows = the tiles' rows, acc
    [B*KV*splits*rows, D] fp32, ml [B*KV*splits*rows, 2] fp32): the grid and the partials' buffers of a split
    kernel over q [N=B*T, H=KV*G, D]."""
    nsplit = attention_splits(S)
    tiles = -(-(G * T) // ATTN_BLOCK_M)
    rows = tiles * ATTN_BLOCK_M
    D = q.shape[2]
    acc = torch.empty(B * KV * nsplit * rows, D, device=q.device, dtype=torch.float32)
    ml = torch.empty(B * KV * nsplit * rows, 2, device=q.device, dtype=torch.float32)
    return nsplit, tiles, rows, acc, ml


def _attn_combine(q: Tensor, acc: Tensor, ml: Tensor, B: int, T: int, KV: int, G: int, nsplit: int,
                  rows: int, live: Tensor, live_add: int) -> Tensor:
    """The splits' partials (``_attn_partials``, row g * T + i) merged in split order -> o [N=B*T, H*D], q's dtype.
    live [B] int64 + live_add: where sequence b's live slots end (the split kernel's bound); later splits are
    dead and not read."""
    N, H, D = q.shape
    o = torch.empty(N, H * D, device=q.device, dtype=q.dtype)
    _attn_combine_kernel[(B * KV, G * T)](acc, ml, o, live, live_add, T, H, KV, G, nsplit, rows, D=D,
                                          SPLIT=ATTN_SPLIT, num_warps=1, **_launch_options(q.device))
    return o


def silu_mul(gu: Tensor) -> Tensor:
    """gu [N, 2I] = [gate | up] -> silu(gate) * up [N, I]."""
    N, I2 = gu.shape
    I = I2 // 2
    assert gu.is_contiguous()
    o = torch.empty(N, I, device=gu.device, dtype=gu.dtype)
    BLOCK = 1024
    _silu_mul_kernel[(N, -(-I // BLOCK))](gu, o, I, BLOCK=BLOCK, num_warps=4, **_launch_options(gu.device))
    return o


# The weight matmuls of the decode / verify pass (``linear(..., invariant=True)``). MATMUL picks the path:
#   "invariant" (default): every pass reduces each output element in one order that does not depend on the pass's
#       rows (batch x tokens), so a token's logits are the same bits in a decode step, in a verification pass of
#       any width and beside any other sequences: bf16/fp16 through invariant.cu (any M), fp32 through gemv.cu
#       v1 in chunks of 8 rows in the model's one (rows, split) configuration (``gemv_config``). What is exact
#       where: ``matmul_path`` and the table in docs/runtime.md ("Exact widths").
#   "cublas": F.linear (cuBLAS) everywhere: the fastest non-invariant pass, for benchmarks/exact.py.
#   "gemv": the rule before invariant.cu (gemv.cu v1 for one sequence of <= 8 tokens, cuBLAS otherwise): exact only
#       at B = 1 and <= 8 tokens; kept for benchmarks/decode.py's comparison.
# VERISPEC_MATMUL sets it.
MATMUL = os.environ.get("VERISPEC_MATMUL", "invariant")
MATMUL_MODES = ("invariant", "cublas", "gemv")
# NOTE: invariant.cu is launched WITHOUT programmatic dependent launch (the Triton kernels around it keep it): with
# PDL the 8B pass measured 7.15 ms at B = 1 against 6.30 ms without (H100, exact.md), the kernels alone no slower.
# VERISPEC_INVARIANT_PDL=1 turns it back on (the bits are the same either way).
INVARIANT_PDL = os.environ.get("VERISPEC_INVARIANT_PDL", "0") == "1"
GEMV_CONFIG: tuple[int, int] | None = None   # (rows, split) for every model; None: ``gemv_config``'s rule
# Packed weights (quant/packed.py) on CUDA, ``linear``'s route (docs/runtime.md, "Packed weights"):
#   * the decode / verify pass (invariant=True), and any matmul of at most PACKED_GEMV_MAX_ROWS rows (the prefill's LM
#     head on the prompts' last tokens): packed.cu, the blocks read in place, batch-invariant like invariant.cu;
#   * the prefill's other matmuls (invariant=False, more rows): each matrix dequantized to x's dtype by packed.cu's
#     dequantizer into a scratch copy, then cuBLAS on the tensor cores (the weights' values are the dense model's, so
#     the prefill is the dense-loaded model's bit for bit but for that LM head).
# VERISPEC_PACKED_GEMV=0 dequantizes every matrix instead (decode too: the dense path, for comparisons), and
# VERISPEC_PACKED_VARIANT=1, 2, 3, 4 or 5 picks packed.cu's variant (its header says what differs; 0: its default, v5):
# v1 and v2 the same bits, v3, v4 and v5 (tensor cores, bf16) another order, batch-invariant too; one model keeps one.
PACKED_GEMV = os.environ.get("VERISPEC_PACKED_GEMV", "1") != "0"
PACKED_VARIANT = int(os.environ.get("VERISPEC_PACKED_VARIANT", "0"))
# NOTE: up to 8 rows packed.cu reads the blocks once (one token tile) and moves only the packed bytes; the dense route
# writes and re-reads a 16-bit copy, about 4 / 0.56 = 7x the bytes of a Q4_K matrix, which pays off only once the
# tensor cores have many rows to work on (the prefill's buckets start at 16 tokens). benchmarks/quant.py measures both.
# VERISPEC_PACKED_GEMV_MAX_ROWS sets it (a large value sends the whole prefill through packed.cu).
PACKED_GEMV_MAX_ROWS = int(os.environ.get("VERISPEC_PACKED_GEMV_MAX_ROWS", "8"))


def gemv_config(hidden_size: int) -> tuple[int, int]:
    """(rows per warp group, warps per row group) of gemv.cu v1 for a model of this width: the one fixed
    configuration of all its fp32 decode and verify matmuls (and of every matmul in MATMUL = "gemv").

    Measured on an H100 (benchmarks/results/decode.md run F, same machine, B = 1, PDL on): for an 8B (E = 4096)
    4 x 4 decodes as fast as 4 x 8 (5.733 vs 5.739 ms) and verifies 4 tokens in 1.05x a decode step instead of
    1.07x; for a 1B (E = 2048) 4 x 8 decodes 9% faster (1.064 vs 1.160 ms) at the price of a slower verify pass
    (1.35x vs 1.08x a step). Small models are mostly drafters, which only decode, so they keep 4 x 8."""
    if GEMV_CONFIG is not None:
        return GEMV_CONFIG
    return (4, 4) if hidden_size >= 4096 else (4, 8)


_gemv_ready: bool | None = None   # None: not tried yet; False: unavailable (no nvcc / build failed)


def _gemv_available() -> bool:
    """Load (building on first use, about a minute, cached on disk) the CUDA extension once; False if it fails."""
    global _gemv_ready
    if _gemv_ready is None:
        if torch.cuda.is_current_stream_capturing():   # never build inside a capture (warm-ups run first)
            return False
        from . import gemv as vgemv
        try:
            vgemv.load()
            _gemv_ready = True
        except Exception as e:  # noqa: BLE001 - any build problem: fall back to cuBLAS, say so once
            warnings.warn(f"verispec: the CUDA matmul extension is unavailable ({type(e).__name__}: {str(e)[:200]}); "
                          f"the decode matmuls use cuBLAS and are NOT batch-invariant (bf16 greedy speculative output "
                          f"may then differ from plain decoding)")
            _gemv_ready = False
    return _gemv_ready


# The paths ``matmul_path`` names (docs/runtime.md's "Exact widths" table lists the same four).
PATH_INVARIANT = "invariant.cu"          # bf16/fp16, any rows: exact at every width
PATH_GEMV_CHUNKS = "gemv.cu v1 x8"       # fp32 on CUDA, chunks of 8 rows: exact at every width
PATH_GEMV = "gemv.cu v1"                 # MATMUL = "gemv", one sequence of <= 8 tokens: exact at those widths
PATH_TORCH = "F.linear"                  # cuBLAS / the CPU's BLAS: NOT invariant across widths


def matmul_path(device_type: str, dtype: torch.dtype, K: int, batch_size: int = 1, tokens: int = 1,
                mode: str | None = None, extension: bool = True) -> str:
    """Which kernel computes a decode / verify matmul of ``batch_size`` sequences x ``tokens`` tokens with inner
    dimension K on this device and dtype (``extension``: whether the CUDA extension loaded). The rule, and the
    table of docs/runtime.md that tests/test_exact_dispatch.py checks it against:

        CUDA, bf16/fp16, K % 8 == 0, MATMUL "invariant"  -> invariant.cu      exact at every width
        CUDA, fp32,      K % 4 == 0, MATMUL "invariant"  -> gemv.cu v1 x8     exact at every width
        CUDA, MATMUL "gemv", batch 1, <= 8 tokens       -> gemv.cu v1        exact among those widths
        anything else (CPU, MATMUL "cublas", odd K, no extension) -> F.linear, not invariant
    """
    mode = MATMUL if mode is None else mode
    if mode not in MATMUL_MODES:
        raise ValueError(f"VERISPEC_MATMUL / ops.MATMUL must be one of {MATMUL_MODES}, got {mode!r}")
    if device_type != "cuda" or not extension or mode == "cublas":
        return PATH_TORCH
    if mode == "gemv":
        ok = batch_size == 1 and tokens <= 8 and (K * (4 if dtype == torch.float32 else 2)) % 16 == 0
        return PATH_GEMV if ok else PATH_TORCH
    if dtype in (torch.bfloat16, torch.float16) and K % 8 == 0:
        return PATH_INVARIANT
    if dtype == torch.float32 and K % 4 == 0:
        return PATH_GEMV_CHUNKS
    return PATH_TORCH


def linear(x: Tensor, w: Tensor | PackedWeight, b: Tensor | None = None, *, invariant: bool = False,
           batch_size: int = 1, config: tuple[int, int] = (4, 8)) -> Tensor:
    """F.linear(x [M, K], w [N, K], b) -> [M, N]. ``invariant=True`` (the decode / verify pass of ``batch_size``
    sequences, M = batch_size * tokens): the path of ``matmul_path`` (invariant.cu, or gemv.cu v1 in 8-row chunks in
    the model's configuration ``config`` = (rows, split)); ``invariant=False`` (the prefill): cuBLAS. A packed w
    (quant/packed.py) on CUDA: packed.cu for the pass and for few rows, else a dequantized copy and cuBLAS (see
    PACKED_GEMV); on the CPU it is dequantized to x's dtype and takes the dense path."""
    if isinstance(w, PackedWeight):
        if not (x.is_cuda and _gemv_available()):
            w = w.dequantize(x.dtype)   # the torch dequantizer (CPU: the reference path)
        elif PACKED_GEMV and (invariant or x.shape[0] <= PACKED_GEMV_MAX_ROWS):
            return _packed_linear(x, w, b)
        else:
            w = _packed_dense(w, x.dtype)
    if not (invariant and x.is_cuda and _gemv_available()):
        return torch.nn.functional.linear(x, w, b)
    M, K = x.shape
    path = matmul_path("cuda", x.dtype, K, batch_size, M // max(batch_size, 1))
    from . import gemv as vgemv

    if path == PATH_INVARIANT and vgemv.invariant_supported(x, w):
        return vgemv.invariant_matmul(x, w, b, pdl=INVARIANT_PDL and use_pdl(x.device))
    rows, split = config
    if path == PATH_GEMV and vgemv.gemv_supported(x, w):
        return vgemv.gemv_cuda(x, w, b, version=1, rows=rows, split=split, pdl=use_pdl(x.device))
    if path == PATH_GEMV_CHUNKS and vgemv.gemv_supported(x[:1], w):
        out = torch.empty(M, w.shape[0], device=x.device, dtype=x.dtype)
        for i in range(0, M, vgemv.GEMV_MAX_M):   # each row's order is fixed by (rows, split), not by the chunk
            vgemv.gemv_cuda(x[i:i + vgemv.GEMV_MAX_M], w, b, out=out[i:i + vgemv.GEMV_MAX_M], version=1, rows=rows,
                            split=split, pdl=use_pdl(x.device))
        return out
    return torch.nn.functional.linear(x, w, b)


def _packed_linear(x: Tensor, w: PackedWeight, b: Tensor | None) -> Tensor:
    """x [M, K] @ w^T (+ b) through packed.cu, one launch per part of w (its rows: [q; k; v] may mix types)."""
    from . import gemv as vgemv

    outs, row = [], 0
    for qtype, blocks in w.parts:
        n = blocks.shape[0]
        outs.append(vgemv.packed_matmul(x, blocks, qtype, None if b is None else b[row:row + n],
                                        variant=PACKED_VARIANT, pdl=use_pdl(x.device)))
        row += n
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def embedding(ids: Tensor, w: Tensor | PackedWeight) -> Tensor:
    """``F.embedding(ids, w)`` for the kernels path: ids [...] -> [..., E]. A packed w on CUDA: the ids' rows of blocks
    gathered and dequantized by packed.cu (two launches; a decode step's embedding in the torch dequantizer is a few
    dozen small kernels), the values of ``PackedWeight.embedding`` bit for bit; otherwise ``quant.packed.embedding``."""
    if isinstance(w, PackedWeight) and ids.is_cuda and len(w.parts) == 1 and _gemv_available():
        from . import gemv as vgemv

        qtype, blocks = w.parts[0]
        rows = vgemv.packed_dequantize(blocks.index_select(0, ids.reshape(-1)), qtype, w.K, w.dtype,
                                       variant=PACKED_VARIANT)
        return rows.view(*ids.shape, w.K)
    return packed_embedding(ids, w)


def _packed_dense(w: PackedWeight, dtype: torch.dtype) -> Tensor:
    """w [N, K] dequantized to ``dtype`` on its CUDA device by packed.cu (the values of ``PackedWeight.dequantize``,
    bit for bit): a scratch copy for one matmul."""
    from . import gemv as vgemv

    if len(w.parts) == 1:
        qtype, blocks = w.parts[0]
        return vgemv.packed_dequantize(blocks, qtype, w.K, dtype, variant=PACKED_VARIANT)
    out = torch.empty(w.shape, device=w.device, dtype=dtype)
    row = 0
    for qtype, blocks in w.parts:
        vgemv.packed_dequantize(blocks, qtype, w.K, dtype, out=out[row:row + blocks.shape[0]], variant=PACKED_VARIANT)
        row += blocks.shape[0]
    return out
