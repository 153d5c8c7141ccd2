// packed_v3.cuh: the per-lane pieces of packed.cu's v3 (every block type through bf16 tensor-core MMAs): what one lane
// loads of a unit of 256 weights, the A fragments (the blocks' small integers as exact bf16) and scales it makes of them, the
// B fragments (x) that pair with them, and how an MMA's result is folded into the fp32 accumulator. Included by
// packed.cu after packed_decoders.cuh; also compiled for the host by tests/test_quant_v3.py (driver
// tests/packed_v3_host.cpp, which emulates the warp's MMAs) to check the fragment layout against the torch
// dequantizer on the CPU.
//
// The MMA is mma.sync m16n8k16 (bf16 in, fp32 out). Lane (g, t) = (lane / 4, lane % 4) holds A[g][2t, 2t + 1] (a0),
// A[g + 8][2t, 2t + 1] (a1), A[g][2t + 8, 2t + 9] (a2), A[g + 8][2t + 8, 2t + 9] (a3) and B[2t, 2t + 1][g] (b0),
// B[2t + 8, 2t + 9][g] (b1); its result D[g][2t, 2t + 1] (d0, d1), D[g + 8][2t, 2t + 1] (d2, d3). A row of A is a
// row of W, a column of B a token, and which of a chunk's 32 columns is logical k is ours to choose, the same for A
// and B. Here lane t takes two groups of 4 adjacent columns of a chunk, one per MMA (group h = 0, 1 at column
// ``v3_group_col<QT>(t, h)``), and within a group the logical order (k 2t, 2t + 1, 2t + 8, 2t + 9) = columns
// (+0, +2, +1, +3): the pairs a 4-byte word of nibbles or bytes gives with one mask (bytes 0 and 2, then 1 and 3).
//   Q4_K: group h of lane t = columns 8 t + 4 h .. + 3 (a lane's 8 bytes of qs cover both groups);
//   Q6_K, Q4_0, Q4_1, Q8_0: group h = columns 16 h + 4 t .. + 3 (Q6_K: each MMA inside one 16-weight scale group;
//   Q4_0 / Q4_1: the low and high nibbles of qs bytes 4 t .. 4 t + 3).
//
// A "unit" is 8 chunks (256 weights): a K-quant super-block, or 8 consecutive Q4_0 / Q4_1 / Q8_0 blocks (the last
// unit of a row may hold fewer: K is only a multiple of 32 there). Per type, V3<QT> gives the unit's bytes, what a
// lane holds of one row's unit (Raw, v3_load: chunks past the row's end are not read), and per chunk j the A
// registers and two fp32 coefficients (s0, s1) of the fold (packed.cu's v3 order):
//   FOLD_MIN    w = s0 q + s1 (Q4_K: s1 = -min; Q4_1: s1 = m): D = one MMA chain over the chunk, X = the same with
//               A = 1 (the token's sum of x), acc = fmaf(s0, D, acc), acc = fmaf(s1, X, acc);
//   FOLD_SPLIT  w = s0 q (weights 0..15), s1 q (16..31) (Q6_K): D0, D1 one MMA each, acc = fmaf(s0, D0, acc), then s1;
//   FOLD_ONE    w = s0 q (Q4_0 with q - 8, Q8_0): D = one MMA chain, acc = fmaf(s0, D, acc).
// Every s0, s1 and q is dequantize.py's value (the same products, rounded once); v3 never forms w itself (its terms
// are summed apart), which is why it differs from dequantize + matmul by more than v1 / v2's summation order.
#pragma once

#ifndef __CUDACC__
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
#endif

#define V3_BF16_ONES 0x3F803F80u      // bf16x2 (1, 1)
#define V3_SLICES 8                   // warps a block = slices of the order (packed.cu, v3)

// (lo, hi) - (c, c) on a bf16x2 holding exact integers below 256 (so exact): one HFMA2.BF16. c2 = bf16x2 (-c, -c).
PK_FN uint32_t v3_sub_bf16x2(uint32_t v, uint32_t c2) {
#ifdef __CUDACC__
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(v), "r"(V3_BF16_ONES), "r"(c2));
    return d;
