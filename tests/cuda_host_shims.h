// cuda_host_shims.h: host stand-ins for the CUDA intrinsics packed.cu's decoders name (packed_decoders.cuh,
// packed_v3.cuh), each the same IEEE operation (round to nearest, no contraction: build with -ffp-contract=off), so
// the CPU tests can compile those headers for the host (packed_decoders_host.cpp, packed_v3_host.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct pk_host_half { unsigned short bits; };
static inline pk_host_half __ushort_as_half(unsigned short u) { return pk_host_half{u}; }
static inline float __half2float(pk_host_half h) {          // exact widening (NaN payloads aside)
    const unsigned s = (h.bits >> 15) & 1, e = (h.bits >> 10) & 31, m = h.bits & 1023;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, unsigned sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline uint32_t __ldg(const uint32_t* p) { return *p; }
static inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
