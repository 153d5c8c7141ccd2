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
// Two kernels:
//   row_stats_partial_kernel  grid (R, chunks): per (row, vocab chunk) the online-softmax
//       statistics (max m, sum exp(z - m)) of z = logits / T, or for T == 0 the argmax with
//       torch's tie-break. 16-byte loads, warp-shuffle reductions (the argmax of
//       verify_greedy.cu's version 2, extended to softmax statistics).
//   rejection_kernel          grid B, 256 threads: warp 0 merges the chunk statistics of the
//       sequence's rows and runs the accept tests of all its drafts at once, __ballot_sync
//       finding the first rejection; then the whole block runs the exponential race
//       over the emitted row (recovered or bonus): one pass over V with one Philox draw per
//       vocabulary id, block argmax through __shfl_down_sync.
//
// top-k / top-p are not implemented in this backend: the Python launcher raises
// NotImplementedError; under CUDA-graph capture (no host check possible) a sequence with an
// active filter gets num_accepted = -1, num_emitted = 0 and tokens all -1.
#include "common.cuh"

#define STATS_THREADS 256
#define REJECT_THREADS 256

// part_a: softmax max m (T > 0) or argmax value (T == 0); part_s: sum exp(z - m); part_idx: argmax
template <typename T>
__global__ void __launch_bounds__(STATS_THREADS)
row_stats_partial_kernel(const T* __restrict__ logits, long long row_stride, int vocab, int chunk_len, int chunks,
                         const int* __restrict__ cu_num_draft, int batch,
                         const float* __restrict__ temperature,  // [B]
                         float* __restrict__ part_a, float* __restrict__ part_s, int* __restrict__ part_idx) {
    const long long r = blockIdx.x;  // rows on x: R can exceed grid.y's 65535
    const int c = blockIdx.y;
    const int b = seq_of_row(cu_num_draft, batch, (int)r);
    const float temp = temperature[b];
    const int start = c * chunk_len;
    const int n = min(chunk_len, vocab - start);
    const T* row = logits + r * row_stride + start;
    const long long o = r * chunks + c;
    if (temp == 0.0f) {
        ArgMax a = argmax_identity();
        if (n > 0) for_each_element<T, 4>(row, n, [&](float v, int i) { argmax_update(a, v, start + i); });
        a = block_argmax(a);
        if (threadIdx.x == 0) { part_a[o] = a.val; part_s[o] = 0.0f; part_idx[o] = a.idx; }
    } else {
        SoftmaxStats s{-INFINITY, 0.0f};
        if (n > 0) for_each_element<T, 4>(row, n, [&](float v, int) { stats_update(s, v / temp); });
        s = block_stats(s);
        if (threadIdx.x == 0) { part_a[o] = s.m; part_s[o] = s.s; part_idx[o] = 0; }
    }
}

__device__ __forceinline__ SoftmaxStats row_stats(const float* part_a, const float* part_s, int chunks, int r) {
    SoftmaxStats s{-INFINITY, 0.0f};
#pragma unroll 8
    for (int c = 0; c < chunks; ++c) s = stats_merge(s, {part_a[(long long)r * chunks + c], part_s[(long long)r * chunks + c]});
    return s;
}

__device__ __forceinline__ int row_argmax_stats(const float* part_a, const int* part_idx, int chunks, int r) {
    ArgMax a = argmax_identity();
#pragma unroll 8
    for (int c = 0; c < chunks; ++c) argmax_update(a, part_a[(long long)r * chunks + c], part_idx[(long long)r * chunks + c]);
    return a.idx;
}

