// verify_sample.cu: rejection-sampling verification (Leviathan et al.), exact in distribution.
//
// Semantics (verispec/verify/reference.py, reference_verify_sample), per sequence b with
// temperature T, key seed[b] and offset[b]:
//   draft row i (target row r, draft x, draft distribution q, p = softmax(logits[r] / T)):
//       accept iff u_i * q(x) < p(x),  u_i = uniform(seed[b], offset[b], row=i, col=0, ACCEPT)
//       else emit argmax_v max(0, p_v - q_v) / -log(u_v),  u_v = uniform(..., row=i, v, RACE)
//            (the exponential race: a sample of norm(max(0, p - q)); p itself if that is empty)
//   all accepted: emit argmax_v p_v / -log(u_v) on the bonus row.
//   n-gram drafts (draft_probs null): q = point mass at x.   T == 0: greedy on the argmax.
// The stream row is the local row i in [0, k_b], not the global r, so a sequence's tokens do
// not depend on its batch neighbours or its position.
// Every random number comes from the shared Philox stream (common.cuh == verispec/verify/rng.py), so
// the kernel emits the reference's tokens, up to float rounding at near-ties (p(x) within an
// ulp of u * q(x), or two race keys within an ulp): softmax sums are accumulated in a different
// order here than in torch.
//
// status [B] (verispec/verify/status.py), from the reads the kernels make anyway: NaN / +inf /
// entirely -inf in any row of the sequence (pass 1), |max logit / T| > 2**30 for T > 0 (SCALED),
// settings out of range (SETTINGS), draft ids outside [0, V) (clamped before the gather),
// q(x) <= 0 or NaN at the accept test, and, when check_q is set, q rows with NaN / negative
// entries or sums off 1 by more than 1e-2 (DRAFT_PROBS; pass 1 then also reads the q rows).
//
// Three launches:
//   pass 1  row_stats_partial_kernel  grid (R, chunks): per (row, vocab chunk) the online-softmax
//       statistics (max m, sum exp(z - m)) of z = logits / T, or for T == 0 the argmax with
//       torch's tie-break, and the status bits of the chunk (+ the q chunk's sum). 16-byte
//       loads, warp-shuffle reductions.
//   pass 2  race_partial_kernel  grid (B, race_chunks), 256 threads: warp 0 merges the chunk
//       statistics of the sequence's rows (lane i: row i, the bonus row included) and runs the
//       accept tests of all its drafts at once, __ballot_sync finding the first rejection and
//       __shfl_sync handing out the stop row's statistics; then the block runs the exponential race over
//       its vocabulary chunk of the emitted row (recovered or bonus), with that row's exact
//       global normalizer: one Philox draw per vocabulary id, block argmax through
//       __shfl_down_sync; it writes the chunk's winners (bonus key p/E, recovery key
//       max(0, p - q)/E). Every chunk's block redoes the accept tests (k_b gathers and merges of
//       pass-1 partials: cheap next to the race).
//   pass 3  finalize_kernel  one warp per sequence: merges the chunk winners (ties: lowest id),
//       the status, and writes the outputs.
// Two versions of pass 2, by race_chunks (the same tokens, bit for bit: the same pass-1
// statistics, the same per-element keys, the same lowest-index tie-break across chunks):
//   v1 "block"  race_chunks = 1: one block races all of V for its sequence. At small B most of
//       the GPU idles (B = 1, V = 128k: ~250 us, measured in benchmarks/results/ablation.md).
//   v2 "split"  race_chunks = vs_race_chunks(B, V, N * SMs): the race spread over vocabulary
//       chunks, about N blocks an SM (verispec/verify/cuda/__init__.py RACE_BLOCKS_PER_SM, set by
//       benchmarks/cuda_verify_sweep.py); from B >= N * SMs on it is v1.
//
// top-k / top-p are not implemented in this backend: the Python launcher raises
// NotImplementedError; under CUDA-graph capture (no host check possible) a sequence with an
// active filter gets num_accepted = -1, num_emitted = 0 and tokens all -1.
#include "common.cuh"
#include "sample_args.h"

