// binding.cpp: torch glue for the backend="cuda" verification kernels (built on first use by
// verispec/verify/cuda/__init__.py through verispec.jit). Checks devices, dtypes and contiguity, allocates
// outputs, and calls the extern "C" launchers of the .cu files on the current stream. No host syncs:
// everything sized from host-known shapes (CUDA-graph safe).
#include "jit_glue.h"
#include "sample_args.h"

using namespace vs_glue;

extern "C" {
int vs_argmax_chunks(int rows, int vocab, int num_sms);
long long vs_argmax_plan(int version, int dtype, int rows, int vocab, int num_sms, int* chunks, long long* per_block);
cudaError_t vs_argmax(int version, const void* logits, int dtype, long long row_stride, int rows, int vocab, int chunks,
                      long long per_block, float* part_val, int* part_idx, int* part_flag, cudaStream_t stream);
cudaError_t vs_greedy_scan(int variant, int balanced, const float* part_val, const int* part_idx, const int* part_flag,
                           int chunks, long long per_block, const long long* draft_tokens, const int* num_draft,
                           const int* cu_num_draft, int batch, int num_rows, int vocab, int width, int* tokens,
                           int* num_accepted, int* num_emitted, int* status, cudaStream_t stream);
int vs_race_chunks(int batch, int vocab, int target_blocks);
cudaError_t vs_verify_sample(const VsSampleArgs* args, cudaStream_t stream);
}

namespace {

// The ragged metadata every verification call shares: int64 draft_tokens [N], int32 num_draft [B],
// int32 cu_num_draft [B + 1], with N = R - B. Shapes only (the kernels check the values: status).
void check_layout(const at::Tensor& logits, const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                  const at::Tensor& cu_num_draft) {
    for (auto* t : {&draft_tokens, &num_draft, &cu_num_draft}) check_cuda(*t, logits, "every verification input");
    check_int(draft_tokens, at::kLong, "draft_tokens");
    check_int(num_draft, at::kInt, "num_draft");
    check_int(cu_num_draft, at::kInt, "cu_num_draft");
    const int64_t batch = num_draft.numel();
    TORCH_CHECK(batch >= 1 && cu_num_draft.numel() == batch + 1, "cu_num_draft must have B + 1 entries");
    TORCH_CHECK(draft_tokens.numel() + batch == logits.size(0),
                "target_logits must have sum(num_draft) + B rows: draft_tokens has ", draft_tokens.numel(),
                " tokens for B=", batch, " and ", logits.size(0), " rows");
}

void check_logits(const at::Tensor& logits) {
    TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1,
                "logits must be a CUDA [R, V] tensor with a contiguous last dim");
    TORCH_CHECK(logits.size(0) < INT32_MAX && logits.size(1) < INT32_MAX, "logits has too many rows or columns");
}

// tokens [B, width], num_accepted, num_emitted, status [B]: int32 views of one allocation (an eager call
// pays for one caching-allocator round trip, not four).
std::vector<at::Tensor> outputs(const at::Tensor& like, int64_t batch, int64_t width) {
    auto all = at::empty({batch * (width + 3)}, like.options().dtype(at::kInt));
    return {all.narrow(0, 0, batch * width).view({batch, width}), all.narrow(0, batch * width, batch),
            all.narrow(0, batch * (width + 1), batch), all.narrow(0, batch * (width + 2), batch)};
}

// Scratch of `words` 4-byte words (float or int32 partials, carved by the launchers) in one allocation.
at::Tensor workspace(const at::Tensor& like, int64_t words) {
    return at::empty({std::max<int64_t>(words, 1)}, like.options().dtype(at::kInt));
}

// ---- greedy ------------------------------------------------------------------------------
// Argmax partials of a chunked version with `chunks` chunks a row (<= 0: automatic):
// logits [R, V] -> (part_val, part_idx, part_flag) [R * chunks]. Tests and benchmarks.
std::vector<at::Tensor> argmax_partial(const at::Tensor& logits, int64_t chunks, int64_t version) {
    check_logits(logits);
    const c10::cuda::CUDAGuard guard(logits.device());
    const int rows = logits.size(0), vocab = logits.size(1);
    const int dtype = dtype_code(logits, "logits");
    int plan_chunks = 1;
    long long per_block = 0;
    TORCH_CHECK(vs_argmax_plan((int)version, dtype, rows, vocab, num_sms(logits), &plan_chunks, &per_block) >= 0 &&
                    per_block == 0,
                "argmax_partial takes a chunked argmax version, got ", version);
    if (chunks <= 0) chunks = plan_chunks;
    auto part_val = at::empty({rows * chunks}, logits.options().dtype(at::kFloat));
    auto part_idx = at::empty({rows * chunks}, logits.options().dtype(at::kInt));
    auto part_flag = at::empty({rows * chunks}, logits.options().dtype(at::kInt));
    check_launch(vs_argmax((int)version, logits.data_ptr(), dtype, logits.stride(0), rows, vocab, (int)chunks, 0,
                           part_val.data_ptr<float>(), part_idx.data_ptr<int>(), part_flag.data_ptr<int>(),
                           at::cuda::getCurrentCUDAStream()),
                 "argmax");
    return {part_val, part_idx, part_flag};
}

