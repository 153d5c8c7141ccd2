// packed.cu: y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) with W held as GGUF blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K:
// verispec/runtime/quant/formats.py has the byte layouts), every weight dequantized in registers, fp32 accumulation,
// any number of rows M, each output element reduced in ONE order that depends on K alone (per variant: v1 / v2 share
// one, v3 has its own, below its kernel): the batch invariance of invariant.cu (a token's logits do not depend on how
// many tokens share the pass), for packed weights. And the prefill's dequantizer: W -> a dense [N, K] copy in x's
// dtype for a tensor-core GEMM.
//
// The order of v1 and v2 (the contract):
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
// 1024 warps (8 a SM on an H100), and a lane's chunks are read one after another.
//   v3  bf16 x, every type: a new order, on the tensor cores (its comment, before the dequantizer, states it): a
//       block of 8 warps owns 16 rows of W, each warp 1/8 of K (units of 256 weights p, p + 8, ...) summed in slice
//       order; each weight is loaded once, decoded once to an exact bf16 integer and applied to all of the block's
//       tokens by mma.sync, its scales folded in per chunk. Not v2's bits (the sum is regrouped); fp32 / fp16 x run
//       v1 under variant 3. Its lane layout (packed_v3.cuh) is checked on the CPU with the MMA emulated
//       (tests/test_quant_v3.py).
//   v4  v3's order and arithmetic, so v3's bits (tests/test_quant_gpu.py checks it on a GPU), the weights staged
//       through shared memory by 16-byte cp.async several units ahead (its comment, below v3's kernel); v3's kernel
//       itself for the large Q4_K matrices, where it is faster.
//   v5  v3's bits again, the loads and the arithmetic in different warps: a producer warp fills a ring of shared-memory
//       slots with the TMA's bulk copies while 8 consumer warps compute, a grid that holds the GPU with each block
//       walking row tiles (its comment, below v4's kernel); Q4_K, Q6_K, and Q8_0 at one row of x; v4 for the rest.
//       v3, v4 and v5 launch with programmatic dependent launch.
//
// Launch (v1, v2): grid (ceil(N / 4), ceil(M / tokens per block)), 4 warps a block, one row of W per warp; v3: grid
// (ceil(M / 8 or 16), ceil(N / 16)), 8 warps a block; v5: (token tiles, row-tile walkers), 9 warps a block. No
// allocation, no host sync: CUDA-graph capturable.
#include "gemv_common.cuh"

#include <algorithm>
#include <atomic>
#include <type_traits>

#define PK_WARPS 4        // rows of W per block (one warp each)
#define PK_TOKENS 8       // tokens per block

#include "packed_decoders.cuh"
#include "packed_v3.cuh"

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

// ------------------------------------------------------------------------------------------------ v3
// Every type with bf16 x, through tensor cores: its own order (below), M-invariant like v1 / v2's but not theirs.
//   * a row is cut into units of 8 chunks of 32 weights (packed_v3.cuh: a K-quant super-block, or 8 Q4_0 / Q4_1 /
//     Q8_0 blocks; the last unit of a row may be short); V3_SLICES = 8 warps a block, warp p owning units p, p + 8, ...
//     (a function of K alone), each a chain of fp32 accumulators from 0 over its units in increasing order, a unit's
//     chunks in order;
//   * a chunk's integers q (exact in bf16) meet x in mma.sync m16n8k16 (fp32 out) in the lane layout of
//     packed_v3.cuh, and its scales are folded in after the MMA, the type's FOLD (see there): Q4_K, Q4_1:
//     D = (0 + A1 B1) + A2 B2 (the chunk's two halves, one MMA chain), X = the same chain with A = 1 (the token's sum
//     of x over the chunk), acc = fmaf(s0, D, acc), acc = fmaf(s1, X, acc) (w = s0 q + s1, dequantize.py's weight,
//     regrouped); Q6_K: D0 = 0 + A1 B1, D1 = 0 + A2 B2 (one per 16-weight scale group), acc = fmaf(s0, D0, acc), then
//     fmaf(s1, D1, acc); Q4_0, Q8_0: D as Q4_K's, acc = fmaf(s0, D, acc);
//   * y = ((0 + P_0) + P_1) + ... + P_7 (through shared memory), then + b, rounded once to bf16.
// An MMA's D[r][n] comes from row r of A and column n of B alone (invariant.cu relies on the same), so a token's
// result depends on its row of x and K only: not on M, its tile, its slot in the n = 8 tile, RT or NT. Columns past
// M repeat token M - 1 and rows past N repeat row N - 1 (valid memory), never stored.
// What it saves against v2: each weight is decoded once per block for all of the block's tokens (8 NT), by 1-2 integer
// ops and half a bf16x2 FMA (Q8_0: two LOP3s and a bf16x2 FMA a pair) instead of a float conversion and a fp32 FMA per
// token; the FMAs run on the tensor cores; x is read once per 16 RT rows of W instead of once per row. A block covers
// 16 RT rows x 8 NT tokens; NT = 2 (16 tokens in registers) for M > 8, and more tokens take more blocks (grid x),
// each the same per-token arithmetic. Each warp loads its next unit while it computes the current one.
// One unit u of the warp's slice (its rows' Raw in cur: rows g and g + 8 of each row tile) into acc: the chunks in
// order, v3's arithmetic (above). nch: chunks a row; xr: token g of each n = 8 tile.
// ``chunk(r, j, ag, ah, sg0, sg1, sh0, sh1)`` gives chunk j's A registers and fold coefficients of rows g (ag, sg*) and
// g + 8 (ah, sh*) of row tile r: v3_chunk on the unit's Raw (v3_unit), or with scales shared across lanes (v5).
template <int QT, int RT, int NT, class Chunk>
__device__ __forceinline__ void v3_unit_of(Chunk&& chunk, int u, int nch, const uint16_t* const (&xr)[NT], int t,
                                           float (&acc)[RT][NT][4]) {
    using Tr = V3<QT>;
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K;   // K a multiple of 256: no short unit
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (!KQUANT && 8 * u + j >= nch) break;              // a short last unit (the whole warp)
        const long long col = 256LL * u + 32 * j;
        uint32_t b[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) v3_b_frags<QT>(xr[n] + col, t, b[n]);
        float xs[NT][4];                                     // FOLD_MIN: each token's sum of x over the chunk
        if constexpr (Tr::FOLD == FOLD_MIN) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                xs[n][0] = xs[n][1] = xs[n][2] = xs[n][3] = 0.0f;
                mma_16816<__nv_bfloat16>(xs[n], V3_BF16_ONES, V3_BF16_ONES, V3_BF16_ONES, V3_BF16_ONES, b[n][0],
                                         b[n][1]);
                mma_16816<__nv_bfloat16>(xs[n], V3_BF16_ONES, V3_BF16_ONES, V3_BF16_ONES, V3_BF16_ONES, b[n][2],
                                         b[n][3]);
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            uint32_t ag[4], ah[4];                           // rows g, g + 8
            float sg0, sg1, sh0, sh1;
            chunk(r, j, ag, ah, sg0, sg1, sh0, sh1);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_16816<__nv_bfloat16>(d0, ag[0], ah[0], ag[1], ah[1], b[n][0], b[n][1]);
                if constexpr (Tr::FOLD == FOLD_SPLIT) {
                    float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_16816<__nv_bfloat16>(d1, ag[2], ah[2], ag[3], ah[3], b[n][2], b[n][3]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {            // (d0, d1): row g; (d2, d3): row g + 8
                        acc[r][n][e] = fmaf(e < 2 ? sg0 : sh0, d0[e], acc[r][n][e]);
                        acc[r][n][e] = fmaf(e < 2 ? sg1 : sh1, d1[e], acc[r][n][e]);
                    }
                } else {
                    mma_16816<__nv_bfloat16>(d0, ag[2], ah[2], ag[3], ah[3], b[n][2], b[n][3]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        acc[r][n][e] = fmaf(e < 2 ? sg0 : sh0, d0[e], acc[r][n][e]);
                        if constexpr (Tr::FOLD == FOLD_MIN)
                            acc[r][n][e] = fmaf(e < 2 ? sg1 : sh1, xs[n][e], acc[r][n][e]);
                    }
                }
            }
        }
    }
}

