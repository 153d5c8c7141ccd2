// binding.cpp: torch glue for the verispec CUDA kernels (built only on a CUDA machine, by
// torch.utils.cpp_extension.load in verispec/cuda/__init__.py). Checks devices, dtypes and
// contiguity, allocates outputs, and calls the extern "C" launchers of the .cu files on the
// current stream. No host syncs: everything sized from host-known shapes (CUDA-graph safe).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

extern "C" {
int vs_argmax_chunks(int rows, int vocab, int num_sms);
cudaError_t vs_argmax_partial(int version, const void* logits, int dtype, long long row_stride, int rows, int vocab,
                              int chunks, float* part_val, int* part_idx, cudaStream_t stream);
cudaError_t vs_greedy_scan(int variant, const float* part_val, const int* part_idx, int chunks,
                           const long long* draft_tokens, const int* num_draft, const int* cu_num_draft, int batch,
                           int width, int* tokens, int* num_accepted, int* num_emitted, cudaStream_t stream);
cudaError_t vs_row_stats_partial(const void* logits, int dtype, long long row_stride, int rows, int vocab, int chunks,
                                 const int* cu_num_draft, int batch, const float* temperature, float* part_a,
                                 float* part_s, int* part_idx, cudaStream_t stream);
cudaError_t vs_rejection(const void* logits, int dtype, long long row_stride, int vocab, const float* part_a,
                         const float* part_s, const int* part_idx, int chunks, const long long* draft_tokens,
                         const void* draft_probs, int q_dtype, long long q_stride, const int* num_draft,
                         const int* cu_num_draft, int batch, const float* temperature, const int* top_k,
                         const float* top_p, const long long* seed, const long long* offset, int width, int* tokens,
                         int* num_accepted, int* num_emitted, cudaStream_t stream);
cudaError_t vs_kv_compact(int variant, const void* new_kv, long long rows_total, long long row_bytes,
                          const int* num_rows, const int* num_emitted, int batch, int to_cache, void* dst,
                          const long long* cache_lens, long long cache_seq_len, int* cu_num_rows, int* cu_num_emitted,
                          cudaStream_t stream);
void vs_gemv_config(int dtype, int M, int N, int K, int num_sms, int* version, int* rows, int* split);
cudaError_t vs_gemv(const void* x, const void* w, const void* b, void* y, int dtype, int M, int N, int K, int version,
                    int rows, int split, int num_sms, cudaStream_t stream);
cudaError_t vs_gemv_fused(int mode, const void* x, const void* delta, const void* g, float eps, void* res_out,
                          const void* w, const void* b, void* y, int dtype, int M, int N, int K, int split, int tiles,
                          int num_sms, cudaStream_t stream);
}

namespace {

int dtype_code(const at::Tensor& t, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return 0;
        case at::kBFloat16: return 1;
        case at::kHalf: return 2;
        default: TORCH_CHECK(false, name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
    }
    return -1;
}

void check_cuda(const at::Tensor& t, const at::Tensor& ref, const char* name) {
    TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), name, " must be on ", ref.device(), ", got ", t.device());
}

void check_int(const at::Tensor& t, at::ScalarType dtype, const char* name) {
    TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous(), name, " must be a contiguous ", dtype, " tensor, got ",
                t.scalar_type());
}

void check_launch(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "verispec CUDA ", what, " launch failed: ", cudaGetErrorString(err));
}

int num_sms(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount; }

// ---- greedy ------------------------------------------------------------------------------
// logits [R, V] (last dim contiguous) -> (part_val [R * chunks] f32, part_idx [R * chunks] i32)
std::vector<at::Tensor> argmax_partial(const at::Tensor& logits, int64_t chunks, int64_t version) {
    TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1, "logits must be a CUDA [R, V] tensor with a contiguous last dim");
    const c10::cuda::CUDAGuard guard(logits.device());
    const int rows = logits.size(0), vocab = logits.size(1);
    if (chunks <= 0) chunks = vs_argmax_chunks(rows, vocab, num_sms(logits));
    auto part_val = at::empty({rows * chunks}, logits.options().dtype(at::kFloat));
    auto part_idx = at::empty({rows * chunks}, logits.options().dtype(at::kInt));
    check_launch(vs_argmax_partial((int)version, logits.data_ptr(), dtype_code(logits, "logits"), logits.stride(0), rows, vocab,
                                   (int)chunks, part_val.data_ptr<float>(), part_idx.data_ptr<int>(),
                                   at::cuda::getCurrentCUDAStream()),
                 "argmax");
    return {part_val, part_idx};
}

