// packed.cu: y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) with W held as GGUF blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K:
// verispec/runtime/quant/formats.py has the byte layouts), every weight dequantized in registers, fp32 accumulation,
// any number of rows M, each output element reduced in ONE order that depends on K alone: the batch invariance of
// invariant.cu (a token's logits do not depend on how many tokens share the pass), for packed weights.
//
// STATUS: compiled in CPU CI (tests/test_cuda_compile.py); not yet run on a GPU. tests/test_quant_gpu.py holds its
// checks (vs the torch dequantizer + matmul, batch invariance, the model's logits); ops.linear uses it only when
// VERISPEC_PACKED_GEMV=1 until they pass on a device. No speed claim: this is the first, plain version.
//
// The order (the contract):
//   * a row of W is cut into chunks of 32 weights (chunk c = columns [32 c, 32 c + 32)): a Q4_0 / Q4_1 / Q8_0
//     block, a Q4_K sub-block, two Q6_K sub-blocks;
//   * lane l of the row's warp owns chunks l, l + 32, l + 64, ... and, per token, accumulates from 0 in that order,
//     within a chunk weight 32 c + 0 .. 32 c + 31: acc = fmaf(w, x, acc) (one rounding per weight);
//   * the 32 lane sums are combined by the xor butterfly (offsets 16, 8, 4, 2, 1), whose result every lane holds
//     bit for bit (IEEE addition commutes), then + b, rounded once to T.
// A token's arithmetic does not depend on M, on its tile (8 tokens per block) or its slot in it; a weight's value
// is exactly the reference dequantizer's (the same products and sums, __fmul_rn / __fsub_rn: no contraction), so
// only the summation order differs from dequantize + matmul.
//
// Launch: grid (ceil(N / 4), ceil(M / 8)), 4 warps a block, one row of W per warp, 8 tokens per block; W is read
// once per 8 tokens (byte loads: the simple version). No allocation, no host sync: CUDA-graph capturable.
#include "gemv_common.cuh"

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

template <typename T, int QT, int QK, int TYPE_SIZE>
static cudaError_t pk_launch(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                             cudaStream_t stream) {
    const long long tiles = ((long long)M + PK_TOKENS - 1) / PK_TOKENS;
    if (tiles > 65535) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)(((long long)N + PK_WARPS - 1) / PK_WARPS), (unsigned)tiles);
    packed_matmul_kernel<T, QT, QK, TYPE_SIZE><<<grid, 32 * PK_WARPS, 0, stream>>>(
        (const T*)x, (const uint8_t*)w, (const T*)b, (T*)y, M, N, K);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t pk_dispatch(int qtype, const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                               cudaStream_t stream) {
    switch (qtype) {
        case PK_Q4_0: return pk_launch<T, PK_Q4_0, 32, 18>(x, w, b, y, M, N, K, stream);
        case PK_Q4_1: return pk_launch<T, PK_Q4_1, 32, 20>(x, w, b, y, M, N, K, stream);
        case PK_Q8_0: return pk_launch<T, PK_Q8_0, 32, 34>(x, w, b, y, M, N, K, stream);
        case PK_Q4_K: return pk_launch<T, PK_Q4_K, 256, 144>(x, w, b, y, M, N, K, stream);
        case PK_Q6_K: return pk_launch<T, PK_Q6_K, 256, 210>(x, w, b, y, M, N, K, stream);
        default: return cudaErrorInvalidValue;
    }
}

// The weights per block of a GGML type this file decodes, 0 for any other type.
extern "C" int vs_packed_block_size(int qtype) {
    return qtype == PK_Q4_K || qtype == PK_Q6_K ? 256 : (qtype == PK_Q4_0 || qtype == PK_Q4_1 || qtype == PK_Q8_0 ? 32 : 0);
}

// y[M, N] = x[M, K] @ W^T (+ b), W as blocks of GGML type qtype, rows of K weights. x, b, y of one dtype (fp32,
// bf16, fp16), contiguous. cudaErrorInvalidValue (nothing launched) for an unknown type or dtype, K not a whole
// number of blocks, or more than 65535 * 8 rows of x.
extern "C" cudaError_t vs_packed_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int qtype,
                                        int M, int N, int K, cudaStream_t stream) {
    const int qk = vs_packed_block_size(qtype);
    if (qk == 0 || M < 1 || N < 0 || K < qk || K % qk != 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    switch (dtype) {
        case VS_F32: return pk_dispatch<float>(qtype, x, w, b, y, M, N, K, stream);
        case VS_BF16: return pk_dispatch<__nv_bfloat16>(qtype, x, w, b, y, M, N, K, stream);
        case VS_F16: return pk_dispatch<__half>(qtype, x, w, b, y, M, N, K, stream);
        default: return cudaErrorInvalidValue;
    }
}
