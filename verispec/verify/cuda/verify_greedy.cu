// verify_greedy.cu: greedy verification of ragged drafts, kernel versions side by side.
//
// Semantics (verispec/verify/reference.py, reference_verify_greedy): sequence b proposes k_b drafts,
// scored by target rows row0 = cu_num_draft[b] + b ... row0 + k_b (the last is the bonus row).
// Drafts are accepted while draft == argmax(target row); then the target argmax of the first
// rejected row (or of the bonus row) is emitted. tokens [B, max_k + 1] int32, -1 padded.
// status [B] int32 (verispec/verify/status.py): NaN / +inf in any row of the sequence, a row
// entirely -inf, a draft id outside [0, V), a num_draft that does not fit the inputs. Every row
// and every draft of the sequence is checked, past the first rejection too.
//
// Two stages, each with its versions:
//
//   argmax (bytes: R * V * sizeof(T), the whole cost at V = 128k). Every version also ORs the
//   status bits of the elements it reads (value_flags) into one int per partial, so the checks
//   cost no second read of the logits.
//   Chunked: grid (R, chunks), a block per (row, vocab chunk); rows are split into chunks when
//   there are too few rows to fill the GPU (B = 1: 5 rows, 132 SMs); chunks == 1 when R is large.
//     v2  256 threads, 16-byte __ldg loads, 4 in flight; per-thread running argmax, then
//         __shfl_down_sync (value, index) reduction with torch.argmax's tie-break (lowest
//         index), then one value per warp through shared memory.
//     v3  the same with evict-first streaming loads (the logits are read once), 8 loads in
//         flight, and a strict `>` per thread (a thread sees its ids in increasing order; the
//         full tie rule runs only where threads, warps and chunks merge).
//     v3-t512 / v3-u16   v3 with 512 threads a block / 16 loads in flight a thread.
//   Balanced: grid = one full wave of resident blocks (occupancy x SMs). The R x V elements,
//   flattened row by row, are cut into equal contiguous slices, one per block, so every block
//   streams the same number of bytes and the last wave is never partly empty (chunked v3 at
//   B = 128, K = 8: 1152 blocks on 132 SMs is 2.2 waves of 4 blocks an SM). A block writes one
//   partial per row its slice touches, at index block + row: along the staircase of (block, row)
//   pairs the sum grows by 1 or 2 per step, so the indices are distinct and G + R - 1 suffice.
//     e.g. R = 2, V = 10, 3 blocks of 7: block 0 -> row 0 [0, 7); block 1 -> row 0 [7, 10) and
//     row 1 [0, 4); block 2 -> row 1 [4, 10). Partials: 0 (b0 r0), 1 (b1 r0), 2 (b1 r1), 3 (b2 r1).
//     bal-t256-u8 / bal-t512-u8 / bal-t256-u16 / bal-t1024-u4   threads a block, loads in flight.
//
//   acceptance scan (bytes: tiny; where the raggedness shows). Each merges a row's partials
//   (row_argmax), reads every row and draft of its sequence for the status, and writes status[b]
//   itself (one writer per sequence: no atomics, nothing to zero first).
//     v1 scan_naive_kernel    one thread per sequence walks its rows serially. Lanes of a warp
//         finish after 1 ... k_b + 1 steps: divergent, and the per-thread serial writes are
//         uncoalesced (stride max_k + 1 between neighbouring threads).
//     v2 scan_ballot_kernel   one warp per sequence: lane i takes position i,
//         __ballot_sync(mismatch) + __ffs gives the first mismatch in one step (32 positions a
//         step, loop for k_b >= 32); the output row is written by the lanes together.
//     v3 scan_segment_kernel  one warp holds 32 / S sequences, S = next_pow2(max_k) lanes each
//         (K = 8: 4 sequences per warp): the same ballot, each segment reading its own bits of
//         the 32-bit mask. v2 leaves 32 - k_b lanes idle (24 of 32 at K = 8); v3 fills them.
//
// Host launchers are extern "C" on raw pointers so that this file compiles with plain nvcc;
// binding.cpp wraps them for torch.
#include "common.cuh"