// The acceptance scan alone, over precomputed partials (chunks == 1: part_idx is the argmax).
std::vector<at::Tensor> greedy_scan(int64_t variant, const std::optional<at::Tensor>& part_val,
                                    const at::Tensor& part_idx, int64_t chunks, const at::Tensor& draft_tokens,
                                    const at::Tensor& num_draft, const at::Tensor& cu_num_draft, int64_t width) {
    check_int(part_idx, at::kInt, "part_idx");
    check_cuda(draft_tokens, part_idx, "draft_tokens");
    check_cuda(num_draft, part_idx, "num_draft");
    check_cuda(cu_num_draft, part_idx, "cu_num_draft");
    check_int(draft_tokens, at::kLong, "draft_tokens");
    check_int(num_draft, at::kInt, "num_draft");
    check_int(cu_num_draft, at::kInt, "cu_num_draft");
    TORCH_CHECK(chunks == 1 || part_val.has_value(), "part_val is needed when chunks > 1");
    const c10::cuda::CUDAGuard guard(part_idx.device());
    const int batch = num_draft.size(0);
    auto opts = part_idx.options().dtype(at::kInt);
    auto tokens = at::empty({batch, width}, opts);
    auto num_accepted = at::empty({batch}, opts);
    auto num_emitted = at::empty({batch}, opts);
    const float* pv = part_val.has_value() ? part_val->data_ptr<float>() : nullptr;
    check_launch(vs_greedy_scan((int)variant, pv, part_idx.data_ptr<int>(), (int)chunks,
                                (const long long*)draft_tokens.data_ptr<int64_t>(),
                                num_draft.data_ptr<int>(), cu_num_draft.data_ptr<int>(), batch, (int)width,
                                tokens.data_ptr<int>(), num_accepted.data_ptr<int>(), num_emitted.data_ptr<int>(),
                                at::cuda::getCurrentCUDAStream()),
                 "greedy scan");
    return {tokens, num_accepted, num_emitted};
}

std::vector<at::Tensor> verify_greedy(const at::Tensor& logits, const at::Tensor& draft_tokens,
                                      const at::Tensor& num_draft, const at::Tensor& cu_num_draft, int64_t width,
                                      int64_t variant, int64_t argmax_version) {
    auto parts = argmax_partial(logits, 0, argmax_version);
    const int64_t chunks = parts[1].numel() / std::max<int64_t>(logits.size(0), 1);
    return greedy_scan(variant, parts[0], parts[1], std::max<int64_t>(chunks, 1), draft_tokens, num_draft,
                       cu_num_draft, width);
}

