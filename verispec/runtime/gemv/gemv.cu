// gemv.cu: y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) for the decode step's few tokens (M = 1..8).
//
// At M <= 8 a weight matmul is a pure stream of W (N * K * sizeof(T) bytes, read once); x, y and
// b are tiny. The only goal is to keep enough 16-byte loads of W in flight on every SM from the
// first microsecond to the last, and to spend nothing else: no split-K second kernel, no atomics.
//
// Versions (vs_gemv_version picks; gemv_cuda(version=...) forces one):
//   v1 gemv_kernel       fp32 FMAs, any dtype (fp32 included). ROWS rows a warp, described below.
//   v2 gemv_mma_kernel   tensor cores (mma.sync m16n8k16, fp32 accumulate), bf16/fp16 only: 16 rows
//       a warp, tokens in the MMA's n = 8. v1 runs out of issue slots at M >= 4 (M FMAs per
//       weight element plus unpacking); v2 spends ~2 instructions per 16-byte W vector at any M.
//
// v1 work split. A block is GEMV_THREADS = 256 threads = 8 warps. The warps form 8 / split groups of
// `split` warps; a group owns ROWS consecutive rows of W, and its `split` warps cut K between them
// (split-K inside the block). Lane l of part p of a group reads the 16-byte vectors
//     c = p * 32 + l, then c + split * 32, c + 2 * split * 32, ...   (c indexes K / VEC vectors)
// of each of its ROWS rows: consecutive lanes read consecutive 16 bytes (coalesced 512 B per warp
// and row), and ROWS * U vector loads are issued before any is used (U = 8 / ROWS: 8 loads, 128 B,
// in flight per thread). W loads bypass L1 (ld.global.nc.L1::no_allocate: read once, they must not
// evict x); x is read with __ldg through L1, where every block of the SM finds it, and each x
// vector serves ROWS rows of W.
//   e.g. N = 2048, K = 2048, bf16 (K / 8 = 256 vectors a row), ROWS = 2, split = 8: a block owns
//   2 rows; warp p reads vectors p * 32 + l of both rows (1 vector each per row); 1024 blocks.
//   e.g. N = 128256, K = 4096, ROWS = 1, split = 1: 8 rows a block, one warp a row, 16 vectors
//   per lane (two rounds of 8 in flight); 16032 blocks.
//
// Reduction, in a fixed order (bit-identical run to run, whatever the scheduling):
//   1. fp32 accumulators acc[ROWS * MP] per thread (MP = M rounded up to a power of 2, padding 0);
//   2. a transposing warp reduction: at each xor-shuffle step a lane keeps half of its values and
//      adds its partner's copy of that half, so V = ROWS * MP <= 32 values take V - 1 shuffles in
//      all (not 5 V); afterwards lane l holds the warp total of value l >> (5 - log2 V);
//   3. split > 1: each warp writes its V totals to shared memory; after one __syncthreads the
//      group's first V threads add the split parts in order p = 0, 1, ..., add the bias, round
//      to T and store. split = 1: the lanes store directly.
//
// split is chosen on the host (gemv_split): the fewest warps per row group that still put about
// 32 warps on every SM, so small-N matrices (e.g. 2048 x 2048) are cut along K and large ones
// (the LM head) keep one warp per row group and no shared-memory step.
//
// Requirements, checked by the launcher (the Python wrapper falls back to F.linear otherwise):
// K * sizeof(T) a multiple of 16 bytes (bf16/fp16: K % 8 == 0; fp32: K % 4 == 0), x and W
// 16-byte aligned and contiguous ([M, K] and [N, K] row-major), 1 <= M <= 8. y is [M, N].
// No allocation, no host sync: CUDA-graph capturable (launches on the given stream).
#include "gemv_common.cuh"

#include <map>
#include <mutex>
#include <tuple>

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)

// The 16 / sizeof(T) elements of a 16-byte vector, as float.
template <typename T>
struct Vec16 {
    static constexpr int N = 16 / sizeof(T);
    __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[N]) {
        const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = to_float(e[i]);
    }
    // N floats -> 16 bytes of T, each rounded to nearest even (fp32: as is)
    __device__ __forceinline__ static uint4 pack(const float (&f)[N]) {
        uint4 v;
        T* e = reinterpret_cast<T*>(&v);
#pragma unroll
        for (int i = 0; i < N; ++i) e[i] = (T)f[i];
        return v;
    }
};

