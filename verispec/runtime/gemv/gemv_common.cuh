// gemv_common.cuh: the device helpers gemv.cu (the decode GEMV) and invariant.cu (the batch-invariant
// matmul) share: streaming 16-byte weight loads, programmatic dependent launch, an L2 prefetch, the bf16/fp16
// tensor-core MMA and the rounding stores. Plain CUDA C++ (nvcc only, no torch headers).
#pragma once

#include <atomic>

#include "cuda_dtypes.cuh"

// 16 bytes of W, read once: no L1 allocation, non-coherent path.
__device__ __forceinline__ uint4 load_stream16(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Programmatic dependent launch (sm_90+; no-ops when the kernel was launched without the attribute).
// A pass is a chain of short kernels, each reading the previous one's output. Launched with PDL, the next
// kernel's blocks start while this one finishes; each kernel lets its dependents launch as soon as all of
// its own blocks are resident (launch_dependents), and waits for its predecessor's completion and memory
// (wait) before touching anything the predecessor writes. Every block executes the wait, so a kernel's
// completion implies its predecessor's: the chain stays ordered transitively.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// cp.async (sm_80+): 16 bytes global -> shared (dst: a shared-space address, or a generic pointer) through L2
// only, no register held; src_bytes < 16 fills the rest with zeros (0: all zeros, src not read). One commit group a
// stage; wait<N>: at most N of this thread's groups still in flight.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {   // dst: a generic pointer
    cp_async16((uint32_t)__cvta_generic_to_shared(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Pull 16 bytes into L2 (no register, no wait): the weights do not depend on the previous kernel.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The current device's SM count and compute capability, read once per device (launchers that pick by them must not pay
// two attribute queries a launch in a pass). Concurrent first calls store the same values.
struct VsDevice {
    int sms, major;
};
static inline cudaError_t vs_device(VsDevice& out) {
    constexpr int MAX_DEVICES = 64;
    static std::atomic<int> sms[MAX_DEVICES], major[MAX_DEVICES];   // 0: not read yet
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    if (device >= MAX_DEVICES) return cudaErrorInvalidDevice;
    if (sms[device].load(std::memory_order_relaxed) == 0) {
        int s = 0, m = 0;
        e = cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, device);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device);
        if (e != cudaSuccess) return e;
        major[device].store(m, std::memory_order_relaxed);
        sms[device].store(s, std::memory_order_release);
    }
    out.sms = sms[device].load(std::memory_order_acquire);
    out.major = major[device].load(std::memory_order_relaxed);
    return cudaSuccess;
}

// Whether the current device is sm_90+ (compute capability 9.0+): the TMA's bulk copies, mbarrier transactions,
// thread-block clusters.
static inline bool vs_sm90() {
    VsDevice d{};
    return vs_device(d) == cudaSuccess && d.major >= 9;
}

// One launch of `kernel` on `stream`; pdl: with the programmatic-stream-serialization attribute, so that the kernel may
// start before the previous kernel on the stream completes (see pdl_wait); cluster_x > 0: in thread-block clusters of
// cluster_x consecutive blocks along x (sm_90+; gridDim.x a multiple of it).
template <typename... Params, typename... Args>
static cudaError_t launch_kernel_ex(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned smem,
                                    cudaStream_t stream, int pdl, unsigned cluster_x, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 0) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    config.attrs = attr;
    config.numAttrs = n;
    return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
static cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                                 int pdl, Args... args) {
    return launch_kernel_ex(kernel, grid, block, smem, stream, pdl, 0u, args...);
}

__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_float(__half* p, float v) { *p = __float2half_rn(v); }


template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
