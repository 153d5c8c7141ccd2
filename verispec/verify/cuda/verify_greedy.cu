// verify_greedy.cu: greedy verification of ragged drafts, kernel versions side by side.
//
// Semantics (verispec/verify/reference.py, reference_verify_greedy): sequence b proposes k_b drafts,
// scored by target rows row0 = cu_num_draft[b] + b ... row0 + k_b (the last is the bonus row).
// Drafts are accepted while draft == argmax(target row); then the target argmax of the first
// rejected row (or of the bonus row) is emitted. tokens [B, max_k + 1] int32, -1 padded.
//
// Two stages, each with its versions:
//
//   argmax (bytes: R * V * sizeof(T), the whole cost at V = 128k):
//     v2 argmax_partial_kernel<T, false>  a block of 256 threads per (row, vocab chunk);
//         16-byte vector loads, 4 loads in flight; per-thread running argmax, then
//         __shfl_down_sync (value, index) reduction with torch.argmax's tie-break (lowest
//         index), then one value per warp through shared memory. Rows are split into chunks
//         when there are too few rows to fill the GPU (B = 1: 5 rows, 132 SMs); the scan
//         kernels merge the chunk partials (chunks == 1 when R is large).
//     v3 argmax_partial_kernel<T, true>   the same with evict-first streaming loads (the logits
//         are read once), 8 loads in flight, and a strict `>` per thread (a thread sees its ids
//         in increasing order; the full tie rule runs only where threads, warps and chunks merge).
//
//   acceptance scan (bytes: tiny; where the raggedness shows):
//     v1 scan_naive_kernel    one thread per sequence walks its drafts until the first
//         mismatch and writes its output row serially. Lanes of a warp finish after
//         1 ... k_b + 1 steps: divergent, and the per-thread serial writes are uncoalesced
//         (stride max_k + 1 between neighbouring threads).
//     v2 scan_ballot_kernel   one warp per sequence: lane i compares position i,
//         __ballot_sync(mismatch) + __ffs gives the first mismatch in one step (32 positions a
//         step, loop for k_b > 32); the output row is written by the lanes together.
//     v3 scan_segment_kernel  one warp holds 32 / S sequences, S = next_pow2(max_k) lanes each
//         (K = 8: 4 sequences per warp): the same ballot, each segment reading its own bits of
//         the 32-bit mask. v2 leaves 32 - k_b lanes idle (24 of 32 at K = 8); v3 fills them.
//
// Host launchers are extern "C" on raw pointers so that this file compiles with plain nvcc;
// binding.cpp wraps them for torch.
#include "common.cuh"

// ---------------------------------------------------------------------------------------
// argmax over each row's vocabulary chunk.  grid = (R, chunks), block = ARGMAX_THREADS.
// Writes part_val/part_idx[r * chunks + c] (idx is the absolute vocab id).
#define ARGMAX_THREADS 256

template <typename T, bool V3>
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_partial_kernel(const T* __restrict__ logits,  // [R, V], row stride row_stride elements
                      long long row_stride, int vocab, int chunk_len, int chunks,
                      float* __restrict__ part_val,  // [R * chunks]
                      int* __restrict__ part_idx) {  // [R * chunks]
    const long long r = blockIdx.x;  // rows on x: R can exceed grid.y's 65535
    const int c = blockIdx.y;
    const int start = c * chunk_len;
    const int n = min(chunk_len, vocab - start);
    ArgMax a = argmax_identity();
    if (n > 0) {
        const T* row = logits + r * row_stride + start;
        if constexpr (V3) {
            for_each_element<T, 8, true>(row, n, [&](float v, int i) { argmax_update_ordered(a, v, start + i); });
        } else {
            for_each_element<T, 4, false>(row, n, [&](float v, int i) { argmax_update(a, v, start + i); });
        }
    }
    a = block_argmax(a);
    if (threadIdx.x == 0) {
        part_val[r * chunks + c] = a.val;
        part_idx[r * chunks + c] = a.idx;
    }
}

// The target argmax of row r from its chunk partials (chunks == 1: part_idx is the argmax and
// part_val may be null). NOTE: the loads are issued 8 chunks at a time before any compare: a
// plain loop makes `chunks` dependent L2 round trips (32 at V = 128k, B = 1: ~4 us measured).
__device__ __forceinline__ int row_argmax(const float* __restrict__ part_val, const int* __restrict__ part_idx,
                                          int chunks, int r) {
    if (chunks == 1) return part_idx[r];
    const float* pv = part_val + (long long)r * chunks;
    const int* pi = part_idx + (long long)r * chunks;
    ArgMax a = argmax_identity();
    int c = 0;
    for (; c + 8 <= chunks; c += 8) {
        float v[8];
        int ix[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) { v[u] = pv[c + u]; ix[u] = pi[c + u]; }
#pragma unroll
        for (int u = 0; u < 8; ++u) argmax_update(a, v[u], ix[u]);
    }
    for (; c < chunks; ++c) argmax_update(a, pv[c], pi[c]);
    return a.idx;
}

