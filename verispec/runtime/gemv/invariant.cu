// invariant.cu: y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) for bf16 / fp16, any number of rows M, with every
// output element reduced in ONE order that does not depend on M, on the row's position, or on the launch
// shape. This is the batch-invariant matmul of the decode / verify pass: a token's logits come out bit for
// bit the same whether it is scored alone (a decode step, M = 1), inside a verification pass of k + 1
// tokens, or beside 63 other sequences, so greedy speculative output equals plain decoding in bf16.
//
// The order (the contract; every variant below computes exactly this):
//   * K is cut into steps of 32 columns (step s = columns [32 s, 32 s + 32); past K reads as zero);
//   * S slices (S in {1, 2, 4, 8}, a function of K alone: vs_inv_slices); step s belongs to slice s % S;
//   * slice p's partial sum P_p is a chain of tensor-core MMAs (mma.sync m16n8k16, fp32 accumulate) over its
//     steps in increasing s, starting from 0; a step is two MMAs of 16 k each under gemv.cu v2's k
//     permutation (lane (g, t) holds columns 32 s + 8 t + {0..3} for MMA 1 and + {4..7} for MMA 2);
//   * y = ((0 + P_0) + P_1) + ... + P_{S-1}, then + b, rounded once to T.
// An MMA computes each output element from its own row of A and column of B only, so a token's result does
// not depend on which column of the n = 8 tile it occupies, nor on the other tokens (the columns past M
// repeat token M - 1 and are never stored).
//
// Variants (what may change with M: only speed), two kernels:
// * the slice-warp kernel (variants 1-12, 17-20): a block is S warps, warp p = slice p, all on one tile of 16 * RT
//   rows of W and 8 * NT tokens; grid = (token tiles, row tiles), token tiles fastest, so the blocks that read one
//   row tile run together and share it through L2 when M > 8 * NT.
//     RT  m16 tiles (16 rows of W each) per warp: more rows per x vector (x reuse), more W loads in flight;
//     NT  n8 tiles (8 tokens each) per warp: 8 * NT tokens per weight read;
//     U   steps per unrolled loop iteration: 2 * RT * U 16-byte W loads in flight per lane.
//   W is streamed once with 16-byte ld.global.nc.L1::no_allocate loads; x through L1 (__ldg), where the blocks of
//   an SM working on nearby steps find it. Under programmatic dependent launch each warp prefetches its first U
//   steps of W into L2 before waiting for x (the previous kernel's output). The partial sums meet in shared
//   memory: fragments (RT * NT of them, float4 per lane) in chunks of <= 8; the block's threads then each sum one
//   (fragment, lane) over p = 0, 1, ..., S - 1 in order, add the bias, round and store.
// * the cluster kernel (variants 13-16, sm_90): a thread-block cluster of S blocks on one tile of 16 * RT * WR rows
//   of W and 8 * NT tokens, block p computing slice p for the whole tile with WR warps (warp w: RT m16 tiles), its
//   steps' W and x lines staged by the block through a cp.async ring of U stages (each W element and x token read
//   once by the block, where the slice-warp kernel's warps each load x); the S partials meet through distributed
//   shared memory, block p summing a 1/S share of the tile's fragments over q = 0, 1, ..., S - 1 in order.
//
// Where it stands (benchmarks/results/exact.md, H100; invariant_cluster.md, H200): M <= 32 rows within
// 0.85-1.2x cuBLAS (decode: 93-96% of gemv.cu v1, which is exact only at B = 1); past 32 rows the slice-warp
// kernel re-reads x[8 NT tokens, K] for only 16 RT rows of W (M = 64 about 1.4-1.7x cuBLAS, M = 160 about 3.5x), and
// the cluster kernel is 1.1-1.3x faster than it on the wide matrices (qkv, gate/up, lm_head), still 1.6-4x cuBLAS
// at 64-256 rows: each block walks only K / S of the steps, so its ring's fill and drain and the cluster's
// reduction are a large share of its life. Tried and measured slower (git history): a slice-major pass over K in
// one block (commit 27d9bae; again on 2026-11-29 as a tiled kernel computing the S slices one after another with
// two accumulator tiles: 2-7x slower, too few blocks for the bandwidth), contiguous slices (785af21; decode
// 1.2-1.4x slower: each warp streams a separate region of a row), and the cluster kernel on 16-token tiles for
// 9-16 rows (2026-11-29, H200, 13 rows: 1.1-1.5x slower than variants 5 / 6 on every 8B and 1B matrix, e.g. 8B down
// 48 vs 43 us; there 13 rows cost the 8B down 43 us against 32 at one row), and two warp groups a block on adjacent
// 16-row tiles, the second reading the slice's x lines through L1 (2026-11-29, H200, 13 rows: 1.04-1.1x slower than
// variants 5 / 6 on the 8B matrices; the slice-warp kernels' PTX was unchanged by the template parameter). Variants
// 17-20 (RT = 4: 64 rows of W a block, x read a quarter as often as at RT = 1) win only on the wide matrices (H200,
// 13 rows: 8B gate/up 63.3 vs 67.2 us, 1B gate/up 18.8 vs 23.1); on the narrow ones their fewer blocks lose (8B down
// 52-62 vs 43 us): so x traffic is not what holds the 9-16-row down back.
//
// Requirements (checked by vs_inv_matmul; the Python wrapper only calls it when they hold): bf16 or fp16,
// K % 8 == 0 (16-byte rows), x and W contiguous and 16-byte aligned, 1 <= M, N < 2^31 / 16 row tiles.
// No allocation, no host sync: CUDA-graph capturable.
#include "gemv_common.cuh"

