// packed_v5.cu: the ablation behind packed.cu's v5 (benchmarks/packed_v5.py runs it; results in
// benchmarks/results/quant_v5_ablation.md). packed.cu is included whole, so its vs_packed_matmul (v3, v4, v5) and v5's
// kernel in other configurations (ab_v5) are here, beside two experimental kernels that compute v3's bits too and were
// not faster than v3 / v4, so they live here only:
//   walk      v4's shared-memory stages, a grid that holds the GPU (each block walks row tiles), shared Q4_K scales;
//   walk_reg  the same walker with v3's register loads, and its loads alone / its arithmetic alone (where time goes).
// Built alone into a shared library by nvcc (no torch), called through ctypes.
#include "packed.cu"

#include <algorithm>

// ------------------------------------------------------------------------------------------------ walk
// walk: v3's order and arithmetic (v3's bits: the same v3_unit_of and v3_store), v4's staging through shared memory, and a
// grid that holds the GPU instead of one block per 16 rows. v4's block owns one row tile: on a decode-shaped matrix a
// warp has 2 units of it (K = 4096), so its copies are issued, waited for and computed once and the block exits; the
// memory pipe drains at every block's end. walk's grid is what fits on the SMs at once (``pk_launch_walk``: the
// occupancy times the SM count, split so that every block has the same number of row tiles), and each block walks
// its row tiles blockIdx.y, blockIdx.y + gridDim.y, ...: a warp's units of all of them are ONE stream of copies, ST
// units ahead, running on while the block sums one tile through shared memory (s_part has two buffers, one
// __syncthreads a tile) and starts the next.
//   SHARE (Q4_K): the scale and min of a sub-block are the same for the 4 lanes of a row; lane (g, t) computes those
// of sub-blocks 2t and 2t + 1 of rows g and g + 8 (v3_q4k_scales, dequantize.py's products) and the others read them
// with a shuffle: 4 shuffles a chunk instead of about 40 integer and float instructions (a decode-shaped Q4_K matrix
// is instruction-bound, not memory-bound, on v3's arithmetic). The same values, so the same bits.
// ST: stages a warp (units in flight); MINB: blocks an SM the registers are sized for (launch bounds).
template <int QT, int NT, int ST>
constexpr int WALK_SMEM = V3_SLICES * ST * 16 * V4_PITCH<QT> + 2 * V3_SLICES * NT * 32 * (int)sizeof(float4);

