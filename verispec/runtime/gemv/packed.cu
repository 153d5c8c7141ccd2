// packed.cu: y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) with W held as GGUF blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K:
// verispec/runtime/quant/formats.py has the byte layouts), every weight dequantized in registers, fp32 accumulation,
// any number of rows M, each output element reduced in ONE order that depends on K alone: the batch invariance of
// invariant.cu (a token's logits do not depend on how many tokens share the pass), for packed weights. And the
// prefill's dequantizer: W -> a dense [N, K] copy in x's dtype for a tensor-core GEMM.
//
// The order (the contract):
//   * a row of W is cut into chunks of 32 weights (chunk c = columns [32 c, 32 c + 32)): a Q4_0 / Q4_1 / Q8_0
//     block, a Q4_K sub-block, two Q6_K sub-blocks;
//   * lane l of the row's warp owns chunks l, l + 32, l + 64, ... and, per token, accumulates from 0 in that order,
//     within a chunk weight 32 c + 0 .. 32 c + 31: acc = fmaf(w, x, acc) (one rounding per weight);
//   * the 32 lane sums are combined by the xor butterfly (offsets 16, 8, 4, 2, 1), whose result every lane holds
//     bit for bit (IEEE addition commutes), then + b, rounded once to T.
// A token's arithmetic does not depend on M, on its tile or its slot in it; a weight's value is exactly the
// reference dequantizer's (the same products and sums, __fmul_rn / __fsub_rn: no contraction), so only the
// summation order differs from dequantize + matmul.
//
// Two variants compute these same bits (tests/test_quant_gpu.py compares them), ``variant`` selects one (0: the
// default, vs_packed_default_variant):
//   v1  the first version (checked on an H100): byte loads of W and x, 8 tokens per block, (float) casts.
//       Each weight costs a byte load and an int -> float conversion (I2F, a quarter-rate instruction on Hopper).
//   v2  the same warp layout and order, cheaper per weight: a chunk's bytes read as aligned 32-bit words (``pk_bytes``:
//       a Q4_K chunk is 12 loads instead of 52, whatever the block's alignment: Q6_K / Q8_0 blocks are only 2-byte
//       aligned), small integers made floats exactly by the 2^23 trick (one LOP + one FADD, full rate), x read as
//       16-byte vectors when aligned, tokens per block 1 / 2 / 4 / 8 (the smallest that holds M, so a decode step
//       carries no dead accumulators), the chunk loop unrolled by 2 (two chunks' loads in flight per lane). Built for
//       bf16 activations only (fp32 and fp16 run v1: fewer kernels to compile, and no model's default dtype on a GPU).
// The warp-per-row layout is the contract's, so neither variant can split K further for a small N: N = 1024 gives
// 1024 warps (8 a SM on an H100), and a lane's chunks are read one after another. A faster kernel for small N needs a
// new order (several warps per row, summed in a fixed order), and with it new checks.
//
// Launch: grid (ceil(N / 4), ceil(M / tokens per block)), 4 warps a block, one row of W per warp. No allocation, no
// host sync: CUDA-graph capturable.
#include "gemv_common.cuh"

#include <type_traits>

#define PK_WARPS 4        // rows of W per block (one warp each)
#define PK_TOKENS 8       // tokens per block

enum PkType { PK_Q4_0 = 2, PK_Q4_1 = 3, PK_Q8_0 = 8, PK_Q4_K = 12, PK_Q6_K = 14 };

// the little-endian f16 at p, widened to fp32 (exact)
__device__ __forceinline__ float pk_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// The 32 weights of chunk c of a row (formats.py's layouts; the arithmetic of dequantize.py, op for op).
template <int QT>
__device__ __forceinline__ void pk_chunk(const uint8_t* row, int c, float (&w)[32]);

template <>
__device__ __forceinline__ void pk_chunk<PK_Q4_0>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk<PK_Q4_1>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk<PK_Q8_0>(const uint8_t* row, int c, float (&w)[32]) {
    const uint8_t* b = row + 34 * c;                     // d f16, qs[32] int8
    const float d = pk_f16(b);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fmul_rn((float)(int8_t)b[2 + i], d);
}

