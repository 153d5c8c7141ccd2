// common.cuh: device helpers shared by the verispec CUDA kernels.
//
//   - load_float / Vec16: 16-byte vector loads of fp32 / bf16 / fp16 rows, unpacked to float
//   - for_each_element: walk [0, n) of a row with 16-byte loads (scalar head to reach alignment,
//     vector body, scalar tail), so V need not be a multiple of anything
//   - argmax with torch.argmax's tie-break (lowest index wins) through __shfl_down_sync
//   - online softmax statistics (running max m, running sum s of exp(z - m)) and their merge
//   - Philox-4x32-10 exactly as verispec/verify/rng.py (counter (col, row, offset, purpose) with
//     row local to the sequence, key (seed_lo, seed_hi) of the sequence's seed), and its uniform
//     map ((x >> 9) * 2 + 1) * 2^-24
//   - the status word (verispec/verify/status.py): its bits, the per-element value test, block OR,
//     and each sequence's place in the ragged layout, checked before any read that depends on it
//
// Plain CUDA C++: no torch headers, so every .cu compiles standalone with nvcc (CPU CI).
#pragma once

#include "cuda_dtypes.cuh"

// Calls f(value, index) for each element i in [0, n) of row (index relative to row) that this
// thread owns, with 16-byte loads for the aligned body. UNROLL vector loads are issued before
// any is used, so several are in flight per thread. Each thread sees its indices in increasing
// order (head, then body, then tail), which lets a per-thread argmax use a strict '>'.
// STREAM: evict-first loads (__ldcs) for data read exactly once, instead of __ldg.
//   e.g. bf16, row at an address = 4 (mod 16): head = 6 scalar elements, then 8 per uint4.
template <bool STREAM>
__device__ __forceinline__ uint4 load16(const uint4* p) {
    if constexpr (STREAM) return __ldcs(p);
    else return __ldg(p);
}

template <typename T, int UNROLL, bool STREAM = false, typename F>
__device__ __forceinline__ void for_each_element(const T* __restrict__ row, int n, F f) {
    constexpr int PER_VEC = 16 / sizeof(T);
    const int bd = blockDim.x, tid = threadIdx.x;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
    int head = (int)(((16 - (addr & 15)) & 15) / sizeof(T));
    if (head > n) head = n;
    for (int i = tid; i < head; i += bd) f(to_float(row[i]), i);
    const int nvec = (n - head) / PER_VEC;
    const uint4* vrow = reinterpret_cast<const uint4*>(row + head);
    int j = tid;
    for (; j + (UNROLL - 1) * bd < nvec; j += UNROLL * bd) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = load16<STREAM>(vrow + j + u * bd);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const T* e = reinterpret_cast<const T*>(&v[u]);
            const int base = head + (j + u * bd) * PER_VEC;
#pragma unroll
            for (int t = 0; t < PER_VEC; ++t) f(to_float(e[t]), base + t);
        }
    }
    for (; j < nvec; j += bd) {
        uint4 v = load16<STREAM>(vrow + j);
        const T* e = reinterpret_cast<const T*>(&v);
        const int base = head + j * PER_VEC;
#pragma unroll
        for (int t = 0; t < PER_VEC; ++t) f(to_float(e[t]), base + t);
    }
    for (int i = head + nvec * PER_VEC + tid; i < n; i += bd) f(to_float(row[i]), i);
}

// ---- argmax with torch.argmax's tie-break -------------------------------------------------
// (val, idx) pairs; "better" = larger value, or equal value and lower index. The identity is
// (-inf, INT_MAX): it loses to every real element, including a -inf one (lower index).
struct ArgMax {
    float val;
    int idx;
};

__device__ __forceinline__ ArgMax argmax_identity() { return {-INFINITY, 0x7fffffff}; }

__device__ __forceinline__ bool argmax_better(float v, int i, const ArgMax& a) {
    return v > a.val || (v == a.val && i < a.idx);
}

__device__ __forceinline__ void argmax_update(ArgMax& a, float v, int i) {
    if (argmax_better(v, i, a)) { a.val = v; a.idx = i; }
}