// ---------------------------------------------------------------------------------------
// The argmax partials of a launch and how a row finds its own.
struct Partials {
    const float* val;     // [P] maximum of each partial, or null (then count == 1: idx is the argmax)
    const int* idx;       // [P] its vocabulary id (lowest on ties)
    const int* flags;     // [P] status bits of the elements it covers, or null
    int balanced;         // 0: chunked, row r -> r * chunks .. + chunks; 1: balanced (see the header)
    int chunks;
    long long per_block;  // balanced: elements per block
    int vocab;
};

// Row r's partials are the contiguous range [first, first + count).
__device__ __forceinline__ void row_partials(const Partials& P, int r, long long& first, int& count) {
    if (!P.balanced) {
        first = (long long)r * P.chunks;
        count = P.chunks;
        return;
    }
    const long long lo = (long long)r * P.vocab / P.per_block;
    const long long hi = ((long long)r * P.vocab + P.vocab - 1) / P.per_block;
    first = lo + r;
    count = (int)(hi - lo + 1);
}

struct RowArgmax {
    int idx;    // the target argmax
    int flags;  // status bits of the row: NaN, +inf, entirely -inf
};

// The target argmax of row r from its partials. NOTE: the loads are issued 8 partials at a time
// before any compare: a plain loop makes `count` dependent L2 round trips (32 at V = 128k, B = 1:
// ~4 us measured).
__device__ __forceinline__ RowArgmax row_argmax(const Partials& P, int r) {
    long long first;
    int count;
    row_partials(P, r, first, count);
    if (P.val == nullptr) return {P.idx[first], P.flags ? P.flags[first] : 0};
    ArgMax a = argmax_identity();
    int flags = 0;
    int c = 0;
    for (; c + 8 <= count; c += 8) {
        float v[8];
        int ix[8], f[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            v[u] = P.val[first + c + u];
            ix[u] = P.idx[first + c + u];
            f[u] = P.flags ? P.flags[first + c + u] : 0;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) { argmax_update(a, v[u], ix[u]); flags |= f[u]; }
    }
    for (; c < count; ++c) {
        argmax_update(a, P.val[first + c], P.idx[first + c]);
        if (P.flags) flags |= P.flags[first + c];
    }
    // a row with a NaN is reported as NaN, not as dead (NaN never wins the '>' compares)
    if (a.val == -INFINITY && !(flags & VS_STATUS_NAN)) flags |= VS_STATUS_DEAD_ROW;
    return {a.idx, flags};
}

// ---------------------------------------------------------------------------------------
// Chunked argmax.  grid = (R, chunks), block = THREADS.
// Writes part_val/part_idx/part_flag[r * chunks + c] (idx is the absolute vocab id).
template <typename T, int THREADS, int UNROLL, bool STREAM>
__global__ void __launch_bounds__(THREADS)
argmax_chunked_kernel(const T* __restrict__ logits,  // [R, V], row stride row_stride elements
                      long long row_stride, int vocab, int chunk_len, int chunks,
                      float* __restrict__ part_val,  // [R * chunks]
                      int* __restrict__ part_idx,    // [R * chunks]
                      int* __restrict__ part_flag) { // [R * chunks]
    const long long r = blockIdx.x;  // rows on x: R can exceed grid.y's 65535
    const int c = blockIdx.y;
    const int start = c * chunk_len;
    const int n = min(chunk_len, vocab - start);
    ArgMax a = argmax_identity();
    int flags = 0;
    if (n > 0) {
        const T* row = logits + r * row_stride + start;
        for_each_element<T, UNROLL, STREAM>(row, n, [&](float v, int i) {
            if constexpr (STREAM) argmax_update_ordered(a, v, start + i);
            else argmax_update(a, v, start + i);
            flags |= value_flags(v);
        });
    }
    a = block_argmax(a);
    flags = block_or(flags);
    if (threadIdx.x == 0) {
        part_val[r * chunks + c] = a.val;
        part_idx[r * chunks + c] = a.idx;
        part_flag[r * chunks + c] = flags;
    }
}