template <>
__device__ __forceinline__ void pk_chunk<PK_Q4_K>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk<PK_Q6_K>(const uint8_t* row, int c, float (&w)[32]) {
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

template <typename T, int QT, int QK, int TYPE_SIZE>
__global__ void __launch_bounds__(32 * PK_WARPS)
packed_matmul_kernel(const T* __restrict__ x,        // [M, K]
                     const uint8_t* __restrict__ w,  // [N, K / QK * TYPE_SIZE]
                     const T* __restrict__ bias,     // [N] or nullptr
                     T* __restrict__ y,              // [M, N]
                     int M, int N, int K) {
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * PK_WARPS + (threadIdx.x >> 5);
    const long long tok0 = (long long)blockIdx.y * PK_TOKENS;
    if (n >= N) return;                                  // a whole warp: no block-level synchronization below
    const uint8_t* row = w + n * (long long)(K / QK) * TYPE_SIZE;
    float acc[PK_TOKENS];
#pragma unroll
    for (int t = 0; t < PK_TOKENS; ++t) acc[t] = 0.0f;
    for (int c = lane; c < K / 32; c += 32) {
        float wv[32];
        pk_chunk<QT>(row, c, wv);
#pragma unroll
        for (int t = 0; t < PK_TOKENS; ++t) {
            if (tok0 + t < M) {                          // the same for every lane
                const T* xr = x + (tok0 + t) * K + 32LL * c;
#pragma unroll
                for (int i = 0; i < 32; ++i) acc[t] = fmaf(wv[i], to_float(xr[i]), acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < PK_TOKENS; ++t) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(VS_FULL_MASK, acc[t], off));
    }
    if (lane == 0) {
        const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
        for (int t = 0; t < PK_TOKENS; ++t) {
            if (tok0 + t < M) store_float(y + (tok0 + t) * N + n, bias != nullptr ? __fadd_rn(acc[t], b) : acc[t]);
        }
    }
}

// ------------------------------------------------------------------------------------------------ v2 decoders
// Bytes [p, p + NB) as words: o[i] holds bytes p[4 i .. 4 i + 3] (little-endian), whatever p's alignment. Reads the
// aligned words that hold those bytes, and no other (an aligned word holding a byte of the tensor lies inside its
// allocation), then funnel-shifts them into place. Bytes past NB in the last word are zero or a neighbour's.
template <int NB>
__device__ __forceinline__ void pk_bytes(const uint8_t* p, uint32_t (&o)[(NB + 3) / 4]) {
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
__device__ __forceinline__ int pk_byte(const uint32_t (&o)[N], int k) { return (o[k >> 2] >> (8 * (k & 3))) & 255; }

// byte k of a word window for a k known only at run time: selects, so the window stays in registers (an indexed
// array would go to local memory)
template <int N>
__device__ __forceinline__ int pk_byte_at(const uint32_t (&o)[N], int k) {
    uint32_t word = o[0];
#pragma unroll
    for (int i = 1; i < N; ++i) word = (k >> 2) == i ? o[i] : word;
    return (word >> (8 * (k & 3))) & 255;
}

// the f16 in the low (hi = 0) or high half of a word, widened to fp32 (exact)
__device__ __forceinline__ float pk_f16w(uint32_t w, int hi) {
    return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffff)));
}

// v - B as fp32 for 0 <= v < 2^22, exactly: the float 2^23 + v has v in its low mantissa bits (no I2F). B = 0, 8,
// 32 or 128 gives the Q4_0, Q6_K and int8 offsets in the same one subtraction (2^23 + B is exact).
template <int B>
__device__ __forceinline__ float pk_int(uint32_t v) { return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.0f + B); }

template <int QT>
__device__ __forceinline__ void pk_chunk2(const uint8_t* row, int c, float (&w)[32]);

template <>
__device__ __forceinline__ void pk_chunk2<PK_Q4_0>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk2<PK_Q4_1>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk2<PK_Q8_0>(const uint8_t* row, int c, float (&w)[32]) {
    uint32_t o[9];                                        // d f16, qs[32] int8
    pk_bytes<34>(row + 34 * c, o);
    const float d = pk_f16w(o[0], 0);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fmul_rn(pk_int<128>(pk_byte(o, 2 + i) ^ 128), d);   // int8 q + 128
}