#include <atomic>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define INV_STEP 32       // columns per step
#define INV_MAX_SLICES 8
#define INV_CHUNK 8       // fragments reduced per shared-memory round

// Store one summed fragment of lane l (the m16n8 accumulator layout: (d0, d1) row g, tokens 2t, 2t + 1; (d2, d3)
// row g + 8) for the m16 tile at row0 and the n8 tile at tok0: + bias, rounded once to T; outside [N) x [M) dropped.
template <typename T>
__device__ __forceinline__ void inv_store_fragment(T* y, const T* bias, float4 v, long long row0, long long tok0,
                                                   int l, int M, int N) {
    const long long row = row0 + (l >> 2), tok = tok0 + 2 * (l & 3);
    const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const long long rr = row + (e >= 2 ? 8 : 0), tt = tok + (e & 1);
        if (rr < N && tt < M) {
            float o = out[e];
            if (bias != nullptr) o += to_float(bias[rr]);
            store_float(y + tt * N + rr, o);
        }
    }
}

// The slice-warp kernel: a block is S warps, warp p = slice p, all on one tile; the partials meet in shared memory.
// Its loop and stores stay written out here, not shared with the cluster kernel's: moved into helper functions they
// compiled to other register allocations, and variants 2 and 7 (decode) ran up to 1.35x slower
// (results/invariant_cluster.md).
template <typename T, int RT, int NT, int U>
__global__ void __launch_bounds__(32 * INV_MAX_SLICES)
inv_matmul_kernel(const T* __restrict__ x,     // [M, K]
                  const T* __restrict__ w,     // [N, K]
                  const T* __restrict__ bias,  // [N] or nullptr
                  T* __restrict__ y,           // [M, N]
                  int M, int N, int K, int S) {
    constexpr int F = RT * NT;                              // accumulator fragments per warp
    constexpr int CH = F < INV_CHUNK ? F : INV_CHUNK;        // fragments per shared-memory round
    __shared__ float4 s_part[INV_MAX_SLICES][CH][32];
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5;   // p: this warp's slice
    const int g = lane >> 2, t = lane & 3;
    const long long tok0 = (long long)blockIdx.x * (8 * NT);
    const long long row0 = (long long)blockIdx.y * (16 * RT);

    const T* wa[RT];
    const T* wb[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {   // rows past N read row N - 1 (valid memory) and are not stored
        const long long ra = row0 + 16 * r + g, rb = ra + 8;
        wa[r] = w + (ra < N ? ra : (long long)N - 1) * K;
        wb[r] = w + (rb < N ? rb : (long long)N - 1) * K;
    }
    const T* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {   // tokens past M read token M - 1: their columns are never stored
        const long long tok = tok0 + 8 * j + g;
        xr[j] = x + (tok < M ? tok : (long long)M - 1) * K;
    }
    const int nsteps = (K + INV_STEP - 1) / INV_STEP;
    const int full_steps = K / INV_STEP;

    pdl_launch_dependents();
#pragma unroll
    for (int u = 0; u < U; ++u) {    // W does not depend on the previous kernel: start pulling it now
        const int step = p + u * S;
        if (step < full_steps) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                prefetch_l2(wa[r] + step * INV_STEP + 8 * t);
                prefetch_l2(wb[r] + step * INV_STEP + 8 * t);
            }
        }
    }
    pdl_wait();

    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.0f;

    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    // one step: for every token tile, the x vector of its token g, then 2 MMAs per row tile
    auto mma_step = [&](const uint4 (&va)[RT], const uint4 (&vb)[RT], int col, bool in_k) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 vx = in_k ? __ldg(reinterpret_cast<const uint4*>(xr[j] + col)) : zero;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                mma_16816<T>(acc[r][j], va[r].x, vb[r].x, va[r].y, vb[r].y, vx.x, vx.y);
                mma_16816<T>(acc[r][j], va[r].z, vb[r].z, va[r].w, vb[r].w, vx.z, vx.w);
            }
        }
    };

    if (row0 < N && tok0 < M) {
        int step = p;
        // full steps unpredicated so that all U steps' W loads are issued before the first MMA
        for (; step + (U - 1) * S < full_steps; step += U * S) {
            uint4 va[U][RT], vb[U][RT];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const int col = (step + u * S) * INV_STEP + 8 * t;
                    va[u][r] = load_stream16(reinterpret_cast<const uint4*>(wa[r] + col));
                    vb[u][r] = load_stream16(reinterpret_cast<const uint4*>(wb[r] + col));
                }
#pragma unroll
            for (int u = 0; u < U; ++u) mma_step(va[u], vb[u], (step + u * S) * INV_STEP + 8 * t, true);
        }
        for (; step < nsteps; step += S) {   // the rest, one step at a time; the last may be partial
            const int col = step * INV_STEP + 8 * t;
            const bool ok = col < K;
            uint4 va[RT], vb[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                va[r] = ok ? load_stream16(reinterpret_cast<const uint4*>(wa[r] + col)) : zero;
                vb[r] = ok ? load_stream16(reinterpret_cast<const uint4*>(wb[r] + col)) : zero;
            }
            mma_step(va, vb, col, ok);
        }
    }

    // The fixed-order sum over slices, CH fragments (f = r * NT + j) at a time.