// Q: draft_probs element type (ignored when draft_probs is null).
template <typename T, typename Q>
__global__ void __launch_bounds__(REJECT_THREADS)
rejection_kernel(const T* __restrict__ logits, long long row_stride, int vocab,
                 const float* __restrict__ part_a, const float* __restrict__ part_s, const int* __restrict__ part_idx,
                 int chunks,
                 const long long* __restrict__ draft_tokens,  // [N]
                 const Q* __restrict__ draft_probs,           // [N, V] (row stride q_stride) or null
                 long long q_stride,
                 const int* __restrict__ num_draft, const int* __restrict__ cu_num_draft, int batch,
                 const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,
                 const long long* __restrict__ seed_ptr,    // [B] per-sequence Philox keys
                 const long long* __restrict__ offset_ptr,  // [B] per-sequence counter offsets
                 int width, int* __restrict__ tokens, int* __restrict__ num_accepted, int* __restrict__ num_emitted) {
    __shared__ int s_acc;
    __shared__ int s_token;  // T == 0: the emitted argmax
    __shared__ float s_m, s_s;
    const int b = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const float temp = temperature[b];
    const int k = num_draft[b], d0 = cu_num_draft[b], row0 = d0 + b;
    const uint64_t seed = (uint64_t)seed_ptr[b], offset = (uint64_t)offset_ptr[b];
    int* out = tokens + (long long)b * width;

    const bool filtered = temp != 0.0f && ((top_k[b] > 0 && top_k[b] < vocab) || top_p[b] < 1.0f);
    if (filtered) {  // block-uniform
        for (int j = threadIdx.x; j < width; j += blockDim.x) out[j] = -1;
        if (threadIdx.x == 0) { num_accepted[b] = -1; num_emitted[b] = 0; }
        return;
    }

    // ---- accept tests: warp 0, 32 drafts per step, first rejection by ballot --------------
    if (threadIdx.x < 32) {
        int acc = k;
        for (int base = 0; base < k; base += 32) {
            const int i = base + lane;
            bool reject = false;
            if (i < k) {
                const int r = row0 + i;
                const int x = (int)draft_tokens[d0 + i];
                if (temp == 0.0f) {
                    reject = x != row_argmax_stats(part_a, part_idx, chunks, r);
                } else {
                    const SoftmaxStats st = row_stats(part_a, part_s, chunks, r);
                    const float z = to_float(logits[(long long)r * row_stride + x]) / temp;
                    const float p_x = expf(z - st.m) * (1.0f / st.s);
                    const float q_x = draft_probs ? to_float(draft_probs[(long long)(d0 + i) * q_stride + x]) : 1.0f;
                    const float u = vs_uniform(seed, offset, (uint32_t)i, 0u, VS_PURPOSE_ACCEPT);  // local row
                    // the reference compares Python floats (double): u * q(x) < p(x)
                    reject = !((double)u * (double)q_x < (double)p_x);
                }
            }
            const unsigned m = __ballot_sync(VS_FULL_MASK, reject);
            if (m) { acc = base + __ffs(m) - 1; break; }
        }
        if (lane == 0) {
            s_acc = acc;
            if (temp == 0.0f) {
                s_token = row_argmax_stats(part_a, part_idx, chunks, row0 + acc);
            } else {
                const SoftmaxStats st = row_stats(part_a, part_s, chunks, row0 + acc);
                s_m = st.m;
                s_s = st.s;
            }
        }
    }
    __syncthreads();
    const int acc = s_acc;
    const int row = row0 + acc;

    // ---- the emitted token: exponential race over the recovered / bonus row ----------------
    int token;
    if (temp == 0.0f) {
        token = s_token;
    } else {
        const float m = s_m, inv_s = 1.0f / s_s;
        const bool recovery = acc < k;
        const int x = recovery ? (int)draft_tokens[d0 + acc] : -1;
        const Q* q_row = (recovery && draft_probs) ? draft_probs + (long long)(d0 + acc) * q_stride : nullptr;
        ArgMax key_p = argmax_identity(), key_res = argmax_identity();
        int any_res = 0;
        for_each_element<T, 2>(logits + (long long)row * row_stride, vocab, [&](float l, int v) {
            const float p = expf(l / temp - m) * inv_s;
            const float e = -logf(vs_uniform(seed, offset, (uint32_t)acc, (uint32_t)v, VS_PURPOSE_RACE));
            argmax_update(key_p, p / e, v);
            if (recovery) {
                const float q = q_row ? to_float(q_row[v]) : (v == x ? 1.0f : 0.0f);
                const float w = fmaxf(p - q, 0.0f);
                any_res |= w > 0.0f;
                argmax_update(key_res, w / e, v);
            }
        });
        key_p = block_argmax(key_p);
        key_res = block_argmax(key_res);
        any_res = __syncthreads_or(any_res);
        token = (recovery && any_res) ? key_res.idx : key_p.idx;
    }
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        out[j] = j < acc ? (int)draft_tokens[d0 + j] : (j == acc ? token : -1);
    }
    if (threadIdx.x == 0) {
        num_accepted[b] = acc;
        num_emitted[b] = acc + 1;
    }
}