// Balanced argmax.  grid = G (one wave), block = THREADS; block g streams the flattened elements
// [g * per_block, (g + 1) * per_block) and writes one partial per row touched, at g + row.
template <typename T, int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS)
argmax_balanced_kernel(const T* __restrict__ logits, long long row_stride, int rows, int vocab, long long per_block,
                       float* __restrict__ part_val,  // [G + R - 1]
                       int* __restrict__ part_idx, int* __restrict__ part_flag) {
    const long long total = (long long)rows * vocab;
    long long f = (long long)blockIdx.x * per_block;
    const long long end = min(f + per_block, total);
    while (f < end) {  // block-uniform
        const int r = (int)(f / vocab);
        const int c = (int)(f - (long long)r * vocab);
        const int n = (int)min((long long)(vocab - c), end - f);
        ArgMax a = argmax_identity();
        int flags = 0;
        for_each_element<T, UNROLL, true>(logits + r * row_stride + c, n, [&](float v, int i) {
            argmax_update_ordered(a, v, c + i);
            flags |= value_flags(v);
        });
        a = block_argmax(a);
        flags = block_or(flags);
        if (threadIdx.x == 0) {
            const long long o = (long long)blockIdx.x + r;
            part_val[o] = a.val;
            part_idx[o] = a.idx;
            part_flag[o] = flags;
        }
        f += n;
    }
}

// ---------------------------------------------------------------------------------------
// The scans. Shared arguments: draft_tokens [N] int64, num_draft [B], cu_num_draft [B + 1],
// num_rows = R, width = max_k + 1; outputs tokens [B, width], num_accepted / num_emitted /
// status [B]. A sequence whose layout is not ok (seq_layout) gets tokens -1, num_accepted 0,
// num_emitted 0 and status NUM_DRAFT.

// Status bits of draft id d (a draft is compared, never used as an index, in greedy).
__device__ __forceinline__ int draft_flags(long long d, int vocab) {
    return (d < 0 || d >= vocab) ? VS_STATUS_DRAFT_ID : 0;
}

// v1: one thread per sequence.
__global__ void scan_naive_kernel(Partials P, const long long* __restrict__ draft_tokens,
                                  const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft, int batch,
                                  int num_rows, int width, int* __restrict__ tokens, int* __restrict__ num_accepted,
                                  int* __restrict__ num_emitted, int* __restrict__ status) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const SeqLayout L = seq_layout(num_draft, cu_num_draft, batch, b, width - 1, num_rows);
    int acc = L.k, emitted = -1, flags = L.ok ? 0 : VS_STATUS_NUM_DRAFT;
    if (L.ok) {
        for (int i = 0; i <= L.k; ++i) {  // every row: the status covers rows past the first rejection
            const RowArgmax t = row_argmax(P, L.row0 + i);
            flags |= t.flags;
            if (i < L.k) {
                const long long d = draft_tokens[L.d0 + i];
                flags |= draft_flags(d, P.vocab);
                if (acc == L.k && d != t.idx) { acc = i; emitted = t.idx; }
            } else if (acc == L.k) {
                emitted = t.idx;
            }
        }
    }
    int* out = tokens + (long long)b * width;
    for (int j = 0; j < width; ++j) out[j] = j < acc ? (int)draft_tokens[L.d0 + j] : (j == acc && L.ok ? emitted : -1);
    num_accepted[b] = acc;
    num_emitted[b] = L.ok ? acc + 1 : 0;
    status[b] = flags;
}

// One lane's position i <= k of a sequence in the warp scans: the row's argmax into `target`, its status bits
// and (i < k) the draft's into `flags`; returns whether draft i differs from the row's argmax.
__device__ __forceinline__ bool scan_position(const Partials& P, const SeqLayout& L,
                                              const long long* __restrict__ draft_tokens, int i, int& flags,
                                              int& target) {
    const RowArgmax t = row_argmax(P, L.row0 + i);
    flags |= t.flags;
    target = t.idx;
    if (i == L.k) return false;
    const long long d = draft_tokens[L.d0 + i];
    flags |= draft_flags(d, P.vocab);
    return d != t.idx;
}