// The acceptance scan alone, over a precomputed target argmax [R] int32 (benchmarks).
std::vector<at::Tensor> greedy_scan(int64_t variant, const at::Tensor& target_argmax, int64_t vocab,
                                    const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                                    const at::Tensor& cu_num_draft, int64_t width) {
    check_int(target_argmax, at::kInt, "target_argmax");
    TORCH_CHECK(target_argmax.is_cuda() && target_argmax.dim() == 1, "target_argmax must be a CUDA [R] tensor");
    check_layout(target_argmax.view({-1, 1}), draft_tokens, num_draft, cu_num_draft);
    const c10::cuda::CUDAGuard guard(target_argmax.device());
    const int batch = num_draft.size(0);
    auto out = outputs(target_argmax, batch, width);
    check_launch(vs_greedy_scan((int)variant, 0, nullptr, target_argmax.data_ptr<int>(), nullptr, 1, 0,
                                (const long long*)draft_tokens.data_ptr<int64_t>(), num_draft.data_ptr<int>(),
                                cu_num_draft.data_ptr<int>(), batch, (int)target_argmax.size(0), (int)vocab,
                                (int)width, out[0].data_ptr<int>(), out[1].data_ptr<int>(), out[2].data_ptr<int>(),
                                out[3].data_ptr<int>(), at::cuda::getCurrentCUDAStream()),
                 "greedy scan");
    return out;
}

// Argmax (version) + acceptance scan (variant) -> tokens, num_accepted, num_emitted, status.
std::vector<at::Tensor> verify_greedy(const at::Tensor& logits, const at::Tensor& draft_tokens,
                                      const at::Tensor& num_draft, const at::Tensor& cu_num_draft, int64_t width,
                                      int64_t variant, int64_t argmax_version) {
    check_logits(logits);
    check_layout(logits, draft_tokens, num_draft, cu_num_draft);
    const c10::cuda::CUDAGuard guard(logits.device());
    const int rows = logits.size(0), vocab = logits.size(1), batch = num_draft.size(0);
    const int dtype = dtype_code(logits, "logits");
    int chunks = 1;
    long long per_block = 0;
    const long long num_partials =
        vs_argmax_plan((int)argmax_version, dtype, rows, vocab, num_sms(logits), &chunks, &per_block);
    TORCH_CHECK(num_partials > 0, "unknown argmax version ", argmax_version);
    auto scratch = workspace(logits, 3 * num_partials);  // part_val (float), part_idx, part_flag
    int* words = scratch.data_ptr<int>();
    float* part_val = reinterpret_cast<float*>(words);
    int *part_idx = words + num_partials, *part_flag = words + 2 * num_partials;
    auto stream = at::cuda::getCurrentCUDAStream();
    check_launch(vs_argmax((int)argmax_version, logits.data_ptr(), dtype, logits.stride(0), rows, vocab, chunks,
                           per_block, part_val, part_idx, part_flag, stream),
                 "argmax");
    auto out = outputs(logits, batch, width);
    check_launch(vs_greedy_scan((int)variant, per_block > 0, part_val, part_idx, part_flag, chunks, per_block,
                                (const long long*)draft_tokens.data_ptr<int64_t>(), num_draft.data_ptr<int>(),
                                cu_num_draft.data_ptr<int>(), batch, rows, vocab, (int)width, out[0].data_ptr<int>(),
                                out[1].data_ptr<int>(), out[2].data_ptr<int>(), out[3].data_ptr<int>(), stream),
                 "greedy scan");
    return out;
}