template <int QT, int NT, bool A4, int ST, int MINB, bool SHARE>
__global__ void __launch_bounds__(32 * V3_SLICES, MINB)
packed_matmul_walk_kernel(const __nv_bfloat16* __restrict__ x,     // [M, K]
                          const uint8_t* __restrict__ w,           // [N, row bytes], 16-byte aligned
                          const __nv_bfloat16* __restrict__ bias,  // [N] or nullptr
                          __nv_bfloat16* __restrict__ y,           // [M, N]
                          int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K;
    constexpr int PITCH = V4_PITCH<QT>, VECS = V4_WIN<QT> / 16, STAGE = 16 * PITCH;
    extern __shared__ __align__(16) uint8_t walk_smem[];          // [V3_SLICES][ST][16 rows][PITCH], s_part[2]
    auto s_part = reinterpret_cast<float4(*)[V3_SLICES][NT][32]>(walk_smem + V3_SLICES * ST * STAGE);
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long tok0 = (long long)blockIdx.x * (8 * NT);
    const int nch = K / 32, nunits = (nch + 7) / 8;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : nch) * Tr::BLOCK;
    const uint8_t* const w_end = w + (long long)N * row_bytes;
    const int tiles = (N + 15) / 16, tile0 = (int)blockIdx.y, tile_step = (int)gridDim.y;
    const int upw = p < nunits ? (nunits - 1 - p) / V3_SLICES + 1 : 0;          // units of a row this warp owns
    const int my_tiles = tile0 < tiles ? (tiles - 1 - tile0) / tile_step + 1 : 0;
    const int items = my_tiles * upw;                                              // the warp's stream of units
    const uint32_t stage0 = (uint32_t)__cvta_generic_to_shared(walk_smem) + (uint32_t)(p * ST * STAGE);
    pdl_launch_dependents();

    // the next item of the stream to copy in: (row tile, the warp's j-th unit of its rows), one commit group an item
    // (empty past the last, so that the wait counts stay fixed). Lanes 2r and 2r + 1 copy row r of the tile, the even
    // and the odd 16-byte vectors of its window (together whole 32-byte sectors); the row's address is computed once a
    // tile, so a copy costs an add, a bound check and the cp.async.
    const int copy_row = lane >> 1, copy_half = lane & 1;
    int next = 0, next_tile = tile0, next_j = 0;
    const uint8_t* copy_src = w + min((long long)tile0 * 16 + copy_row, (long long)N - 1) * row_bytes;
    auto issue = [&]() {
        if (next < items) {
            const int u = p + V3_SLICES * next_j;
            const int ubytes = KQUANT ? Tr::UNIT : min(8, nch - 8 * u) * Tr::BLOCK;
            const uint32_t dst = stage0 + (uint32_t)((next % ST) * STAGE + copy_row * PITCH + 16 * copy_half);
            const uint8_t* unit = copy_src + (long long)u * Tr::UNIT;
            const uint8_t* a0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(unit) & ~(uintptr_t)15);
#pragma unroll
            for (int c = 0; c < (VECS + 1) / 2; ++c) {
                const uint8_t* src = a0 + 16 * (2 * c + copy_half);
                if (src < unit + ubytes) {
                    const long long left = w_end - src;
                    cp_async16(dst + (uint32_t)(32 * c), src, left >= 16 ? 16 : (int)left);
                }
            }
            if (++next_j == upw) {
                next_j = 0;
                next_tile += tile_step;
                copy_src = w + min((long long)next_tile * 16 + copy_row, (long long)N - 1) * row_bytes;
            }
        }
        ++next;
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue();
    pdl_wait();                                                  // x comes from the previous kernel

    const uint16_t* xr[NT];
    v3_token_rows<NT>(x, tok0, g, M, K, xr);
    float acc[1][NT][4];
    int i = 0;                                                   // the stream's item computed next
    for (int k = 0; k < my_tiles; ++k) {
        const long long row0 = (long long)(tile0 + k * tile_step) * 16;
        const long long rg = row0 + g < N ? row0 + g : (long long)N - 1;
        const long long rh = row0 + 8 + g < N ? row0 + 8 + g : (long long)N - 1;
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
        for (int u = p; u < nunits; ++i, u += V3_SLICES) {
            issue();
            cp_async_wait<ST - 1>();                             // item i's copies (this lane's) have landed
            __syncwarp();                                        // ... and every lane's
            const int valid = KQUANT ? 8 : min(8, nch - 8 * u);
            const uint32_t stage = stage0 + (uint32_t)((i % ST) * STAGE);
            const long long ug = (long long)u * Tr::UNIT;
            const uint32_t og = (uint32_t)(reinterpret_cast<uintptr_t>(w + rg * row_bytes + ug) & 15),
                           oh = (uint32_t)(reinterpret_cast<uintptr_t>(w + rh * row_bytes + ug) & 15);
            Raw cur[1][2];
            const V4Shared<A4> sg{stage + (uint32_t)(g * PITCH) + og}, sh{stage + (uint32_t)((g + 8) * PITCH) + oh};
            if (valid == 8) {
                v3_read(sg, t, 8, cur[0][0]);
                v3_read(sh, t, 8, cur[0][1]);
            } else {
                v3_read(sg, t, valid, cur[0][0]);
                v3_read(sh, t, valid, cur[0][1]);
            }
            __syncwarp();                                        // the stage is free for item i + ST
            if constexpr (QT == PK_Q4_K && SHARE) {
                v3_unit_q4k_shared<NT>(cur, u, nch, xr, t, acc);
            } else {
                v3_unit<QT, 1, NT>(cur, u, nch, xr, t, acc);
            }
        }
        v3_store<1, NT>(acc, s_part[k & 1], bias, y, row0, tok0, M, N);
    }
    cp_async_wait<0>();
}