#define STATS_THREADS 256
#define REJECT_THREADS 256
#define RACE_THREADS 256
#define FINALIZE_WARPS 4

// ---------------------------------------------------------------------------------------
// draft_probs element i as float; q_dtype is launch-uniform (a predictable branch, not a template: one
// kernel per logits dtype instead of nine).
__device__ __forceinline__ float q_at(const void* __restrict__ q, int q_dtype, long long i) {
    if (q_dtype == VS_BF16) return to_float(((const __nv_bfloat16*)q)[i]);
    if (q_dtype == VS_F16) return to_float(((const __half*)q)[i]);
    return ((const float*)q)[i];
}

// The address of draft_probs element i (a q row's start).
__device__ __forceinline__ const void* q_row_ptr(const void* q, int q_dtype, long long i) {
    return (const char*)q + i * (q_dtype == VS_F32 ? 4 : 2);
}

// Sum and status bits (negative or NaN entries) of n elements of a q row.
template <typename Q>
__device__ __forceinline__ float q_range_check(const Q* __restrict__ q, int n, int& flags) {
    float sum = 0.0f;
    for_each_element<Q, 4>(q, n, [&](float v, int) {
        sum += v;
        if (!(v >= 0.0f)) flags |= VS_STATUS_DRAFT_PROBS;  // negative or NaN
    });
    return sum;
}

// pass 1. part_a: softmax max m (T != 0) or argmax value (T == 0); part_s: sum exp(z - m);
// part_idx: argmax; part_flag: status bits, plus VS_ALIVE when some logit of the chunk is not -inf
// (a row is dead when no chunk is alive: judged on the logits, not on logits / T, which a bad T can
// turn into NaN); part_qsum: the q chunk's sum (1 where not checked).
#define VS_ALIVE (1 << 30)  // never a status bit (status.py's bits are < 256)
template <typename T>
__global__ void __launch_bounds__(STATS_THREADS)
row_stats_partial_kernel(const T* __restrict__ logits, long long row_stride, int vocab, int chunk_len, int chunks,
                         const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft, int batch,
                         int num_rows, int max_num_draft,
                         const float* __restrict__ temperature,  // [B]
                         const void* __restrict__ draft_probs, int q_dtype, long long q_stride, int check_q,
                         float* __restrict__ part_a, float* __restrict__ part_s, int* __restrict__ part_idx,
                         int* __restrict__ part_flag, float* __restrict__ part_qsum) {
    const long long r = blockIdx.x;  // rows on x: R can exceed grid.y's 65535
    const int c = blockIdx.y;
    const int b = seq_of_row(cu_num_draft, batch, (int)r);
    const float temp = temperature[b];
    const int start = c * chunk_len;
    const int n = min(chunk_len, vocab - start);
    const T* row = logits + r * row_stride + start;
    const long long o = r * chunks + c;
    int flags = 0, alive = 0;  // alive: some logit is not -inf (NaN counts: a NaN row is reported as NaN)
    if (temp == 0.0f) {
        ArgMax a = argmax_identity();
        if (n > 0) for_each_element<T, 4>(row, n, [&](float v, int i) {
            argmax_update(a, v, start + i);
            flags |= value_flags(v);
            alive |= v != -INFINITY;
        });
        a = block_argmax(a);
        if (threadIdx.x == 0) { part_a[o] = a.val; part_s[o] = 0.0f; part_idx[o] = a.idx; }
    } else {
        SoftmaxStats s{-INFINITY, 0.0f};
        if (n > 0) for_each_element<T, 4>(row, n, [&](float v, int) {
            stats_update(s, v / temp);
            flags |= value_flags(v);
            alive |= v != -INFINITY;
        });
        s = block_stats(s);
        if (threadIdx.x == 0) { part_a[o] = s.m; part_s[o] = s.s; part_idx[o] = 0; }
    }
    if (check_q) {
        const SeqLayout L = seq_layout(num_draft, cu_num_draft, batch, b, max_num_draft, num_rows);
        const int i = (int)r - L.row0;  // local row: a draft row of a sequence with a sound layout
        float qsum = 1.0f;
        if (L.ok && i >= 0 && i < L.k && n > 0) {  // block-uniform
            const long long at = (long long)(L.d0 + i) * q_stride + start;
            float sum;
            if (q_dtype == VS_BF16) sum = q_range_check((const __nv_bfloat16*)draft_probs + at, n, flags);
            else if (q_dtype == VS_F16) sum = q_range_check((const __half*)draft_probs + at, n, flags);
            else sum = q_range_check((const float*)draft_probs + at, n, flags);
            qsum = block_sum(sum);
        } else if (L.ok && i >= 0 && i < L.k) {
            qsum = 0.0f;  // an empty chunk adds nothing
        }
        if (threadIdx.x == 0) part_qsum[o] = qsum;
    }
    alive = __syncthreads_or(alive);
    flags = block_or(flags);
    if (threadIdx.x == 0) part_flag[o] = flags | (alive ? VS_ALIVE : 0);
}

