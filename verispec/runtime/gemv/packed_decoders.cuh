// packed_decoders.cuh: the 32 weights of one chunk of a GGUF block row, as fp32, for packed.cu: v1 (``pk_chunk``, byte
// loads and int -> float casts) and v2 (``pk_chunk2``, aligned word loads and the exact 2^23 trick), the values of
// verispec/runtime/quant/dequantize.py bit for bit (the same products and sums: __fmul_rn / __fadd_rn / __fsub_rn,
// no contraction). Included by packed.cu; also compiled for the host by tests/test_quant_decoders.py (with host
// stand-ins for the CUDA intrinsics it names, see tests/packed_decoders_host.cpp), which checks v2 == v1 on every
// type and block alignment on the CPU.
#pragma once

#ifdef __CUDACC__
#define PK_FN __device__ __forceinline__
#else
#define PK_FN inline
#endif

enum PkType { PK_Q4_0 = 2, PK_Q4_1 = 3, PK_Q8_0 = 8, PK_Q4_K = 12, PK_Q6_K = 14 };

// the little-endian f16 at p, widened to fp32 (exact)
PK_FN float pk_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// The 32 weights of chunk c of a row (formats.py's layouts; the arithmetic of dequantize.py, op for op).
template <int QT>
PK_FN void pk_chunk(const uint8_t* row, int c, float (&w)[32]);

template <>
PK_FN void pk_chunk<PK_Q4_0>(const uint8_t* row, int c, float (&w)[32]) {
    const uint8_t* b = row + 18 * c;                     // d f16, qs[16]: weight i low nibble, i + 16 high
    const float d = pk_f16(b);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int q = b[2 + i];
        w[i] = __fmul_rn(d, (float)((q & 15) - 8));
        w[i + 16] = __fmul_rn(d, (float)((q >> 4) - 8));
    }
}

template <>
PK_FN void pk_chunk<PK_Q4_1>(const uint8_t* row, int c, float (&w)[32]) {
    const uint8_t* b = row + 20 * c;                     // d f16, m f16, qs[16]
    const float d = pk_f16(b), m = pk_f16(b + 2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int q = b[4 + i];
        w[i] = __fadd_rn(__fmul_rn(d, (float)(q & 15)), m);
        w[i + 16] = __fadd_rn(__fmul_rn(d, (float)(q >> 4)), m);
    }
}

template <>
PK_FN void pk_chunk<PK_Q8_0>(const uint8_t* row, int c, float (&w)[32]) {
    const uint8_t* b = row + 34 * c;                     // d f16, qs[32] int8
    const float d = pk_f16(b);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fmul_rn((float)(int8_t)b[2 + i], d);
}

template <>
PK_FN void pk_chunk<PK_Q4_K>(const uint8_t* row, int c, float (&w)[32]) {
    const int j = c & 7;                                 // sub-block of super-block c / 8
    const uint8_t* b = row + 144 * (c >> 3);             // d, dmin f16, scales[12], qs[128]
    const uint8_t* s = b + 4;
    int sc, mn;                                          // 6-bit scale and min of sub-block j
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const float d = __fmul_rn(pk_f16(b), (float)sc), dm = __fmul_rn(pk_f16(b + 2), (float)mn);
    const uint8_t* qs = b + 16 + 32 * (j >> 1);          // sub-block 2k: low nibbles of qs chunk k, 2k + 1: high
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fsub_rn(__fmul_rn(d, (float)((qs[i] >> shift) & 15)), dm);
}

template <>
PK_FN void pk_chunk<PK_Q6_K>(const uint8_t* row, int c, float (&w)[32]) {
    const int j = c & 7, h = j >> 2, i4 = j & 3;         // weights 128 h + 32 i4 + l of super-block c / 8
    const uint8_t* b = row + 210 * (c >> 3);             // ql[128], qh[64], scales[16] int8, d f16
    const uint8_t* ql = b + 64 * h + 32 * (i4 & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * i4;
    const float d = pk_f16(b + 208);
    const float d0 = __fmul_rn(d, (float)sc[0]), d1 = __fmul_rn(d, (float)sc[1]);
    const int lo = 4 * (i4 >> 1), hi = 2 * i4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = ((ql[l] >> lo) & 15) | (((qh[l] >> hi) & 3) << 4);
        w[l] = __fmul_rn(l < 16 ? d0 : d1, (float)(q - 32));
    }
}

// ------------------------------------------------------------------------------------------------ v2
// Bytes [p, p + NB) as words: o[i] holds bytes p[4 i .. 4 i + 3] (little-endian), whatever p's alignment. Reads the
// aligned words that hold those bytes, and no other (an aligned word holding a byte of the tensor lies inside its
// allocation), then funnel-shifts them into place. Bytes past NB in the last word are zero or a neighbour's.
template <int NB>
PK_FN void pk_bytes(const uint8_t* p, uint32_t (&o)[(NB + 3) / 4]) {
    constexpr int NO = (NB + 3) / 4;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), a0 = a & ~(uintptr_t)3;
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a0);
    const unsigned sh = (unsigned)(a - a0) * 8u;
    uint32_t r[NO + 1];
#pragma unroll
    for (int i = 0; i <= NO; ++i) r[i] = (a0 + 4 * i < a + NB) ? __ldg(w + i) : 0u;
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = __funnelshift_r(r[i], r[i + 1], sh);
}