// v2: one warp per sequence, SCAN_WARPS sequences per block.
#define SCAN_WARPS 4

__global__ void __launch_bounds__(SCAN_WARPS * 32)
scan_ballot_kernel(Partials P, const long long* __restrict__ draft_tokens, const int* __restrict__ num_draft,
                   const int* __restrict__ cu_num_draft, int batch, int num_rows, int width,
                   int* __restrict__ tokens, int* __restrict__ num_accepted, int* __restrict__ num_emitted,
                   int* __restrict__ status) {
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * SCAN_WARPS + (threadIdx.x >> 5);
    if (b >= batch) return;  // warp-uniform: the whole warp leaves together
    const SeqLayout L = seq_layout(num_draft, cu_num_draft, batch, b, width - 1, num_rows);
    int acc = L.k, emitted = -1, flags = L.ok ? 0 : VS_STATUS_NUM_DRAFT;
    // positions 0 .. k (k = the bonus row), 32 a step; !L.ok: no step
    for (int base = 0; L.ok && base <= L.k; base += 32) {
        const int i = base + lane;
        int target = -1;
        const bool mismatch = i <= L.k && scan_position(P, L, draft_tokens, i, flags, target);
        const unsigned m = __ballot_sync(VS_FULL_MASK, mismatch);
        if (acc == L.k && m) acc = base + __ffs(m) - 1;  // the first rejection (warp-uniform)
        if (acc >= base && acc - base < 32) {           // warp-uniform: this step holds the emitted row
            const int e = __shfl_sync(VS_FULL_MASK, target, acc - base);
            if (emitted == -1) emitted = e;
        }
    }
    flags = __reduce_or_sync(VS_FULL_MASK, flags);
    int* out = tokens + (long long)b * width;
    for (int j = lane; j < width; j += 32) out[j] = j < acc ? (int)draft_tokens[L.d0 + j] : (j == acc ? emitted : -1);
    if (lane == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = L.ok ? acc + 1 : 0;
        status[b] = flags;
    }
}