template <int QT, int RT, int NT>
__device__ __forceinline__ void v3_unit(const typename V3<QT>::Raw (&cur)[RT][2], int u, int nch,
                                        const uint16_t* const (&xr)[NT], int t, float (&acc)[RT][NT][4]) {
    v3_unit_of<QT, RT, NT>([&](int r, int j, uint32_t (&ag)[4], uint32_t (&ah)[4], float& sg0, float& sg1, float& sh0,
                               float& sh1) {
        v3_chunk(cur[r][0], j, ag, sg0, sg1);
        v3_chunk(cur[r][1], j, ah, sh0, sh1);
    }, u, nch, xr, t, acc);
}

// The fixed-order sum over the V3_SLICES warps' accumulators (through s_part), + b, rounded once, stored.
// CONSUMERS: the block's first 32 V3_SLICES threads meet at named barrier 1 instead of __syncthreads (a block with
// warps of other roles).
template <int RT, int NT, bool CONSUMERS = false>
__device__ __forceinline__ void v3_store(const float (&acc)[RT][NT][4], float4 (*s_part)[RT * NT][32],
                                         const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y,
                                         long long row0, long long tok0, int M, int N) {
    constexpr int F = RT * NT;
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5;
#pragma unroll
    for (int f = 0; f < F; ++f) {
        const float* a = acc[f / NT][f % NT];
        s_part[p][f][lane] = make_float4(a[0], a[1], a[2], a[3]);
    }
    if constexpr (CONSUMERS) asm volatile("bar.sync 1, %0;" ::"n"(32 * V3_SLICES) : "memory");
    else __syncthreads();
    for (int i = threadIdx.x; i < F * 32; i += 32 * V3_SLICES) {
        const int f = i / 32, l = i % 32;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int q = 0; q < V3_SLICES; ++q) {
            const float4 part = s_part[q][f][l];
            v.x = __fadd_rn(v.x, part.x);
            v.y = __fadd_rn(v.y, part.y);
            v.z = __fadd_rn(v.z, part.z);
            v.w = __fadd_rn(v.w, part.w);
        }
        const long long row = row0 + 16 * (f / NT) + (l >> 2), tok = tok0 + 8 * (f % NT) + 2 * (l & 3);
        const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long rr = row + (e >= 2 ? 8 : 0), tt = tok + (e & 1);
            if (rr < N && tt < M) {
                const float o = bias != nullptr ? __fadd_rn(out[e], to_float(bias[rr])) : out[e];
                store_float(y + tt * N + rr, o);
            }
        }
    }
}

// xr[n] = token g of n = 8 tile n of the block's tokens from tok0 (tokens past M repeat token M - 1: valid memory, never
// stored)
template <int NT>
__device__ __forceinline__ void v3_token_rows(const __nv_bfloat16* x, long long tok0, int g, int M, int K,
                                              const uint16_t* (&xr)[NT]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const long long tok = tok0 + 8 * n + g;
        xr[n] = reinterpret_cast<const uint16_t*>(x) + (tok < M ? tok : (long long)M - 1) * K;
    }
}