// For a thread that sees its indices in increasing order: the first maximum is kept by '>'
// (the idx test takes the first element when all are -inf, as torch.argmax returns 0).
__device__ __forceinline__ void argmax_update_ordered(ArgMax& a, float v, int i) {
    if (v > a.val || a.idx == 0x7fffffff) { a.val = v; a.idx = i; }
}

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float v = __shfl_down_sync(VS_FULL_MASK, a.val, off);
        int i = __shfl_down_sync(VS_FULL_MASK, a.idx, off);
        argmax_update(a, v, i);
    }
    return a;
}

// Block-wide argmax; the result is valid in every thread. blockDim.x multiple of 32, <= 1024.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    a = warp_argmax(a);
    __syncthreads();  // protect s_* against a previous call still reading them
    if (lane == 0) { s_val[warp] = a.val; s_idx[warp] = a.idx; }
    __syncthreads();
    a = lane < nwarps ? ArgMax{s_val[lane], s_idx[lane]} : argmax_identity();
    a = warp_argmax(a);  // every warp reduces the same 32 values: no second broadcast needed
    return {__shfl_sync(VS_FULL_MASK, a.val, 0), __shfl_sync(VS_FULL_MASK, a.idx, 0)};
}

// ---- online softmax statistics ------------------------------------------------------------
// (m, s): running max m of z and s = sum exp(z - m). -inf entries (filtered tokens) add nothing
// and never produce exp(-inf - -inf) = NaN.
struct SoftmaxStats {
    float m;
    float s;
};

__device__ __forceinline__ void stats_update(SoftmaxStats& a, float z) {
    if (z == -INFINITY) return;
    if (z > a.m) {
        a.s = a.s * expf(a.m - z) + 1.0f;  // a.m = -inf gives exp(-inf) = 0
        a.m = z;
    } else {
        a.s += expf(z - a.m);
    }
}

__device__ __forceinline__ SoftmaxStats stats_merge(SoftmaxStats a, SoftmaxStats b) {
    if (b.m == -INFINITY) return a;
    if (a.m == -INFINITY) return b;
    const float m = fmaxf(a.m, b.m);
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ SoftmaxStats block_stats(SoftmaxStats a) {
    __shared__ float s_m[32];
    __shared__ float s_s[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        SoftmaxStats o{__shfl_down_sync(VS_FULL_MASK, a.m, off), __shfl_down_sync(VS_FULL_MASK, a.s, off)};
        a = stats_merge(a, o);
    }
    __syncthreads();
    if (lane == 0) { s_m[warp] = a.m; s_s[warp] = a.s; }
    __syncthreads();
    a = lane < nwarps ? SoftmaxStats{s_m[lane], s_s[lane]} : SoftmaxStats{-INFINITY, 0.0f};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        SoftmaxStats o{__shfl_down_sync(VS_FULL_MASK, a.m, off), __shfl_down_sync(VS_FULL_MASK, a.s, off)};
        a = stats_merge(a, o);
    }
    return {__shfl_sync(VS_FULL_MASK, a.m, 0), __shfl_sync(VS_FULL_MASK, a.s, 0)};
}

// ---- the verispec random stream (verispec/verify/rng.py) -----------------------------------------
#define VS_PURPOSE_ACCEPT 0u
#define VS_PURPOSE_RACE 1u

// Word 0 of philox4x32-10(key=(k0, k1), counter=(c0, c1, c2, c3)).
__device__ __forceinline__ uint32_t philox_x0(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                              uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const uint32_t hi_b = __umulhi(0xCD9E8D57u, c2), lo_b = 0xCD9E8D57u * c2;
        const uint32_t hi_a = __umulhi(0xD2511F53u, c0), lo_a = 0xD2511F53u * c0;
        c0 = hi_b ^ c1 ^ k0;
        c1 = lo_b;
        c2 = hi_a ^ c3 ^ k1;
        c3 = lo_a;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}