// v3: segments of SEG lanes (a power of two <= 32), one sequence per segment.
//   e.g. SEG = 8: lanes 0-7 -> sequence 4w, lanes 8-15 -> 4w + 1, ...; the ballot mask m holds
//   every segment's mismatches, segment s reads (m >> 8s) & 0xff.
__global__ void __launch_bounds__(128)
scan_segment_kernel(Partials P, const long long* __restrict__ draft_tokens, const int* __restrict__ num_draft,
                    const int* __restrict__ cu_num_draft, int batch, int num_rows, int width, int seg,
                    int* __restrict__ tokens, int* __restrict__ num_accepted, int* __restrict__ num_emitted,
                    int* __restrict__ status) {
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int seg_lane = lane & (seg - 1);
    const int seg_base = lane - seg_lane;
    const unsigned seg_mask = seg == 32 ? VS_FULL_MASK : ((1u << seg) - 1u);
    const int b = warp * (32 / seg) + lane / seg;
    const bool valid = b < batch;  // NOT warp-uniform: every lane still takes part in the ballots
    SeqLayout L = valid ? seq_layout(num_draft, cu_num_draft, batch, b, width - 1, num_rows) : SeqLayout{0, 0, 0, false};
    const int last = L.ok ? L.k : -1;  // the segment's positions are 0 .. last
    int acc = L.k, emitted = -1, flags = (valid && !L.ok) ? VS_STATUS_NUM_DRAFT : 0;
    for (int base = 0; __any_sync(VS_FULL_MASK, base <= last); base += seg) {
        const int i = base + seg_lane;
        int target = -1;
        const bool mismatch = i <= last && scan_position(P, L, draft_tokens, i, flags, target);
        const unsigned bits = (__ballot_sync(VS_FULL_MASK, mismatch) >> seg_base) & seg_mask;
        if (base <= last && acc == L.k && bits) acc = base + __ffs(bits) - 1;
        const bool here = base <= last && acc >= base && acc - base < seg;  // this step holds the emitted row
        const int e = __shfl_sync(VS_FULL_MASK, target, seg_base + (here ? acc - base : 0));
        if (here && emitted == -1) emitted = e;
    }
    for (int off = 1; off < seg; off <<= 1) flags |= __shfl_xor_sync(VS_FULL_MASK, flags, off);  // within the segment
    if (!valid) return;
    int* out = tokens + (long long)b * width;
    for (int j = seg_lane; j < width; j += seg) out[j] = j < acc ? (int)draft_tokens[L.d0 + j] : (j == acc ? emitted : -1);
    if (seg_lane == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = L.ok ? acc + 1 : 0;
        status[b] = flags;
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

// Argmax versions: (balanced?, threads, loads in flight, streaming loads). The codes are
// verispec/verify/cuda/__init__.py's ARGMAX_VARIANTS.
#define VS_ARGMAX_VERSIONS(X)          \
    X(2, 0, 256, 4, false)             \
    X(3, 0, 256, 8, true)              \
    X(4, 0, 512, 8, true)              \
    X(5, 0, 256, 16, true)             \
    X(10, 1, 256, 8, true)             \
    X(11, 1, 512, 8, true)             \
    X(12, 1, 256, 16, true)            \
    X(13, 1, 1024, 4, true)

#define VS_BALANCED_MIN_ELEMENTS 4096  // a balanced block streams at least this many elements

template <typename T, int THREADS, int UNROLL>
static int balanced_blocks_per_sm() {
    static int per_sm = 0;  // one occupancy query per instantiation (a host computation, no stream work)
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, argmax_balanced_kernel<T, THREADS, UNROLL>, THREADS, 0) !=
                cudaSuccess || n < 1)
            n = 1;
        per_sm = n;
    }
    return per_sm;
}

// Resident blocks an SM of a balanced version (0 for a chunked one, -1 for an unknown version).
template <typename T>
static int blocks_per_sm(int version) {
    switch (version) {
#define VS_CASE(code, bal, threads, unroll, stream)                              \
    case code:                                                                   \
        if constexpr (bal) return balanced_blocks_per_sm<T, threads, unroll>(); \
        else return 0;
        VS_ARGMAX_VERSIONS(VS_CASE)
#undef VS_CASE
    }
    return -1;
}

static bool is_balanced(int version) {
    switch (version) {
#define VS_CASE(code, bal, threads, unroll, stream) case code: return bal;
        VS_ARGMAX_VERSIONS(VS_CASE)
#undef VS_CASE
    }
    return false;
}

// The partial layout of `version` for [rows, vocab]: returns the number of partials P (buffers to
// allocate), or -1 for an unknown version / dtype. *chunks (chunked) or *per_block (balanced).
extern "C" long long vs_argmax_plan(int version, int dtype, int rows, int vocab, int num_sms, int* chunks,
                                    long long* per_block) {
    *chunks = 1;
    *per_block = 0;
    int per_sm = -1;
    switch (dtype) {
        case VS_F32: per_sm = blocks_per_sm<float>(version); break;
        case VS_BF16: per_sm = blocks_per_sm<__nv_bfloat16>(version); break;
        case VS_F16: per_sm = blocks_per_sm<__half>(version); break;
        default: return -1;
    }
    if (per_sm < 0) return -1;
    if (per_sm == 0) {
        *chunks = vs_argmax_chunks(rows, vocab, num_sms);
        return (long long)rows * *chunks;
    }
    const long long total = (long long)rows * vocab;
    const long long blocks = (long long)per_sm * num_sms;
    long long per = (total + blocks - 1) / blocks;
    if (per < VS_BALANCED_MIN_ELEMENTS) per = VS_BALANCED_MIN_ELEMENTS;
    per = (per + 63) / 64 * 64;
    *per_block = per;
    const long long grid = (total + per - 1) / per;
    return grid + rows - 1;
}