template <>
__device__ __forceinline__ void pk_chunk2<PK_Q4_K>(const uint8_t* row, int c, float (&w)[32]) {
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
__device__ __forceinline__ void pk_chunk2<PK_Q6_K>(const uint8_t* row, int c, float (&w)[32]) {
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

// the 32 values x[0..31] as fp32; VX: x is 16-byte aligned (vector loads)
template <typename T, bool VX>
__device__ __forceinline__ void pk_x32(const T* __restrict__ x, float (&xf)[32]) {
    if constexpr (VX) {
        constexpr int PER = 16 / sizeof(T);               // elements per 16-byte load
#pragma unroll
        for (int v = 0; v < 32 / PER; ++v) {
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(x) + v);
            const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
            for (int i = 0; i < PER; ++i) xf[v * PER + i] = to_float(e[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) xf[i] = to_float(x[i]);
    }
}

template <typename T, int QT, int QK, int TYPE_SIZE, int NT, bool VX>
__global__ void __launch_bounds__(32 * PK_WARPS)
packed_matmul_v2_kernel(const T* __restrict__ x,        // [M, K]
                        const uint8_t* __restrict__ w,  // [N, K / QK * TYPE_SIZE]
                        const T* __restrict__ bias,     // [N] or nullptr
                        T* __restrict__ y,              // [M, N]
                        int M, int N, int K) {
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * PK_WARPS + (threadIdx.x >> 5);
    const long long tok0 = (long long)blockIdx.y * NT;
    if (n >= N) return;                                  // a whole warp: no block-level synchronization below
    const uint8_t* row = w + n * (long long)(K / QK) * TYPE_SIZE;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < K / 32; c += 32) {
        float wv[32];
        pk_chunk2<QT>(row, c, wv);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (NT == 1 || tok0 + t < M) {               // the same for every lane
                float xf[32];
                pk_x32<T, VX>(x + (tok0 + t) * K + 32LL * c, xf);
#pragma unroll
                for (int i = 0; i < 32; ++i) acc[t] = fmaf(wv[i], xf[i], acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(VS_FULL_MASK, acc[t], off));
    }
    if (lane == 0) {
        const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (tok0 + t < M) store_float(y + (tok0 + t) * N + n, bias != nullptr ? __fadd_rn(acc[t], b) : acc[t]);
        }
    }
}

// ------------------------------------------------------------------------------------------------ dequantizer
// W [N, K] -> out [N, K] in T, one thread per chunk of 32 weights: the weights of the GEMV (the same decoders, so
// the values of dequantize.py, bit for bit), rounded once to T. 64 (bf16) or 128 (fp32) bytes a thread, stored as
// 16-byte vectors (out: contiguous, 16-byte aligned; the launcher checks).
// one 32-bit word of T values from fp32 (each rounded once, to nearest even)
template <typename T>
__device__ __forceinline__ uint32_t pk_word(const float* v);
template <>
__device__ __forceinline__ uint32_t pk_word<float>(const float* v) { return __float_as_uint(v[0]); }
template <>
__device__ __forceinline__ uint32_t pk_word<__nv_bfloat16>(const float* v) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[0])) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[1])) << 16);
}
template <>
__device__ __forceinline__ uint32_t pk_word<__half>(const float* v) {
    return (uint32_t)__half_as_ushort(__float2half_rn(v[0])) | ((uint32_t)__half_as_ushort(__float2half_rn(v[1])) << 16);
}

template <typename T, int QT, int V>
__global__ void __launch_bounds__(256)
packed_dequantize_kernel(const uint8_t* __restrict__ w, T* __restrict__ out, long long chunks, int K) {
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= chunks) return;
    const long long n = g / (K / 32);
    const int c = (int)(g % (K / 32));
    constexpr int QK = (QT == PK_Q4_K || QT == PK_Q6_K) ? 256 : 32;
    constexpr int TS = QT == PK_Q4_0 ? 18 : QT == PK_Q4_1 ? 20 : QT == PK_Q8_0 ? 34 : QT == PK_Q4_K ? 144 : 210;
    const uint8_t* row = w + n * (long long)(K / QK) * TS;
    float wv[32];
    if constexpr (V == 1) pk_chunk<QT>(row, c, wv);
    else pk_chunk2<QT>(row, c, wv);
    constexpr int PER = 4 / sizeof(T);                    // values a 32-bit word
    uint4* dst = reinterpret_cast<uint4*>(out + g * 32);