template <>
struct Vec16<__nv_bfloat16> {
    static constexpr int N = 8;
    __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[N]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // bf16 -> fp32 is a 16-bit shift: exact
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    __device__ __forceinline__ static uint4 pack(const float (&f)[N]) {
        uint4 v;
        __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        return v;
    }
};

template <>
struct Vec16<__half> {
    static constexpr int N = 8;
    __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[N]) {
        const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 p = __half22float2(h[i]);
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
    __device__ __forceinline__ static uint4 pack(const float (&f)[N]) {
        uint4 v;
        __half2* p = reinterpret_cast<__half2*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        return v;
    }
};

// v rounded to T's precision (round to nearest even), back as float: what a store to T and a reload give.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return v; }
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
template <>
__device__ __forceinline__ float round_to<__half>(float v) { return __half2float(__float2half_rn(v)); }

__host__ __device__ constexpr int next_pow2(int v) { return v <= 1 ? 1 : 2 * next_pow2((v + 1) / 2); }
__host__ __device__ constexpr int log2_exact(int v) { return v <= 1 ? 0 : 1 + log2_exact(v / 2); }

// Step 2 above. a[0..V) in every lane -> a[0] = warp total of value (lane >> (5 - log2 V)).
//   e.g. V = 4: offset 16 keeps values {0,1} in lanes 0-15 and {2,3} in lanes 16-31; offset 8
//   keeps one value (lane >> 3); offsets 4, 2, 1 are plain butterflies over that one value.
template <int V>
__device__ __forceinline__ void warp_reduce_transpose(float (&a)[V], int lane) {
    int width = V;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        if (width > 1) {
            const int half = width / 2;
            const bool upper = (lane & off) != 0;
#pragma unroll
            for (int i = 0; i < V / 2; ++i) {
                if (i < half) {
                    const float send = upper ? a[i] : a[i + half];
                    const float keep = upper ? a[i + half] : a[i];
                    a[i] = keep + __shfl_xor_sync(VS_FULL_MASK, send, off);
                }
            }
            width = half;
        } else {
            a[0] += __shfl_xor_sync(VS_FULL_MASK, a[0], off);
        }
    }
}

// Steps 2 and 3 above for the ROWS x MP accumulators of one thread: warp reduction, the split
// parts summed in order p = 0, 1, ... through shared memory (split > 1), bias, rounding, store.
// split > 1 ends with every thread past a __syncthreads and s_part still being read by the group's
// first threads: a caller that reuses s_part must __syncthreads first.
template <typename T, int M, int ROWS>
__device__ __forceinline__ void gemv_epilogue(float (&acc)[ROWS * next_pow2(M)],
                                              float (*s_part)[ROWS * next_pow2(M)], const T* __restrict__ bias,
                                              T* __restrict__ y, long long row0, int N, int split, int group,
                                              int part, int warp, int lane) {
    constexpr int MP = next_pow2(M);
    constexpr int V = ROWS * MP;
    warp_reduce_transpose<V>(acc, lane);
    constexpr int SHIFT = 5 - log2_exact(V);
    const int idx = lane >> SHIFT;  // which of the V values this lane now holds
    const int r = idx / MP, m = idx % MP;
    if (split == 1) {
        if ((lane & ((1 << SHIFT) - 1)) == 0 && m < M && row0 + r < N) {
            float v = acc[0];
            if (bias != nullptr) v += to_float(bias[row0 + r]);
            store_float(y + (long long)m * N + row0 + r, v);
        }
        return;
    }
    if ((lane & ((1 << SHIFT) - 1)) == 0) s_part[warp][idx] = acc[0];
    __syncthreads();
    if (part == 0 && lane < V) {
        const int rr = lane / MP, mm = lane % MP;
        if (mm < M && row0 + rr < N) {
            float v = 0.0f;
            for (int p = 0; p < split; ++p) v += s_part[group * split + p][lane];
            if (bias != nullptr) v += to_float(bias[row0 + rr]);
            store_float(y + (long long)mm * N + row0 + rr, v);
        }
    }
}