// ---------------------------------------------------------------------------------------
// v1: one thread per sequence.
__global__ void scan_naive_kernel(const float* __restrict__ part_val, const int* __restrict__ part_idx, int chunks,
                                  const long long* __restrict__ draft_tokens,  // [N]
                                  const int* __restrict__ num_draft,           // [B]
                                  const int* __restrict__ cu_num_draft,        // [B + 1]
                                  int batch, int width,                        // width = max_k + 1
                                  int* __restrict__ tokens,                    // [B, width]
                                  int* __restrict__ num_accepted,              // [B]
                                  int* __restrict__ num_emitted) {             // [B]
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const int k = num_draft[b], d0 = cu_num_draft[b], row0 = d0 + b;
    int* out = tokens + (long long)b * width;
    int acc = 0;
    while (acc < k) {
        const int target = row_argmax(part_val, part_idx, chunks, row0 + acc);
        const int draft = (int)draft_tokens[d0 + acc];
        if (draft != target) break;
        out[acc++] = draft;
    }
    out[acc] = row_argmax(part_val, part_idx, chunks, row0 + acc);
    for (int j = acc + 1; j < width; ++j) out[j] = -1;
    num_accepted[b] = acc;
    num_emitted[b] = acc + 1;
}

// v2: one warp per sequence, SCAN_WARPS sequences per block.
#define SCAN_WARPS 4

__global__ void __launch_bounds__(SCAN_WARPS * 32)
scan_ballot_kernel(const float* __restrict__ part_val, const int* __restrict__ part_idx, int chunks,
                   const long long* __restrict__ draft_tokens, const int* __restrict__ num_draft,
                   const int* __restrict__ cu_num_draft, int batch, int width, int* __restrict__ tokens,
                   int* __restrict__ num_accepted, int* __restrict__ num_emitted) {
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * SCAN_WARPS + (threadIdx.x >> 5);
    if (b >= batch) return;  // warp-uniform: the whole warp leaves together
    const int k = num_draft[b], d0 = cu_num_draft[b], row0 = d0 + b;
    int acc = k;  // all accepted unless a mismatch is found
    for (int base = 0; base < k; base += 32) {
        const int i = base + lane;
        bool mismatch = false;
        if (i < k) mismatch = (int)draft_tokens[d0 + i] != row_argmax(part_val, part_idx, chunks, row0 + i);
        const unsigned m = __ballot_sync(VS_FULL_MASK, mismatch);
        if (m) {  // warp-uniform
            acc = base + __ffs(m) - 1;
            break;
        }
    }
    int* out = tokens + (long long)b * width;
    for (int j = lane; j < width; j += 32) {
        int t = -1;
        if (j < acc) t = (int)draft_tokens[d0 + j];
        else if (j == acc) t = row_argmax(part_val, part_idx, chunks, row0 + acc);
        out[j] = t;
    }
    if (lane == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = acc + 1;
    }
}

// v3: segments of SEG lanes (a power of two <= 32), one sequence per segment.
//   e.g. SEG = 8: lanes 0-7 -> sequence 4w, lanes 8-15 -> 4w + 1, ...; the ballot mask m holds
//   every segment's mismatches, segment s reads (m >> 8s) & 0xff.
__global__ void __launch_bounds__(128)
scan_segment_kernel(const float* __restrict__ part_val, const int* __restrict__ part_idx, int chunks,
                    const long long* __restrict__ draft_tokens, const int* __restrict__ num_draft,
                    const int* __restrict__ cu_num_draft, int batch, int width, int seg,
                    int* __restrict__ tokens, int* __restrict__ num_accepted, int* __restrict__ num_emitted) {
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int seg_lane = lane & (seg - 1);
    const int seg_base = lane - seg_lane;
    const unsigned seg_mask = seg == 32 ? VS_FULL_MASK : ((1u << seg) - 1u);
    const int b = warp * (32 / seg) + lane / seg;
    const bool valid = b < batch;  // NOT warp-uniform: every lane still takes part in the ballots
    const int k = valid ? num_draft[b] : 0;
    const int d0 = valid ? cu_num_draft[b] : 0, row0 = d0 + b;
    int acc = k;
    bool done = k == 0;
    for (int base = 0; __any_sync(VS_FULL_MASK, !done); base += seg) {
        const int i = base + seg_lane;
        const bool mismatch =
            !done && i < k && (int)draft_tokens[d0 + i] != row_argmax(part_val, part_idx, chunks, row0 + i);
        const unsigned bits = (__ballot_sync(VS_FULL_MASK, mismatch) >> seg_base) & seg_mask;
        if (!done) {
            if (bits) { acc = base + __ffs(bits) - 1; done = true; }
            else if (base + seg >= k) done = true;  // all k accepted
        }
    }
    if (!valid) return;
    int* out = tokens + (long long)b * width;
    for (int j = seg_lane; j < width; j += seg) {
        int t = -1;
        if (j < acc) t = (int)draft_tokens[d0 + j];
        else if (j == acc) t = row_argmax(part_val, part_idx, chunks, row0 + acc);
        out[j] = t;
    }
    if (seg_lane == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = acc + 1;
    }
}