#pragma unroll
    for (int c0 = 0; c0 < F; c0 += CH) {
#pragma unroll
        for (int f = c0; f < c0 + CH && f < F; ++f) {
            const float* a = acc[f / NT][f % NT];
            s_part[p][f - c0][lane] = make_float4(a[0], a[1], a[2], a[3]);
        }
        __syncthreads();
        const int items = (F - c0 < CH ? F - c0 : CH) * 32;
        for (int i = threadIdx.x; i < items; i += 32 * S) {
            const int f = c0 + i / 32, l = i % 32;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int q = 0; q < S; ++q) {
                const float4 part = s_part[q][f - c0][l];
                v.x += part.x;
                v.y += part.y;
                v.z += part.z;
                v.w += part.w;
            }
            const int lg = l >> 2, lt = l & 3;
            const long long row = row0 + 16 * (f / NT) + lg;
            const long long tok = tok0 + 8 * (f % NT) + 2 * lt;
            const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {   // (d0, d1): row, tokens 2t, 2t + 1; (d2, d3): row + 8
                const long long rr = row + (e >= 2 ? 8 : 0), tt = tok + (e & 1);
                if (rr < N && tt < M) {
                    float o = out[e];
                    if (bias != nullptr) o += to_float(bias[rr]);
                    store_float(y + tt * N + rr, o);
                }
            }
        }
        __syncthreads();   // s_part is rewritten by the next chunk
    }
}