// v3_unit for Q4_K with the scales shared: a sub-block's scale and min are the same for the 4 lanes of a row, so lane
// (g, t) computes those of sub-blocks 2t and 2t + 1 of rows g and g + 8 (v3_q4k_scales: dequantize.py's products) and
// the others read them by shuffle (the same values: v3's bits).
template <int NT>
__device__ __forceinline__ void v3_unit_q4k_shared(const V3RawQ4K (&cur)[1][2], int u, int nch,
                                                   const uint16_t* const (&xr)[NT], int t, float (&acc)[1][NT][4]) {
    float sc[2][4];                                              // sub-blocks 2t, 2t + 1: rows g, g + 8
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        v3_q4k_scales(cur[0][0].head, 2 * t + e, sc[e][0], sc[e][1]);
        v3_q4k_scales(cur[0][1].head, 2 * t + e, sc[e][2], sc[e][3]);
    }
    const int quad = (threadIdx.x & 31) & ~3;
    v3_unit_of<PK_Q4_K, 1, NT>([&](int, int c, uint32_t (&ag)[4], uint32_t (&ah)[4], float& sg0, float& sg1,
                                   float& sh0, float& sh1) {
        v3_q4k_frags(cur[0][0], c, ag);
        v3_q4k_frags(cur[0][1], c, ah);
        const int from = quad | (c >> 1);
        sg0 = __shfl_sync(VS_FULL_MASK, sc[c & 1][0], from);
        sg1 = __shfl_sync(VS_FULL_MASK, sc[c & 1][1], from);
        sh0 = __shfl_sync(VS_FULL_MASK, sc[c & 1][2], from);
        sh1 = __shfl_sync(VS_FULL_MASK, sc[c & 1][3], from);
    }, u, nch, xr, t, acc);
}

template <int QT, int RT, int NT>
__global__ void __launch_bounds__(32 * V3_SLICES, 2)   // two blocks an SM: <= 128 registers a thread
packed_matmul_v3_kernel(const __nv_bfloat16* __restrict__ x,     // [M, K]
                        const uint8_t* __restrict__ w,           // [N, row bytes]
                        const __nv_bfloat16* __restrict__ bias,  // [N] or nullptr
                        __nv_bfloat16* __restrict__ y,           // [M, N]
                        int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K;   // K a multiple of 256: no short unit
    __shared__ float4 s_part[V3_SLICES][RT * NT][32];
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long row0 = (long long)blockIdx.y * (16 * RT), tok0 = (long long)blockIdx.x * (8 * NT);
    const int nch = K / 32, nunits = (nch + 7) / 8;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : nch) * Tr::BLOCK;
    const uint8_t* wr[RT][2];                                    // rows g and g + 8 of each row tile
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const long long rr = row0 + 16 * r + 8 * hf + g;
            wr[r][hf] = w + (rr < N ? rr : (long long)N - 1) * row_bytes;
        }
    const uint16_t* xr[NT];                                      // token g of each n = 8 tile
    v3_token_rows<NT>(x, tok0, g, M, K, xr);
    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.0f;

    pdl_launch_dependents();
    Raw cur[RT][2];
    int u = p;
    if (u < nunits) {
        const int valid = KQUANT ? 8 : min(8, nch - 8 * u);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) v3_load(wr[r][hf] + (long long)u * Tr::UNIT, t, valid, cur[r][hf]);
    }
    pdl_wait();                                                  // x comes from the previous kernel (weights do not)
    for (; u < nunits; u += V3_SLICES) {
        const bool more = u + V3_SLICES < nunits;
        Raw nxt[RT][2];
        if (more) {
            const int valid = KQUANT ? 8 : min(8, nch - 8 * (u + V3_SLICES));
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf)
                    v3_load(wr[r][hf] + (long long)(u + V3_SLICES) * Tr::UNIT, t, valid, nxt[r][hf]);
        }
        v3_unit<QT, RT, NT>(cur, u, nch, xr, t, acc);
        if (more) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                cur[r][0] = nxt[r][0];
                cur[r][1] = nxt[r][1];
            }
        }
    }
    v3_store<RT, NT>(acc, s_part, bias, y, row0, tok0, M, N);
}

// ------------------------------------------------------------------------------------------------ v4
// v3's order and arithmetic (the same bits: the same v3_unit and v3_store), the weights brought in differently. v3's
// lanes read their own bytes of each unit straight from global memory, one unit ahead: 4-byte loads spread over 8 rows
// (Q8_0, Q4_0, Q6_K blocks are only 2-byte aligned) and a few KB in flight a warp, not enough to cover the latency on
// the small matrices of a decode step. v4 copies each (row, unit) window to the warp's shared-memory stage with 16-byte
// cp.async (whole 32-byte sectors, no registers held), V4_STAGES<QT> units ahead, and the lanes read their bytes from
// there (V4Shared). Under programmatic dependent launch the first stages are issued before pdl_wait: the weights do
// not depend on the previous kernel, only x does.
//   A window is the unit's bytes widened to 16-byte boundaries (V4_WIN<QT> bytes: a unit starts at any even offset in
//   general); its row's stage slot is V4_PITCH<QT> bytes, an odd number of 16-byte columns so that the 8 rows a warp
//   instruction reads start in different banks. Bytes past the tensor's end are zero-filled, never read.
template <int QT> constexpr int V4_WIN = ((V3<QT>::UNIT + 15) / 16 + 1) * 16;
template <int QT> constexpr int V4_PITCH = (V4_WIN<QT> / 16) % 2 ? V4_WIN<QT> : V4_WIN<QT> + 16;
// stages: as many as fit about 96 KB a block (two blocks an SM), at least 2
template <int QT> constexpr int V4_STAGES =
    (96 * 1024) / (V3_SLICES * 16 * V4_PITCH<QT>) > 4 ? 4
    : ((96 * 1024) / (V3_SLICES * 16 * V4_PITCH<QT>) < 2 ? 2 : (96 * 1024) / (V3_SLICES * 16 * V4_PITCH<QT>));