template <typename T, int M, int ROWS>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(const T* __restrict__ x,     // [M, K]
            const T* __restrict__ w,     // [N, K]
            const T* __restrict__ bias,  // [N] or nullptr
            T* __restrict__ y,           // [M, N]
            int N, int K, int split) {
    using V16 = Vec16<T>;
    constexpr int VEC = V16::N;
    constexpr int MP = next_pow2(M);
    constexpr int V = ROWS * MP;  // values a thread accumulates, <= 32
    constexpr int U = 8 / ROWS > 0 ? 8 / ROWS : 1;
    static_assert(V <= 32, "ROWS * next_pow2(M) must be <= 32");
    __shared__ float s_part[GEMV_WARPS][V];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / split, part = warp % split;
    const int groups = GEMV_WARPS / split;
    const long long row0 = ((long long)blockIdx.x * groups + group) * ROWS;
    const int kvec = K / VEC;
    const int stride = split * 32;

    const uint4* wrow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {  // rows past N read row N - 1 (valid memory) and are not stored
        const long long row = row0 + r < N ? row0 + r : (long long)N - 1;
        wrow[r] = reinterpret_cast<const uint4*>(w + row * K);
    }
    const uint4* xrow = reinterpret_cast<const uint4*>(x);

    // Under PDL this runs while the previous kernel (the one producing x) finishes: warm L2 with the
    // thread's first U vectors of each row, then wait for x.
    pdl_launch_dependents();
    if (row0 < N) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = part * 32 + lane + u * stride;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                if (c < kvec) prefetch_l2(wrow[r] + c);
        }
    }
    pdl_wait();

    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;

    auto fma_vec = [&](const uint4 (&wv)[ROWS], int c) {
        float wf[ROWS][VEC];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) V16::unpack(wv[r], wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float xf[VEC];
            V16::unpack(__ldg(xrow + (long long)m * kvec + c), xf);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float s = acc[r * MP + m];
#pragma unroll
                for (int e = 0; e < VEC; ++e) s = fmaf(wf[r][e], xf[e], s);
                acc[r * MP + m] = s;
            }
        }
    };

    if (row0 < N) {
        int c = part * 32 + lane;
        for (; c + (U - 1) * stride < kvec; c += U * stride) {
            uint4 wv[U][ROWS];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < ROWS; ++r) wv[u][r] = load_stream16(wrow[r] + c + u * stride);
#pragma unroll
            for (int u = 0; u < U; ++u) fma_vec(wv[u], c + u * stride);
        }
        for (; c < kvec; c += stride) {
            uint4 wv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) wv[r] = load_stream16(wrow[r] + c);
            fma_vec(wv, c);
        }
    }

    gemv_epilogue<T, M, ROWS>(acc, s_part, bias, y, row0, N, split, group, part, warp, lane);
}


// v1 (FMA) warps per row group: the smallest power of 2 (<= 8, and <= K / (32 * VEC) so that every
// lane gets a vector) that puts about `target` warps on the GPU. Measured on an H100 (sweep in
// benchmarks/results/gemv.md): at M <= 2 the most split wins (short per-warp loops, more warps in
// flight); at larger M the kernel is issue-bound and fewer, longer warps win (~23 warps/SM at
// M <= 4, ~12 at M = 8).
extern "C" int vs_gemv_split(int M, int N, int K, int rows, int elem_bytes, int num_sms) {
    const int kvec = K * elem_bytes / 16;
    const long long groups = (N + rows - 1) / rows;
    const long long target = M <= 2 ? (1LL << 40) : (M <= 4 ? 23LL : 12LL) * num_sms;
    int split = 1;
    while (split < GEMV_WARPS && groups * split < target && 2 * split * 32 <= kvec) split *= 2;
    return split;
}

// v1 rows per warp group: each x vector (M L1 reads) serves ROWS rows of W.
extern "C" int vs_gemv_rows(int M) { return M <= 2 ? 4 : (M <= 4 ? 2 : 4); }

