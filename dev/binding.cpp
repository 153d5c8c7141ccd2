// binding.cpp: torch glue for the dev/ experiments: KV compaction variants (dev/kv/kv_compact.cu) and the
// fused-prologue GEMV (dev/gemv_fused/gemv_fused.cu). Built on first use by dev/cuda_ext.py.
#include "jit_glue.h"

using namespace vs_glue;

extern "C" {
cudaError_t vs_kv_compact(int variant, const void* new_kv, long long rows_total, long long row_bytes,
                          const int* num_rows, const int* num_emitted, int batch, int to_cache, void* dst,
                          const long long* cache_lens, long long cache_seq_len, int* cu_num_rows, int* cu_num_emitted,
                          cudaStream_t stream);
cudaError_t vs_gemv_fused(int mode, const void* x, const void* delta, const void* g, float eps, void* res_out,
                          const void* w, const void* b, void* y, int dtype, int M, int N, int K, int split, int tiles,
                          int num_sms, cudaStream_t stream);
}

namespace {

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
// (a new tensor), or x itself without delta. M <= 2 (dev/cuda_ext.py checks first).
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
    m.doc() = "verispec dev experiments: KV compaction variants, fused-prologue GEMV";
    m.def("kv_compact", &kv_compact, "pack kept KV rows (variant 0 naive, 1 scan, 2 fused)");
    m.def("kv_scatter", &kv_scatter, "write kept KV rows into a static cache (variant 0 naive, 1 scan, 2 fused)");
    m.def("gemv_rmsnorm", &gemv_rmsnorm, "(y, residual): RMSNorm(x + delta) * g @ w^T (+ b), M <= 2 (tiles: 0 = auto)");
    m.def("gemv_swiglu", &gemv_swiglu, "y = (silu(gate) * up) @ w^T (+ b), gu = [gate | up], M <= 2 (tiles: 0 = auto)");
}
