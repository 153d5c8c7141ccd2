// cuda_dtypes.cuh: what every verispec .cu file shares: the dtype codes its torch binding passes
// (jit_glue.h, dtype_code) and the conversions of each element type to float, plus the full warp mask.
// Plain CUDA C++ (no torch headers): every .cu compiles standalone with nvcc (CPU CI).
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define VS_FULL_MASK 0xffffffffu

// dtype codes shared with jit_glue.h's dtype_code
enum VsDtype { VS_F32 = 0, VS_BF16 = 1, VS_F16 = 2 };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