// byte k of a word window (k known at compile time after unrolling: a shift of a register)
template <int N>
PK_FN int pk_byte(const uint32_t (&o)[N], int k) { return (o[k >> 2] >> (8 * (k & 3))) & 255; }

// byte k of a word window for a k known only at run time: selects, so the window stays in registers (an indexed
// array would go to local memory)
template <int N>
PK_FN int pk_byte_at(const uint32_t (&o)[N], int k) {
    uint32_t word = o[0];
#pragma unroll
    for (int i = 1; i < N; ++i) word = (k >> 2) == i ? o[i] : word;
    return (word >> (8 * (k & 3))) & 255;
}

// the f16 in the low (hi = 0) or high half of a word, widened to fp32 (exact)
PK_FN float pk_f16w(uint32_t w, int hi) {
    return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffff)));
}

// v - B as fp32 for 0 <= v < 2^22, exactly: the float 2^23 + v has v in its low mantissa bits (no I2F). B = 0, 8,
// 32 or 128 gives the Q4_0, Q6_K and int8 offsets in the same one subtraction (2^23 + B is exact).
template <int B>
PK_FN float pk_int(uint32_t v) { return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.0f + B); }

template <int QT>
PK_FN void pk_chunk2(const uint8_t* row, int c, float (&w)[32]);

template <>
PK_FN void pk_chunk2<PK_Q4_0>(const uint8_t* row, int c, float (&w)[32]) {
    uint32_t o[5];                                        // d f16, qs[16]
    pk_bytes<18>(row + 18 * c, o);
    const float d = pk_f16w(o[0], 0);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint32_t q = pk_byte(o, 2 + i);
        w[i] = __fmul_rn(d, pk_int<8>(q & 15));
        w[i + 16] = __fmul_rn(d, pk_int<8>(q >> 4));
    }
}

template <>
PK_FN void pk_chunk2<PK_Q4_1>(const uint8_t* row, int c, float (&w)[32]) {
    uint32_t o[5];                                        // d f16, m f16, qs[16]
    pk_bytes<20>(row + 20 * c, o);
    const float d = pk_f16w(o[0], 0), m = pk_f16w(o[0], 1);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint32_t q = pk_byte(o, 4 + i);
        w[i] = __fadd_rn(__fmul_rn(d, pk_int<0>(q & 15)), m);
        w[i + 16] = __fadd_rn(__fmul_rn(d, pk_int<0>(q >> 4)), m);
    }
}

template <>
PK_FN void pk_chunk2<PK_Q8_0>(const uint8_t* row, int c, float (&w)[32]) {
    uint32_t o[9];                                        // d f16, qs[32] int8
    pk_bytes<34>(row + 34 * c, o);
    const float d = pk_f16w(o[0], 0);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fmul_rn(pk_int<128>(pk_byte(o, 2 + i) ^ 128), d);   // int8 q + 128
}

template <>
PK_FN void pk_chunk2<PK_Q4_K>(const uint8_t* row, int c, float (&w)[32]) {
    const int j = c & 7;
    const uint8_t* b = row + 144 * (c >> 3);
    uint32_t h[4], qs[8];                                 // d, dmin, scales[12]; sub-block j's 32 qs bytes
    pk_bytes<16>(b, h);
    pk_bytes<32>(b + 16 + 32 * (j >> 1), qs);
    int sc, mn;                                           // as pk_chunk<PK_Q4_K>; scales byte k = header byte 4 + k
    if (j < 4) {
        sc = pk_byte_at(h, 4 + j) & 63;
        mn = pk_byte_at(h, 8 + j) & 63;
    } else {
        sc = (pk_byte_at(h, 8 + j) & 15) | ((pk_byte_at(h, j) >> 6) << 4);
        mn = (pk_byte_at(h, 8 + j) >> 4) | ((pk_byte_at(h, 4 + j) >> 6) << 4);
    }
    const float d = __fmul_rn(pk_f16w(h[0], 0), pk_int<0>(sc)), dm = __fmul_rn(pk_f16w(h[0], 1), pk_int<0>(mn));
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fsub_rn(__fmul_rn(d, pk_int<0>((pk_byte(qs, i) >> shift) & 15)), dm);
}

template <>
PK_FN void pk_chunk2<PK_Q6_K>(const uint8_t* row, int c, float (&w)[32]) {
    const int j = c & 7, hh = j >> 2, i4 = j & 3;         // as pk_chunk<PK_Q6_K>
    const uint8_t* b = row + 210 * (c >> 3);
    uint32_t ql[8], qh[8], s[1], dd[1];
    pk_bytes<32>(b + 64 * hh + 32 * (i4 & 1), ql);
    pk_bytes<32>(b + 128 + 32 * hh, qh);
    pk_bytes<2>(b + 192 + 8 * hh + 2 * i4, s);            // the two int8 sub-block scales
    pk_bytes<2>(b + 208, dd);
    const float d = pk_f16w(dd[0], 0);
    const float d0 = __fmul_rn(d, pk_int<128>((s[0] & 255) ^ 128)), d1 = __fmul_rn(d, pk_int<128>(((s[0] >> 8) & 255) ^ 128));
    const int lo = 4 * (i4 >> 1), hi = 2 * i4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const uint32_t q = ((pk_byte(ql, l) >> lo) & 15) | (((pk_byte(qh, l) >> hi) & 3) << 4);
        w[l] = __fmul_rn(l < 16 ? d0 : d1, pk_int<32>(q));
    }
}