// Uniform in (0, 1), exact in float32: 23 random bits with the lowest bit set. seed / offset are
// one sequence's; row is local to that sequence (draft position, bonus row = k_b).
__device__ __forceinline__ float vs_uniform(uint64_t seed, uint64_t offset, uint32_t row, uint32_t col,
                                            uint32_t purpose) {
    const uint32_t x = philox_x0(col, row, (uint32_t)offset, purpose, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (float)((x >> 9) * 2u + 1u) * 5.9604644775390625e-08f;  // 2^-24
}

// ---- ragged layout ------------------------------------------------------------------------
// The sequence that owns target row r: the largest b with cu_num_draft[b] + b <= r.
//   e.g. num_draft=[2,0,3] -> cu=[0,2,2,5], rows 0-2 -> b=0, row 3 -> b=1, rows 4-7 -> b=2
__device__ __forceinline__ int seq_of_row(const int* __restrict__ cu_num_draft, int batch, int r) {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu_num_draft[mid] + mid <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// ---- the status word (verispec/verify/status.py; tests/test_cuda_compile.py checks the values agree) ----
#define VS_STATUS_NAN 1
#define VS_STATUS_POS_INF 2
#define VS_STATUS_DEAD_ROW 4
#define VS_STATUS_DRAFT_ID 8
#define VS_STATUS_NUM_DRAFT 16
#define VS_STATUS_SCALED 32
#define VS_STATUS_SETTINGS 64
#define VS_STATUS_DRAFT_PROBS 128
#define VS_MAX_SCALED_LOGIT 1073741824.0f  // 2**30: the largest |logit / T| a sampled row may have
#define VS_MIN_TEMPERATURE 1e-6f           // verispec/verify/sampling.py MIN_TEMPERATURE

// The status bits one logit sets on its own (NaN, +inf); -inf is a filtered token, not an error.
__device__ __forceinline__ int value_flags(float v) {
    return (v != v ? VS_STATUS_NAN : 0) | (v == INFINITY ? VS_STATUS_POS_INF : 0);
}

// OR of every thread's flags, valid in thread 0. One barrier when the block is clean (the usual case).
__device__ __forceinline__ int block_or(int flags) {
    __shared__ int s_or;
    if (!__syncthreads_or(flags)) return 0;  // block-uniform
    if (threadIdx.x == 0) s_or = 0;
    __syncthreads();
    if (flags) atomicOr(&s_or, flags);
    __syncthreads();
    return s_or;
}

// Block-wide float sum, valid in thread 0 (a fixed order: the result does not depend on timing).
__device__ __forceinline__ float block_sum(float x) {
    __shared__ float s_sum[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(VS_FULL_MASK, x, off);
    __syncthreads();
    if (lane == 0) s_sum[warp] = x;
    __syncthreads();
    x = lane < nwarps ? s_sum[lane] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(VS_FULL_MASK, x, off);
    return x;
}

// Sequence b's place in the ragged layout, or ok = false (status NUM_DRAFT) when num_draft /
// cu_num_draft cannot be trusted: k_b < 0, k_b > max_num_draft, sum(num_draft) + B != rows
// (cu_num_draft[B] read on the device), or its drafts not inside [0, N) with N = rows - B (what
// draft_tokens and draft_probs hold: the host checks their shapes). A sequence that is not ok is
// given k = 0 and no row: nothing of it is read.
//   e.g. num_draft = [2, -1, 3] (rows 7): cu = [0, 2, 1, 4] and cu[B] + B = 7 = rows. b = 1 has
//   k < 0: flagged. b = 2 reads drafts 1..3 and rows 3..6, all in range (no out-of-bounds read)
//   though meaningless; the batch's status is non-zero, so the caller refuses the whole call.
struct SeqLayout {
    int k;     // drafts
    int d0;    // first draft (draft_tokens / draft_probs row)
    int row0;  // first target row
    bool ok;
};

__device__ __forceinline__ SeqLayout seq_layout(const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft,
                                                int batch, int b, int max_num_draft, int num_rows) {
    const int k = num_draft[b], d0 = cu_num_draft[b], total = cu_num_draft[batch];
    const long long num_drafts = (long long)num_rows - batch;
    const bool ok = k >= 0 && k <= max_num_draft && d0 >= 0 && (long long)d0 + k <= num_drafts &&
                    (long long)total + batch == num_rows;
    return ok ? SeqLayout{k, d0, d0 + b, true} : SeqLayout{0, 0, 0, false};
}
