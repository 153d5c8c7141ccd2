"""The K-quant quantizers (Q4_K, Q6_K), written from the format with ggml's reference rounding.

What llama.cpp's ``llama-quantize`` writes without an importance matrix is ggml's ``quantize_row_q4_K_ref`` /
``quantize_row_q6_K_ref`` (ggml/src/ggml-quants.c, ggml-org/llama.cpp). Each picks, per sub-block, a scale (and
for Q4_K a min) by a small search, then stores the sub-block scales in 6 / 8 bits relative to one f16 scale per
256 weights, and re-rounds every weight against the stored scales:

  Q4_K (8 sub-blocks of 32, q in [0, 15], weight ~ s * q - m):
    1. weights w_i = sqrt(mean(x^2)) + |x_i| (the sub-block's error weights);
    2. ``make_qkx2_quants``: start from the min/max fit (m = min(x, 0), s = (max - m) / 15); then for 21 trial
       inverse scales (15 - 1 + 0.1 t) / (max - m), t = 0..20, round q_i = round((x_i - m) * inverse scale),
       solve the weighted least-squares (s, m) for those q (m clamped to <= 0) and keep the trial whose weighted
       squared error is strictly smallest; m is the best trial's so far (later trials round against it);
    3. d = max_s / 63, dmin = max_m / 63 (f16); each sub-block's 6-bit sc = round(63 s / max_s), mn likewise;
    4. q_i = clamp(round((x_i + dmin * mn) / (d * sc)), 0, 15) with the stored (rounded) d, dmin, sc, mn.
  Q6_K (16 sub-blocks of 16, q in [-32, 31], weight ~ s * q):
    1. ``make_qx_quants`` (weights x^2): start from s = max / -32 (max: the value of largest |x|), least-squares
       s for those q; try 18 more inverse scales -(32 + 0.1 t) / max, t = -9..9, t != 0, keeping the one whose
       sum(w x q)^2 / sum(w q^2) is strictly largest;
    2. d = s_max / -128 (s_max: the sub-block scale of largest |s|), 8-bit signed sc = min(127, round(-128 s / s_max));
    3. q_i = clamp(round(x_i / (d * sc)), -32, 31) + 32.

Exactness. The arithmetic is ggml's in its order and precision: every sum over a sub-block is accumulated
left to right in fp32 (a loop over the 32 or 16 lanes, vectorized across sub-blocks), each operation rounded
once (no fused multiply-add: ggml's x86-64 baseline build), ``nearest_int`` by ggml's own trick (add 1.5 * 2^23,
read the low mantissa bits: round half to even, and the same bits as ggml for out-of-range values), integer
casts wrapped as C wraps them (uint8_t / int8_t). A ggml built with FMA contraction (e.g. -march=native on
x86 with FMA, or ARM) can round some sums differently and so pick a different trial on near ties; the blocks
then differ from ours, both being valid encodings. Blocks where ggml divides by zero (a sub-block whose stored
scale is 0) keep the search's codes, as ggml does.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

GROUP_MAX_EPS = 1e-15      # ggml: a sub-block whose largest |x| is below this is all zeros


def f32(v: float) -> float:
    """The fp32 rounding of a Python number, as a Python float (so tensor ops with it stay exact fp32)."""
    return float(np.float32(v))


def div(a, b) -> Tensor:
    """a / b in fp32 with ONE rounding, a Python number on either side broadcast to a full tensor first:
    torch computes ``number / tensor`` as ``tensor.reciprocal() * number`` and, on CUDA, ``tensor / number`` as
    ``tensor * (1 / number)`` (two roundings each), where ggml divides once."""
    if not isinstance(a, Tensor):
        a = torch.full_like(b, a)
    elif not isinstance(b, Tensor):
        b = torch.full_like(a, b)
    return torch.div(a, b)


def nearest_int(v: Tensor) -> Tensor:
    """ggml's nearest_int: fp32 [..] -> int32, round half to even (valid for |v| < 2^22, ggml's range)."""
    return ((v + 12582912.0).view(torch.int32) & 0x7FFFFF) - 0x400000


def seq_sum(t: Tensor, start: Tensor | None = None) -> Tensor:
    """Sum over the lanes left to right in fp32, as a C loop ``s += t[i]``: lane-major [n, G] -> [G].
    start: the initial value (ggml's ``float s = 0``) or None to start from t[0]."""
    s = t[0].clone() if start is None else start + t[0]
    for i in range(1, t.shape[0]):
        s.add_(t[i])
    return s


def _wsq_error(w: Tensor, scale: Tensor, q: Tensor, offset: Tensor, x: Tensor) -> Tensor:
    """sum_i w_i (scale q_i + offset - x_i)^2 in ggml's order: lane-major [n, G] -> [G]."""
    diff = scale * q + offset - x
    return seq_sum(w * (diff * diff), torch.zeros_like(scale))


# The searches below work on lane-major sub-blocks, x [n, G] (lane i of every sub-block contiguous), so that
# ggml's left-to-right sums are n contiguous vector adds.
def make_qkx2_quants(x: Tensor, w: Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """ggml's ``make_qkx2_quants`` (use_mad = false) over G sub-blocks at once.

    x, w: [n, G] fp32 (weights, error weights) -> (scale [G], the_min [G] (weight ~ scale * q - the_min),
    q [n, G] int32 in [0, nmax])."""
    mn = x.amin(dim=0).clamp(max=0.0)                                      # min(x), at most 0
    mx = x.amax(dim=0)
    zero, one = torch.zeros_like(mx), torch.ones_like(mx)
    sum_w = seq_sum(w)
    sum_x = seq_sum(w * x)
    flat = mx == mn                                                        # handled at the end
    flat_min = mn
    iscale = div(f32(nmax), torch.where(flat, one, mx - mn))
    scale = div(1.0, iscale)
    q = nearest_int(iscale * (x - mn)).clamp(0, nmax)
    best = _wsq_error(w, scale, q.float(), mn, x)
    for t in range(nstep + 1):
        # NOTE: ggml's min moves to the best trial's, and later trials round against it
        iscale = div(f32(f32(f32(rmin) + f32(f32(rdelta) * t)) + nmax), torch.where(flat, one, mx - mn))
        lt = nearest_int(iscale * (x - mn)).clamp(0, nmax)
        lf = lt.float()
        wl = w * lf
        sum_l, sum_l2, sum_xl = seq_sum(wl, zero), seq_sum(wl * lf, zero), seq_sum(wl * x, zero)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_scale = torch.where(pos, sum_xl / sum_l2, this_scale)
        this_min = torch.where(pos, zero, this_min)
        err = _wsq_error(w, this_scale, lf, this_min, x)
        take = (D > 0) & (err < best)
        q = torch.where(take, lt, q)
        best = torch.where(take, err, best)
        scale = torch.where(take, this_scale, scale)
        mn = torch.where(take, this_min, mn)
    # max == min: every q = 0, scale 0, the_min = -min
    q = torch.where(flat, torch.zeros_like(q), q)
    scale = torch.where(flat, zero, scale)
    return scale, -torch.where(flat, flat_min, mn), q


def quantize_q4_k(x: Tensor) -> Tensor:
    """x [n, 256] fp32 -> Q4_K blocks [n, 144] (quantize_row_q4_K_ref)."""
    n = x.shape[0]
    xs = x.reshape(n * 8, 32).t().contiguous()                             # [32, G = 8 n] lane-major sub-blocks
    # NOTE: torch's fp32 sqrt on the CPU is not always correctly rounded (measured: off by 1 ulp), C's sqrtf is;
    # the fp64 square root rounded to fp32 is sqrtf's result (53 >= 2 * 24 + 2 bits: no double-rounding error)
    av_x = torch.sqrt(div(seq_sum(xs * xs, torch.zeros(n * 8, device=x.device)), 32.0).double()).float()
    w = av_x + xs.abs()
    scales, mins, q = make_qkx2_quants(xs, w, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20)
    scales, mins, q = scales.view(n, 8), mins.view(n, 8), q.t().reshape(n, 8, 32)
    zero = torch.zeros(n, device=x.device)
    max_scale = torch.where(scales.amax(dim=1) > 0, scales.amax(dim=1), zero)   # ggml: max over j from +0
    max_min = torch.where(mins.amax(dim=1) > 0, mins.amax(dim=1), zero)
    inv_scale = torch.where(max_scale > 0, div(63.0, torch.where(max_scale > 0, max_scale, 1.0)), zero)
    inv_min = torch.where(max_min > 0, div(63.0, torch.where(max_min > 0, max_min, 1.0)), zero)
    ls = (nearest_int(inv_scale[:, None] * scales) & 0xFF).clamp(max=63)   # uint8_t ls = nearest_int(..); MIN(63, ls)
    lm = (nearest_int(inv_min[:, None] * mins) & 0xFF).clamp(max=63)
    # the 12 scale bytes (formats.py): bytes 0-3 sc 0-3 (+ top bits of sc 4-7), 4-7 mins 0-3 (+ top bits of
    # mins 4-7), 8-11 low nibbles of sc 4-7 | mins 4-7 << 4
    packed = torch.cat([ls[:, :4] | ((ls[:, 4:] >> 4) << 6), lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                        (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)], dim=1)
    d16 = div(max_scale, 63.0).to(torch.float16)
    dmin16 = div(max_min, 63.0).to(torch.float16)
    d = d16.float()[:, None] * ls.float()                                  # the stored sub-block scales
    dm = dmin16.float()[:, None] * lm.float()
    safe_d = torch.where(d == 0, torch.ones_like(d), d)
    requant = nearest_int((x.view(n, 8, 32) + dm[..., None]) / safe_d[..., None]).clamp(0, 15)
    q = torch.where((d != 0)[..., None], requant, q)                       # ggml: `if (!d) continue;`
    qs = q.view(n, 4, 2, 32).to(torch.uint8)                               # chunk c: sub-blocks 2c (low), 2c+1 (high)
    qs = (qs[:, :, 0] | (qs[:, :, 1] << 4)).view(n, 128)
    return torch.cat([d16.view(torch.uint8).view(n, 2), dmin16.view(torch.uint8).view(n, 2),
                      packed.to(torch.uint8), qs], dim=1)


def make_qx_quants(x: Tensor, nmax: int) -> tuple[Tensor, Tensor]:
    """ggml's ``make_qx_quants`` with rmse_type = 1 (error weights x^2) and no importance weights, over G
    sub-blocks: x [n, G] fp32 -> (scale [G], q [n, G] int32 in [0, 2 nmax): weight ~ scale * (q - nmax))."""
    G = x.shape[1]
    first = x.abs().argmax(dim=0, keepdim=True)                            # the first largest |x|
    amax, xmax = x.abs().gather(0, first)[0], x.gather(0, first)[0]
    zero = amax < GROUP_MAX_EPS
    xmax = torch.where(zero, torch.ones_like(xmax), xmax)
    w = x * x
    start = torch.zeros(G, device=x.device)

    def trial(iscale):
        l = nearest_int(iscale * x).clamp(-nmax, nmax - 1)
        lf = l.float()
        return l, seq_sum((w * x) * lf, start), seq_sum((w * lf) * lf, start)

    l, sumlx, suml2 = trial(div(f32(-nmax), xmax))
    scale = torch.where(suml2 != 0, sumlx / torch.where(suml2 != 0, suml2, 1.0), torch.zeros_like(sumlx))
    best = scale * sumlx
    for t in range(-9, 10):
        if t == 0:
            continue
        lt, sumlx, suml2 = trial(div(-f32(nmax + f32(f32(0.1) * t)), xmax))
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        l = torch.where(take, lt, l)
        new_scale = sumlx / torch.where(take, suml2, 1.0)
        scale = torch.where(take, new_scale, scale)
        best = torch.where(take, new_scale * sumlx, best)
    q = torch.where(zero, torch.zeros_like(l), l + nmax)                   # all-zero sub-block: q = 0, scale 0
    return torch.where(zero, torch.zeros_like(scale), scale), q


def quantize_q6_k(x: Tensor) -> Tensor:
    """x [n, 256] fp32 -> Q6_K blocks [n, 210] (quantize_row_q6_K_ref)."""
    n = x.shape[0]
    scales, q = make_qx_quants(x.reshape(n * 16, 16).t().contiguous(), nmax=32)   # lane-major [16, 16 n]
    scales, q = scales.view(n, 16), q.t().reshape(n, 16, 16)
    first = scales.abs().argmax(dim=1, keepdim=True)                       # the first largest |scale|
    max_abs, max_scale = scales.abs().gather(1, first)[:, 0], scales.gather(1, first)[:, 0]
    empty = max_abs < GROUP_MAX_EPS                                        # ggml: an all-zero block
    iscale = div(-128.0, torch.where(empty, torch.ones_like(max_scale), max_scale))
    d16 = div(1.0, iscale).to(torch.float16)
    sc = nearest_int(iscale[:, None] * scales).clamp(max=127)
    sc = ((sc + 128) & 0xFF) - 128                                         # stored as int8_t
    d = d16.float()[:, None] * sc.float()
    safe_d = torch.where(d == 0, torch.ones_like(d), d)
    requant = nearest_int(x.view(n, 16, 16) / safe_d[..., None]).clamp(-32, 31) + 32
    q = torch.where((d != 0)[..., None], requant, q).view(n, 2, 4, 32)    # [half, i, lane]: weight 128 h + 32 i + l
    lo, hi = q & 0xF, q >> 4
    ql = torch.cat([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], dim=2)   # [n, 2, 64]
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)              # [n, 2, 32]
    blocks = torch.cat([ql.reshape(n, 128).to(torch.uint8), qh.reshape(n, 64).to(torch.uint8),
                        sc.to(torch.int8).view(torch.uint8), d16.view(torch.uint8).view(n, 2)], dim=1)
    return torch.where(empty[:, None], torch.zeros_like(blocks), blocks)
