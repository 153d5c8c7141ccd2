// gemv_fused.cu: gemv.cu's v1 GEMV with the RMSNorm (+ residual add) or SwiGLU prologue computed in the
// same launch (an experiment, measured in benchmarks/results/gemv.md: slower than the separate kernels in
// 14 of 16 cells on an H100, so verispec's runtime does not use it). It includes the library's gemv.cu for
// the shared load helpers and the v1 split choice, and adds only the fused kernel and its launcher.
#include "gemv.cu"

// ---------------------------------------------------------------------------------------
// v1 with a fused prologue (MODE, a template parameter: the plain gemv_kernel above is untouched).
// The GEMV input vector h [M, K] is computed by every block into shared memory (as T: it is rounded
// to T anyway), then the v1 loop runs over it instead of __ldg(x):
//   GEMV_NORM    h = round_T(r * rstd * g), r = round_T(x + delta) (or x), rstd = 1 / sqrt(mean(r^2) + eps)
//                per token row, all in fp32: what runtime/ops.py's _add_rmsnorm_kernel computes (the sum of
//                squares in another order). Block 0 writes r to res_out when delta is given.
//   GEMV_SWIGLU  h = round_T(gate / (1 + exp(-gate)) * up), gu = [gate | up] [M, 2K]: what
//                runtime/ops.py's _silu_mul_kernel computes.
// The prologue reads M * K (NORM: + M * K delta + K g; SWIGLU: 2 M K) elements per block from L2 / L1
// and, for NORM, does one block reduction. To keep HBM busy meanwhile, each block issues its first
// tile's W loads (U * ROWS 16-byte vectors a thread) BEFORE the prologue and consumes them after it.
// To amortize the prologue, a block may serve several row tiles (grid-stride over `ntiles` tiles of
// ROWS * groups rows): the launcher picks about one wave of resident blocks (see launch_fused).
// Only M <= 2 (ROWS = 4, the v1 choice there) is instantiated.
// Measured on an H100 (benchmarks/results/gemv.md, "Fused prologues"), this is SLOWER than the separate Triton
// norm / SwiGLU kernel + gemv_kernel in 14 of 16 (shape, M) cells, and B=1 decode got slower with it, so the runtime
// does not use it. Each block's prologue latency stays on the critical path, and 80 registers allow 3 blocks an SM.
enum { GEMV_NORM = 1, GEMV_SWIGLU = 2 };
#define GEMV_FUSED_ROWS 4
#ifndef GEMV_FUSED_MIN_BLOCKS
#define GEMV_FUSED_MIN_BLOCKS 3  // 80 registers: 3 blocks (24 warps) an SM; 4 spilled more
#endif