// The pass-1 results of one launch.
struct RowParts {
    const float* a;
    const float* s;
    const int* idx;
    const int* flag;
    const float* qsum;  // null unless the q rows were checked
    int chunks;
};

__device__ __forceinline__ SoftmaxStats row_stats(const RowParts& P, int r) {
    SoftmaxStats s{-INFINITY, 0.0f};
#pragma unroll 8
    for (int c = 0; c < P.chunks; ++c) s = stats_merge(s, {P.a[(long long)r * P.chunks + c], P.s[(long long)r * P.chunks + c]});
    return s;
}

__device__ __forceinline__ int row_argmax_stats(const RowParts& P, int r) {
    ArgMax a = argmax_identity();
#pragma unroll 8
    for (int c = 0; c < P.chunks; ++c) argmax_update(a, P.a[(long long)r * P.chunks + c], P.idx[(long long)r * P.chunks + c]);
    return a.idx;
}

// Whether T is 0 (greedy) or finite and >= MIN_TEMPERATURE (the reference's check_temperature).
__device__ __forceinline__ bool temperature_ok(float temp) {
    return temp == 0.0f || (temp >= VS_MIN_TEMPERATURE && temp <= 3.402823466e38f);  // NaN fails both
}

// Status bits of a sequence's settings (check_temperature / check_top_k / check_top_p).
__device__ __forceinline__ int settings_flags(float temp, int top_k, float top_p) {
    const bool top_p_ok = top_p > 0.0f && top_p <= 1.0f;
    return (temperature_ok(temp) && top_k >= 0 && top_p_ok) ? 0 : VS_STATUS_SETTINGS;
}

// The status word of a sequence from its pass-1 partials (warp-wide: every lane calls it; the
// result is valid in every lane). Rows past the first rejection are checked too. SCALED is judged
// only under a valid temperature (a bad one is SETTINGS, and makes logits / T meaningless).
__device__ __forceinline__ int sequence_status(const RowParts& P, const SeqLayout& L, float temp, int top_k,
                                               float top_p, int lane) {
    int flags = (L.ok ? 0 : VS_STATUS_NUM_DRAFT) | settings_flags(temp, top_k, top_p);
    const bool sampled = temp > 0.0f && temperature_ok(temp);
    for (int i = lane; L.ok && i <= L.k; i += 32) {
        const long long base = (long long)(L.row0 + i) * P.chunks;
        float mx = -INFINITY, qsum = 0.0f;
        int f = 0;
        for (int c = 0; c < P.chunks; ++c) {
            f |= P.flag[base + c];
            mx = fmaxf(mx, P.a[base + c]);
            if (P.qsum) qsum += P.qsum[base + c];
        }
        f = (f & VS_ALIVE) ? (f & ~VS_ALIVE) : (f | VS_STATUS_DEAD_ROW);
        // m is max(logit / T): beyond 2**30 (or overflowed to inf) the float32 softmax is not exact
        if (sampled && !(f & (VS_STATUS_NAN | VS_STATUS_POS_INF | VS_STATUS_DEAD_ROW)) && fabsf(mx) > VS_MAX_SCALED_LOGIT)
            f |= VS_STATUS_SCALED;
        if (P.qsum && i < L.k && !(fabsf(qsum - 1.0f) <= 1e-2f)) f |= VS_STATUS_DRAFT_PROBS;
        flags |= f;
    }
    return (int)__reduce_or_sync(VS_FULL_MASK, (unsigned)flags);
}