template <typename T>
static cudaError_t launch_argmax(int version, const void* logits, long long row_stride, int rows, int vocab,
                                 int chunks, long long per_block, float* part_val, int* part_idx, int* part_flag,
                                 cudaStream_t stream) {
    const T* x = (const T*)logits;
    switch (version) {
#define VS_CASE(code, bal, threads, unroll, stream_loads)                                                          \
    case code:                                                                                                     \
        if constexpr (bal) {                                                                                       \
            const long long grid = ((long long)rows * vocab + per_block - 1) / per_block;                          \
            argmax_balanced_kernel<T, threads, unroll><<<(unsigned)grid, threads, 0, stream>>>(                  \
                x, row_stride, rows, vocab, per_block, part_val, part_idx, part_flag);                            \
        } else {                                                                                                   \
            argmax_chunked_kernel<T, threads, unroll, stream_loads><<<dim3(rows, chunks), threads, 0, stream>>>( \
                x, row_stride, vocab, vs_argmax_chunk_len(vocab, chunks), chunks, part_val, part_idx, part_flag);  \
        }                                                                                                          \
        break;
        VS_ARGMAX_VERSIONS(VS_CASE)
#undef VS_CASE
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// The argmax partials of `version` (the layout vs_argmax_plan gave: chunks or per_block).
extern "C" cudaError_t vs_argmax(int version, const void* logits, int dtype, long long row_stride, int rows, int vocab,
                                 int chunks, long long per_block, float* part_val, int* part_idx, int* part_flag,
                                 cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    if (is_balanced(version) && per_block <= 0) return cudaErrorInvalidValue;
#define VS_ARGS version, logits, row_stride, rows, vocab, chunks, per_block, part_val, part_idx, part_flag, stream
    switch (dtype) {
        case VS_F32: return launch_argmax<float>(VS_ARGS);
        case VS_BF16: return launch_argmax<__nv_bfloat16>(VS_ARGS);
        case VS_F16: return launch_argmax<__half>(VS_ARGS);
        default: return cudaErrorInvalidValue;
    }
#undef VS_ARGS
}

// variant: 0 = naive (v1), 1 = ballot (v2), 2 = segment (v3; max_k = width - 1 sets the segment).
// part_val / part_flag may be null when chunks == 1 and the layout is chunked (a precomputed argmax).
extern "C" cudaError_t vs_greedy_scan(int variant, int balanced, const float* part_val, const int* part_idx,
                                      const int* part_flag, int chunks, long long per_block,
                                      const long long* draft_tokens, const int* num_draft, const int* cu_num_draft,
                                      int batch, int num_rows, int vocab, int width, int* tokens, int* num_accepted,
                                      int* num_emitted, int* status, cudaStream_t stream) {
    if (batch == 0) return cudaSuccess;
    if (part_val == nullptr && (balanced || chunks != 1)) return cudaErrorInvalidValue;
    const Partials P{part_val, part_idx, part_flag, balanced, chunks, per_block, vocab};
    if (variant == 0) {
        const int threads = 128;
        scan_naive_kernel<<<(batch + threads - 1) / threads, threads, 0, stream>>>(
            P, draft_tokens, num_draft, cu_num_draft, batch, num_rows, width, tokens, num_accepted, num_emitted,
            status);
    } else if (variant == 1) {
        scan_ballot_kernel<<<(batch + SCAN_WARPS - 1) / SCAN_WARPS, SCAN_WARPS * 32, 0, stream>>>(
            P, draft_tokens, num_draft, cu_num_draft, batch, num_rows, width, tokens, num_accepted, num_emitted,
            status);
    } else if (variant == 2) {
        int seg = 1;
        while (seg < width - 1 && seg < 32) seg <<= 1;
        const int per_block_seqs = 4 * (32 / seg);  // 4 warps a block
        scan_segment_kernel<<<(batch + per_block_seqs - 1) / per_block_seqs, 128, 0, stream>>>(
            P, draft_tokens, num_draft, cu_num_draft, batch, num_rows, width, seg, tokens, num_accepted, num_emitted,
            status);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