// ---- sampling ----------------------------------------------------------------------------
std::vector<at::Tensor> verify_sample(const at::Tensor& logits, const at::Tensor& draft_tokens,
                                      const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft,
                                      const at::Tensor& cu_num_draft, int64_t width, const at::Tensor& temperature,
                                      const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
                                      const at::Tensor& offset) {
    TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1, "logits must be a CUDA [R, V] tensor with a contiguous last dim");
    for (auto* t : {&draft_tokens, &num_draft, &cu_num_draft, &temperature, &top_k, &top_p, &seed, &offset})
        check_cuda(*t, logits, "every verify_sample input");
    check_int(draft_tokens, at::kLong, "draft_tokens");
    check_int(num_draft, at::kInt, "num_draft");
    check_int(cu_num_draft, at::kInt, "cu_num_draft");
    check_int(temperature, at::kFloat, "temperature");
    check_int(top_k, at::kInt, "top_k");
    check_int(top_p, at::kFloat, "top_p");
    check_int(seed, at::kLong, "seed");
    check_int(offset, at::kLong, "offset");
    const c10::cuda::CUDAGuard guard(logits.device());
    const int rows = logits.size(0), vocab = logits.size(1), batch = num_draft.size(0);
    const int chunks = vs_argmax_chunks(rows, vocab, num_sms(logits));
    auto fopts = logits.options().dtype(at::kFloat);
    auto iopts = logits.options().dtype(at::kInt);
    auto part_a = at::empty({(int64_t)rows * chunks}, fopts);
    auto part_s = at::empty({(int64_t)rows * chunks}, fopts);
    auto part_idx = at::empty({(int64_t)rows * chunks}, iopts);
    auto stream = at::cuda::getCurrentCUDAStream();
    const int dtype = dtype_code(logits, "logits");
    check_launch(vs_row_stats_partial(logits.data_ptr(), dtype, logits.stride(0), rows, vocab, chunks,
                                      cu_num_draft.data_ptr<int>(), batch, temperature.data_ptr<float>(),
                                      part_a.data_ptr<float>(), part_s.data_ptr<float>(), part_idx.data_ptr<int>(),
                                      stream),
                 "row statistics");
    const void* q = nullptr;
    int q_dtype = 0;
    int64_t q_stride = 0;
    if (draft_probs.has_value()) {
        check_cuda(*draft_probs, logits, "draft_probs");
        TORCH_CHECK(draft_probs->dim() == 2 && draft_probs->stride(1) == 1, "draft_probs must be [N, V] with a contiguous last dim");
        q = draft_probs->data_ptr();
        q_dtype = dtype_code(*draft_probs, "draft_probs");
        q_stride = draft_probs->stride(0);
    }
    auto tokens = at::empty({batch, width}, iopts);
    auto num_accepted = at::empty({batch}, iopts);
    auto num_emitted = at::empty({batch}, iopts);
    check_launch(vs_rejection(logits.data_ptr(), dtype, logits.stride(0), vocab, part_a.data_ptr<float>(),
                              part_s.data_ptr<float>(), part_idx.data_ptr<int>(), chunks,
                              (const long long*)draft_tokens.data_ptr<int64_t>(), q, q_dtype, q_stride,
                              num_draft.data_ptr<int>(), cu_num_draft.data_ptr<int>(), batch,
                              temperature.data_ptr<float>(), top_k.data_ptr<int>(), top_p.data_ptr<float>(),
                              (const long long*)seed.data_ptr<int64_t>(), (const long long*)offset.data_ptr<int64_t>(),
                              (int)width, tokens.data_ptr<int>(), num_accepted.data_ptr<int>(),
                              num_emitted.data_ptr<int>(), stream),
                 "rejection");
    return {tokens, num_accepted, num_emitted};
}

// ---- KV compaction -----------------------------------------------------------------------
// packed mode: returns (packed [R, ...] like new_kv, cu_num_emitted [B + 1] int32)
std::vector<at::Tensor> kv_compact(int64_t variant, const at::Tensor& new_kv, const at::Tensor& num_rows,
                                   const at::Tensor& num_emitted) {
    TORCH_CHECK(new_kv.is_cuda() && new_kv.is_contiguous(), "new_kv must be a contiguous CUDA tensor");
    check_cuda(num_rows, new_kv, "num_rows");
    check_cuda(num_emitted, new_kv, "num_emitted");
    check_int(num_rows, at::kInt, "num_rows");
    check_int(num_emitted, at::kInt, "num_emitted");
    const c10::cuda::CUDAGuard guard(new_kv.device());
    const int batch = num_rows.size(0);
    const int64_t rows = new_kv.size(0);
    const int64_t row_bytes = rows ? new_kv.numel() / rows * new_kv.element_size() : 0;
    auto packed = at::empty_like(new_kv);
    auto iopts = num_rows.options();
    auto cu_num_rows = at::empty({batch + 1}, iopts);
    auto cu_num_emitted = at::empty({batch + 1}, iopts);
    check_launch(vs_kv_compact((int)variant, new_kv.data_ptr(), rows, row_bytes, num_rows.data_ptr<int>(),
                               num_emitted.data_ptr<int>(), batch, 0, packed.data_ptr(), nullptr, 0,
                               cu_num_rows.data_ptr<int>(), cu_num_emitted.data_ptr<int>(),
                               at::cuda::getCurrentCUDAStream()),
                 "kv compact");
    return {packed, cu_num_emitted};
}