__device__ __forceinline__ bool uses_filter(float temp, int top_k, float top_p, int vocab) {
    return temp != 0.0f && ((top_k > 0 && top_k < vocab) || top_p < 1.0f);
}

struct Accepted {
    int acc;          // accepted drafts (the stop row is row0 + acc)
    int flags;        // DRAFT_ID, DRAFT_PROBS (q(x) <= 0 or NaN) over every draft
    SoftmaxStats stop;  // T != 0: the stop row's merged statistics (its global normalizer)
};

// The accept tests of every draft of a sequence (warp 0; the result is valid in every lane). Lane i
// takes position i (the bonus row k too), so the stop row's statistics come out of the same step.
// NOTE: the loop does not stop at the first rejection: the id and q(x) checks cover every draft.
template <typename T>
__device__ __forceinline__ Accepted accept_scan(const T* __restrict__ logits, long long row_stride, int vocab,
                                                const RowParts& P, const long long* __restrict__ draft_tokens,
                                                const void* __restrict__ draft_probs, int q_dtype,
                                                long long q_stride, const SeqLayout& L, float temp, uint64_t seed,
                                                uint64_t offset, int lane) {
    int acc = L.k, flags = 0;
    SoftmaxStats stop{-INFINITY, 0.0f};
    for (int base = 0; L.ok && base <= L.k; base += 32) {
        const int i = base + lane;
        bool reject = false;
        SoftmaxStats st{-INFINITY, 0.0f};
        if (i <= L.k && temp != 0.0f) st = row_stats(P, L.row0 + i);
        if (i < L.k) {
            const int r = L.row0 + i;
            const long long x_raw = draft_tokens[L.d0 + i];
            const bool bad_id = x_raw < 0 || x_raw >= vocab;
            const int x = bad_id ? 0 : (int)x_raw;  // clamped before any indexed read
            if (bad_id) flags |= VS_STATUS_DRAFT_ID;
            if (temp == 0.0f) {
                reject = bad_id || x != row_argmax_stats(P, r);
            } else {
                const float z = to_float(logits[(long long)r * row_stride + x]) / temp;
                const float p_x = expf(z - st.m) * (1.0f / st.s);
                const float q_x = draft_probs ? q_at(draft_probs, q_dtype, (long long)(L.d0 + i) * q_stride + x) : 1.0f;
                if (!(q_x > 0.0f)) flags |= VS_STATUS_DRAFT_PROBS;
                const float u = vs_uniform(seed, offset, (uint32_t)i, 0u, VS_PURPOSE_ACCEPT);  // local row
                // the reference compares Python floats (double): u * q(x) < p(x)
                reject = bad_id || !((double)u * (double)q_x < (double)p_x);
            }
        }
        const unsigned m = __ballot_sync(VS_FULL_MASK, reject);
        if (acc == L.k && m) acc = base + __ffs(m) - 1;  // the first rejection (warp-uniform)
        if (acc >= base && acc - base < 32) {           // warp-uniform: exactly one step holds the stop row
            stop.m = __shfl_sync(VS_FULL_MASK, st.m, acc - base);
            stop.s = __shfl_sync(VS_FULL_MASK, st.s, acc - base);
        }
    }
    return {acc, (int)__reduce_or_sync(VS_FULL_MASK, (unsigned)flags), stop};
}