// h[M, K] into shared memory (16-byte vectors, kvec = K / VEC a row); ends with __syncthreads.
template <typename T, int M, int MODE>
__device__ __forceinline__ void gemv_prologue(uint4* __restrict__ s_h, const T* __restrict__ x,
                                              const T* __restrict__ delta, const T* __restrict__ g, float eps,
                                              T* __restrict__ res_out, int K) {
    using V16 = Vec16<T>;
    constexpr int VEC = V16::N;
    const int kvec = K / VEC, tid = threadIdx.x;
    if constexpr (MODE == GEMV_SWIGLU) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4* gate = reinterpret_cast<const uint4*>(x + (long long)m * 2 * K);
            const uint4* up = gate + kvec;
            for (int j = tid; j < kvec; j += GEMV_THREADS) {
                float gf[VEC], uf[VEC];
                V16::unpack(__ldg(gate + j), gf);
                V16::unpack(__ldg(up + j), uf);
#pragma unroll
                for (int e = 0; e < VEC; ++e) gf[e] = gf[e] / (1.0f + expf(-gf[e])) * uf[e];
                s_h[m * kvec + j] = V16::pack(gf);
            }
        }
        __syncthreads();
    } else {
        __shared__ float s_red[M][GEMV_WARPS];
        const bool write_res = res_out != nullptr && blockIdx.x == 0;
        float ss[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            ss[m] = 0.0f;
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * K);
            const uint4* dr = reinterpret_cast<const uint4*>(delta + (long long)m * K);
            for (int j = tid; j < kvec; j += GEMV_THREADS) {
                float r[VEC];
                V16::unpack(__ldg(xr + j), r);
                if (delta != nullptr) {
                    float d[VEC];
                    V16::unpack(__ldg(dr + j), d);
#pragma unroll
                    for (int e = 0; e < VEC; ++e) r[e] = round_to<T>(r[e] + d[e]);  // the stored residual
                }
#pragma unroll
                for (int e = 0; e < VEC; ++e) ss[m] = fmaf(r[e], r[e], ss[m]);
                const uint4 packed = V16::pack(r);  // exact: r holds T values
                s_h[m * kvec + j] = packed;
                if (write_res) reinterpret_cast<uint4*>(res_out + (long long)m * K)[j] = packed;
            }
        }
        // block sum of ss[m] in a fixed order: warp butterfly, then warps 0..7 in order (every thread
        // computes the same total, and so does every block)
        const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
        for (int m = 0; m < M; ++m) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ss[m] += __shfl_xor_sync(VS_FULL_MASK, ss[m], off);
            if (lane == 0) s_red[m][warp] = ss[m];
        }
        __syncthreads();
        float rstd[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) total += s_red[m][w];
            rstd[m] = 1.0f / sqrtf(total / (float)K + eps);
        }
        const uint4* gv = reinterpret_cast<const uint4*>(g);
        for (int j = tid; j < kvec; j += GEMV_THREADS) {  // the same vectors this thread wrote above
            float gf[VEC];
            V16::unpack(__ldg(gv + j), gf);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float r[VEC];
                V16::unpack(s_h[m * kvec + j], r);
#pragma unroll
                for (int e = 0; e < VEC; ++e) r[e] = r[e] * rstd[m] * gf[e];
                s_h[m * kvec + j] = V16::pack(r);
            }
        }
        __syncthreads();
    }
}

template <typename T, int M, int ROWS, int MODE>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_FUSED_MIN_BLOCKS)
gemv_fused_kernel(const T* __restrict__ x,      // NORM: [M, K]; SWIGLU: gu [M, 2K]
                  const T* __restrict__ delta,  // NORM: [M, K] or nullptr
                  const T* __restrict__ g,      // NORM: [K]
                  float eps,
                  T* __restrict__ res_out,      // NORM with delta: [M, K] (written by block 0)
                  const T* __restrict__ w,      // [N, K]
                  const T* __restrict__ bias,   // [N] or nullptr
                  T* __restrict__ y,            // [M, N]
                  int N, int K, int split, int ntiles) {
    using V16 = Vec16<T>;
    constexpr int VEC = V16::N;
    constexpr int MP = next_pow2(M);
    constexpr int V = ROWS * MP;
    constexpr int U = 8 / ROWS > 0 ? 8 / ROWS : 1;
    static_assert(V <= 32, "ROWS * next_pow2(M) must be <= 32");
    extern __shared__ uint4 s_h[];  // [M * kvec] 16-byte vectors of h
    __shared__ float s_part[GEMV_WARPS][V];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = warp / split, part = warp % split;
    const int groups = GEMV_WARPS / split;
    const int kvec = K / VEC;
    const int stride = split * 32;
    const int c0 = part * 32 + lane;

    auto row_ptrs = [&](long long row0, const uint4* (&wrow)[ROWS]) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {  // rows past N read row N - 1 (valid memory) and are not stored
            const long long row = row0 + r < N ? row0 + r : (long long)N - 1;
            wrow[r] = reinterpret_cast<const uint4*>(w + row * K);
        }
    };

    // The first tile's first U * ROWS vectors of W, in flight during the prologue.
    long long row0 = ((long long)blockIdx.x * groups + group) * ROWS;
    const uint4* wrow[ROWS];
    row_ptrs(row0, wrow);
    const bool pre = row0 < N && c0 + (U - 1) * stride < kvec;
    uint4 wpre[U][ROWS];
    if (pre) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) wpre[u][r] = load_stream16(wrow[r] + c0 + u * stride);
    }

    gemv_prologue<T, M, MODE>(s_h, x, delta, g, eps, res_out, K);

    float acc[V];
    auto fma_vec = [&](const uint4 (&wv)[ROWS], int c) {
        float wf[ROWS][VEC];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) V16::unpack(wv[r], wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float xf[VEC];
            V16::unpack(s_h[m * kvec + c], xf);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float s = acc[r * MP + m];
#pragma unroll
                for (int e = 0; e < VEC; ++e) s = fmaf(wf[r][e], xf[e], s);
                acc[r * MP + m] = s;
            }
        }
    };

    // One tile from vector c on (acc accumulated so far), then its epilogue.
    auto run_tile = [&](int c) {
        if (row0 < N) {
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
        if (split > 1) __syncthreads();  // s_part is reused by the next tile
    };

    // The first tile (blockIdx.x < ntiles) starts with the prefetched round; peeled out of the tile
    // loop so that wpre is dead (no registers) in the loop.
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    if (pre) {
#pragma unroll
        for (int u = 0; u < U; ++u) fma_vec(wpre[u], c0 + u * stride);
    }
    run_tile(pre ? c0 + U * stride : c0);
    for (int tile = blockIdx.x + gridDim.x; tile < ntiles; tile += gridDim.x) {
        row0 = ((long long)tile * groups + group) * ROWS;
        row_ptrs(row0, wrow);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = 0.0f;
        run_tile(c0);
    }
}