#pragma unroll
    for (int v = 0; v < 32 / (4 * PER); ++v) {
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) u[i] = pk_word<T>(wv + (4 * v + i) * PER);
        dst[v] = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

template <typename T, int QT, int QK, int TYPE_SIZE>
static cudaError_t pk_launch_v1(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream) {
    const long long tiles = ((long long)M + PK_TOKENS - 1) / PK_TOKENS;
    if (tiles > 65535) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)(((long long)N + PK_WARPS - 1) / PK_WARPS), (unsigned)tiles);
    packed_matmul_kernel<T, QT, QK, TYPE_SIZE><<<grid, 32 * PK_WARPS, 0, stream>>>(
        (const T*)x, (const uint8_t*)w, (const T*)b, (T*)y, M, N, K);
    return cudaGetLastError();
}

template <typename T, int QT, int QK, int TYPE_SIZE, int NT>
static cudaError_t pk_launch_v2(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream) {
    const long long tiles = ((long long)M + NT - 1) / NT;
    if (tiles > 65535 || reinterpret_cast<uintptr_t>(x) % 16) return cudaErrorInvalidValue;  // x: 16-byte vectors
    const dim3 grid((unsigned)(((long long)N + PK_WARPS - 1) / PK_WARPS), (unsigned)tiles);
    packed_matmul_v2_kernel<T, QT, QK, TYPE_SIZE, NT, true><<<grid, 32 * PK_WARPS, 0, stream>>>(
        (const T*)x, (const uint8_t*)w, (const T*)b, (T*)y, M, N, K);
    return cudaGetLastError();
}

template <typename T, int QT, int QK, int TYPE_SIZE>
static cudaError_t pk_launch(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int variant,
                             cudaStream_t stream) {
    if constexpr (!std::is_same<T, __nv_bfloat16>::value) {   // v2 is built for bf16 (the GPU models' dtype) only:
        return pk_launch_v1<T, QT, QK, TYPE_SIZE>(x, w, b, y, M, N, K, stream);   // fewer kernels to compile
    } else {
        if (variant == 1) return pk_launch_v1<T, QT, QK, TYPE_SIZE>(x, w, b, y, M, N, K, stream);
        // tokens a block: the smallest of 1, 2, 4, 8 that holds M (a decode step carries no dead accumulators)
        if (M <= 1) return pk_launch_v2<T, QT, QK, TYPE_SIZE, 1>(x, w, b, y, M, N, K, stream);
        if (M <= 2) return pk_launch_v2<T, QT, QK, TYPE_SIZE, 2>(x, w, b, y, M, N, K, stream);
        if (M <= 4) return pk_launch_v2<T, QT, QK, TYPE_SIZE, 4>(x, w, b, y, M, N, K, stream);
        return pk_launch_v2<T, QT, QK, TYPE_SIZE, 8>(x, w, b, y, M, N, K, stream);
    }
}

template <typename T, int QT>
static cudaError_t pk_dequantize_launch(const void* w, void* out, int N, int K, int variant, cudaStream_t stream) {
    if (reinterpret_cast<uintptr_t>(out) % 16) return cudaErrorInvalidValue;
    const long long chunks = (long long)N * (K / 32);
    const long long grid = (chunks + 255) / 256;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    if (variant == 1) {
        packed_dequantize_kernel<T, QT, 1><<<(unsigned)grid, 256, 0, stream>>>((const uint8_t*)w, (T*)out, chunks, K);
    } else {
        packed_dequantize_kernel<T, QT, 2><<<(unsigned)grid, 256, 0, stream>>>((const uint8_t*)w, (T*)out, chunks, K);
    }
    return cudaGetLastError();
}

template <typename T>
static cudaError_t pk_dispatch(int qtype, const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                               int variant, cudaStream_t stream) {
    switch (qtype) {
        case PK_Q4_0: return pk_launch<T, PK_Q4_0, 32, 18>(x, w, b, y, M, N, K, variant, stream);
        case PK_Q4_1: return pk_launch<T, PK_Q4_1, 32, 20>(x, w, b, y, M, N, K, variant, stream);
        case PK_Q8_0: return pk_launch<T, PK_Q8_0, 32, 34>(x, w, b, y, M, N, K, variant, stream);
        case PK_Q4_K: return pk_launch<T, PK_Q4_K, 256, 144>(x, w, b, y, M, N, K, variant, stream);
        case PK_Q6_K: return pk_launch<T, PK_Q6_K, 256, 210>(x, w, b, y, M, N, K, variant, stream);
        default: return cudaErrorInvalidValue;
    }
}

