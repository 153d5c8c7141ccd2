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
// Two variants compute these same bits (tests/test_quant_gpu.py compares them on a GPU; their block decoders, in
// packed_decoders.cuh, are compared with the torch dequantizer on the CPU by tests/test_quant_decoders.py),
// ``variant`` selects one (0: the default, vs_packed_default_variant):
//   v1  the first version (checked on an H100): byte loads of W and x, 8 tokens per block, (float) casts.
//       Each weight costs a byte load and an int -> float conversion (I2F, a quarter-rate instruction on Hopper).
//   v2  the same warp layout and order, cheaper per weight: a chunk's bytes read as aligned 32-bit words (``pk_bytes``:
//       a Q4_K chunk is 12 to 14 word loads instead of about 40 byte loads, whatever the block's alignment: Q6_K /
//       Q8_0 blocks are only 2-byte aligned), small integers made floats exactly by the 2^23 trick (one LOP + one
//       FADD, full rate), x read as 16-byte vectors (the wrapper copies a misaligned x), tokens per block 1 / 2 / 4 / 8 (the smallest that holds M, so a decode step
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

#include "packed_decoders.cuh"

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
