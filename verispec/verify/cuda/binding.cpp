// binding.cpp: torch glue for the backend="cuda" verification kernels (built on first use by
// verispec/verify/cuda/__init__.py through verispec.jit). Checks devices, dtypes and contiguity, allocates
// outputs, and calls the extern "C" launchers of the .cu files on the current stream. No host syncs:
// everything sized from host-known shapes (CUDA-graph safe).
#include "jit_glue.h"

using namespace vs_glue;

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
}

namespace {

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
    // one Philox key and one offset per sequence (verispec/verify/rng.py)
    TORCH_CHECK(seed.dim() == 1 && seed.size(0) == batch,
                "seed must be a [B] int64 tensor (one key per sequence)");
    TORCH_CHECK(offset.dim() == 1 && offset.size(0) == batch,
                "offset must be a [B] int64 tensor (one per sequence)");
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "verispec backend='cuda' verification kernels (see verispec/verify/cuda/*.cu)";
    m.def("argmax_partial", &argmax_partial, "row argmax partials over vocab chunks (chunks <= 0: auto)");
    m.def("greedy_scan", &greedy_scan, "greedy acceptance scan (variant 0 naive, 1 ballot, 2 segment)");
    m.def("verify_greedy", &verify_greedy, "argmax + acceptance scan");
    m.def("verify_sample", &verify_sample, "rejection-sampling verification");
}