// walk_reg: walk's walker with v3's register loads (each lane reads its own bytes of the next item straight from global
// memory while it computes the current one) instead of the shared-memory stages. The same items, the same bits.
template <int QT, int NT, int MINB, bool SHARE, int MODE = 0, int PF = 0>
__global__ void __launch_bounds__(32 * V3_SLICES, MINB)
packed_matmul_walk_reg_kernel(const __nv_bfloat16* __restrict__ x,     // [M, K]
                              const uint8_t* __restrict__ w,           // [N, row bytes]
                              const __nv_bfloat16* __restrict__ bias,  // [N] or nullptr
                              __nv_bfloat16* __restrict__ y,           // [M, N]
                              int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K;
    __shared__ float4 s_part[2][V3_SLICES][NT][32];
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long tok0 = (long long)blockIdx.x * (8 * NT);
    const int nch = K / 32, nunits = (nch + 7) / 8;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : nch) * Tr::BLOCK;
    const int tiles = (N + 15) / 16, tile0 = (int)blockIdx.y, tile_step = (int)gridDim.y;
    const int upw = p < nunits ? (nunits - 1 - p) / V3_SLICES + 1 : 0;
    const int my_tiles = tile0 < tiles ? (tiles - 1 - tile0) / tile_step + 1 : 0;
    const int items = my_tiles * upw;
    pdl_launch_dependents();

    // item (tile, j) -> rows g and g + 8 of the tile, the warp's j-th unit
    int next_tile = tile0, next_j = 0;
    auto load = [&](int item, Raw (&r)[1][2]) {
        if (item < items) {
            const int u = p + V3_SLICES * next_j;
            const int valid = KQUANT ? 8 : min(8, nch - 8 * u);
            const long long row0 = (long long)next_tile * 16;
            const long long rg = row0 + g < N ? row0 + g : (long long)N - 1;
            const long long rh = row0 + 8 + g < N ? row0 + 8 + g : (long long)N - 1;
            v3_load(w + rg * row_bytes + (long long)u * Tr::UNIT, t, valid, r[0][0]);
            v3_load(w + rh * row_bytes + (long long)u * Tr::UNIT, t, valid, r[0][1]);
            if (++next_j == upw) {
                next_j = 0;
                next_tile += tile_step;
            }
        }
    };
    // PF > 0: item i + PF pulled into L2 while item i + 1 is loaded (lane t: 128 bytes of row g (t < 2) or g + 8)
    int pf_tile = tile0, pf_j = 0;
    auto prefetch = [&](int item) {
        if (item < items) {
            const int u = p + V3_SLICES * pf_j;
            const long long row0 = (long long)pf_tile * 16, rr = row0 + g + (t >= 2 ? 8 : 0);
            if (rr < N) prefetch_l2(w + rr * row_bytes + (long long)u * Tr::UNIT + 128 * (t & 1));
            if (++pf_j == upw) {
                pf_j = 0;
                pf_tile += tile_step;
            }
        }
    };
    Raw cur[1][2];
    if constexpr (PF > 0) {
#pragma unroll
        for (int a = 0; a < PF; ++a) prefetch(a);
    }
    load(0, cur);
    pdl_wait();                                                  // x comes from the previous kernel

    const uint16_t* xr[NT];
    v3_token_rows<NT>(x, tok0, g, M, K, xr);
    float acc[1][NT][4];
    int i = 0;
    for (int k = 0; k < my_tiles; ++k) {
        const long long row0 = (long long)(tile0 + k * tile_step) * 16;
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
        for (int u = p; u < nunits; ++i, u += V3_SLICES) {
            Raw nxt[1][2];
            if constexpr (MODE == 2) {
                nxt[0][0] = cur[0][0];
                nxt[0][1] = cur[0][1];
            } else {
                if constexpr (PF > 0) prefetch(i + PF);
                load(i + 1, nxt);
            }
            if constexpr (MODE == 1) {
                const uint32_t* a = reinterpret_cast<const uint32_t*>(&cur[0][0]);
                const uint32_t* b = reinterpret_cast<const uint32_t*>(&cur[0][1]);
                uint32_t h = 0;
#pragma unroll
                for (int e = 0; e < (int)(sizeof(Raw) / 4); ++e) h ^= a[e] ^ b[e];
                acc[0][0][0] += __uint_as_float(h & 0x007fffffu);
            } else if constexpr (QT == PK_Q4_K && SHARE) {
                v3_unit_q4k_shared<NT>(cur, u, nch, xr, t, acc);
            } else {
                v3_unit<QT, 1, NT>(cur, u, nch, xr, t, acc);
            }
            cur[0][0] = nxt[0][0];
            cur[0][1] = nxt[0][1];
        }
        v3_store<1, NT>(acc, s_part[k & 1], bias, y, row0, tok0, M, N);
    }
}

