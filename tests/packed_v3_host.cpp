// packed_v3_host.cpp: packed.cu v3's lane pieces (verispec/runtime/gemv/packed_v3.cuh) run on the host, with the
// warp's mma.sync m16n8k16 emulated from the PTX fragment layout, so the CPU tests can check what each lane loads,
// decodes and pairs with x against the torch dequantizer + matmul (tests/test_quant_v3.py). The kernel's loop is
// mirrored: 16 rows x 8 tokens a tile, 8 slices of units, 8 chunks a unit (fewer in a row's short last unit), the
// same fmaf folds and the same slice-order sum. The emulated MMA sums its 16 exact products in double and rounds once, so the result is
// v3's up to the tensor core's own rounding (the test's tolerance covers it).
//
//   packed_v3_host IN OUT
//   IN:  int32 qtype, int32 K, int32 N, int32 M, then N rows of K / block size * type size bytes, then x: M x K
//        bf16 bits
//   OUT: float32 [M, N]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda_host_shims.h"

static inline uint32_t __byte_perm(uint32_t a, uint32_t b, uint32_t s) {   // PTX prmt, default mode
    const uint64_t v = ((uint64_t)b << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 255) << (8 * i);
    return r;
}

#include "packed_decoders.cuh"
#include "packed_v3.cuh"

static float bf16(uint32_t pair, int hi) { return __uint_as_float(((pair >> (16 * hi)) & 0xffffu) << 16); }

// d[lane][4] += A B for the 32 lanes' fragments (layout in packed_v3.cuh's header)
static void mma(float (&d)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2]) {
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 2; ++i) {
            A[g][2 * t + i] = bf16(a[lane][0], i);
            A[g + 8][2 * t + i] = bf16(a[lane][1], i);
            A[g][2 * t + 8 + i] = bf16(a[lane][2], i);
            A[g + 8][2 * t + 8 + i] = bf16(a[lane][3], i);
            B[2 * t + i][g] = bf16(b[lane][0], i);
            B[2 * t + 8 + i][g] = bf16(b[lane][1], i);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int e = 0; e < 4; ++e) {
            const int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
            double s = d[lane][e];
            for (int k = 0; k < 16; ++k) s += (double)A[r][k] * (double)B[k][n];
            d[lane][e] = (float)s;
        }
    }
}