template <typename T>
static cudaError_t pk_dequantize_dispatch(int qtype, const void* w, void* out, int N, int K, int variant,
                                          cudaStream_t stream) {
    switch (qtype) {
        case PK_Q4_0: return pk_dequantize_launch<T, PK_Q4_0>(w, out, N, K, variant, stream);
        case PK_Q4_1: return pk_dequantize_launch<T, PK_Q4_1>(w, out, N, K, variant, stream);
        case PK_Q8_0: return pk_dequantize_launch<T, PK_Q8_0>(w, out, N, K, variant, stream);
        case PK_Q4_K: return pk_dequantize_launch<T, PK_Q4_K>(w, out, N, K, variant, stream);
        case PK_Q6_K: return pk_dequantize_launch<T, PK_Q6_K>(w, out, N, K, variant, stream);
        default: return cudaErrorInvalidValue;
    }
}

// The weights per block of a GGML type this file decodes, 0 for any other type.
extern "C" int vs_packed_block_size(int qtype) {
    return qtype == PK_Q4_K || qtype == PK_Q6_K ? 256 : (qtype == PK_Q4_0 || qtype == PK_Q4_1 || qtype == PK_Q8_0 ? 32 : 0);
}

// The variant vs_packed_matmul / vs_packed_dequantize run for variant = 0: v1, the one checked on a GPU, until v2's
// checks (tests/test_quant_gpu.py: v2 == v1, the dequantizer == torch's) have passed on one too; then 2.
extern "C" int vs_packed_default_variant() { return 1; }

// y[M, N] = x[M, K] @ W^T (+ b), W as blocks of GGML type qtype, rows of K weights. x, b, y of one dtype (fp32,
// bf16, fp16), contiguous; variant 0 (the default), 1 or 2 (the same bits). cudaErrorInvalidValue (nothing launched)
// for an unknown type, dtype or variant, K not a whole number of blocks, too many rows of x for the grid, or (v2) x
// not 16-byte aligned.
extern "C" cudaError_t vs_packed_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int qtype,
                                        int M, int N, int K, int variant, cudaStream_t stream) {
    const int qk = vs_packed_block_size(qtype);
    variant = variant == 0 ? vs_packed_default_variant() : variant;
    if (qk == 0 || M < 1 || N < 0 || K < qk || K % qk != 0 || (variant != 1 && variant != 2)) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    switch (dtype) {
        case VS_F32: return pk_dispatch<float>(qtype, x, w, b, y, M, N, K, variant, stream);
        case VS_BF16: return pk_dispatch<__nv_bfloat16>(qtype, x, w, b, y, M, N, K, variant, stream);
        case VS_F16: return pk_dispatch<__half>(qtype, x, w, b, y, M, N, K, variant, stream);
        default: return cudaErrorInvalidValue;
    }
}

// out[N, K] (dtype, contiguous, 16-byte aligned) = W dequantized: the GEMV's weight values rounded once to dtype
// (the prefill's dense copy for a tensor-core GEMM). Errors as vs_packed_matmul.
extern "C" cudaError_t vs_packed_dequantize(const void* w, void* out, int dtype, int qtype, int N, int K, int variant,
                                            cudaStream_t stream) {
    const int qk = vs_packed_block_size(qtype);
    variant = variant == 0 ? vs_packed_default_variant() : variant;
    if (qk == 0 || N < 0 || K < qk || K % qk != 0 || (variant != 1 && variant != 2)) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    switch (dtype) {
        case VS_F32: return pk_dequantize_dispatch<float>(qtype, w, out, N, K, variant, stream);
        case VS_BF16: return pk_dequantize_dispatch<__nv_bfloat16>(qtype, w, out, N, K, variant, stream);
        case VS_F16: return pk_dequantize_dispatch<__half>(qtype, w, out, N, K, variant, stream);
        default: return cudaErrorInvalidValue;
    }
}