// cache mode: cache [B, S, ...] written in place; cache_lens [B] int64.
void kv_scatter(int64_t variant, at::Tensor cache, const at::Tensor& cache_lens, const at::Tensor& new_kv,
                const at::Tensor& num_rows, const at::Tensor& num_emitted) {
    TORCH_CHECK(new_kv.is_cuda() && new_kv.is_contiguous(), "new_kv must be a contiguous CUDA tensor");
    TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == new_kv.scalar_type(), "cache must be contiguous with new_kv's dtype");
    check_cuda(cache, new_kv, "cache");
    check_cuda(cache_lens, new_kv, "cache_lens");
    check_cuda(num_rows, new_kv, "num_rows");
    check_cuda(num_emitted, new_kv, "num_emitted");
    check_int(cache_lens, at::kLong, "cache_lens");
    check_int(num_rows, at::kInt, "num_rows");
    check_int(num_emitted, at::kInt, "num_emitted");
    const c10::cuda::CUDAGuard guard(new_kv.device());
    const int batch = num_rows.size(0);
    const int64_t rows = new_kv.size(0);
    const int64_t row_bytes = cache.size(0) && cache.size(1) ? cache.numel() / (cache.size(0) * cache.size(1)) * cache.element_size() : 0;
    auto iopts = num_rows.options();
    auto cu_num_rows = at::empty({batch + 1}, iopts);
    auto cu_num_emitted = at::empty({batch + 1}, iopts);
    check_launch(vs_kv_compact((int)variant, new_kv.data_ptr(), rows, row_bytes, num_rows.data_ptr<int>(),
                               num_emitted.data_ptr<int>(), batch, 1, cache.data_ptr(),
                               (const long long*)cache_lens.data_ptr<int64_t>(), cache.size(1),
                               cu_num_rows.data_ptr<int>(), cu_num_emitted.data_ptr<int>(),
                               at::cuda::getCurrentCUDAStream()),
                 "kv scatter");
}

// ---- decode GEMV ------------------------------------------------------------------------
// y [M, N] = x [M, K] @ w [N, K]^T (+ b [N]); M <= 8, K * elem % 16 == 0, 16-byte aligned x, w
// (verispec/cuda/__init__.py checks and falls back to F.linear first). out: written in place.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                const std::optional<at::Tensor>& out, int64_t version, int64_t rows, int64_t split) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), "x must be a contiguous CUDA [M, K] tensor");
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == x.size(1), "w must be a contiguous [N, K] tensor, K = ",
                x.size(1), ", got ", w.sizes());
    check_cuda(w, x, "w");
    TORCH_CHECK(w.scalar_type() == x.scalar_type(), "w dtype ", w.scalar_type(), " != x dtype ", x.scalar_type());
    const int M = x.size(0), N = w.size(0), K = x.size(1);
    const void* bp = nullptr;
    if (b.has_value()) {
        check_cuda(*b, x, "b");
        TORCH_CHECK(b->scalar_type() == x.scalar_type() && b->is_contiguous() && b->numel() == N,
                    "b must be a contiguous [N] tensor of x's dtype");
        bp = b->data_ptr();
    }
    at::Tensor y;
    if (out.has_value()) {
        check_cuda(*out, x, "out");
        TORCH_CHECK(out->scalar_type() == x.scalar_type() && out->is_contiguous() && out->dim() == 2 &&
                        out->size(0) == M && out->size(1) == N,
                    "out must be a contiguous [M, N] tensor of x's dtype");
        y = *out;
    } else {
        y = at::empty({M, N}, x.options());
    }
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(vs_gemv(x.data_ptr(), w.data_ptr(), bp, y.data_ptr(), dtype_code(x, "x"), M, N, K, (int)version,
                         (int)rows, (int)split, num_sms(x), at::cuda::getCurrentCUDAStream()),
                 "gemv");
    return y;
}

// The (version, rows, split) the launcher picks for this shape when all are 0 (benchmarks).
std::vector<int64_t> gemv_config(const at::Tensor& w, int64_t M) {
    TORCH_CHECK(w.is_cuda() && w.dim() == 2, "w must be a CUDA [N, K] tensor");
    int version = 0, rows = 0, split = 0;
    vs_gemv_config(dtype_code(w, "w"), (int)M, (int)w.size(0), (int)w.size(1), num_sms(w), &version, &rows, &split);
    return {version, rows, split};
}

// ---- decode GEMV with a fused prologue (gemv.cu, gemv_fused_kernel) ----------------------
// Shared checks: w [N, K] contiguous of x's dtype on x's device, optional bias [N]; returns the bias pointer.
const void* check_gemv_weight(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t K) {
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == K, "w must be a contiguous [N, ", K, "] tensor, got ",
                w.sizes());
    check_cuda(w, x, "w");
    TORCH_CHECK(w.scalar_type() == x.scalar_type(), "w dtype ", w.scalar_type(), " != x dtype ", x.scalar_type());
    if (!b.has_value()) return nullptr;
    check_cuda(*b, x, "b");
    TORCH_CHECK(b->scalar_type() == x.scalar_type() && b->is_contiguous() && b->numel() == w.size(0),
                "b must be a contiguous [N] tensor of x's dtype");
    return b->data_ptr();
}