#else
    uint32_t out = 0;
    for (int h = 0; h < 2; ++h) {       // bf16 -> fp32 is a shift; the difference is an exact small integer
        const float a = __uint_as_float(((v >> (16 * h)) & 0xffffu) << 16);
        const float c = __uint_as_float(((c2 >> (16 * h)) & 0xffffu) << 16);
        uint32_t bits;
        const float r = a + c;
        std::memcpy(&bits, &r, 4);
        out |= (bits >> 16) << (16 * h);
    }
    return out;
#endif
}

// 8 / 16 bytes at p (aligned to their size), read once: weights are streamed
PK_FN uint2 v3_ld8(const uint8_t* p) {
#ifdef __CUDACC__
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    uint2 v;
    std::memcpy(&v, p, 8);
    return v;
#endif
}
PK_FN uint4 v3_ld16(const uint8_t* p) {
#ifdef __CUDACC__
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
#endif
}
// 8 bytes of x (bf16, 8-byte aligned), through L1: every warp of the block reads the same x
PK_FN uint2 v3_ldx8(const uint16_t* p) {
#ifdef __CUDACC__
    return __ldg(reinterpret_cast<const uint2*>(p));
#else
    uint2 v;
    std::memcpy(&v, p, 8);
    return v;
#endif
}

// Where a unit's bytes are read from: ``v3_read`` takes a source with ld8 / ld16 (8 / 16 bytes at an offset aligned
// to their size) and bytes<NB> (NB bytes at any offset, as aligned 32-bit words). V3Global: the blocks in global
// memory (v3, and the host test); packed.cu's V4Shared: a warp's stage in shared memory (v4). One layout, two sources.
struct V3Global {
    const uint8_t* p;
    PK_FN uint2 ld8(int o) const { return v3_ld8(p + o); }
    PK_FN uint4 ld16(int o) const { return v3_ld16(p + o); }
    template <int NB>
    PK_FN void bytes(int o, uint32_t (&out)[(NB + 3) / 4]) const { pk_bytes<NB>(p + o, out); }
};

// byte i of w as fp32 (exact): 2^23 + byte built by one PRMT, minus 2^23 + B (B = 128: w's bytes are int8 ^ 0x80)
template <int B>
PK_FN float v3_byte_f(uint32_t w, int i) {
    return __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)i)), 8388608.0f + B);
}

// The bf16x2 pairs (bytes 0, 2) and (bytes 1, 3) of a word whose bytes hold integers below 128, each + 128 then - off
// (exact): a group's A registers for logical k (2t, 2t + 1) and (2t + 8, 2t + 9).
PK_FN void v3_pairs(uint32_t bytes, uint32_t off2, uint32_t& lo, uint32_t& hi) {
    lo = v3_sub_bf16x2((bytes & 0x00FF00FFu) | 0x43004300u, off2);
    hi = v3_sub_bf16x2(((bytes >> 8) & 0x00FF00FFu) | 0x43004300u, off2);
}

// the first column of lane t's group h within a chunk of 32 (see the header)
template <int QT>
PK_FN int v3_group_col(int t, int h) { return QT == PK_Q4_K ? 8 * t + 4 * h : 16 * h + 4 * t; }

enum V3Fold { FOLD_MIN, FOLD_SPLIT, FOLD_ONE };

// (bytes 0, 2) and (bytes 1, 3) of a word of int8 as exact bf16x2 pairs. Per half: 0x4300 | (b & 0x7F) is 128 + the
// low 7 bits (bf16's 7 mantissa bits at exponent 2^7), and 0xC300 | (b & 0x80) is -128 (sign bit clear) or -256
// (set); their sum is the two's complement value q, exact: two LOP3s and one bf16x2 FMA per pair.
PK_FN uint32_t v3_i8_pair(uint32_t w) {
    return v3_sub_bf16x2((w & 0x007F007Fu) | 0x43004300u, (w & 0x00800080u) | 0xC300C300u);
}
PK_FN void v3_pairs_i8(uint32_t word, uint32_t& lo, uint32_t& hi) {
    lo = v3_i8_pair(word);
    hi = v3_i8_pair(word >> 8);
}