// ---- sampling ----------------------------------------------------------------------------
// race_blocks_per_sm: 0 = one block per sequence races all of V (v1), N > 0 = the race split over vocabulary
// chunks, about N blocks an SM (v2).
// check_q: pass 1 also reads every draft_probs row to check it (NaN, negative, sum).
std::vector<at::Tensor> verify_sample(const at::Tensor& logits, const at::Tensor& draft_tokens,
                                      const std::optional<at::Tensor>& draft_probs, const at::Tensor& num_draft,
                                      const at::Tensor& cu_num_draft, int64_t width, const at::Tensor& temperature,
                                      const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
                                      const at::Tensor& offset, int64_t race_blocks_per_sm, bool check_q) {
    check_logits(logits);
    check_layout(logits, draft_tokens, num_draft, cu_num_draft);
    for (auto* t : {&temperature, &top_k, &top_p, &seed, &offset}) check_cuda(*t, logits, "every verify_sample input");
    check_int(temperature, at::kFloat, "temperature");
    check_int(top_k, at::kInt, "top_k");
    check_int(top_p, at::kFloat, "top_p");
    check_int(seed, at::kLong, "seed");
    check_int(offset, at::kLong, "offset");
    const c10::cuda::CUDAGuard guard(logits.device());
    const int rows = logits.size(0), vocab = logits.size(1), batch = num_draft.size(0);
    // one Philox key, one offset and one setting of each kind per sequence (verispec/verify/rng.py)
    for (auto* t : {&temperature, &top_k, &top_p, &seed, &offset})
        TORCH_CHECK(t->dim() == 1 && t->size(0) == batch, "temperature, top_k, top_p, seed and offset must be [B] tensors");
    const int sms = num_sms(logits);
    VsSampleArgs a{};
    a.logits = logits.data_ptr();
    a.dtype = dtype_code(logits, "logits");
    a.row_stride = logits.stride(0);
    a.rows = rows;
    a.vocab = vocab;
    a.batch = batch;
    a.width = (int)width;
    a.draft_tokens = (const long long*)draft_tokens.data_ptr<int64_t>();
    if (draft_probs.has_value()) {
        check_cuda(*draft_probs, logits, "draft_probs");
        TORCH_CHECK(draft_probs->dim() == 2 && draft_probs->stride(1) == 1 &&
                        draft_probs->size(0) == draft_tokens.numel() && draft_probs->size(1) == vocab,
                    "draft_probs must be [N, V] with a contiguous last dim");
        a.draft_probs = draft_probs->data_ptr();
        a.q_dtype = dtype_code(*draft_probs, "draft_probs");
        a.q_stride = draft_probs->stride(0);
    }
    a.check_q = check_q ? 1 : 0;
    a.num_draft = num_draft.data_ptr<int>();
    a.cu_num_draft = cu_num_draft.data_ptr<int>();
    a.temperature = temperature.data_ptr<float>();
    a.top_k = top_k.data_ptr<int>();
    a.top_p = top_p.data_ptr<float>();
    a.seed = (const long long*)seed.data_ptr<int64_t>();
    a.offset = (const long long*)offset.data_ptr<int64_t>();
    a.chunks = vs_argmax_chunks(rows, vocab, sms);
    a.race_chunks = race_blocks_per_sm > 0 ? vs_race_chunks(batch, vocab, (int)race_blocks_per_sm * sms) : 1;
    // scratch: 5 words a pass-1 partial, 5 a race partial, 2 a sequence
    const int64_t parts = (int64_t)rows * a.chunks, race_parts = (int64_t)batch * a.race_chunks;
    auto scratch = workspace(logits, 5 * parts + 5 * race_parts + 2 * batch);
    int* w = scratch.data_ptr<int>();
    auto take = [&w](int64_t n) { int* p = w; w += n; return p; };
    a.part_a = reinterpret_cast<float*>(take(parts));
    a.part_s = reinterpret_cast<float*>(take(parts));
    a.part_qsum = reinterpret_cast<float*>(take(parts));
    a.part_idx = take(parts);
    a.part_flag = take(parts);
    a.race_p_val = reinterpret_cast<float*>(take(race_parts));
    a.race_res_val = reinterpret_cast<float*>(take(race_parts));
    a.race_p_idx = take(race_parts);
    a.race_res_idx = take(race_parts);
    a.race_any = take(race_parts);
    a.race_acc = take(batch);
    a.race_flags = take(batch);
    auto out = outputs(logits, batch, width);
    a.tokens = out[0].data_ptr<int>();
    a.num_accepted = out[1].data_ptr<int>();
    a.num_emitted = out[2].data_ptr<int>();
    a.status = out[3].data_ptr<int>();
    check_launch(vs_verify_sample(&a, at::cuda::getCurrentCUDAStream()), "verify_sample");
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "verispec backend='cuda' verification kernels (see verispec/verify/cuda/*.cu)";
    m.def("argmax_partial", &argmax_partial, "argmax partials of a chunked version (chunks <= 0: auto)");
    m.def("greedy_scan", &greedy_scan, "greedy acceptance scan over a precomputed argmax (variant 0 naive, 1 ballot, 2 segment)");
    m.def("verify_greedy", &verify_greedy, "argmax + acceptance scan -> tokens, num_accepted, num_emitted, status");
    m.def("verify_sample", &verify_sample, "rejection-sampling verification -> tokens, num_accepted, num_emitted, status");
}
