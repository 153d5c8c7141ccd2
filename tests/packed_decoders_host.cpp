// packed_decoders_host.cpp: verispec/runtime/gemv/packed_decoders.cuh (packed.cu's block decoders) compiled for the
// host, so the CPU tests can compare both variants with the torch dequantizer (tests/test_quant_decoders.py).
//
//   packed_decoders_host IN OUT
//   IN:  int32 qtype, int32 K, int32 N, int32 offset, then N rows of K / QK * type_size bytes
//   OUT: float32 [2, N, K]: every chunk decoded by pk_chunk (v1), then by pk_chunk2 (v2)
// The rows are copied to ``offset`` bytes past a 64-byte boundary (0..3), so v2's word loads meet every alignment.
// The CUDA intrinsics the decoders name get host stand-ins below, each the same IEEE operation (round to nearest,
// no contraction: build with -ffp-contract=off).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_host_shims.h"

#include "packed_decoders.cuh"

template <int QT>
static void decode(const uint8_t* rows, int row_bytes, int K, int N, float* v1, float* v2) {
    for (int n = 0; n < N; ++n) {
        for (int c = 0; c < K / 32; ++c) {
            float w[32];
            pk_chunk<QT>(rows + (size_t)n * row_bytes, c, w);
            std::memcpy(v1 + (size_t)n * K + 32 * c, w, sizeof w);
            pk_chunk2<QT>(rows + (size_t)n * row_bytes, c, w);
            std::memcpy(v2 + (size_t)n * K + 32 * c, w, sizeof w);
        }
    }
}

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    int32_t head[4];
    if (!in || std::fread(head, 4, 4, in) != 4) return 3;
    const int qtype = head[0], K = head[1], N = head[2], offset = head[3];
    const int qk = qtype == PK_Q4_K || qtype == PK_Q6_K ? 256 : 32;
    const int ts = qtype == PK_Q4_0 ? 18 : qtype == PK_Q4_1 ? 20 : qtype == PK_Q8_0 ? 34 : qtype == PK_Q4_K ? 144 : 210;
    const size_t row_bytes = (size_t)K / qk * ts, nbytes = row_bytes * N;
    std::vector<uint8_t> buf(nbytes + 128);
    uint8_t* rows = buf.data() + (64 - (reinterpret_cast<uintptr_t>(buf.data()) % 64)) % 64 + offset;
    if (std::fread(rows, 1, nbytes, in) != nbytes) return 3;
    std::fclose(in);
    std::vector<float> out(2 * (size_t)N * K);
    float *v1 = out.data(), *v2 = out.data() + (size_t)N * K;
    switch (qtype) {
        case PK_Q4_0: decode<PK_Q4_0>(rows, (int)row_bytes, K, N, v1, v2); break;
        case PK_Q4_1: decode<PK_Q4_1>(rows, (int)row_bytes, K, N, v1, v2); break;
        case PK_Q8_0: decode<PK_Q8_0>(rows, (int)row_bytes, K, N, v1, v2); break;
        case PK_Q4_K: decode<PK_Q4_K>(rows, (int)row_bytes, K, N, v1, v2); break;
        case PK_Q6_K: decode<PK_Q6_K>(rows, (int)row_bytes, K, N, v1, v2); break;
        default: return 4;
    }
    FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(out.data(), 4, out.size(), o) != out.size()) return 5;
    std::fclose(o);
    return 0;
}
