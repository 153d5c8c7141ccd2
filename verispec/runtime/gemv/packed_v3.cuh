// packed_v3.cuh: the per-lane pieces of packed.cu's v3 (Q4_K and Q6_K through bf16 tensor-core MMAs): what one lane
// loads of a super-block, the A fragments (the blocks' small integers as exact bf16) and scales it makes of them, the
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
//   Q6_K: group h = columns 16 h + 4 t .. + 3 (each MMA inside one 16-weight scale group).
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

PK_FN void v3_load(const uint8_t* sb, int t, V3RawQ4K& r) {
    r.head = v3_ld16(sb);
#pragma unroll
    for (int p = 0; p < 4; ++p) r.qs[p] = v3_ld8(sb + 16 + 32 * p + 8 * t);
}

// Sub-block j (0..7) of a row: A registers a[2 h] (k 2t, 2t + 1), a[2 h + 1] (k 2t + 8, 2t + 9) of group h, and the
// scale d * sc and min dmin * mn of dequantize.py (so w = scale * q - min), each product rounded once as there.
PK_FN void v3_chunk(const V3RawQ4K& r, int j, uint32_t (&a)[4], float& scale, float& mn) {
    const uint32_t s03 = r.head.y, s47 = r.head.z, s811 = r.head.w;   // scales bytes 0..3, 4..7, 8..11
    uint32_t scw, mnw;                      // bytes j % 4 of these: sub-block j's 6-bit scale and min
    if (j < 4) {
        scw = s03 & 0x3F3F3F3Fu;
        mnw = s47 & 0x3F3F3F3Fu;
    } else {                                // low 4 bits from bytes 8..11, high 2 from the top of bytes 0..3 / 4..7
        scw = (s811 & 0x0F0F0F0Fu) | ((s03 >> 2) & 0x30303030u);
        mnw = ((s811 >> 4) & 0x0F0F0F0Fu) | ((s47 >> 2) & 0x30303030u);
    }
    scale = __fmul_rn(pk_f16w(r.head.x, 0), v3_byte_f<0>(scw, j & 3));
    mn = __fmul_rn(pk_f16w(r.head.x, 1), v3_byte_f<0>(mnw, j & 3));
    const uint2 q = r.qs[j >> 1];
    const int shift = 4 * (j & 1);
    const uint32_t off = 0xC300C300u;       // - 128
    v3_pairs((q.x >> shift) & 0x0F0F0F0Fu, off, a[0], a[1]);   // group 0: weights 8 t .. 8 t + 3
    v3_pairs((q.y >> shift) & 0x0F0F0F0Fu, off, a[2], a[3]);   // group 1: 8 t + 4 .. 8 t + 7
}

// ------------------------------------------------------------------------------------------------ Q6_K
// One row's super-block (210 bytes: ql[128], qh[64], scales[16] int8, d f16; only 2-byte aligned, so read with
// pk_bytes' aligned words) as lane t holds it: ql words (h, a, s) = bytes 64 h + 32 a + 16 s + 4 t .. + 3, qh words
// (h, s) = bytes 128 + 32 h + 16 s + 4 t .. + 3, the 16 scales, d.
struct V3RawQ6K {
    uint32_t ql[8], qh[4], sc[4];
    float d;
};

PK_FN void v3_load(const uint8_t* sb, int t, V3RawQ6K& r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        uint32_t o[1];
        pk_bytes<4>(sb + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t, o);
        r.ql[i] = o[0];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t o[1];
        pk_bytes<4>(sb + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t, o);
        r.qh[i] = o[0];
    }
    pk_bytes<16>(sb + 192, r.sc);
    uint32_t dd[1];
    pk_bytes<2>(sb + 208, dd);
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