template <int QT>
static void run(const uint8_t* w, const uint16_t* x, float* y, int M, int N, int K) {
    using Tr = V3<QT>;
    using Raw = typename Tr::Raw;
    const bool kquant = QT == PK_Q4_K || QT == PK_Q6_K;
    const int nch = K / 32, nunits = (nch + 7) / 8;
    const long long row_bytes = (long long)(kquant ? K / 256 : nch) * Tr::BLOCK;
    for (int row0 = 0; row0 < N; row0 += 16) {
        for (int tok0 = 0; tok0 < M; tok0 += 8) {
            float part[V3_SLICES][32][4] = {};
            for (int p = 0; p < V3_SLICES; ++p) {
                float acc[32][4] = {};
                for (int u = p; u < nunits; u += V3_SLICES) {
                    const int valid = kquant ? 8 : std::min(8, nch - 8 * u);
                    std::vector<Raw> raw(64);                    // [lane][row g, row g + 8]
                    for (int lane = 0; lane < 32; ++lane)
                        for (int hf = 0; hf < 2; ++hf) {
                            const int rr = std::min(row0 + 8 * hf + (lane >> 2), N - 1);
                            v3_load(w + rr * row_bytes + (long long)u * Tr::UNIT, lane & 3, valid, raw[2 * lane + hf]);
                        }
                    for (int j = 0; j < valid; ++j) {
                        uint32_t bf[32][4], ag[32][4], ah[32][4];
                        float s[32][4];
                        for (int lane = 0; lane < 32; ++lane) {
                            const int tok = std::min(tok0 + (lane >> 2), M - 1);
                            v3_b_frags<QT>(x + (long long)tok * K + 256 * u + 32 * j, lane & 3, bf[lane]);
                            v3_chunk(raw[2 * lane], j, ag[lane], s[lane][0], s[lane][1]);
                            v3_chunk(raw[2 * lane + 1], j, ah[lane], s[lane][2], s[lane][3]);
                        }
                        uint32_t a1[32][4], a2[32][4], b1[32][2], b2[32][2], ones[32][4];
                        for (int lane = 0; lane < 32; ++lane) {
                            const uint32_t f1[4] = {ag[lane][0], ah[lane][0], ag[lane][1], ah[lane][1]};
                            const uint32_t f2[4] = {ag[lane][2], ah[lane][2], ag[lane][3], ah[lane][3]};
                            for (int i = 0; i < 4; ++i) {
                                a1[lane][i] = f1[i];
                                a2[lane][i] = f2[i];
                                ones[lane][i] = V3_BF16_ONES;
                            }
                            b1[lane][0] = bf[lane][0];
                            b1[lane][1] = bf[lane][1];
                            b2[lane][0] = bf[lane][2];
                            b2[lane][1] = bf[lane][3];
                        }
                        float d0[32][4] = {}, d1[32][4] = {}, xs[32][4] = {};
                        mma(d0, a1, b1);
                        if (Tr::FOLD == FOLD_SPLIT) {
                            mma(d1, a2, b2);
                        } else {
                            mma(d0, a2, b2);
                        }
                        if (Tr::FOLD == FOLD_MIN) {
                            mma(xs, ones, b1);
                            mma(xs, ones, b2);
                        }
                        for (int lane = 0; lane < 32; ++lane)
                            for (int e = 0; e < 4; ++e) {
                                const float s0 = s[lane][e < 2 ? 0 : 2], s1 = s[lane][e < 2 ? 1 : 3];
                                acc[lane][e] = std::fma(s0, d0[lane][e], acc[lane][e]);
                                if (Tr::FOLD == FOLD_SPLIT) acc[lane][e] = std::fma(s1, d1[lane][e], acc[lane][e]);
                                if (Tr::FOLD == FOLD_MIN) acc[lane][e] = std::fma(s1, xs[lane][e], acc[lane][e]);
                            }
                    }
                }
                std::memcpy(part[p], acc, sizeof acc);
            }
            for (int lane = 0; lane < 32; ++lane)
                for (int e = 0; e < 4; ++e) {
                    float v = 0.0f;
                    for (int p = 0; p < V3_SLICES; ++p) v += part[p][lane][e];
                    const int rr = row0 + (lane >> 2) + (e >= 2 ? 8 : 0), tt = tok0 + 2 * (lane & 3) + (e & 1);
                    if (rr < N && tt < M) y[(long long)tt * N + rr] = v;
                }
        }
    }
}

static int vs_block(int qtype) {
    return qtype == PK_Q4_K || qtype == PK_Q6_K ? 256 : qtype == PK_Q4_0 || qtype == PK_Q4_1 || qtype == PK_Q8_0 ? 32 : 0;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    int32_t head[4];
    if (!in || std::fread(head, 4, 4, in) != 4) return 3;
    const int qtype = head[0], K = head[1], N = head[2], M = head[3];
    const int qk = vs_block(qtype);
    if (qk == 0 || K % qk || N < 1 || M < 1) return 4;
    const int ts = qtype == PK_Q4_0 ? 18 : qtype == PK_Q4_1 ? 20 : qtype == PK_Q8_0 ? 34 : qtype == PK_Q4_K ? 144 : 210;
    const size_t row_bytes = (size_t)K / qk * ts, nbytes = row_bytes * N;
    std::vector<uint8_t> buf(nbytes + 64);
    uint8_t* rows = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) % 16)) % 16;
    std::vector<uint16_t> x((size_t)M * K);
    if (std::fread(rows, 1, nbytes, in) != nbytes || std::fread(x.data(), 2, x.size(), in) != x.size()) return 3;
    std::fclose(in);
    std::vector<float> y((size_t)M * N);
    switch (qtype) {
        case PK_Q4_0: run<PK_Q4_0>(rows, x.data(), y.data(), M, N, K); break;
        case PK_Q4_1: run<PK_Q4_1>(rows, x.data(), y.data(), M, N, K); break;
        case PK_Q8_0: run<PK_Q8_0>(rows, x.data(), y.data(), M, N, K); break;
        case PK_Q4_K: run<PK_Q4_K>(rows, x.data(), y.data(), M, N, K); break;
        default: run<PK_Q6_K>(rows, x.data(), y.data(), M, N, K); break;
    }
    FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(y.data(), 4, y.size(), o) != y.size()) return 5;
    std::fclose(o);
    return 0;
}