// ---------------------------------------------------------------------------------------
// Fused prologues (gemv_fused_kernel): launch. h lives in dynamic shared memory, M * K * sizeof(T)
// bytes (opted in past 48 KB, up to the device's per-block maximum). Grid: ntiles row tiles of
// GEMV_FUSED_ROWS * (8 / split) rows; `tiles` tiles a block (0: enough that one wave of resident
// blocks covers them all, from the occupancy calculator; then every block pays the prologue once).
template <typename Kernel>
static cudaError_t fused_resident_blocks(Kernel kernel, size_t smem, int* blocks_per_sm) {
    // cached per (kernel, smem, device): the occupancy calculator and the attribute are host calls
    // that need not be repeated on every launch (and the first launch happens before graph capture)
    static std::mutex mu;
    static std::map<std::tuple<const void*, size_t, int>, int> cache;
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), smem, dev);
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
        *blocks_per_sm = it->second;
        return cudaSuccess;
    }
    if (smem > 48 * 1024) {
        int optin = 0;
        err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (err != cudaSuccess) return err;
        if (smem + 1024 > (size_t)optin) return cudaErrorInvalidValue;  // + the static s_part / s_red
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return err;
    }
    int n = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, GEMV_THREADS, smem);
    if (err != cudaSuccess) return err;
    if (n < 1) return cudaErrorInvalidValue;
    cache[key] = n;
    *blocks_per_sm = n;
    return cudaSuccess;
}

template <typename T, int M, int MODE>
static cudaError_t launch_fused(const void* x, const void* delta, const void* g, float eps, void* res_out,
                                const void* w, const void* b, void* y, int N, int K, int split, int tiles, int num_sms,
                                cudaStream_t stream) {
    constexpr int ROWS = GEMV_FUSED_ROWS;
    auto kernel = gemv_fused_kernel<T, M, ROWS, MODE>;
    const size_t smem = (size_t)M * K * sizeof(T);
    int per_sm = 0;
    cudaError_t err = fused_resident_blocks(kernel, smem, &per_sm);
    if (err != cudaSuccess) return err;
    const int rows_per_block = ROWS * (GEMV_WARPS / split);
    const long long ntiles = ((long long)N + rows_per_block - 1) / rows_per_block;
    if (ntiles > 0x7fffffffLL) return cudaErrorInvalidValue;
    if (tiles <= 0) {
        const long long resident = (long long)per_sm * num_sms;
        tiles = (int)((ntiles + resident - 1) / resident);
    }
    const long long blocks = (ntiles + tiles - 1) / tiles;
    kernel<<<(unsigned)blocks, GEMV_THREADS, smem, stream>>>((const T*)x, (const T*)delta, (const T*)g, eps,
                                                             (T*)res_out, (const T*)w, (const T*)b, (T*)y, N, K, split,
                                                             (int)ntiles);
    return cudaGetLastError();
}