// walk's grid: packed.cu's walkers (pk_walkers), as v5's.
template <int QT, int NT, bool A4, int ST, int MINB, bool SHARE>
static cudaError_t pk_launch_walk_shape(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                        cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT), row_tiles = ((long long)N + 15) / 16;
    if (tok_tiles > 0x7fffffffLL || reinterpret_cast<uintptr_t>(x) % 8 || reinterpret_cast<uintptr_t>(w) % 16)
        return cudaErrorInvalidValue;
    constexpr int smem = WALK_SMEM<QT, NT, ST>;
    auto kernel = packed_matmul_walk_kernel<QT, NT, A4, ST, MINB, SHARE>;
    static std::atomic<int> occupancy{0};
    unsigned walkers = 0;
    const cudaError_t e = pk_walkers(kernel, 32 * V3_SLICES, smem, tok_tiles, row_tiles, occupancy, walkers);
    if (e != cudaSuccess) return e;
    return launch_kernel(kernel, dim3((unsigned)tok_tiles, walkers), dim3(32 * V3_SLICES), (unsigned)smem,
                         stream, pdl, (const __nv_bfloat16*)x, (const uint8_t*)w, (const __nv_bfloat16*)b,
                         (__nv_bfloat16*)y, M, N, K);
}

template <int QT, int NT, int MINB, bool SHARE, int MODE = 0, int PF = 0>
static cudaError_t pk_launch_walk_reg_shape(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                            cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT), row_tiles = ((long long)N + 15) / 16;
    if (tok_tiles > 0x7fffffffLL || reinterpret_cast<uintptr_t>(x) % 8 ||
        (QT == PK_Q4_K && reinterpret_cast<uintptr_t>(w) % 16))
        return cudaErrorInvalidValue;
    auto kernel = packed_matmul_walk_reg_kernel<QT, NT, MINB, SHARE, MODE, PF>;
    static std::atomic<int> occupancy{0};
    unsigned walkers = 0;
    const cudaError_t e = pk_walkers(kernel, 32 * V3_SLICES, 0, tok_tiles, row_tiles, occupancy, walkers);
    if (e != cudaSuccess) return e;
    return launch_kernel(kernel, dim3((unsigned)tok_tiles, walkers), dim3(32 * V3_SLICES), 0, stream, pdl,
                         (const __nv_bfloat16*)x, (const uint8_t*)w, (const __nv_bfloat16*)b, (__nv_bfloat16*)y, M, N,
                         K);
}

template <int QT, int MINB, bool SHARE, int MODE = 0, int PF = 0>
static cudaError_t pk_launch_walk_reg(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                 cudaStream_t stream, int pdl) {
    if (M <= 8) return pk_launch_walk_reg_shape<QT, 1, MINB, SHARE, MODE, PF>(x, w, b, y, M, N, K, stream, pdl);
    return pk_launch_walk_reg_shape<QT, 2, MINB, SHARE, MODE, PF>(x, w, b, y, M, N, K, stream, pdl);
}

template <int QT, class C>
static cudaError_t pk_launch_walk(const void* x, const void* w, const void* b, void* y, int M, int N, int K,
                                cudaStream_t stream, int pdl) {
    constexpr bool KQUANT = QT == PK_Q4_K || QT == PK_Q6_K, A4T = V3<QT>::UNIT % 4 == 0;
    const long long row_bytes = (long long)(KQUANT ? K / 256 : K / 32) * V3<QT>::BLOCK;
    const bool a4 = row_bytes % 4 == 0 && A4T;
    if (M > 16 && a4 == A4T)
        return pk_launch_walk_shape<QT, 4, A4T, C::ST, 1, C::SHARE>(x, w, b, y, M, N, K, stream, pdl);
    if (a4) {
        if (M <= 8) return pk_launch_walk_shape<QT, 1, true, C::ST, C::MINB, C::SHARE>(x, w, b, y, M, N, K, stream, pdl);
        return pk_launch_walk_shape<QT, 2, true, C::ST, C::MINB, C::SHARE>(x, w, b, y, M, N, K, stream, pdl);
    }
    if (M <= 8) return pk_launch_walk_shape<QT, 1, false, C::ST, C::MINB, C::SHARE>(x, w, b, y, M, N, K, stream, pdl);
    return pk_launch_walk_shape<QT, 2, false, C::ST, C::MINB, C::SHARE>(x, w, b, y, M, N, K, stream, pdl);
}

template <int ST_, int MINB_, bool SHARE_>
struct WalkCfg {
    static constexpr int ST = ST_, MINB = MINB_;
    static constexpr bool SHARE = SHARE_;
};