// The race keys of one vocabulary range [start, start + n) of the stop row: bonus p_v / E_v and
// recovery max(0, p_v - q_v) / E_v, E_v = -log(u_v). Block-wide; results valid in every thread.
struct RaceKeys {
    ArgMax p;
    ArgMax res;
    int any_res;  // some max(0, p - q) > 0 in the range
};

template <typename T, int UNROLL>
__device__ __forceinline__ RaceKeys race_range(const T* __restrict__ row, int start, int n, float temp, float m,
                                               float inv_s, bool recovery, int x, const void* __restrict__ q_row,
                                               int q_dtype, uint64_t seed, uint64_t offset, int acc) {
    ArgMax key_p = argmax_identity(), key_res = argmax_identity();
    int any_res = 0;
    if (n > 0) {
        for_each_element<T, UNROLL>(row + start, n, [&](float l, int i) {
            const int v = start + i;
            const float p = expf(l / temp - m) * inv_s;
            const float e = -logf(vs_uniform(seed, offset, (uint32_t)acc, (uint32_t)v, VS_PURPOSE_RACE));
            argmax_update(key_p, p / e, v);
            if (recovery) {
                const float q = q_row ? q_at(q_row, q_dtype, v) : (v == x ? 1.0f : 0.0f);
                const float w = fmaxf(p - q, 0.0f);
                any_res |= w > 0.0f;
                argmax_update(key_res, w / e, v);
            }
        });
    }
    key_p = block_argmax(key_p);
    key_res = block_argmax(key_res);
    any_res = __syncthreads_or(any_res);
    return {key_p, key_res, any_res};
}

__device__ __forceinline__ void write_outputs(int* __restrict__ out, int width, const long long* __restrict__ draft_tokens,
                                              const SeqLayout& L, int acc, int token, int t0, int stride) {
    for (int j = t0; j < width; j += stride) out[j] = j < acc ? (int)draft_tokens[L.d0 + j] : (j == acc ? token : -1);
}

// ---------------------------------------------------------------------------------------
// pass 2: race chunk winners, one block per (sequence, vocabulary chunk).
struct RaceParts {
    float* p_val;    // [B * race_chunks] the chunk's best bonus key p / E
    int* p_idx;
    float* res_val;  // the chunk's best recovery key max(0, p - q) / E
    int* res_idx;
    int* any_res;    // some max(0, p - q) > 0 in the chunk
    int* acc;        // [B] accepted drafts (written by chunk 0)
    int* flags;      // [B] the accept tests' status bits (chunk 0)
    int chunks;
};