// acc = 0 (every fragment of a warp's tile).
template <int RT, int NT>
__device__ __forceinline__ void inv_zero(float (&acc)[RT][NT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.0f;
}

// Slice p's partial sum for a block's tile of ROWS = 16 RT WR rows of W (from tile_row0) x TOKS = 8 NT tokens (from
// tok0), warp w on rows [16 RT w, 16 RT (w + 1)) of it: the same MMAs on the same operands as the slice-warp
// kernel's, with each step's W and x lines (32 columns each; a chunk past K reads as zero, rows past N and tokens past
// M repeat the last) staged by the whole block through a ring of STAGES shared-memory buffers, STAGES - 1 steps ahead.
template <typename T, int RT, int NT, int WR, int STAGES>
__device__ __forceinline__ void inv_slice_partial_staged(float (&acc)[RT][NT][4], uint4* ring, const T* x, const T* w,
                                                         long long tile_row0, long long tok0, int M, int N, int K,
                                                         int p, int S) {
    constexpr int ROWS = 16 * RT * WR, LINES = ROWS + 8 * NT;   // a stage: LINES lines of 4 chunks of 16 bytes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsteps = (K + INV_STEP - 1) / INV_STEP;
    const int count = p < nsteps ? (nsteps - p + S - 1) / S : 0;   // this slice's steps: p, p + S, ...
    auto stage = [&](int i) {   // step p + i S into buffer i % STAGES; one commit group either way
        if (i < count) {
            const long long col0 = (long long)(p + i * S) * INV_STEP;
            uint4* buf = ring + (i % STAGES) * LINES * 4;
            for (int c = threadIdx.x; c < LINES * 4; c += 32 * WR) {
                const int line = c >> 2;
                const long long col = col0 + 8 * (c & 3);
                const T* row;
                if (line < ROWS) {
                    const long long r = tile_row0 + line;
                    row = w + (r < N ? r : (long long)N - 1) * K;
                } else {
                    const long long tok = tok0 + (line - ROWS);
                    row = x + (tok < M ? tok : (long long)M - 1) * K;
                }
                cp_async16(buf + c, col < K ? row + col : row, col < K ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    inv_zero(acc);
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) stage(i);
    for (int i = 0; i < count; ++i) {
        cp_async_wait<STAGES - 2>();   // step i has landed (for this thread's copies) ...
        __syncthreads();               // ... and everyone's; buffer (i - 1) % STAGES is free again
        stage(i + STAGES - 1);
        const uint4* buf = ring + (i % STAGES) * LINES * 4;
        uint4 va[RT], vb[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            va[r] = buf[(16 * RT * warp + 16 * r + g) * 4 + t];
            vb[r] = buf[(16 * RT * warp + 16 * r + g + 8) * 4 + t];
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 vx = buf[(ROWS + 8 * j + g) * 4 + t];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                mma_16816<T>(acc[r][j], va[r].x, vb[r].x, va[r].y, vb[r].y, vx.x, vx.y);
                mma_16816<T>(acc[r][j], va[r].z, vb[r].z, va[r].w, vb[r].w, vx.z, vx.w);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();   // the ring is free: the caller reuses it
}

// Shared memory of the cluster kernel: the ring of staged steps, later the block's partial tile (the larger of
// the two).
template <int RT, int NT, int WR, int STAGES>
constexpr unsigned inv_cluster_smem() {
    constexpr unsigned ring = STAGES * (16 * RT * WR + 8 * NT) * 64, part = WR * RT * NT * 32 * 16;
    return ring > part ? ring : part;
}

// The cluster kernel (sm_90): a thread-block cluster of S blocks on one tile of 16 RT WR rows of W x 8 NT tokens;
// block p of the cluster computes slice p's partial for the whole tile (inv_slice_partial_staged: the block reads
// each W element and x token of its slice once). The partials meet through distributed shared memory: each block
// writes its own, and block p sums a 1/S share of the tile's fragments over q = 0, 1, ..., S - 1 in order, reading
// block q's memory.
template <typename T, int RT, int NT, int STAGES, int WR>
__global__ void __launch_bounds__(32 * WR)
inv_cluster_kernel(const T* __restrict__ x,     // [M, K]
                   const T* __restrict__ w,     // [N, K]
                   const T* __restrict__ bias,  // [N] or nullptr
                   T* __restrict__ y,           // [M, N]
                   int M, int N, int K, int S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int F = RT * NT;
    extern __shared__ uint4 s_mem[];   // the ring, then this block's partial P_p: [WR][F][32] float4
    cg::cluster_group cluster = cg::this_cluster();
    const int p = (int)cluster.block_rank();                 // this block's slice: blockIdx.x % S
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long tok0 = (long long)(blockIdx.x / S) * (8 * NT);
    const long long tile_row0 = (long long)blockIdx.y * (16 * RT * WR);
    pdl_launch_dependents();
    pdl_wait();
    float acc[RT][NT][4];
    inv_slice_partial_staged<T, RT, NT, WR, STAGES>(acc, s_mem, x, w, tile_row0, tok0, M, N, K, p, S);
    float4* const part = reinterpret_cast<float4*>(s_mem);
#pragma unroll
    for (int f = 0; f < F; ++f) {
        const float* a = acc[f / NT][f % NT];
        part[(warp * F + f) * 32 + lane] = make_float4(a[0], a[1], a[2], a[3]);
    }
    cluster.sync();   // every block's partial is written
    for (int i = p * (32 * WR) + threadIdx.x; i < WR * F * 32; i += S * 32 * WR) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int q = 0; q < S; ++q) {
            const float4 pq = cluster.map_shared_rank(part, q)[i];
            v.x += pq.x;
            v.y += pq.y;
            v.z += pq.z;
            v.w += pq.w;
        }
        const int wi = i / (F * 32), f = (i / 32) % F, l = i % 32;
        inv_store_fragment(y, bias, v, tile_row0 + 16 * RT * wi + 16 * (f / NT), tok0 + 8 * (f % NT), l, M, N);
    }
    cluster.sync();   // no block leaves while another still reads its shared memory
#endif
}

// The slice count of the order for inner dimension K: 8, fewer only when K has fewer than 16 steps (each
// slice keeps >= 2 steps). A function of K alone: every M, variant and GPU uses the same.
extern "C" int vs_inv_slices(int K) {
    const int nsteps = (K + INV_STEP - 1) / INV_STEP;
    int S = 1;
    while (S < INV_MAX_SLICES && 2 * (2 * S) <= nsteps) S *= 2;
    return S;
}

// Variant table: (RT, NT, U, WR); WR = 0: the slice-warp kernel (U: steps unrolled); WR > 0: the cluster kernel, WR
// warps a block, U stages in its ring (sm_90; elsewhere INV_CLUSTER_FALLBACK runs instead). Index 0 is no variant:
// the choice is the caller's (gemv.invariant_variant, from the sweeps in benchmarks/results/exact*.md), and the
// sweep in benchmarks/exact.py times them all. Every variant computes the same bits.
static const int INV_VARIANTS[][4] = {
    {0, 0, 0, 0},
    {1, 1, 4, 0}, {1, 1, 8, 0}, {2, 1, 4, 0}, {2, 1, 2, 0},    // 1-8 tokens a tile
    {1, 2, 4, 0}, {2, 2, 2, 0},                                // 16
    {1, 4, 2, 0}, {2, 4, 2, 0}, {2, 4, 1, 0},                  // 32
    {1, 8, 2, 0}, {2, 8, 1, 0}, {2, 8, 2, 0},                  // 64
    {2, 8, 4, 4}, {2, 8, 3, 8}, {1, 8, 4, 8}, {2, 8, 6, 4},    // clusters: (16 RT WR) rows of W x 64 tokens
    {4, 2, 2, 0}, {4, 2, 1, 0}, {2, 2, 4, 0}, {4, 1, 2, 0},    // 17-20: 64 rows of W a block (x read 1/4 as often)
};
#define INV_NUM_VARIANTS ((int)(sizeof(INV_VARIANTS) / sizeof(INV_VARIANTS[0])))
#define INV_CLUSTER_FALLBACK 12

extern "C" int vs_inv_num_variants() { return INV_NUM_VARIANTS - 1; }

// The variant's tile shape (wr = 0 for the slice-warp kernel); a cluster variant off sm_90 reports its fallback's.
extern "C" void vs_inv_variant_shape(int variant, int* rt, int* nt, int* u, int* wr) {
    *rt = *nt = *u = *wr = 0;
    if (variant < 1 || variant >= INV_NUM_VARIANTS) return;
    if (INV_VARIANTS[variant][3] > 0 && !vs_sm90()) variant = INV_CLUSTER_FALLBACK;
    *rt = INV_VARIANTS[variant][0];
    *nt = INV_VARIANTS[variant][1];
    *u = INV_VARIANTS[variant][2];
    *wr = INV_VARIANTS[variant][3];
}

template <typename T, int RT, int NT, int U>
static cudaError_t inv_launch(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int S,
                              cudaStream_t stream, int pdl) {
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT);
    const long long row_tiles = ((long long)N + 16 * RT - 1) / (16 * RT);
    if (tok_tiles > 0x7fffffffLL || row_tiles > 65535) return cudaErrorInvalidValue;
    return launch_kernel(inv_matmul_kernel<T, RT, NT, U>, dim3((unsigned)tok_tiles, (unsigned)row_tiles), dim3(32 * S),
                         0, stream, pdl, (const T*)x, (const T*)w, (const T*)b, (T*)y, M, N, K, S);
}

// The cluster kernel: grid (S x token tiles, row tiles), clusters of S blocks along x (one per slice). Its shared
// memory may pass the 48 KB default: the opt-in is set once per instantiation, at its first launch (the warm-up's,
// before any capture).
template <typename T, int RT, int NT, int STAGES, int WR>
static cudaError_t inv_launch_cluster(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int S,
                                      cudaStream_t stream, int pdl) {
    constexpr unsigned smem = inv_cluster_smem<RT, NT, WR, STAGES>();
    static std::atomic<int> opted{0};
    if (!opted.load(std::memory_order_relaxed)) {
        const cudaError_t e = cudaFuncSetAttribute(inv_cluster_kernel<T, RT, NT, STAGES, WR>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted.store(1, std::memory_order_relaxed);
    }
    const long long tok_tiles = ((long long)M + 8 * NT - 1) / (8 * NT);
    const long long row_tiles = ((long long)N + 16 * RT * WR - 1) / (16 * RT * WR);
    if (S * tok_tiles > 0x7fffffffLL || row_tiles > 65535) return cudaErrorInvalidValue;
    return launch_kernel_ex(inv_cluster_kernel<T, RT, NT, STAGES, WR>, dim3((unsigned)(S * tok_tiles),
                            (unsigned)row_tiles), dim3(32 * WR), smem, stream, pdl, (unsigned)S, (const T*)x,
                            (const T*)w, (const T*)b, (T*)y, M, N, K, S);
}

template <typename T>
static cudaError_t inv_dispatch(int variant, const void* x, const void* w, const void* b, void* y, int M, int N,
                                int K, int S, cudaStream_t stream, int pdl) {
    if (INV_VARIANTS[variant][3] > 0 && !vs_sm90()) variant = INV_CLUSTER_FALLBACK;
    switch (variant) {
        case 1: return inv_launch<T, 1, 1, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 2: return inv_launch<T, 1, 1, 8>(x, w, b, y, M, N, K, S, stream, pdl);
        case 3: return inv_launch<T, 2, 1, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 4: return inv_launch<T, 2, 1, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 5: return inv_launch<T, 1, 2, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 6: return inv_launch<T, 2, 2, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 7: return inv_launch<T, 1, 4, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 8: return inv_launch<T, 2, 4, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 9: return inv_launch<T, 2, 4, 1>(x, w, b, y, M, N, K, S, stream, pdl);
        case 10: return inv_launch<T, 1, 8, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 11: return inv_launch<T, 2, 8, 1>(x, w, b, y, M, N, K, S, stream, pdl);
        case 12: return inv_launch<T, 2, 8, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 13: return inv_launch_cluster<T, 2, 8, 4, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 14: return inv_launch_cluster<T, 2, 8, 3, 8>(x, w, b, y, M, N, K, S, stream, pdl);
        case 15: return inv_launch_cluster<T, 1, 8, 4, 8>(x, w, b, y, M, N, K, S, stream, pdl);
        case 16: return inv_launch_cluster<T, 2, 8, 6, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 17: return inv_launch<T, 4, 2, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        case 18: return inv_launch<T, 4, 2, 1>(x, w, b, y, M, N, K, S, stream, pdl);
        case 19: return inv_launch<T, 2, 2, 4>(x, w, b, y, M, N, K, S, stream, pdl);
        case 20: return inv_launch<T, 4, 1, 2>(x, w, b, y, M, N, K, S, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// y[M, N] = x[M, K] @ w[N, K]^T (+ b) in the invariant order. variant: an index of INV_VARIANTS (the caller's
// choice: gemv.invariant_variant in Python). slices: 0 = vs_inv_slices(K) (the product always passes 0; another
// value computes a different, equally fixed order: tests only). Returns cudaErrorInvalidValue for anything
// outside the requirements in the header (nothing is launched then).
extern "C" cudaError_t vs_inv_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int M, int N,
                                     int K, int variant, int slices, cudaStream_t stream, int pdl) {
    if (dtype != VS_BF16 && dtype != VS_F16) return cudaErrorInvalidValue;
    if (M < 1 || N < 0 || K < 8 || K % 8 != 0) return cudaErrorInvalidValue;
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15) return cudaErrorInvalidValue;
    const int S = slices == 0 ? vs_inv_slices(K) : slices;
    if (S != 1 && S != 2 && S != 4 && S != 8) return cudaErrorInvalidValue;
    if (variant < 1 || variant >= INV_NUM_VARIANTS) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    return dtype == VS_BF16 ? inv_dispatch<__nv_bfloat16>(variant, x, w, b, y, M, N, K, S, stream, pdl)
                            : inv_dispatch<__half>(variant, x, w, b, y, M, N, K, S, stream, pdl);
}