// ---------------------------------------------------------------------------------------
// v2 (tensor cores; bf16 / fp16 only): the same stream of W, multiplied by mma.sync m16n8k16
// (fp32 accumulation) instead of fp32 FMAs. At M = 8 v1 issues ~100 instructions per 16-byte W
// vector (64 FMAs, unpacking, x loads) and becomes issue-bound; one MMA covers 16 rows x 16 k x
// 8 tokens. A warp owns a tile of 16 rows; M <= 8 tokens fill the MMA's n = 8 (tokens >= M are
// zeros and are not stored), so one instance serves every M.
//
// Loads stay 16-byte and coalesced thanks to a k permutation: a dot product does not care about
// the order of k, only that A (W) and B (x) use the same order. Lane (g = lane / 4, t = lane % 4)
// loads columns col = 32 s + 8 t ... + 7 of rows g and g + 8 (one 16-byte vector each) and of
// x's token g, and uses them as
//     MMA 1: a0 = W[g][col+0:2], a1 = W[g+8][col+0:2], a2 = W[g][col+2:4], a3 = W[g+8][col+2:4],
//            b0 = x[g][col+0:2], b1 = x[g][col+2:4]
//     MMA 2: the same with col+4:6 and col+6:8,
// i.e. logical k {2t, 2t+1, 2t+8, 2t+9} of each k16 step is physical column col + {0, 1, 2, 3}
// (MMA 1) or col + {4, 5, 6, 7} (MMA 2), the same mapping for A and B since col depends on t only.
// A k step of 32 columns = 2 MMAs; a warp's 4 lanes of one row read 64 contiguous bytes a step
// and U = 4 steps are in flight (8 W vectors per lane). Split-K across the `split` warps of a row
// group as in v1 (warp p takes steps p, p + split, ...; fixed-order shared-memory sum). The
// accumulator fragment (d0, d1) = rows g, tokens 2t, 2t + 1; (d2, d3) = row g + 8, same tokens.
// K % 32 != 0: the lanes past K in the last step load zeros.
#define GEMV_MMA_ROWS 16