template <int QT> constexpr int V4_SMEM = V3_SLICES * V4_STAGES<QT> * 16 * V4_PITCH<QT>;

// A unit's bytes in a warp's stage (``a``: the shared-memory address of its first byte). A4: a is a multiple of 4
// (rows and units of a multiple of 4 bytes: every type but Q6_K, whose 210-byte units alternate), so a word's
// alignment is its offset's, known once unrolled: an aligned word is one load, another two loads and a funnel shift.
template <bool A4>
struct V4Shared {
    uint32_t a;
    __device__ __forceinline__ uint2 ld8(int o) const {
        uint2 v;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a + o));
        return v;
    }
    __device__ __forceinline__ uint4 ld16(int o) const {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(a + o));
        return v;
    }
    __device__ __forceinline__ static uint32_t lds(uint32_t at) {
        uint32_t v;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(at));
        return v;
    }
    template <int NB>
    __device__ __forceinline__ void bytes(int o, uint32_t (&out)[(NB + 3) / 4]) const {
        constexpr int NO = (NB + 3) / 4;
        const uint32_t at = A4 ? a + (uint32_t)(o & ~3) : (a + o) & ~3u;
        const uint32_t sh = A4 ? (uint32_t)(o & 3) * 8u : ((a + o) & 3u) * 8u;
        uint32_t r[NO + 1];
#pragma unroll
        for (int i = 0; i < NO; ++i) r[i] = lds(at + 4 * i);
        r[NO] = sh != 0 ? lds(at + 4 * NO) : 0u;
#pragma unroll
        for (int i = 0; i < NO; ++i) out[i] = sh != 0 ? __funnelshift_r(r[i], r[i + 1], sh) : r[i];
    }
};