// ---------------------------------------------------------------------------------------
extern "C" int vs_argmax_chunk_len(int vocab, int chunks);  // verify_greedy.cu

extern "C" cudaError_t vs_row_stats_partial(const void* logits, int dtype, long long row_stride, int rows, int vocab,
                                            int chunks, const int* cu_num_draft, int batch, const float* temperature,
                                            float* part_a, float* part_s, int* part_idx, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const int chunk_len = vs_argmax_chunk_len(vocab, chunks);
    dim3 grid(rows, chunks);
#define VS_LAUNCH_STATS(T)                                                                                       \
    row_stats_partial_kernel<T><<<grid, STATS_THREADS, 0, stream>>>((const T*)logits, row_stride, vocab,       \
                                                                     chunk_len, chunks, cu_num_draft, batch,    \
                                                                     temperature, part_a, part_s, part_idx)
    switch (dtype) {
        case VS_F32: VS_LAUNCH_STATS(float); break;
        case VS_BF16: VS_LAUNCH_STATS(__nv_bfloat16); break;
        case VS_F16: VS_LAUNCH_STATS(__half); break;
        default: return cudaErrorInvalidValue;
    }
#undef VS_LAUNCH_STATS
    return cudaGetLastError();
}

template <typename T>
static void launch_rejection(const void* logits, long long row_stride, int vocab, const float* part_a,
                             const float* part_s, const int* part_idx, int chunks, const long long* draft_tokens,
                             const void* draft_probs, int q_dtype, long long q_stride, const int* num_draft,
                             const int* cu_num_draft, int batch, const float* temperature, const int* top_k,
                             const float* top_p, const long long* seed, const long long* offset, int width,
                             int* tokens, int* num_accepted, int* num_emitted, cudaStream_t stream) {
#define VS_LAUNCH_REJECT(Q)                                                                                        \
    rejection_kernel<T, Q><<<batch, REJECT_THREADS, 0, stream>>>(                                                 \
        (const T*)logits, row_stride, vocab, part_a, part_s, part_idx, chunks, draft_tokens, (const Q*)draft_probs, \
        q_stride, num_draft, cu_num_draft, batch, temperature, top_k, top_p, seed, offset, width, tokens,         \
        num_accepted, num_emitted)
    if (draft_probs == nullptr || q_dtype == VS_F32) VS_LAUNCH_REJECT(float);
    else if (q_dtype == VS_BF16) VS_LAUNCH_REJECT(__nv_bfloat16);
    else VS_LAUNCH_REJECT(__half);
#undef VS_LAUNCH_REJECT
}

extern "C" cudaError_t vs_rejection(const void* logits, int dtype, long long row_stride, int vocab, const float* part_a,
                                    const float* part_s, const int* part_idx, int chunks,
                                    const long long* draft_tokens, const void* draft_probs, int q_dtype,
                                    long long q_stride, const int* num_draft, const int* cu_num_draft, int batch,
                                    const float* temperature, const int* top_k, const float* top_p,
                                    const long long* seed, const long long* offset, int width, int* tokens,
                                    int* num_accepted, int* num_emitted, cudaStream_t stream) {
    if (batch == 0) return cudaSuccess;
    if (q_dtype < VS_F32 || q_dtype > VS_F16) return cudaErrorInvalidValue;
#define VS_ARGS                                                                                                  \
    logits, row_stride, vocab, part_a, part_s, part_idx, chunks, draft_tokens, draft_probs, q_dtype, q_stride, \
        num_draft, cu_num_draft, batch, temperature, top_k, top_p, seed, offset, width, tokens, num_accepted,  \
        num_emitted, stream
    switch (dtype) {
        case VS_F32: launch_rejection<float>(VS_ARGS); break;
        case VS_BF16: launch_rejection<__nv_bfloat16>(VS_ARGS); break;
        case VS_F16: launch_rejection<__half>(VS_ARGS); break;
        default: return cudaErrorInvalidValue;
    }
#undef VS_ARGS
    return cudaGetLastError();
}
