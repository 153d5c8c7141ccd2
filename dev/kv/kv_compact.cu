// kv_compact.cu: keep the accepted K/V entries of a verify pass (dev/kv/kv.py semantics).
//
// A verify pass wrote num_rows[b] = k_b + 1 new entries per sequence, ragged and contiguous:
// new_kv [R, row_bytes], sequence b's rows at cu_num_rows[b] ... cu_num_rows[b + 1]. The first
// num_emitted[b] of them are kept, and go either
//   packed:  to packed[cu_num_emitted[b] + j]              (compact_kv)
//   cache:   to cache[b, cache_lens[b] + j]                (scatter_to_cache, cache [B, S, ...])
//   e.g. num_rows=[3,1,4], num_emitted=[2,1,3] -> cu_num_rows=[0,3,4,8], cu_num_emitted=[0,2,3,6]
// The kept rows of one sequence are contiguous at both ends, so each sequence is ONE memcpy of
// num_emitted[b] * row_bytes bytes: all the work is finding where it starts.
//
// Versions:
//   v1 kv_naive_kernel   one thread per sequence: a serial loop over the previous sequences for
//       its offsets (O(B^2) reads in all), then copies its bytes alone, 4 bytes at a time when
//       aligned. One thread moves a whole sequence (kilobytes): no coalescing, and the
//       sequences with more kept rows hold the whole warp back.
//   v2 kv_scan_kernel + kv_copy_kernel: one block computes the exclusive prefix sums
//       of num_emitted and num_rows (warp __shfl_up_sync scans, one value per warp through
//       shared memory, carried across 1024-wide tiles), then a grid of (B, blocks per
//       sequence) blocks copies every sequence's byte range with 16-byte vectors (8/4/1 when the
//       addresses or the size are not 16-byte aligned), consecutive threads on consecutive
//       vectors: coalesced reads and writes. Two launches, no host sync (the output capacity
//       is R rows, known on the host).
//   v3 kv_fused_kernel: ONE launch. Block (b, c) computes its own exclusive
//       prefix sums by a block reduction over num_rows[0:b] and num_emitted[0:b] (b ints each,
//       L2-resident: O(B^2) reads in all but spread over B blocks, a few hundred ns each for
//       B <= a few thousand), then copies like v2. Saves v2's second launch and the
//       dependency between the two, which is most of the time at small B.
#include "cuda_dtypes.cuh"

// ---------------------------------------------------------------------------------------
// v1
__global__ void kv_naive_kernel(const unsigned char* __restrict__ new_kv, long long row_bytes,
                                const int* __restrict__ num_rows, const int* __restrict__ num_emitted, int batch,
                                int to_cache, unsigned char* __restrict__ dst_base,
                                const long long* __restrict__ cache_lens, long long cache_seq_len,
                                int* __restrict__ cu_num_emitted) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    long long src_row = 0, dst_row = 0;
    for (int j = 0; j < b; ++j) {
        src_row += num_rows[j];
        dst_row += min(max(num_emitted[j], 0), num_rows[j]);
    }
    int n = min(max(num_emitted[b], 0), num_rows[b]);
    if (!to_cache) {
        if (b == 0) cu_num_emitted[0] = 0;
        cu_num_emitted[b + 1] = (int)(dst_row + n);
    } else {
        const long long len = cache_lens[b];
        dst_row = (long long)b * cache_seq_len + len;
        n = (int)max(0LL, min((long long)n, cache_seq_len - len));  // never write past the capacity
    }
    const unsigned char* src = new_kv + src_row * row_bytes;
    unsigned char* dst = dst_base + dst_row * row_bytes;
    const long long nbytes = n * row_bytes;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | (uintptr_t)nbytes) & 3) == 0) {
        for (long long i = 0; i < nbytes / 4; ++i) ((unsigned*)dst)[i] = ((const unsigned*)src)[i];
    } else {
        for (long long i = 0; i < nbytes; ++i) dst[i] = src[i];
    }
}

// ---------------------------------------------------------------------------------------
// v2: exclusive prefix sums in one block.
#define KV_SCAN_THREADS 1024

__device__ __forceinline__ int block_inclusive_scan(int v, int* s_warp /* [32] */, int* s_total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int o = __shfl_up_sync(VS_FULL_MASK, v, off);
        if (lane >= off) v += o;
    }
    if (lane == 31) s_warp[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = s_warp[lane];  // KV_SCAN_THREADS = 1024: exactly 32 warps
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int o = __shfl_up_sync(VS_FULL_MASK, w, off);
            if (lane >= off) w += o;
        }
        s_warp[lane] = w;  // inclusive over warps
        if (lane == 31) *s_total = w;
    }
    __syncthreads();
    if (warp > 0) v += s_warp[warp - 1];
    return v;
}