template <typename T>
__global__ void __launch_bounds__(RACE_THREADS)
race_partial_kernel(const T* __restrict__ logits, long long row_stride, int vocab, int chunk_len, RowParts P,
                    const long long* __restrict__ draft_tokens, const void* __restrict__ draft_probs, int q_dtype,
                    long long q_stride,
                    const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft, int batch, int num_rows,
                    int max_num_draft, const float* __restrict__ temperature, const int* __restrict__ top_k,
                    const float* __restrict__ top_p, const long long* __restrict__ seed_ptr,
                    const long long* __restrict__ offset_ptr, RaceParts R) {
    __shared__ int s_acc;
    __shared__ float s_m, s_s;
    const int b = blockIdx.x, c = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const float temp = temperature[b];
    const SeqLayout L = seq_layout(num_draft, cu_num_draft, batch, b, max_num_draft, num_rows);
    const uint64_t seed = (uint64_t)seed_ptr[b], offset = (uint64_t)offset_ptr[b];
    if (threadIdx.x < 32) {
        const Accepted a = accept_scan<T>(logits, row_stride, vocab, P, draft_tokens, draft_probs, q_dtype, q_stride, L, temp,
                                             seed, offset, lane);
        if (lane == 0) {
            s_acc = a.acc;
            s_m = a.stop.m;
            s_s = a.stop.s;
            if (c == 0) { R.acc[b] = a.acc; R.flags[b] = a.flags; }
        }
    }
    __syncthreads();
    if (!L.ok || !(temp > 0.0f) || uses_filter(temp, top_k[b], top_p[b], vocab)) return;  // block-uniform: no race
    const int acc = s_acc;
    const bool recovery = acc < L.k;
    const long long x_raw = recovery ? draft_tokens[L.d0 + acc] : -1;
    const int x = (x_raw < 0 || x_raw >= vocab) ? -1 : (int)x_raw;
    const void* q_row = (recovery && draft_probs) ? q_row_ptr(draft_probs, q_dtype, (long long)(L.d0 + acc) * q_stride)
                                                  : nullptr;
    const int start = c * chunk_len;
    const RaceKeys keys = race_range<T, 2>(logits + (long long)(L.row0 + acc) * row_stride, start,
                                           min(chunk_len, vocab - start), temp, s_m, 1.0f / s_s, recovery, x, q_row,
                                           q_dtype, seed, offset, acc);
    if (threadIdx.x == 0) {
        const long long o = (long long)b * R.chunks + c;
        R.p_val[o] = keys.p.val;
        R.p_idx[o] = keys.p.idx;
        R.res_val[o] = keys.res.val;
        R.res_idx[o] = keys.res.idx;
        R.any_res[o] = keys.any_res;
    }
}

// pass 3: one warp per sequence merges the race winners (or the T == 0 argmax), the status, the outputs.
__global__ void __launch_bounds__(FINALIZE_WARPS * 32)
finalize_kernel(int vocab, RowParts P, RaceParts R, const long long* __restrict__ draft_tokens,
                const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft, int batch, int num_rows,
                const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,
                int width, int* __restrict__ tokens, int* __restrict__ num_accepted, int* __restrict__ num_emitted,
                int* __restrict__ status) {
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * FINALIZE_WARPS + (threadIdx.x >> 5);
    if (b >= batch) return;  // warp-uniform
    const float temp = temperature[b];
    const SeqLayout L = seq_layout(num_draft, cu_num_draft, batch, b, width - 1, num_rows);
    const bool filtered = uses_filter(temp, top_k[b], top_p[b], vocab);
    const int flags = sequence_status(P, L, temp, top_k[b], top_p[b], lane) | R.flags[b];
    int acc = L.ok ? R.acc[b] : 0, token = -1;
    if (!L.ok || filtered) {
        acc = L.ok ? -1 : 0;  // filtered: the top-k / top-p marker (see the header)
    } else if (temp > 0.0f) {
        ArgMax key_p = argmax_identity(), key_res = argmax_identity();
        int any_res = 0;
        for (int c = lane; c < R.chunks; c += 32) {
            const long long o = (long long)b * R.chunks + c;
            argmax_update(key_p, R.p_val[o], R.p_idx[o]);
            argmax_update(key_res, R.res_val[o], R.res_idx[o]);
            any_res |= R.any_res[o];
        }
        key_p = warp_argmax(key_p);
        key_res = warp_argmax(key_res);
        any_res = __any_sync(VS_FULL_MASK, any_res);
        const int p_idx = __shfl_sync(VS_FULL_MASK, key_p.idx, 0);
        const int res_idx = __shfl_sync(VS_FULL_MASK, key_res.idx, 0);
        token = (acc < L.k && any_res) ? res_idx : p_idx;
    } else {
        ArgMax a = argmax_identity();
        const long long base = (long long)(L.row0 + acc) * P.chunks;
        for (int c = lane; c < P.chunks; c += 32) argmax_update(a, P.a[base + c], P.idx[base + c]);
        a = warp_argmax(a);
        token = __shfl_sync(VS_FULL_MASK, a.idx, 0);
    }
    write_outputs(tokens + (long long)b * width, width, draft_tokens, L, acc, token, lane, 32);
    if (lane == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = (L.ok && !filtered) ? acc + 1 : 0;
        status[b] = flags;
    }
}