// (y [M, N], residual [M, K]): y = (RMSNorm(x + delta) * g) @ w^T (+ b); residual = x + delta rounded
// (a new tensor), or x itself without delta. M <= 2 (verispec/cuda/__init__.py checks first).
std::vector<at::Tensor> gemv_rmsnorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g, double eps,
                                     const std::optional<at::Tensor>& delta, const std::optional<at::Tensor>& b,
                                     int64_t tiles) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), "x must be a contiguous CUDA [M, K] tensor");
    const int M = x.size(0), K = x.size(1);
    const void* bp = check_gemv_weight(x, w, b, K);
    check_cuda(g, x, "norm_weight");
    TORCH_CHECK(g.scalar_type() == x.scalar_type() && g.is_contiguous() && g.numel() == K,
                "norm_weight must be a contiguous [K] tensor of x's dtype");
    const void* dp = nullptr;
    at::Tensor res = x;
    if (delta.has_value()) {
        check_cuda(*delta, x, "delta");
        TORCH_CHECK(delta->scalar_type() == x.scalar_type() && delta->is_contiguous() && delta->sizes() == x.sizes(),
                    "delta must be a contiguous [M, K] tensor of x's dtype");
        dp = delta->data_ptr();
        res = at::empty_like(x);
    }
    auto y = at::empty({M, w.size(0)}, x.options());
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(vs_gemv_fused(1, x.data_ptr(), dp, g.data_ptr(), (float)eps, dp ? res.data_ptr() : nullptr,
                               w.data_ptr(), bp, y.data_ptr(), dtype_code(x, "x"), M, w.size(0), K, 0, (int)tiles,
                               num_sms(x), at::cuda::getCurrentCUDAStream()),
                 "gemv_rmsnorm");
    return {y, res};
}

// y [M, N] = (silu(gate) * up) @ w^T (+ b), gu [M, 2K] = [gate | up]; M <= 2.
at::Tensor gemv_swiglu(const at::Tensor& gu, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t tiles) {
    TORCH_CHECK(gu.is_cuda() && gu.dim() == 2 && gu.is_contiguous() && gu.size(1) % 2 == 0,
                "gu must be a contiguous CUDA [M, 2K] tensor");
    const int M = gu.size(0), K = gu.size(1) / 2;
    const void* bp = check_gemv_weight(gu, w, b, K);
    auto y = at::empty({M, w.size(0)}, gu.options());
    const c10::cuda::CUDAGuard guard(gu.device());
    check_launch(vs_gemv_fused(2, gu.data_ptr(), nullptr, nullptr, 0.0f, nullptr, w.data_ptr(), bp, y.data_ptr(),
                               dtype_code(gu, "gu"), M, w.size(0), K, 0, (int)tiles, num_sms(gu),
                               at::cuda::getCurrentCUDAStream()),
                 "gemv_swiglu");
    return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "verispec CUDA verification kernels (see verispec/cuda/*.cu)";
    m.def("argmax_partial", &argmax_partial, "row argmax partials over vocab chunks (chunks <= 0: auto)");
    m.def("greedy_scan", &greedy_scan, "greedy acceptance scan (variant 0 naive, 1 ballot, 2 segment)");
    m.def("verify_greedy", &verify_greedy, "argmax + acceptance scan");
    m.def("verify_sample", &verify_sample, "rejection-sampling verification");
    m.def("kv_compact", &kv_compact, "pack kept KV rows (variant 0 naive, 1 scan, 2 fused)");
    m.def("kv_scatter", &kv_scatter, "write kept KV rows into a static cache (variant 0 naive, 1 scan, 2 fused)");
    m.def("gemv", &gemv, "y = x @ w^T (+ b) for M <= 8 rows of x (version, rows, split: 0 = auto)");
    m.def("gemv_rmsnorm", &gemv_rmsnorm, "(y, residual): RMSNorm(x + delta) * g @ w^T (+ b), M <= 2 (tiles: 0 = auto)");
    m.def("gemv_swiglu", &gemv_swiglu, "y = (silu(gate) * up) @ w^T (+ b), gu = [gate | up], M <= 2 (tiles: 0 = auto)");
    m.def("gemv_config", &gemv_config, "the automatic (version, rows, split) of vs_gemv for w [N, K] and M rows");
}
