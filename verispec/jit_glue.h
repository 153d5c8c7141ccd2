// jit_glue.h: the torch-side checks every verispec CUDA binding shares (dtype codes of cuda_dtypes.cuh,
// device and dtype checks, launch errors, SM count). Included by the binding.cpp of each extension.
#pragma once

#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

namespace vs_glue {

inline int dtype_code(const at::Tensor& t, const char* name) {
    switch (t.scalar_type()) {
        case at::kFloat: return 0;
        case at::kBFloat16: return 1;
        case at::kHalf: return 2;
        default: TORCH_CHECK(false, name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
    }
    return -1;
}

inline void check_cuda(const at::Tensor& t, const at::Tensor& ref, const char* name) {
    TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), name, " must be on ", ref.device(), ", got ", t.device());
}

inline void check_int(const at::Tensor& t, at::ScalarType dtype, const char* name) {
    TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous(), name, " must be a contiguous ", dtype, " tensor, got ",
                t.scalar_type());
}

inline void check_launch(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, "verispec CUDA ", what, " launch failed: ", cudaGetErrorString(err));
}

inline int num_sms(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount; }

}  // namespace vs_glue