// ---------------------------------------------------------------------------------------
extern "C" int vs_argmax_chunks(int rows, int vocab, int num_sms);  // verify_greedy.cu
extern "C" int vs_argmax_chunk_len(int vocab, int chunks);          // verify_greedy.cu

// Vocabulary chunks of the race a sequence: enough for about `target_blocks` blocks in all (the race
// is compute-bound: a Philox draw, a log, an exp and two divisions per id), with chunks of at least
// 1024 ids; 1 from B >= target_blocks on (v1: one block per sequence).
extern "C" int vs_race_chunks(int batch, int vocab, int target_blocks) {
    int chunks = (target_blocks + batch - 1) / batch;
    const int max_chunks = (vocab + 1023) / 1024;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    return chunks;
}

template <typename T>
static cudaError_t launch_sample(const VsSampleArgs& a, cudaStream_t stream) {
    const T* logits = (const T*)a.logits;
    const int check_q = a.check_q && a.draft_probs != nullptr;
    if (a.rows > 0) {
        row_stats_partial_kernel<T><<<dim3(a.rows, a.chunks), STATS_THREADS, 0, stream>>>(
            logits, a.row_stride, a.vocab, vs_argmax_chunk_len(a.vocab, a.chunks), a.chunks, a.num_draft,
            a.cu_num_draft, a.batch, a.rows, a.width - 1, a.temperature, a.draft_probs, a.q_dtype, a.q_stride, check_q,
            a.part_a, a.part_s, a.part_idx, a.part_flag, a.part_qsum);
    }
    const RowParts P{a.part_a, a.part_s, a.part_idx, a.part_flag, check_q ? a.part_qsum : nullptr, a.chunks};
    const RaceParts R{a.race_p_val, a.race_p_idx, a.race_res_val, a.race_res_idx, a.race_any, a.race_acc, a.race_flags,
                      a.race_chunks};
    race_partial_kernel<T><<<dim3(a.batch, a.race_chunks), RACE_THREADS, 0, stream>>>(
        logits, a.row_stride, a.vocab, vs_argmax_chunk_len(a.vocab, a.race_chunks), P, a.draft_tokens, a.draft_probs,
        a.q_dtype, a.q_stride, a.num_draft, a.cu_num_draft, a.batch, a.rows, a.width - 1, a.temperature, a.top_k,
        a.top_p, a.seed, a.offset, R);
    finalize_kernel<<<(a.batch + FINALIZE_WARPS - 1) / FINALIZE_WARPS, FINALIZE_WARPS * 32, 0, stream>>>(
        a.vocab, P, R, a.draft_tokens, a.num_draft, a.cu_num_draft, a.batch, a.rows, a.temperature, a.top_k, a.top_p,
        a.width, a.tokens, a.num_accepted, a.num_emitted, a.status);
    return cudaGetLastError();
}

extern "C" cudaError_t vs_verify_sample(const VsSampleArgs* args, cudaStream_t stream) {
    if (args->batch == 0) return cudaSuccess;
    if (args->draft_probs != nullptr && (args->q_dtype < VS_F32 || args->q_dtype > VS_F16)) return cudaErrorInvalidValue;
    switch (args->dtype) {
        case VS_F32: return launch_sample<float>(*args, stream);
        case VS_BF16: return launch_sample<__nv_bfloat16>(*args, stream);
        case VS_F16: return launch_sample<__half>(*args, stream);
        default: return cudaErrorInvalidValue;
    }
}