// B fragments of lane t for one token and one chunk: b[2 h], b[2 h + 1] = (b0, b1) of group h's MMA. xc: the
// token's 32 bf16 values of the chunk (8-byte aligned).
template <int QT>
PK_FN void v3_b_frags(const uint16_t* xc, int t, uint32_t (&b)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint2 v = v3_ldx8(xc + v3_group_col<QT>(t, h));   // (x0, x1), (x2, x3)
        b[2 * h] = __byte_perm(v.x, v.y, 0x5410u);              // (x0, x2)
        b[2 * h + 1] = __byte_perm(v.x, v.y, 0x7632u);          // (x1, x3)
    }
}

// ------------------------------------------------------------------------------------------------ Q4_K
// One row's super-block (144 bytes: d, dmin f16, scales[12], qs[128]; 16-byte aligned: rows of K / 256 * 144 bytes
// from a 16-byte aligned tensor) as lane t holds it: the 16-byte header and, for each pair p of sub-blocks, qs bytes
// 32 p + 8 t .. + 7 (low nibbles: sub-block 2 p, high: 2 p + 1; weights 8 t .. 8 t + 7 of each).
struct V3RawQ4K {
    uint4 head;
    uint2 qs[4];
};

template <class Src>
PK_FN void v3_read(const Src& sb, int t, int, V3RawQ4K& r) {
    r.head = sb.ld16(0);
#pragma unroll
    for (int p = 0; p < 4; ++p) r.qs[p] = sb.ld8(16 + 32 * p + 8 * t);
}

// Sub-block j (0..7) of a row: the scale d * sc and minus the min dmin * mn of dequantize.py (w = scale * q - min),
// each product rounded once as there. j may be known only at run time (v5 computes a lane's two sub-blocks and shares
// them with the lanes of its row, packed.cu).
PK_FN void v3_q4k_scales(uint4 head, int j, float& scale, float& neg_min) {
    const uint32_t s03 = head.y, s47 = head.z, s811 = head.w;          // scales bytes 0..3, 4..7, 8..11
    uint32_t scw, mnw;                      // bytes j % 4 of these: sub-block j's 6-bit scale and min
    if (j < 4) {
        scw = s03 & 0x3F3F3F3Fu;
        mnw = s47 & 0x3F3F3F3Fu;
    } else {                                // low 4 bits from bytes 8..11, high 2 from the top of bytes 0..3 / 4..7
        scw = (s811 & 0x0F0F0F0Fu) | ((s03 >> 2) & 0x30303030u);
        mnw = ((s811 >> 4) & 0x0F0F0F0Fu) | ((s47 >> 2) & 0x30303030u);
    }
    scale = __fmul_rn(pk_f16w(head.x, 0), v3_byte_f<0>(scw, j & 3));
    neg_min = -__fmul_rn(pk_f16w(head.x, 1), v3_byte_f<0>(mnw, j & 3));
}

// Sub-block j of a row: A registers a[2 h] (k 2t, 2t + 1), a[2 h + 1] (k 2t + 8, 2t + 9) of group h.
PK_FN void v3_q4k_frags(const V3RawQ4K& r, int j, uint32_t (&a)[4]) {
    const uint2 q = r.qs[j >> 1];
    const int shift = 4 * (j & 1);
    const uint32_t off = 0xC300C300u;       // - 128
    v3_pairs((q.x >> shift) & 0x0F0F0F0Fu, off, a[0], a[1]);   // group 0: weights 8 t .. 8 t + 3
    v3_pairs((q.y >> shift) & 0x0F0F0F0Fu, off, a[2], a[3]);   // group 1: 8 t + 4 .. 8 t + 7
}