template <int QT, int NT, bool A4>
__global__ void __launch_bounds__(32 * V3_SLICES, NT >= 4 ? 1 : 2)   // 32 tokens' accumulators: one block an SM
packed_matmul_v4_kernel(const __nv_bfloat16* __restrict__ x,     // [M, K]
                        const uint8_t* __restrict__ w,           // [N, row bytes], 16-byte aligned
                        const __nv_bfloat16* __restrict__ bias,  // [N] or nullptr
                        __nv_bfloat16* __restrict__ y,           // [M, N]
                        int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K;
    constexpr int ST = V4_STAGES<QT>, PITCH = V4_PITCH<QT>, VECS = V4_WIN<QT> / 16;
    extern __shared__ __align__(16) uint8_t v4_smem[];          // [V3_SLICES][ST][16 rows][PITCH]
    __shared__ float4 s_part[V3_SLICES][NT][32];
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long row0 = (long long)blockIdx.y * 16, tok0 = (long long)blockIdx.x * (8 * NT);
    const int nch = K / 32, nunits = (nch + 7) / 8;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : nch) * Tr::BLOCK;
    const uint8_t* const w_end = w + (long long)N * row_bytes;
    const uint32_t stage0 = (uint32_t)__cvta_generic_to_shared(v4_smem) + (uint32_t)(p * ST * 16 * PITCH);
    pdl_launch_dependents();

    // the window of (row r of the tile, the warp's i-th unit) into stage i % ST: VECS 16-byte copies a row, the lanes
    // taking (row, vector) pairs in turn; one commit group a unit (empty past the last, so wait counts stay fixed)
    auto issue = [&](int i) {
        const int u = p + V3_SLICES * i;
        if (u < nunits) {
            const int ubytes = KQUANT ? Tr::UNIT : min(8, nch - 8 * u) * Tr::BLOCK;
            const uint32_t stage = stage0 + (uint32_t)((i % ST) * 16 * PITCH);
            for (int e = lane; e < 16 * VECS; e += 32) {
                const int r = e / VECS, v = e % VECS;
                const long long rr = row0 + r < N ? row0 + r : (long long)N - 1;
                const uint8_t* unit = w + rr * row_bytes + (long long)u * Tr::UNIT;
                const uint8_t* a0 =
                    reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(unit) & ~(uintptr_t)15);
                const uint8_t* src = a0 + 16 * v;
                if (src < unit + ubytes) {
                    const long long left = w_end - src;
                    cp_async16(stage + (uint32_t)(r * PITCH + 16 * v), src, left >= 16 ? 16 : (int)left);
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue(i);
    pdl_wait();                                                  // x comes from the previous kernel

    const uint16_t* xr[NT];
    v3_token_rows<NT>(x, tok0, g, M, K, xr);
    float acc[1][NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
    const long long rg = row0 + g < N ? row0 + g : (long long)N - 1;
    const long long rh = row0 + 8 + g < N ? row0 + 8 + g : (long long)N - 1;

    for (int i = 0, u = p; u < nunits; ++i, u += V3_SLICES) {
        issue(i + ST - 1);
        cp_async_wait<ST - 1>();                                 // unit i's copies (this lane's) have landed
        __syncwarp();                                            // ... and every lane's
        const int valid = KQUANT ? 8 : min(8, nch - 8 * u);
        const uint32_t stage = stage0 + (uint32_t)((i % ST) * 16 * PITCH);
        const long long ug = (long long)u * Tr::UNIT;
        const uint32_t og = (uint32_t)(reinterpret_cast<uintptr_t>(w + rg * row_bytes + ug) & 15),
                       oh = (uint32_t)(reinterpret_cast<uintptr_t>(w + rh * row_bytes + ug) & 15);
        Raw cur[1][2];
        const V4Shared<A4> sg{stage + (uint32_t)(g * PITCH) + og}, sh{stage + (uint32_t)((g + 8) * PITCH) + oh};
        if (valid == 8) {                                        // a whole unit: the chunk checks fold away
            v3_read(sg, t, 8, cur[0][0]);
            v3_read(sh, t, 8, cur[0][1]);
        } else {
            v3_read(sg, t, valid, cur[0][0]);
            v3_read(sh, t, valid, cur[0][1]);
        }
        __syncwarp();                                            // the stage is free for unit i + ST
        v3_unit<QT, 1, NT>(cur, u, nch, xr, t, acc);
    }
    cp_async_wait<0>();
    v3_store<1, NT>(acc, s_part, bias, y, row0, tok0, M, N);
}

// ------------------------------------------------------------------------------------------------ v5
// v3's order and arithmetic (v3's bits: the same v3_unit_of and v3_store) with the loads and the arithmetic in different
// warps. In v3 and v4 every warp both loads and computes, and the two hardly overlap: on an H200 a Q4_K gate+up call
// takes about the time of its loads alone plus its arithmetic alone (benchmarks/results/quant_v5_ablation.md). Here
// warp 8 of a block (the producer) copies each item's bytes into a ring of S shared-memory slots with the TMA's bulk
// copies (cp.async.bulk: one instruction a row, no per-lane address arithmetic), each slot's "full" mbarrier counting
// the bytes in; warps 0..7 (the consumers: v3's slices) wait on it, read their unit, release the slot on its "empty"
// mbarrier and compute while the producer refills it. An item = (row tile, j): the tile's 16 rows x units 8j .. 8j + 7,
// warp p's unit 8j + p (v3's slice order); each row's 8 units are contiguous, one bulk copy.
//   The grid holds the GPU (the launcher: occupancy x SMs blocks, every block the same number of row tiles), and a
// block walks its row tiles blockIdx.y, blockIdx.y + gridDim.y, ..., so the producer's stream of copies runs on across
// tiles while the consumers sum a tile through shared memory (s_part has two buffers; named barrier 1, the producer
// does not take part).
//   Q4_K: the scales shared by shuffle across each row's 4 lanes (v3_unit_q4k_shared: the same values, a quarter of
// the work).
// The mbarrier and bulk-copy instructions are sm_90's (the Hopper TMA): v5 launches only there (pk_launch_v5 sends
// older GPUs to v4), and an older build compiles these to a trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define V5_SM90 1
#else
#define V5_SM90 0
#endif
__device__ __forceinline__ void mb_init(uint32_t bar, int count) {
#if V5_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void mb_init_fence() {
#if V5_SM90
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mb_expect_tx(uint32_t bar, int bytes) {
#if V5_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mb_arrive(uint32_t bar) {
#if V5_SM90
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mb_wait(uint32_t bar, int parity) {
#if V5_SM90
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar), "r"(parity) : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
#if V5_SM90
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

// a row's 8 units + 32 bytes: a multiple of 16 (the bulk copy's unit) that starts consecutive rows in different banks
template <int QT> constexpr int V5_PITCH = 8 * V3<QT>::UNIT + 32;
template <int QT, int NT, int S>
constexpr int V5_SMEM = S * 16 * V5_PITCH<QT> + 2 * V3_SLICES * NT * 32 * (int)sizeof(float4) + 2 * S * 8;

template <int QT, int NT, int S, int MINB>
__global__ void __launch_bounds__(32 * (V3_SLICES + 1), MINB)
packed_matmul_v5_kernel(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                        const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    constexpr int UNIT = Tr::UNIT, PITCH = V5_PITCH<QT>;
    constexpr bool A4 = UNIT % 4 == 0;
    extern __shared__ __align__(128) uint8_t v5_smem[];
    auto s_part = reinterpret_cast<float4(*)[V3_SLICES][NT][32]>(v5_smem + S * 16 * PITCH);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(v5_smem);
    const uint32_t bars = ring + S * 16 * PITCH + 2 * V3_SLICES * NT * 32 * (int)sizeof(float4);
    // full[s] = bars + 8 s, empty[s] = bars + 8 (S + s)
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5;
    const int nunits = K / 256, per_tile = (nunits + 7) / 8;      // K a multiple of 256 (the launcher checks)
    const long long row_bytes = (long long)nunits * UNIT;
    const int tiles = (N + 15) / 16, tile0 = (int)blockIdx.y, tile_step = (int)gridDim.y;
    const int my_tiles = tile0 < tiles ? (tiles - 1 - tile0) / tile_step + 1 : 0;
    const int items = my_tiles * per_tile;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mb_init(bars + 8 * s, 1);
            mb_init(bars + 8 * (S + s), V3_SLICES);
        }
        mb_init_fence();
    }
    __syncthreads();
    pdl_launch_dependents();

    if (p == V3_SLICES) {                                        // the producer
        int tile = tile0, j = 0;
        for (int it = 0; it < items; ++it) {
            const int s = it % S;
            if (it >= S) mb_wait(bars + 8 * (S + s), ((it / S) - 1) & 1);
            const int units = min(8, nunits - 8 * j);
            if (lane == 0) mb_expect_tx(bars + 8 * s, 16 * units * UNIT);
            __syncwarp();
            if (lane < 16) {
                const long long rr = min((long long)tile * 16 + lane, (long long)N - 1);
                bulk_copy(ring + (uint32_t)((s * 16 + lane) * PITCH), w + rr * row_bytes + (long long)8 * j * UNIT,
                          units * UNIT, bars + 8 * s);
            }
            if (++j == per_tile) {
                j = 0;
                tile += tile_step;
            }
        }
        return;
    }

    const int g = (lane >> 2), t = lane & 3;
    const long long tok0 = (long long)blockIdx.x * (8 * NT);
    pdl_wait();
    const uint16_t* xr[NT];
    v3_token_rows<NT>(x, tok0, g, M, K, xr);
    float acc[1][NT][4];
    int it = 0;
    for (int k = 0; k < my_tiles; ++k) {
        const long long row0 = (long long)(tile0 + k * tile_step) * 16;
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[0][n][0] = acc[0][n][1] = acc[0][n][2] = acc[0][n][3] = 0.0f;
        for (int j = 0; j < per_tile; ++j, ++it) {
            const int s = it % S, u = 8 * j + p;
            mb_wait(bars + 8 * s, (it / S) & 1);
            Raw cur[1][2];
            const bool mine = u < nunits;
            if (mine) {
                const uint32_t base = ring + (uint32_t)(s * 16 * PITCH + p * UNIT);
                v3_read(V4Shared<A4>{base + (uint32_t)(g * PITCH)}, t, 8, cur[0][0]);
                v3_read(V4Shared<A4>{base + (uint32_t)((g + 8) * PITCH)}, t, 8, cur[0][1]);
            }
            __syncwarp();
            if (lane == 0) mb_arrive(bars + 8 * (S + s));
            if (mine) {
                if constexpr (QT == PK_Q4_K) {
                    v3_unit_q4k_shared<NT>(cur, u, K / 32, xr, t, acc);
                } else {
                    v3_unit<QT, 1, NT>(cur, u, K / 32, xr, t, acc);
                }
            }
        }
        v3_store<1, NT, true>(acc, s_part[k & 1], bias, y, row0, tok0, M, N);
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

template <int QT, int RT, int NT>
static cudaError_t pk_launch_v3_shape(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                      cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT), row_tiles = ((long long)N + 16 * RT - 1) / (16 * RT);
    // x: 8-byte loads; Q4_K blocks: 16- and 8-byte loads (rows are whole multiples of 16 bytes)
    if (tok_tiles > 0x7fffffffLL || row_tiles > 65535 || reinterpret_cast<uintptr_t>(x) % 8 ||
        (QT == PK_Q4_K && reinterpret_cast<uintptr_t>(w) % 16))
        return cudaErrorInvalidValue;
    // token tiles fastest (as invariant.cu): the blocks that read one row tile run together and share it through L2
    return launch_kernel(packed_matmul_v3_kernel<QT, RT, NT>, dim3((unsigned)tok_tiles, (unsigned)row_tiles),
                         dim3(32 * V3_SLICES), 0, stream, pdl, (const __nv_bfloat16*)x, (const uint8_t*)w,
                         (const __nv_bfloat16*)b, (__nv_bfloat16*)y, M, N, K);
}

// v3's block shape: speed only (every shape computes the same bits). 16 rows a block (RT = 1: 32 rows took 255
// registers and spilled under nvcc 13.0, one block an SM), 16 tokens in registers past 8 (a verify pass of up to 16
// tokens reads the blocks once).
template <int QT>
static cudaError_t pk_launch_v3(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream, int pdl) {
    if (M <= 8) return pk_launch_v3_shape<QT, 1, 1>(x, w, b, y, M, N, K, stream, pdl);
    return pk_launch_v3_shape<QT, 1, 2>(x, w, b, y, M, N, K, stream, pdl);
}

template <int QT, int NT, bool A4>
static cudaError_t pk_launch_v4_shape(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                      cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT), row_tiles = ((long long)N + 15) / 16;
    if (tok_tiles > 0x7fffffffLL || row_tiles > 65535 || reinterpret_cast<uintptr_t>(x) % 8 ||
        reinterpret_cast<uintptr_t>(w) % 16)
        return cudaErrorInvalidValue;
    static bool sized = false;                   // once per instantiation, before any capture (warm-up runs first)
    if (!sized) {
        const cudaError_t e = cudaFuncSetAttribute(packed_matmul_v4_kernel<QT, NT, A4>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, V4_SMEM<QT>);
        if (e != cudaSuccess) return e;
        sized = true;
    }
    return launch_kernel(packed_matmul_v4_kernel<QT, NT, A4>, dim3((unsigned)tok_tiles, (unsigned)row_tiles),
                         dim3(32 * V3_SLICES), (unsigned)V4_SMEM<QT>, stream, pdl, (const __nv_bfloat16*)x,
                         (const uint8_t*)w, (const __nv_bfloat16*)b, (__nv_bfloat16*)y, M, N, K);
}

// v4, or v3's kernel (the same bits) for the Q4_K matrices of 2^26 weights and more: their 16- and 8-byte aligned
// blocks already load well straight from global memory, and the staging costs more than it saves there (H100:
// benchmarks/results/quant.md, 8B gate+up 40.6 us in v3 vs 44.7 in v4; q/o 9.6 vs 8.6).
// Past 16 rows of x a block holds 32 tokens (NT = 4): a wide pass (a batch's verification, B x (k + 1) rows) reads
// each weight once per 32 tokens instead of once per 16; the tokens' arithmetic is the same.
template <int QT>
static cudaError_t pk_launch_v4(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream, int pdl) {
    if (QT == PK_Q4_K && M <= 16 && (long long)N * K >= (1LL << 26))
        return pk_launch_v3<QT>(x, w, b, y, M, N, K, stream, pdl);
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K, A4T = V3<QT>::UNIT % 4 == 0;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : K / 32) * V3<QT>::BLOCK;
    const bool a4 = row_bytes % 4 == 0 && A4T;
    if (M > 16 && a4 == A4T) return pk_launch_v4_shape<QT, 4, A4T>(x, w, b, y, M, N, K, stream, pdl);
    if (a4) {                                    // every unit starts at a multiple of 4 bytes (not Q6_K's)
        if (M <= 8) return pk_launch_v4_shape<QT, 1, true>(x, w, b, y, M, N, K, stream, pdl);
        return pk_launch_v4_shape<QT, 2, true>(x, w, b, y, M, N, K, stream, pdl);
    }
    if (M <= 8) return pk_launch_v4_shape<QT, 1, false>(x, w, b, y, M, N, K, stream, pdl);
    return pk_launch_v4_shape<QT, 2, false>(x, w, b, y, M, N, K, stream, pdl);
}

// A walker grid's height (gridDim.y): as many row-tile walkers a token tile as are resident at once (``occupancy``
// blocks an SM of ``kernel`` with ``threads`` and ``smem`` bytes, looked up into the caller's per-instantiation
// static the first time, before any capture), cut so that every walker has the same number of row tiles.
template <typename Kernel>
static cudaError_t pk_walkers(Kernel kernel, int threads, int smem, long long tok_tiles, long long row_tiles,
                              std::atomic<int>& occupancy, unsigned& walkers) {
    if (occupancy.load(std::memory_order_relaxed) == 0) {
        int blocks = 0;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
        if (e != cudaSuccess) return e;
        if (blocks < 1) return cudaErrorInvalidConfiguration;
        occupancy.store(blocks, std::memory_order_relaxed);
    }
    VsDevice d{};
    const cudaError_t e = vs_device(d);
    if (e != cudaSuccess) return e;
    const long long slots = std::max(1LL, (long long)occupancy.load(std::memory_order_relaxed) * d.sms / tok_tiles);
    const long long per = (row_tiles + slots - 1) / slots;
    walkers = (unsigned)std::min(65535LL, (row_tiles + per - 1) / per);
    return cudaSuccess;
}

template <int QT, int NT, int S, int MINB>
static cudaError_t pk_launch_v5_shape(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                      cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT), row_tiles = ((long long)N + 15) / 16;
    const long long row_bytes = (long long)(K / 256) * V3<QT>::UNIT;
    // bulk copies: 16-byte aligned rows and 8-unit segments, whole units (K a multiple of 256)
    static_assert((8 * V3<QT>::UNIT) % 16 == 0, "a row's 8 units are whole 16-byte vectors");
    if (tok_tiles > 0x7fffffffLL || reinterpret_cast<uintptr_t>(x) % 8 || reinterpret_cast<uintptr_t>(w) % 16 ||
        K % 256 || row_bytes % 16 || ((K / 256) % 8) * V3<QT>::UNIT % 16)
        return cudaErrorInvalidValue;
    constexpr int smem = V5_SMEM<QT, NT, S>;
    auto kernel = packed_matmul_v5_kernel<QT, NT, S, MINB>;
    static std::atomic<int> occupancy{0};        // once per instantiation, before any capture (warm-up runs first)
    unsigned walkers = 0;
    const cudaError_t e = pk_walkers(kernel, 32 * (V3_SLICES + 1), smem, tok_tiles, row_tiles, occupancy, walkers);
    if (e != cudaSuccess) return e;
    return launch_kernel(kernel, dim3((unsigned)tok_tiles, walkers), dim3(32 * (V3_SLICES + 1)), (unsigned)smem,
                         stream, pdl, (const __nv_bfloat16*)x, (const uint8_t*)w, (const __nv_bfloat16*)b,
                         (__nv_bfloat16*)y, M, N, K);
}

// v5 for Q4_K and Q6_K, and Q8_0 at one row of x; v4 where v5 does not apply or does not pay (H200,
// benchmarks/results/quant_v5_ablation.md): other types, Q8_0 at more rows (its x loads for several tokens cost more
// than v5 saves: 8B gate+up at M = 5 65.0 us vs v4's 57.3), fewer than 2048 rows of W (64 row tiles leave most SMs
// idle: 8B k/v 4.2 us vs 3.8), K not a multiple of 256, rows or 8-unit segments that are not whole 16-byte vectors
// (the bulk copy's unit), more than 16 rows of x, a GPU older than sm_90.
// S = 3 slots, registers for 2 blocks an SM: the fastest of the configurations timed (quant_v5_ablation.md).
template <int QT, int S = 3, int MINB = 2>
static cudaError_t pk_launch_v5(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream, int pdl) {
    constexpr bool V5_TYPE = QT == PK_Q4_K || QT == PK_Q6_K || QT == PK_Q8_0;
    if constexpr (!V5_TYPE) {
        return pk_launch_v4<QT>(x, w, b, y, M, N, K, stream, pdl);
    } else {
        const long long row_bytes = (long long)(K / 256) * V3<QT>::UNIT;
        const bool fits = K % 256 == 0 && row_bytes % 16 == 0 && ((K / 256) % 8) * V3<QT>::UNIT % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 8 == 0;
        if (!fits || M > 16 || N < 2048 || (QT == PK_Q8_0 && M > 1) || !vs_sm90())
            return pk_launch_v4<QT>(x, w, b, y, M, N, K, stream, pdl);
        if (M <= 8) return pk_launch_v5_shape<QT, 1, S, MINB>(x, w, b, y, M, N, K, stream, pdl);
        return pk_launch_v5_shape<QT, 2, S, MINB>(x, w, b, y, M, N, K, stream, pdl);
    }
}

template <typename T, int QT, int QK, int TYPE_SIZE>
static cudaError_t pk_launch(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int variant,
                             cudaStream_t stream, int pdl) {
    if constexpr (!std::is_same<T, __nv_bfloat16>::value) {   // v2 and v3 are built for bf16 (the GPU models' dtype)
        return pk_launch_v1<T, QT, QK, TYPE_SIZE>(x, w, b, y, M, N, K, stream);   // only: fewer kernels to compile
    } else {
        if (variant == 1) return pk_launch_v1<T, QT, QK, TYPE_SIZE>(x, w, b, y, M, N, K, stream);
        if (variant == 3) return pk_launch_v3<QT>(x, w, b, y, M, N, K, stream, pdl);
        if (variant == 4) return pk_launch_v4<QT>(x, w, b, y, M, N, K, stream, pdl);
        if (variant == 5) return pk_launch_v5<QT>(x, w, b, y, M, N, K, stream, pdl);
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
                               int variant, cudaStream_t stream, int pdl) {
    switch (qtype) {
        case PK_Q4_0: return pk_launch<T, PK_Q4_0, 32, 18>(x, w, b, y, M, N, K, variant, stream, pdl);
        case PK_Q4_1: return pk_launch<T, PK_Q4_1, 32, 20>(x, w, b, y, M, N, K, variant, stream, pdl);
        case PK_Q8_0: return pk_launch<T, PK_Q8_0, 32, 34>(x, w, b, y, M, N, K, variant, stream, pdl);
        case PK_Q4_K: return pk_launch<T, PK_Q4_K, 256, 144>(x, w, b, y, M, N, K, variant, stream, pdl);
        case PK_Q6_K: return pk_launch<T, PK_Q6_K, 256, 210>(x, w, b, y, M, N, K, variant, stream, pdl);
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

// The variant vs_packed_matmul / vs_packed_dequantize run for variant = 0: v5 (v3's bits; H200, benchmarks/results/
// quant_v5_ablation.md: the 8B matmuls at one row 1.08x v4 in Q4_K, 1.37-1.43x in Q6_K, 1.12-1.22x in Q8_0). It
// runs v1 for fp32 / fp16 activations.
extern "C" int vs_packed_default_variant() { return 5; }

// y[M, N] = x[M, K] @ W^T (+ b), W as blocks of GGML type qtype, rows of K weights. x, b, y of one dtype (fp32,
// bf16, fp16), contiguous; variant 0 (the default), 1 or 2 (the same bits), 3, 4 or 5 (v3's bits); pdl: v3 / v4 / v5
// launched with programmatic dependent launch. cudaErrorInvalidValue (nothing launched) for an unknown type, dtype or
// variant, K not a whole number of blocks, too many rows of x (v1, v2) or of W (v3, v4: N > 16 * 65535) for the
// grid, (v2) x not 16-byte aligned, (v3) x not 8-byte or Q4_K blocks not 16-byte aligned, or (v4, v5) x not 8-byte or
// the blocks not 16-byte aligned.
extern "C" cudaError_t vs_packed_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int qtype,
                                        int M, int N, int K, int variant, cudaStream_t stream, int pdl) {
    const int qk = vs_packed_block_size(qtype);
    variant = variant == 0 ? vs_packed_default_variant() : variant;
    if (qk == 0 || M < 1 || N < 0 || K < qk || K % qk != 0 || variant < 1 || variant > 5) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    switch (dtype) {
        case VS_F32: return pk_dispatch<float>(qtype, x, w, b, y, M, N, K, variant, stream, pdl);
        case VS_BF16: return pk_dispatch<__nv_bfloat16>(qtype, x, w, b, y, M, N, K, variant, stream, pdl);
        case VS_F16: return pk_dispatch<__half>(qtype, x, w, b, y, M, N, K, variant, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// out[N, K] (dtype, contiguous, 16-byte aligned) = W dequantized: the GEMV's weight values rounded once to dtype
// (the prefill's dense copy for a tensor-core GEMM). Errors as vs_packed_matmul.
extern "C" cudaError_t vs_packed_dequantize(const void* w, void* out, int dtype, int qtype, int N, int K, int variant,
                                            cudaStream_t stream) {
    const int qk = vs_packed_block_size(qtype);
    variant = variant == 0 ? vs_packed_default_variant() : variant;
    if (qk == 0 || N < 0 || K < qk || K % qk != 0 || variant < 1 || variant > 5) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    switch (dtype) {
        case VS_F32: return pk_dequantize_dispatch<float>(qtype, w, out, N, K, variant, stream);
        case VS_BF16: return pk_dequantize_dispatch<__nv_bfloat16>(qtype, w, out, N, K, variant, stream);
        case VS_F16: return pk_dequantize_dispatch<__half>(qtype, w, out, N, K, variant, stream);
        default: return cudaErrorInvalidValue;
    }
}