template <typename T>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_mma_kernel(const T* __restrict__ x,     // [M, K]
                const T* __restrict__ w,     // [N, K]
                const T* __restrict__ bias,  // [N] or nullptr
                T* __restrict__ y,           // [M, N]
                int M, int N, int K, int split) {
    constexpr int U = 4;
    __shared__ float4 s_part[GEMV_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / split, part = warp % split;
    const int groups = GEMV_WARPS / split;
    const long long row0 = ((long long)blockIdx.x * groups + group) * GEMV_MMA_ROWS;
    const int g = lane >> 2, t = lane & 3;
    const long long ra = row0 + g < N ? row0 + g : (long long)N - 1;  // rows past N: read row N - 1
    const long long rb = row0 + g + 8 < N ? row0 + g + 8 : (long long)N - 1;
    const T* wa = w + ra * K;
    const T* wb = w + rb * K;
    const bool has_x = g < M;
    const T* xr = x + (long long)(has_x ? g : 0) * K;
    const int nsteps = (K + 31) / 32;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    pdl_launch_dependents();
    pdl_wait();   // x comes from the previous kernel (see pdl_wait)

    // Full steps (every lane inside K) unpredicated, so the compiler issues all U steps' loads
    // before the first MMA; the one partial step (K % 32 != 0) goes through the predicated tail.
    const int full_steps = K / 32;
    auto mma_step = [&](const uint4& va, const uint4& vb, const uint4& vx) {
        mma_16816<T>(d, va.x, vb.x, va.y, vb.y, vx.x, vx.y);
        mma_16816<T>(d, va.z, vb.z, va.w, vb.w, vx.z, vx.w);
    };
    if (row0 < N) {
        int step = part;
        for (; step + (U - 1) * split < full_steps; step += U * split) {
            uint4 va[U], vb[U], vx[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int col = (step + u * split) * 32 + 8 * t;
                va[u] = load_stream16(reinterpret_cast<const uint4*>(wa + col));
                vb[u] = load_stream16(reinterpret_cast<const uint4*>(wb + col));
                vx[u] = has_x ? __ldg(reinterpret_cast<const uint4*>(xr + col)) : zero;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) mma_step(va[u], vb[u], vx[u]);
        }
        for (; step < nsteps; step += split) {
            const int col = step * 32 + 8 * t;
            const bool ok = col < K;
            const uint4 va = ok ? load_stream16(reinterpret_cast<const uint4*>(wa + col)) : zero;
            const uint4 vb = ok ? load_stream16(reinterpret_cast<const uint4*>(wb + col)) : zero;
            const uint4 vx = ok && has_x ? __ldg(reinterpret_cast<const uint4*>(xr + col)) : zero;
            mma_step(va, vb, vx);
        }
    }

    auto store = [&](float v, int n, long long row) {
        if (n < M && row < N) {
            if (bias != nullptr) v += to_float(bias[row]);
            store_float(y + (long long)n * N + row, v);
        }
    };
    if (split > 1) {
        s_part[warp][lane] = make_float4(d[0], d[1], d[2], d[3]);
        __syncthreads();
        if (part != 0) return;
        d[0] = d[1] = d[2] = d[3] = 0.0f;
        for (int p = 0; p < split; ++p) {
            const float4 q = s_part[group * split + p][lane];
            d[0] += q.x;
            d[1] += q.y;
            d[2] += q.z;
            d[3] += q.w;
        }
    }
    store(d[0], 2 * t, row0 + g);
    store(d[1], 2 * t + 1, row0 + g);
    store(d[2], 2 * t, row0 + g + 8);
    store(d[3], 2 * t + 1, row0 + g + 8);
}

// v2 warps per row group (16 rows): 8 (a block per row tile), fewer only when K has fewer than 8
// steps of 32. Measured on an H100: split 8 was the fastest v2 configuration on every benchmark
// shape (a 16-row tile is only 64 B per lane and step: v2 needs many warps for loads in flight).
extern "C" int vs_gemv_mma_split(int N, int K, int num_sms) {
    (void)N;
    (void)num_sms;
    const int nsteps = (K + 31) / 32;
    int split = 1;
    while (split < GEMV_WARPS && 2 * split <= nsteps) split *= 2;
    return split;
}

// Which version serves (dtype, M, N, K). v2 needs a 16-bit type; measured on an H100, it beats v1
// at M = 8 only where there are many row tiles (N > K: qkv, gate/up, LM head), and v1 wins
// everywhere at M <= 4 (benchmarks/results/gemv.md).
extern "C" int vs_gemv_version(int dtype, int M, int N, int K) { return dtype != VS_F32 && M >= 6 && N > K ? 2 : 1; }

template <typename T>
static cudaError_t launch_mma(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int split,
                              cudaStream_t stream, int pdl) {
    const int rows_per_block = GEMV_MMA_ROWS * (GEMV_WARPS / split);
    const long long blocks = ((long long)N + rows_per_block - 1) / rows_per_block;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    return launch_kernel(gemv_mma_kernel<T>, dim3((unsigned)blocks), dim3(GEMV_THREADS), 0, stream, pdl, (const T*)x,
                         (const T*)w, (const T*)b, (T*)y, M, N, K, split);
}

template <typename T, int M, int ROWS>
static cudaError_t launch_rows(const void* x, const void* w, const void* b, void* y, int N, int K, int split,
                               cudaStream_t stream, int pdl) {
    const int rows_per_block = ROWS * (GEMV_WARPS / split);
    const long long blocks = ((long long)N + rows_per_block - 1) / rows_per_block;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    return launch_kernel(gemv_kernel<T, M, ROWS>, dim3((unsigned)blocks), dim3(GEMV_THREADS), 0, stream, pdl,
                         (const T*)x, (const T*)w, (const T*)b, (T*)y, N, K, split);
}

template <typename T, int M>
static cudaError_t launch_m(const void* x, const void* w, const void* b, void* y, int N, int K, int rows, int split,
                            cudaStream_t stream, int pdl) {
    switch (rows) {
        case 1: return launch_rows<T, M, 1>(x, w, b, y, N, K, split, stream, pdl);
        case 2: return launch_rows<T, M, 2>(x, w, b, y, N, K, split, stream, pdl);
        case 4: return launch_rows<T, M, 4>(x, w, b, y, N, K, split, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

template <typename T>
static cudaError_t launch_t(const void* x, const void* w, const void* b, void* y, int M, int N, int K, int rows,
                            int split, cudaStream_t stream, int pdl) {
    switch (M) {
        case 1: return launch_m<T, 1>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 2: return launch_m<T, 2>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 3: return launch_m<T, 3>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 4: return launch_m<T, 4>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 5: return launch_m<T, 5>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 6: return launch_m<T, 6>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 7: return launch_m<T, 7>(x, w, b, y, N, K, rows, split, stream, pdl);
        case 8: return launch_m<T, 8>(x, w, b, y, N, K, rows, split, stream, pdl);
        default: return cudaErrorInvalidValue;
    }
}

// y[M, N] = x[M, K] @ w[N, K]^T (+ b). version: 1 (FMA), 2 (tensor cores, bf16/fp16), 0 =
// vs_gemv_version. rows (v1 only): 1, 2 or 4, 0 = vs_gemv_rows; split: 1, 2, 4 or 8 warps per row
// group, 0 = the version's automatic choice. Returns cudaErrorInvalidValue for a shape or
// alignment outside the requirements in the header (nothing is launched then). pdl: launch with
// programmatic dependent launch (sm_90+; see pdl_wait).
extern "C" cudaError_t vs_gemv(const void* x, const void* w, const void* b, void* y, int dtype, int M, int N, int K,
                               int version, int rows, int split, int num_sms, cudaStream_t stream, int pdl) {
    const int elem = dtype == VS_F32 ? 4 : 2;
    if (M < 1 || M > 8 || N < 0 || K < 0) return cudaErrorInvalidValue;
    if (((long long)K * elem) % 16 != 0) return cudaErrorInvalidValue;
    if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15) return cudaErrorInvalidValue;
    if (dtype != VS_F32 && dtype != VS_BF16 && dtype != VS_F16) return cudaErrorInvalidValue;
    if (version == 0) version = vs_gemv_version(dtype, M, N, K);
    if (version == 2 && dtype == VS_F32) return cudaErrorInvalidValue;
    if (version != 1 && version != 2) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    if (version == 2) {
        if (split == 0) split = vs_gemv_mma_split(N, K, num_sms);
        if (split != 1 && split != 2 && split != 4 && split != 8) return cudaErrorInvalidValue;
        return dtype == VS_BF16 ? launch_mma<__nv_bfloat16>(x, w, b, y, M, N, K, split, stream, pdl)
                                : launch_mma<__half>(x, w, b, y, M, N, K, split, stream, pdl);
    }
    if (rows == 0) rows = vs_gemv_rows(M);
    if (split == 0) split = vs_gemv_split(M, N, K, rows, elem, num_sms);
    if (split != 1 && split != 2 && split != 4 && split != 8) return cudaErrorInvalidValue;
    switch (dtype) {
        case VS_F32: return launch_t<float>(x, w, b, y, M, N, K, rows, split, stream, pdl);
        case VS_BF16: return launch_t<__nv_bfloat16>(x, w, b, y, M, N, K, rows, split, stream, pdl);
        default: return launch_t<__half>(x, w, b, y, M, N, K, rows, split, stream, pdl);
    }
}

// The (version, rows, split) that vs_gemv picks when all three are 0 (rows = 16 for v2's tiles).
extern "C" void vs_gemv_config(int dtype, int M, int N, int K, int num_sms, int* version, int* rows, int* split) {
    const int elem = dtype == VS_F32 ? 4 : 2;
    *version = vs_gemv_version(dtype, M, N, K);
    if (*version == 2) {
        *rows = GEMV_MMA_ROWS;
        *split = vs_gemv_mma_split(N, K, num_sms);
    } else {
        *rows = vs_gemv_rows(M);
        *split = vs_gemv_split(M, N, K, *rows, elem, num_sms);
    }
}

