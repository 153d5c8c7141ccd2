// binding.cpp: torch glue for the runtime's matmuls (gemv.cu, invariant.cu, packed.cu), built on first use by
// verispec/runtime/gemv/__init__.py through verispec.jit. No host syncs (CUDA-graph safe).
#include "jit_glue.h"

using namespace vs_glue;

extern "C" {
void vs_gemv_config(int dtype, int M, int N, int K, int num_sms, int* version, int* rows, int* split);
cudaError_t vs_gemv(const void* x, const void* w, const void* b, void* y, int dtype, int M, int N, int K, int version,
                    int rows, int split, int num_sms, cudaStream_t stream, int pdl);
int vs_inv_slices(int K);
int vs_inv_num_variants();
void vs_inv_variant_shape(int variant, int* rt, int* nt, int* u, int* wr);
cudaError_t vs_inv_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int M, int N, int K,
                          int variant, int slices, cudaStream_t stream, int pdl);
int vs_packed_block_size(int qtype);
int vs_packed_default_variant();
cudaError_t vs_packed_matmul(const void* x, const void* w, const void* b, void* y, int dtype, int qtype, int M, int N,
                             int K, int variant, cudaStream_t stream, int pdl);
cudaError_t vs_packed_dequantize(const void* w, void* out, int dtype, int qtype, int N, int K, int variant,
                                 cudaStream_t stream);
}

namespace {

// ---- decode GEMV ------------------------------------------------------------------------
// y [M, N] = x [M, K] @ w [N, K]^T (+ b [N]); M <= 8, K * elem % 16 == 0, 16-byte aligned x, w
// (verispec/runtime/gemv/__init__.py checks and falls back to F.linear first). out: written in place.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                const std::optional<at::Tensor>& out, int64_t version, int64_t rows, int64_t split, bool pdl) {
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
                         (int)rows, (int)split, num_sms(x), at::cuda::getCurrentCUDAStream(), pdl ? 1 : 0),
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

// ---- batch-invariant matmul ---------------------------------------------------------------
// y [M, N] = x [M, K] @ w [N, K]^T (+ b [N]) in invariant.cu's fixed order; bf16/fp16, K % 8 == 0, 16-byte
// aligned contiguous x and w (verispec/runtime/gemv/__init__.py checks first). out: written in place.
at::Tensor inv_matmul(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                      const std::optional<at::Tensor>& out, int64_t variant, int64_t slices, bool pdl) {
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
    check_launch(vs_inv_matmul(x.data_ptr(), w.data_ptr(), bp, y.data_ptr(), dtype_code(x, "x"), M, N, K, (int)variant,
                               (int)slices, at::cuda::getCurrentCUDAStream(), pdl ? 1 : 0),
                 "inv_matmul");
    return y;
}

// [slices, variant, RT, NT, U, WR] that inv_matmul runs for M rows of x and w [N, K] in ``variant`` (1..n; the rule
// choosing it is gemv.invariant_variant in Python).
std::vector<int64_t> inv_config(int64_t M, int64_t N, int64_t K, int64_t variant) {
    TORCH_CHECK(variant >= 1 && variant <= vs_inv_num_variants(), "inv_config: variant must be 1..",
                vs_inv_num_variants(), ", got ", variant);
    (void)M;
    (void)N;
    const int v = (int)variant;
    int rt = 0, nt = 0, u = 0, wr = 0;
    vs_inv_variant_shape(v, &rt, &nt, &u, &wr);
    return {vs_inv_slices((int)K), v, rt, nt, u, wr};
}

// ---- packed (GGUF block) matmul ---------------------------------------------------------------
// y [M, N] = x [M, K] @ W^T (+ b [N]), W = blocks uint8 [N, K / QK * type size] of GGML type qtype (packed.cu).
at::Tensor packed_matmul(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t type_size,
                         const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& out, int64_t variant,
                         bool pdl) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), "x must be a contiguous CUDA [M, K] tensor");
    check_cuda(blocks, x, "blocks");
    const int qk = vs_packed_block_size((int)qtype);
    const int M = x.size(0), K = x.size(1);
    TORCH_CHECK(qk > 0 && K % qk == 0, "GGML type ", qtype, " is not one packed.cu decodes, or K = ", K,
                " is not a whole number of its blocks");
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.size(1) == (int64_t)(K / qk) * type_size,
                "blocks must be a contiguous uint8 [N, ", (int64_t)(K / qk) * type_size, "] tensor, got ", blocks.sizes());
    const int N = blocks.size(0);
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
    check_launch(vs_packed_matmul(x.data_ptr(), blocks.data_ptr(), bp, y.data_ptr(), dtype_code(x, "x"), (int)qtype,
                                  M, N, K, (int)variant, at::cuda::getCurrentCUDAStream(), (int)pdl),
                 "packed_matmul");
    return y;
}

// out [N, K] (contiguous, fp32 / bf16 / fp16) = W dequantized, W = blocks uint8 [N, K / QK * type size] of GGML type
// qtype; returns out.
at::Tensor packed_dequantize(const at::Tensor& blocks, int64_t qtype, int64_t type_size, const at::Tensor& out,
                             int64_t variant) {
    TORCH_CHECK(blocks.is_cuda(), "blocks must be a CUDA tensor");
    check_cuda(out, blocks, "out");
    const int qk = vs_packed_block_size((int)qtype);
    TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == blocks.size(0),
                "out must be a contiguous [N, K] tensor, N = ", blocks.size(0), ", got ", out.sizes());
    const int64_t K = out.size(1);
    TORCH_CHECK(qk > 0 && K % qk == 0, "GGML type ", qtype, " is not one packed.cu decodes, or K = ", K,
                " is not a whole number of its blocks");
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                    blocks.size(1) == (K / qk) * type_size,
                "blocks must be a contiguous uint8 [N, ", (K / qk) * type_size, "] tensor, got ", blocks.sizes());
    const c10::cuda::CUDAGuard guard(blocks.device());
    check_launch(vs_packed_dequantize(blocks.data_ptr(), out.data_ptr(), dtype_code(out, "out"), (int)qtype,
                                      (int)blocks.size(0), (int)K, (int)variant, at::cuda::getCurrentCUDAStream()),
                 "packed_dequantize");
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "verispec decode GEMV (see verispec/runtime/gemv/gemv.cu)";
    m.def("gemv", &gemv, "y = x @ w^T (+ b) for M <= 8 rows of x (version, rows, split: 0 = auto; pdl: programmatic dependent launch)");
    m.def("inv_matmul", &inv_matmul, "y = x @ w^T (+ b) in the batch-invariant order, any M (variant, slices: 0 = auto)");
    m.def("inv_config", &inv_config, "[slices, variant, RT, NT, U, WR] of inv_matmul for (M, N, K, variant)");
    m.def("inv_num_variants", &vs_inv_num_variants, "how many variants inv_matmul has (1..n)");
    m.def("gemv_config", &gemv_config, "the automatic (version, rows, split) of vs_gemv for w [N, K] and M rows");
    m.def("packed_matmul", &packed_matmul, "y = x @ W^T (+ b), W as GGUF blocks, in packed.cu's fixed order, any M "
          "(variant: 0 = default, 1, 2: the same bits; 3: tensor cores (bf16), its own fixed order)");
    m.def("packed_dequantize", &packed_dequantize, "out [N, K] = W dequantized from its GGUF blocks (variant as above)");
    m.def("packed_default_variant", &vs_packed_default_variant, "the variant packed_matmul runs for variant 0");
}