__global__ void __launch_bounds__(KV_SCAN_THREADS)
kv_scan_kernel(const int* __restrict__ num_rows, const int* __restrict__ num_emitted, int batch,
               int* __restrict__ cu_num_rows, int* __restrict__ cu_num_emitted) {  // [B + 1] each
    __shared__ int s_warp[32];
    __shared__ int s_total;
    int carry_rows = 0, carry_emit = 0;
    if (threadIdx.x == 0) { cu_num_rows[0] = 0; cu_num_emitted[0] = 0; }
    for (int base = 0; base < batch; base += KV_SCAN_THREADS) {
        const int b = base + threadIdx.x;
        const int rows = b < batch ? num_rows[b] : 0;
        const int emit = b < batch ? min(max(num_emitted[b], 0), rows) : 0;
        const int inc_rows = block_inclusive_scan(rows, s_warp, &s_total);
        const int tile_rows = s_total;
        __syncthreads();  // s_warp / s_total are reused by the next scan
        const int inc_emit = block_inclusive_scan(emit, s_warp, &s_total);
        const int tile_emit = s_total;
        __syncthreads();
        if (b < batch) {
            cu_num_rows[b + 1] = carry_rows + inc_rows;
            cu_num_emitted[b + 1] = carry_emit + inc_emit;
        }
        carry_rows += tile_rows;
        carry_emit += tile_emit;
    }
}

// v2: the coalesced copy. grid = (B, blocks_per_seq).
#define KV_COPY_THREADS 256

template <typename W>
__device__ __forceinline__ void copy_words(const unsigned char* src, unsigned char* dst, long long nbytes) {
    const W* s = reinterpret_cast<const W*>(src);
    W* d = reinterpret_cast<W*>(dst);
    const long long n = nbytes / (long long)sizeof(W);
    const long long stride = (long long)gridDim.y * blockDim.x;
    long long i = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    for (; i + stride < n; i += 2 * stride) {  // two loads in flight per thread
        const W a = s[i], c = s[i + stride];
        d[i] = a;
        d[i + stride] = c;
    }
    if (i < n) d[i] = s[i];
}

__global__ void __launch_bounds__(KV_COPY_THREADS)
kv_copy_kernel(const unsigned char* __restrict__ new_kv, long long row_bytes, const int* __restrict__ num_rows,
               const int* __restrict__ num_emitted, const int* __restrict__ cu_num_rows,
               const int* __restrict__ cu_num_emitted, int to_cache, unsigned char* __restrict__ dst_base,
               const long long* __restrict__ cache_lens, long long cache_seq_len) {
    const int b = blockIdx.x;
    int n = min(max(num_emitted[b], 0), num_rows[b]);
    long long dst_row;
    if (to_cache) {
        const long long len = cache_lens[b];
        dst_row = (long long)b * cache_seq_len + len;
        n = (int)max(0LL, min((long long)n, cache_seq_len - len));
    } else {
        dst_row = cu_num_emitted[b];
    }
    const unsigned char* src = new_kv + (long long)cu_num_rows[b] * row_bytes;
    unsigned char* dst = dst_base + dst_row * row_bytes;
    const long long nbytes = n * row_bytes;
    const uintptr_t align = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | (uintptr_t)nbytes;
    if ((align & 15) == 0) copy_words<uint4>(src, dst, nbytes);  // block-uniform branches
    else if ((align & 7) == 0) copy_words<uint2>(src, dst, nbytes);
    else if ((align & 3) == 0) copy_words<unsigned>(src, dst, nbytes);
    else copy_words<unsigned char>(src, dst, nbytes);
}

// v3 (v2 fused into one launch): grid = (B, blocks_per_seq); each block finds its own offsets.
__device__ __forceinline__ void block_sum2(long long& x, long long& y) {
    __shared__ long long s_x[32], s_y[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        x += __shfl_down_sync(VS_FULL_MASK, x, off);
        y += __shfl_down_sync(VS_FULL_MASK, y, off);
    }
    if (lane == 0) { s_x[warp] = x; s_y[warp] = y; }
    __syncthreads();
    x = lane < nwarps ? s_x[lane] : 0;
    y = lane < nwarps ? s_y[lane] : 0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        x += __shfl_down_sync(VS_FULL_MASK, x, off);
        y += __shfl_down_sync(VS_FULL_MASK, y, off);
    }
    x = __shfl_sync(VS_FULL_MASK, x, 0);
    y = __shfl_sync(VS_FULL_MASK, y, 0);
}