// ---------------------------------------------------------------------------------------
// Host launchers.

// How many vocabulary chunks per row: enough blocks to fill the GPU (about 4 per SM) when there
// are few rows, but never chunks shorter than 4096 elements (a block then streams at least two
// 16-byte loads per thread). Multiple of 64 elements keeps every chunk start 16-byte aligned
// relative to its row for all three dtypes.
extern "C" int vs_argmax_chunks(int rows, int vocab, int num_sms) {
    const int target_blocks = 4 * num_sms;
    int chunks = (target_blocks + rows - 1) / rows;
    const int max_chunks = (vocab + 4095) / 4096;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    return chunks;
}

extern "C" int vs_argmax_chunk_len(int vocab, int chunks) {
    int len = (vocab + chunks - 1) / chunks;
    return (len + 63) / 64 * 64;
}

template <typename T>
static void launch_argmax(int version, dim3 grid, const void* logits, long long row_stride, int vocab, int chunk_len,
                          int chunks, float* part_val, int* part_idx, cudaStream_t stream) {
    if (version == 3)
        argmax_partial_kernel<T, true><<<grid, ARGMAX_THREADS, 0, stream>>>((const T*)logits, row_stride, vocab,
                                                                            chunk_len, chunks, part_val, part_idx);
    else
        argmax_partial_kernel<T, false><<<grid, ARGMAX_THREADS, 0, stream>>>((const T*)logits, row_stride, vocab,
                                                                             chunk_len, chunks, part_val, part_idx);
}

// version: 2 (plain vector loads) or 3 (streaming loads, strict per-thread compare).
extern "C" cudaError_t vs_argmax_partial(int version, const void* logits, int dtype, long long row_stride, int rows,
                                         int vocab, int chunks, float* part_val, int* part_idx, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    if (version != 2 && version != 3) return cudaErrorInvalidValue;
    const int chunk_len = vs_argmax_chunk_len(vocab, chunks);
    dim3 grid(rows, chunks);
    switch (dtype) {
        case VS_F32: launch_argmax<float>(version, grid, logits, row_stride, vocab, chunk_len, chunks, part_val, part_idx, stream); break;
        case VS_BF16: launch_argmax<__nv_bfloat16>(version, grid, logits, row_stride, vocab, chunk_len, chunks, part_val, part_idx, stream); break;
        case VS_F16: launch_argmax<__half>(version, grid, logits, row_stride, vocab, chunk_len, chunks, part_val, part_idx, stream); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// variant: 0 = naive (v1), 1 = ballot (v2), 2 = segment (v3; max_k = width - 1 sets the segment).
extern "C" cudaError_t vs_greedy_scan(int variant, const float* part_val, const int* part_idx, int chunks,
                                      const long long* draft_tokens, const int* num_draft, const int* cu_num_draft,
                                      int batch, int width, int* tokens, int* num_accepted, int* num_emitted,
                                      cudaStream_t stream) {
    if (batch == 0) return cudaSuccess;
    if (variant == 0) {
        const int threads = 128;
        scan_naive_kernel<<<(batch + threads - 1) / threads, threads, 0, stream>>>(
            part_val, part_idx, chunks, draft_tokens, num_draft, cu_num_draft, batch, width, tokens, num_accepted,
            num_emitted);
    } else if (variant == 1) {
        scan_ballot_kernel<<<(batch + SCAN_WARPS - 1) / SCAN_WARPS, SCAN_WARPS * 32, 0, stream>>>(
            part_val, part_idx, chunks, draft_tokens, num_draft, cu_num_draft, batch, width, tokens, num_accepted,
            num_emitted);
    } else if (variant == 2) {
        int seg = 1;
        while (seg < width - 1 && seg < 32) seg <<= 1;
        const int per_block = 4 * (32 / seg);  // 4 warps a block
        scan_segment_kernel<<<(batch + per_block - 1) / per_block, 128, 0, stream>>>(
            part_val, part_idx, chunks, draft_tokens, num_draft, cu_num_draft, batch, width, seg, tokens, num_accepted,
            num_emitted);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