template <class C>
static cudaError_t ab_dispatch(int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                               cudaStream_t stream, int pdl) {
    switch (qtype) {
        case PK_Q4_K: return pk_launch_walk<PK_Q4_K, C>(x, w, nullptr, y, M, N, K, stream, pdl);
        case PK_Q6_K: return pk_launch_walk<PK_Q6_K, C>(x, w, nullptr, y, M, N, K, stream, pdl);
        case PK_Q8_0: return pk_launch_walk<PK_Q8_0, C>(x, w, nullptr, y, M, N, K, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// walk's and walk_reg's configurations, in the order packed_v5.py names them (WALKS there).
extern "C" int ab_num_configs() { return 10; }


template <int MINB, bool SHARE, int MODE = 0, int PF = 0>
static cudaError_t ab_registers(int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                                cudaStream_t stream, int pdl) {
    switch (qtype) {
        case PK_Q4_K: return pk_launch_walk_reg<PK_Q4_K, MINB, SHARE, MODE, PF>(x, w, nullptr, y, M, N, K, stream, pdl);
        case PK_Q6_K: return pk_launch_walk_reg<PK_Q6_K, MINB, SHARE, MODE, PF>(x, w, nullptr, y, M, N, K, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t ab_walk(int config, int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                             cudaStream_t stream, int pdl) {
    switch (config) {
        case 0: return ab_dispatch<WalkCfg<3, 2, true>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 1: return ab_dispatch<WalkCfg<3, 2, false>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 2: return ab_dispatch<WalkCfg<2, 3, true>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 3: return ab_dispatch<WalkCfg<2, 4, true>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 4: return ab_dispatch<WalkCfg<4, 2, true>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 5: return ab_dispatch<WalkCfg<2, 2, true>>(qtype, x, w, y, M, N, K, stream, pdl);
        case 6: return ab_registers<2, true>(qtype, x, w, y, M, N, K, stream, pdl);
        case 7: return ab_registers<2, false>(qtype, x, w, y, M, N, K, stream, pdl);
        case 8: return ab_registers<2, true, 0, 2>(qtype, x, w, y, M, N, K, stream, pdl);
        case 9: return ab_registers<2, true, 0, 4>(qtype, x, w, y, M, N, K, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// walk_reg/2b/share with its loads only (1: each unit's bytes folded into one word, no arithmetic) or its arithmetic only
// (2: the first unit loaded once and computed for every item): where the time of a call goes. Wrong outputs.
extern "C" cudaError_t ab_walk_reg_part(int mode, int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                                   cudaStream_t stream, int pdl) {
    if (mode == 1) return ab_registers<2, true, 1>(qtype, x, w, y, M, N, K, stream, pdl);
    if (mode == 3) return ab_registers<2, true, 1, 4>(qtype, x, w, y, M, N, K, stream, pdl);
    if (mode == 2) return ab_registers<2, true, 2>(qtype, x, w, y, M, N, K, stream, pdl);
    return cudaErrorInvalidValue;
}

// packed.cu's v5 kernel itself (no fallback to v4) with S slots and the register budget of MINB blocks an SM
template <int QT, int S, int MINB>
static cudaError_t ab_v5_rows(const void* x, const void* w, void* y, int M, int N, int K, cudaStream_t stream, int pdl) {
    if (M <= 8) return pk_launch_v5_shape<QT, 1, S, MINB>(x, w, nullptr, y, M, N, K, stream, pdl);
    return pk_launch_v5_shape<QT, 2, S, MINB>(x, w, nullptr, y, M, N, K, stream, pdl);
}

template <int S, int MINB>
static cudaError_t ab_v5_type(int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                              cudaStream_t stream, int pdl) {
    switch (qtype) {
        case PK_Q4_K: return ab_v5_rows<PK_Q4_K, S, MINB>(x, w, y, M, N, K, stream, pdl);
        case PK_Q6_K: return ab_v5_rows<PK_Q6_K, S, MINB>(x, w, y, M, N, K, stream, pdl);
        case PK_Q8_0: return ab_v5_rows<PK_Q8_0, S, MINB>(x, w, y, M, N, K, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// packed.cu's v5 kernel in configuration c of packed_v5.py's V5 (packed.cu's default: c = 2)
extern "C" cudaError_t ab_v5(int config, int qtype, const void* x, const void* w, void* y, int M, int N, int K,
                             cudaStream_t stream, int pdl) {
    switch (config) {
        case 0: return ab_v5_type<4, 2>(qtype, x, w, y, M, N, K, stream, pdl);
        case 1: return ab_v5_type<6, 1>(qtype, x, w, y, M, N, K, stream, pdl);
        case 2: return ab_v5_type<3, 2>(qtype, x, w, y, M, N, K, stream, pdl);
        case 3: return ab_v5_type<2, 3>(qtype, x, w, y, M, N, K, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}