__global__ void __launch_bounds__(KV_COPY_THREADS)
kv_fused_kernel(const unsigned char* __restrict__ new_kv, long long row_bytes, const int* __restrict__ num_rows,
                const int* __restrict__ num_emitted, int to_cache, unsigned char* __restrict__ dst_base,
                const long long* __restrict__ cache_lens, long long cache_seq_len, int* __restrict__ cu_num_emitted) {
    const int b = blockIdx.x;
    long long src_row = 0, emit_before = 0;
    for (int j = threadIdx.x; j < b; j += blockDim.x) {
        const int rows = num_rows[j];
        src_row += rows;
        emit_before += min(max(num_emitted[j], 0), rows);
    }
    block_sum2(src_row, emit_before);
    int n = min(max(num_emitted[b], 0), num_rows[b]);
    long long dst_row = emit_before;
    if (to_cache) {
        const long long len = cache_lens[b];
        dst_row = (long long)b * cache_seq_len + len;
        n = (int)max(0LL, min((long long)n, cache_seq_len - len));
    } else if (blockIdx.y == 0 && threadIdx.x == 0) {
        if (b == 0) cu_num_emitted[0] = 0;
        cu_num_emitted[b + 1] = (int)(emit_before + n);
    }
    const unsigned char* src = new_kv + src_row * row_bytes;
    unsigned char* dst = dst_base + dst_row * row_bytes;
    const long long nbytes = n * row_bytes;
    const uintptr_t align = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | (uintptr_t)nbytes;
    if ((align & 15) == 0) copy_words<uint4>(src, dst, nbytes);
    else if ((align & 7) == 0) copy_words<uint2>(src, dst, nbytes);
    else if ((align & 3) == 0) copy_words<unsigned>(src, dst, nbytes);
    else copy_words<unsigned char>(src, dst, nbytes);
}

// ---------------------------------------------------------------------------------------
// Host launcher. variant 0 = naive (v1), 1 = scan (v2), 2 = fused (v3). to_cache = 0: dst is packed [R, row];
// 1: dst is the cache [B, cache_seq_len, row] and cache_lens [B] int64. cu_num_rows is
// scratch [B + 1]; cu_num_emitted [B + 1] is written in packed mode (and by v2 always).
extern "C" cudaError_t vs_kv_compact(int variant, const void* new_kv, long long rows_total, long long row_bytes,
                                     const int* num_rows, const int* num_emitted, int batch, int to_cache, void* dst,
                                     const long long* cache_lens, long long cache_seq_len, int* cu_num_rows,
                                     int* cu_num_emitted, cudaStream_t stream) {
    if (batch == 0) return cudaSuccess;
    if (variant == 0) {
        const int threads = 128;
        kv_naive_kernel<<<(batch + threads - 1) / threads, threads, 0, stream>>>(
            (const unsigned char*)new_kv, row_bytes, num_rows, num_emitted, batch, to_cache, (unsigned char*)dst,
            cache_lens, cache_seq_len, cu_num_emitted);
        return cudaGetLastError();
    }
    if (variant != 1 && variant != 2) return cudaErrorInvalidValue;
    // Blocks per sequence from the average bytes per sequence (host-known: R rows in all), one
    // block per 32 KiB, at most 64; the grid-stride copy handles any per-sequence size.
    const long long avg_bytes = (rows_total * row_bytes + batch - 1) / batch;
    long long per_seq = (avg_bytes + 32767) / 32768;
    if (per_seq < 1) per_seq = 1;
    if (per_seq > 64) per_seq = 64;
    dim3 grid(batch, (unsigned)per_seq);
    if (variant == 2) {
        kv_fused_kernel<<<grid, KV_COPY_THREADS, 0, stream>>>((const unsigned char*)new_kv, row_bytes, num_rows,
                                                              num_emitted, to_cache, (unsigned char*)dst, cache_lens,
                                                              cache_seq_len, cu_num_emitted);
        return cudaGetLastError();
    }
    kv_scan_kernel<<<1, KV_SCAN_THREADS, 0, stream>>>(num_rows, num_emitted, batch, cu_num_rows, cu_num_emitted);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    kv_copy_kernel<<<grid, KV_COPY_THREADS, 0, stream>>>((const unsigned char*)new_kv, row_bytes, num_rows,
                                                         num_emitted, cu_num_rows, cu_num_emitted, to_cache,
                                                         (unsigned char*)dst, cache_lens, cache_seq_len);
    return cudaGetLastError();
}