// Sub-block j of a row: its A registers, scale and minus min.
PK_FN void v3_chunk(const V3RawQ4K& r, int j, uint32_t (&a)[4], float& scale, float& neg_min) {
    v3_q4k_scales(r.head, j, scale, neg_min);
    v3_q4k_frags(r, j, a);
}

// ------------------------------------------------------------------------------------------------ Q6_K
// One row's super-block (210 bytes: ql[128], qh[64], scales[16] int8, d f16; only 2-byte aligned, so read with
// pk_bytes' aligned words) as lane t holds it: ql words (h, a, s) = bytes 64 h + 32 a + 16 s + 4 t .. + 3, qh words
// (h, s) = bytes 128 + 32 h + 16 s + 4 t .. + 3, the 16 scales, d.
struct V3RawQ6K {
    uint32_t ql[8], qh[4], sc[4];
    float d;
};

template <class Src>
PK_FN void v3_read(const Src& sb, int t, int, V3RawQ6K& r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        uint32_t o[1];
        sb.template bytes<4>(64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t, o);
        r.ql[i] = o[0];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t o[1];
        sb.template bytes<4>(128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t, o);
        r.qh[i] = o[0];
    }
    sb.template bytes<16>(192, r.sc);
    uint32_t dd[1];
    sb.template bytes<2>(208, dd);
    r.d = pk_f16w(dd[0], 0);
}

// Chunk j (0..7: weights 128 h + 32 i4 + l, h = j / 4, i4 = j % 4) of a row: A registers as Q4_K's, and the scales
// d * sc[2 j] (group 0: l < 16) and d * sc[2 j + 1] (group 1), so w = scale * (q - 32) as dequantize.py.
PK_FN void v3_chunk(const V3RawQ6K& r, int j, uint32_t (&a)[4], float& scale0, float& scale1) {
    const int h = j >> 2, i4 = j & 3;
    const uint32_t sw = r.sc[j >> 1] ^ 0x80808080u;       // int8 scales + 128
    scale0 = __fmul_rn(r.d, v3_byte_f<128>(sw, 2 * (j & 1)));
    scale1 = __fmul_rn(r.d, v3_byte_f<128>(sw, 2 * (j & 1) + 1));
    const uint32_t off = 0xC320C320u;                     // - 160: (128 + q) - 160 = q - 32
#pragma unroll
    for (int s = 0; s < 2; ++s) {                         // group s: l = 16 s + 4 t .. + 3
        const uint32_t lo4 = (r.ql[4 * h + 2 * (i4 & 1) + s] >> (4 * (i4 >> 1))) & 0x0F0F0F0Fu;
        const uint32_t hi2 = ((r.qh[2 * h + s] >> (2 * i4)) & 0x03030303u) << 4;
        v3_pairs(lo4 | hi2, off, a[2 * s], a[2 * s + 1]);
    }
}

// ------------------------------------------------------------------------------------------------ Q4_0, Q4_1, Q8_0
// A unit: 8 blocks (18, 20 or 34 bytes: d f16 [, m f16], qs), of which the first ``valid`` lie in the row; lane t holds
// of block c its qs word(s) (Q4_0 / Q4_1: bytes 4 t .. + 3, weights 4 t .. + 3 low, 16 + 4 t .. high; Q8_0: int8
// weights 4 t .. + 3 and 16 + 4 t .. + 3) and its f16 scale(s). Words through pk_bytes: Q4_0 / Q8_0 blocks are only
// 2-byte aligned.
struct V3RawQ40 {
    uint32_t qs[8];
    float d[8];
};
struct V3RawQ41 {
    uint32_t qs[8];
    uint32_t dm[8];                                     // d | m << 16
};
struct V3RawQ80 {
    uint32_t qs[16];
    float d[8];
};

template <int NB, class Src>
PK_FN uint32_t v3_word(const Src& u, int o) {          // NB (<= 4) bytes at offset o as one word, any alignment
    uint32_t w[1];
    u.template bytes<NB>(o, w);
    return w[0];
}

