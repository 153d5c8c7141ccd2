"""ggml's reference K-quant quantizers (quantize_row_q4_K_ref / quantize_row_q6_K_ref, ggml-quants.c), restated as
plain scalar loops over numpy float32 values: one operation per line as C evaluates it, no vectorization. The
oracle for verispec/runtime/quant/kquants.py, which computes the same searches across many sub-blocks at once
(tests/test_quant_kquants.py compares them block by block). Slow: a few blocks per test.
"""
from __future__ import annotations

import numpy as np

F = np.float32
EPS = F(1e-15)


def nearest_int(v) -> int:
    return (int(np.array(F(v) + F(12582912.0), dtype=np.float32).view(np.int32)) & 0x7FFFFF) - 0x400000


def f16(v) -> F:
    """fp32 -> f16 -> fp32 (round to nearest even)."""
    return F(np.float16(F(v)))


def make_qkx2(x, w, nmax, rmin, rdelta, nstep):
    n = len(x)
    mn, mx = x[0], x[0]
    sum_w = w[0]
    sum_x = F(sum_w * x[0])
    for i in range(1, n):
        mn = x[i] if x[i] < mn else mn
        mx = x[i] if x[i] > mx else mx
        sum_w = F(sum_w + w[i])
        sum_x = F(sum_x + F(w[i] * x[i]))
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return F(0), F(-mn), [0] * n
    iscale = F(F(nmax) / F(mx - mn))
    scale = F(F(1) / iscale)
    L = [max(0, min(nmax, nearest_int(F(iscale * F(x[i] - mn))))) for i in range(n)]
    best = F(0)
    for i in range(n):
        diff = F(F(F(scale * F(L[i])) + mn) - x[i])
        best = F(best + F(w[i] * F(diff * diff)))
    for t in range(nstep + 1):
        iscale = F(F(F(F(rmin) + F(F(rdelta) * F(t))) + F(nmax)) / F(mx - mn))
        aux = [max(0, min(nmax, nearest_int(F(iscale * F(x[i] - mn))))) for i in range(n)]
        sum_l = sum_l2 = sum_xl = F(0)
        for i in range(n):
            wl = F(w[i] * F(aux[i]))
            sum_l = F(sum_l + wl)
            sum_l2 = F(sum_l2 + F(wl * F(aux[i])))
            sum_xl = F(sum_xl + F(wl * x[i]))
        D = F(F(sum_w * sum_l2) - F(sum_l * sum_l))
        if D > 0:
            this_scale = F(F(F(sum_w * sum_xl) - F(sum_x * sum_l)) / D)
            this_min = F(F(F(sum_l2 * sum_x) - F(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = F(0)
                this_scale = F(sum_xl / sum_l2)
            err = F(0)
            for i in range(n):
                diff = F(F(F(this_scale * F(aux[i])) + this_min) - x[i])
                err = F(err + F(w[i] * F(diff * diff)))
            if err < best:
                L, best, scale, mn = aux, err, this_scale, this_min
    return scale, F(-mn), L


def q4_k_block(x) -> bytes:
    """256 float32 -> one Q4_K block (144 bytes)."""
    x = [F(v) for v in x]
    scales, mins, L = [], [], []
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        s2 = F(0)
        for v in xs:
            s2 = F(s2 + F(v * v))
        av = F(np.sqrt(np.float64(F(s2 / F(32)))))
        w = [F(av + F(abs(v))) for v in xs]
        s, m, l = make_qkx2(xs, w, 15, -1.0, 0.1, 20)
        scales.append(s), mins.append(m), L.extend(l)
    max_scale = max_min = F(0)
    for s, m in zip(scales, mins):
        max_scale = s if s > max_scale else max_scale
        max_min = m if m > max_min else max_min
    inv_scale = F(F(63) / max_scale) if max_scale > 0 else F(0)
    inv_min = F(F(63) / max_min) if max_min > 0 else F(0)
    packed = [0] * 12
    ls_all, lm_all = [], []
    for j in range(8):
        ls = min(63, nearest_int(F(inv_scale * scales[j])) & 0xFF)
        lm = min(63, nearest_int(F(inv_min * mins[j])) & 0xFF)
        ls_all.append(ls), lm_all.append(lm)
        if j < 4:
            packed[j], packed[j + 4] = ls, lm
        else:
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            packed[j - 4] |= (ls >> 4) << 6
            packed[j] |= (lm >> 4) << 6
    d, dmin = np.float16(F(max_scale / F(63))), np.float16(F(max_min / F(63)))
    for j in range(8):
        dj = F(F(d) * F(ls_all[j]))
        if dj == 0:
            continue
        dm = F(F(dmin) * F(lm_all[j]))
        for i in range(32):
            L[32 * j + i] = max(0, min(15, nearest_int(F(F(x[32 * j + i] + dm) / dj))))
    qs = [L[64 * c + i] | (L[64 * c + 32 + i] << 4) for c in range(4) for i in range(32)]
    return np.array([d, dmin], dtype=np.float16).tobytes() + bytes(packed) + bytes(qs)


def make_qx(x, nmax):
    n = len(x)
    amax = mx = F(0)
    for v in x:
        if F(abs(v)) > amax:
            amax, mx = F(abs(v)), v
    if amax < EPS:
        return F(0), [0] * n
    w = [F(v * v) for v in x]

    def trial(iscale):
        ls, slx, sl2 = [], F(0), F(0)
        for i in range(n):
            lv = max(-nmax, min(nmax - 1, nearest_int(F(iscale * x[i]))))
            ls.append(lv)
            slx = F(slx + F(F(w[i] * x[i]) * F(lv)))
            sl2 = F(sl2 + F(F(w[i] * F(lv)) * F(lv)))
        return ls, slx, sl2

    L, sumlx, suml2 = trial(F(F(-nmax) / mx))
    scale = F(sumlx / suml2) if suml2 != 0 else F(0)
    best = F(scale * sumlx)
    for t in range(-9, 10):
        if t == 0:
            continue
        lt, sumlx, suml2 = trial(F(F(-F(F(nmax) + F(F(0.1) * F(t)))) / mx))
        if suml2 > 0 and F(sumlx * sumlx) > F(best * suml2):
            L, scale = lt, F(sumlx / suml2)
            best = F(scale * sumlx)
    return scale, [lv + nmax for lv in L]


def q6_k_block(x) -> bytes:
    """256 float32 -> one Q6_K block (210 bytes)."""
    x = [F(v) for v in x]
    scales, L = [], []
    for j in range(16):
        s, l = make_qx(x[16 * j:16 * j + 16], 32)
        scales.append(s), L.extend(l)
    max_abs = max_scale = F(0)
    for s in scales:
        if F(abs(s)) > max_abs:
            max_abs, max_scale = F(abs(s)), s
    if max_abs < EPS:
        return bytes(210)
    iscale = F(F(-128) / max_scale)
    d = np.float16(F(F(1) / iscale))
    sc = [(((min(127, nearest_int(F(iscale * s)))) + 128) & 0xFF) - 128 for s in scales]
    for j in range(16):
        dj = F(F(d) * F(sc[j]))
        if dj == 0:
            continue
        for i in range(16):
            L[16 * j + i] = max(-32, min(31, nearest_int(F(x[16 * j + i] / dj)))) + 32
    ql, qh = [], []
    for h in range(2):
        b = 128 * h
        ql += [(L[b + i] & 0xF) | ((L[b + 64 + i] & 0xF) << 4) for i in range(32)]
        ql += [(L[b + 32 + i] & 0xF) | ((L[b + 96 + i] & 0xF) << 4) for i in range(32)]
        qh += [(L[b + i] >> 4) | ((L[b + 32 + i] >> 4) << 2) | ((L[b + 64 + i] >> 4) << 4) | ((L[b + 96 + i] >> 4) << 6)
               for i in range(32)]
    return bytes(ql) + bytes(qh) + np.array(sc, dtype=np.int8).tobytes() + np.array([d], dtype=np.float16).tobytes()