template <typename T, int MODE>
static cudaError_t launch_fused_m(const void* x, const void* delta, const void* g, float eps, void* res_out,
                                  const void* w, const void* b, void* y, int M, int N, int K, int split, int tiles,
                                  int num_sms, cudaStream_t stream) {
    switch (M) {
        case 1: return launch_fused<T, 1, MODE>(x, delta, g, eps, res_out, w, b, y, N, K, split, tiles, num_sms, stream);
        case 2: return launch_fused<T, 2, MODE>(x, delta, g, eps, res_out, w, b, y, N, K, split, tiles, num_sms, stream);
        default: return cudaErrorInvalidValue;
    }
}

template <int MODE>
static cudaError_t launch_fused_t(const void* x, const void* delta, const void* g, float eps, void* res_out,
                                  const void* w, const void* b, void* y, int dtype, int M, int N, int K, int split,
                                  int tiles, int num_sms, cudaStream_t stream) {
    switch (dtype) {
        case VS_F32:
            return launch_fused_m<float, MODE>(x, delta, g, eps, res_out, w, b, y, M, N, K, split, tiles, num_sms, stream);
        case VS_BF16:
            return launch_fused_m<__nv_bfloat16, MODE>(x, delta, g, eps, res_out, w, b, y, M, N, K, split, tiles,
                                                       num_sms, stream);
        case VS_F16:
            return launch_fused_m<__half, MODE>(x, delta, g, eps, res_out, w, b, y, M, N, K, split, tiles, num_sms,
                                                stream);
        default: return cudaErrorInvalidValue;
    }
}

// y[M, N] = h[M, K] @ w[N, K]^T (+ b) with h computed by the fused prologue (v1 only, 1 <= M <= 2):
//   mode 1 (GEMV_NORM):   x [M, K], delta [M, K] or null, g [K], eps; res_out [M, K] (x + delta,
//                         rounded) is written when delta is given (must not alias x or delta).
//   mode 2 (GEMV_SWIGLU): x = gu [M, 2K] = [gate | up]; delta, g, res_out unused.
// Every pointer 16-byte aligned, K * sizeof(T) a multiple of 16, M * K * sizeof(T) bytes of shared
// memory available. split: 1, 2, 4, 8 or 0 (vs_gemv_split); tiles: row tiles a block, 0 = one wave.
extern "C" cudaError_t vs_gemv_fused(int mode, const void* x, const void* delta, const void* g, float eps,
                                     void* res_out, const void* w, const void* b, void* y, int dtype, int M, int N,
                                     int K, int split, int tiles, int num_sms, cudaStream_t stream) {
    const int elem = dtype == VS_F32 ? 4 : 2;
    if (M < 1 || M > 2 || N < 0 || K < 1 || tiles < 0) return cudaErrorInvalidValue;
    if (((long long)K * elem) % 16 != 0) return cudaErrorInvalidValue;
    if (mode != GEMV_NORM && mode != GEMV_SWIGLU) return cudaErrorInvalidValue;
    if (mode == GEMV_NORM && (g == nullptr || (delta != nullptr && res_out == nullptr))) return cudaErrorInvalidValue;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) |
                           reinterpret_cast<uintptr_t>(delta) | reinterpret_cast<uintptr_t>(g) |
                           reinterpret_cast<uintptr_t>(res_out);
    if (addr & 15) return cudaErrorInvalidValue;
    if (mode == GEMV_SWIGLU) delta = g = res_out = nullptr;
    if (mode == GEMV_NORM && delta == nullptr) res_out = nullptr;
    if (N == 0) return cudaSuccess;
    if (split == 0) split = vs_gemv_split(M, N, K, GEMV_FUSED_ROWS, elem, num_sms);
    if (split != 1 && split != 2 && split != 4 && split != 8) return cudaErrorInvalidValue;
    return mode == GEMV_NORM
               ? launch_fused_t<GEMV_NORM>(x, delta, g, eps, res_out, w, b, y, dtype, M, N, K, split, tiles, num_sms, stream)
               : launch_fused_t<GEMV_SWIGLU>(x, delta, g, eps, res_out, w, b, y, dtype, M, N, K, split, tiles, num_sms,
                                             stream);
}