template <class Src>
PK_FN void v3_read(const Src& u, int t, int valid, V3RawQ40& r) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const bool in = c < valid;
        r.qs[c] = in ? v3_word<4>(u, 18 * c + 2 + 4 * t) : 0u;
        r.d[c] = in ? pk_f16w(v3_word<2>(u, 18 * c), 0) : 0.0f;
    }
}
template <class Src>
PK_FN void v3_read(const Src& u, int t, int valid, V3RawQ41& r) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const bool in = c < valid;
        r.qs[c] = in ? v3_word<4>(u, 20 * c + 4 + 4 * t) : 0u;
        r.dm[c] = in ? v3_word<4>(u, 20 * c) : 0u;
    }
}
template <class Src>
PK_FN void v3_read(const Src& u, int t, int valid, V3RawQ80& r) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const bool in = c < valid;
        r.qs[2 * c] = in ? v3_word<4>(u, 34 * c + 2 + 4 * t) : 0u;
        r.qs[2 * c + 1] = in ? v3_word<4>(u, 34 * c + 18 + 4 * t) : 0u;
        r.d[c] = in ? pk_f16w(v3_word<2>(u, 34 * c), 0) : 0.0f;
    }
}

// A unit of one row straight from global memory (v3; the host test)
template <class Raw>
PK_FN void v3_load(const uint8_t* p, int t, int valid, Raw& r) { v3_read(V3Global{p}, t, valid, r); }

// Block j of the unit: w = d (q - 8) (q - 8 exact in bf16), s1 unused
PK_FN void v3_chunk(const V3RawQ40& r, int j, uint32_t (&a)[4], float& s0, float& s1) {
    const uint32_t off = 0xC308C308u;                   // - 136: (128 + q) - 136 = q - 8
    v3_pairs(r.qs[j] & 0x0F0F0F0Fu, off, a[0], a[1]);
    v3_pairs((r.qs[j] >> 4) & 0x0F0F0F0Fu, off, a[2], a[3]);
    s0 = r.d[j];
    s1 = 0.0f;
}
// w = d q + m
PK_FN void v3_chunk(const V3RawQ41& r, int j, uint32_t (&a)[4], float& s0, float& s1) {
    const uint32_t off = 0xC300C300u;                   // - 128
    v3_pairs(r.qs[j] & 0x0F0F0F0Fu, off, a[0], a[1]);
    v3_pairs((r.qs[j] >> 4) & 0x0F0F0F0Fu, off, a[2], a[3]);
    s0 = pk_f16w(r.dm[j], 0);
    s1 = pk_f16w(r.dm[j], 1);
}
// w = q d
PK_FN void v3_chunk(const V3RawQ80& r, int j, uint32_t (&a)[4], float& s0, float& s1) {
    v3_pairs_i8(r.qs[2 * j], a[0], a[1]);
    v3_pairs_i8(r.qs[2 * j + 1], a[2], a[3]);
    s0 = r.d[j];
    s1 = 0.0f;
}

// ------------------------------------------------------------------------------------------------ per type
template <int QT>
struct V3;
template <>
struct V3<PK_Q4_K> { using Raw = V3RawQ4K; static constexpr int UNIT = 144, BLOCK = 144, FOLD = FOLD_MIN; };
template <>
struct V3<PK_Q6_K> { using Raw = V3RawQ6K; static constexpr int UNIT = 210, BLOCK = 210, FOLD = FOLD_SPLIT; };
template <>
struct V3<PK_Q4_0> { using Raw = V3RawQ40; static constexpr int UNIT = 8 * 18, BLOCK = 18, FOLD = FOLD_ONE; };
template <>
struct V3<PK_Q4_1> { using Raw = V3RawQ41; static constexpr int UNIT = 8 * 20, BLOCK = 20, FOLD = FOLD_MIN; };
template <>
struct V3<PK_Q8_0> { using Raw = V3RawQ80; static constexpr int UNIT = 8 * 34, BLOCK = 34, FOLD = FOLD_ONE; };
// BLOCK: bytes per 32-weight chunk's block (K-quants: per unit; a row is K / 256 of those, the others K / 32)
