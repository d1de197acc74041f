// Tests of the prefill GEMM's 8-bit tensor-core route (kernels/gemm_q8.cu) on the CPU emulation: every type it
// takes against a double-precision reference over the same Q8_1 activation blocks, on shapes that leave partial
// row, token and k tiles; and the shapes and types it refuses. Two thread orders each; outputs start as NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "emu/cuda_emu.h"
#include "gguf/ggml_types.h"
#include "kernels.h"
#include "random_blocks.h"

using namespace tandem;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 9}};

float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return cpu::fp16_to_fp32_portable(h);
}

// The offset m of element e's (sub-)block in a row (values d * code + m): its 32-element block's own fp16 min
// (Q4_1, Q5_1), -dmin * m_j of the super-block's sub-block j of 32 (Q4_K, Q5_K) or of 16 (Q2_K); 0 for the others.
float element_offset(GgmlType type, const uint8_t* row, int e) {
    switch (type) {
        case GgmlType::Q4_1: return half_at(row + 20 * (e / 32) + 2);
        case GgmlType::Q5_1: return half_at(row + 24 * (e / 32) + 2);
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: {
            const uint8_t* blk = row + (type == GgmlType::Q4_K ? 144 : 176) * (e / 256);
            uint8_t sc[8], m[8];
            cpu::unpack_scale_min_k4(blk + 4, sc, m);
            return -(half_at(blk + 2) * static_cast<float>(m[e % 256 / 32]));
        }
        case GgmlType::Q2_K: {
            const uint8_t* blk = row + 84 * (e / 256);
            return -(half_at(blk + 82) * static_cast<float>(blk[e % 256 / 16] >> 4));
        }
        default: return 0.0f;
    }
}

}  // namespace

TEST_CASE("cuda gemm_q8: every type matches a double reference over the same 8-bit activations") {
    // The reference: sum over e of w_e * (d_x * code_e), with w from the CPU's dequantize_row and the device's Q8_1
    // blocks (bitwise the CPU's, tested in test_cuda_matvec_q8). The kernel's sums are exact integers scaled per
    // block (or per 16 elements: Q2_K, Q3_K, Q6_K), so it differs by float rounding (1e-5 of the sum of |terms|)
    // and, for types with an offset per 32 elements, by using the block's fp16 s = d_x * sum(codes) in m * s (that
    // rounding is added to the bound exactly; Q2_K's halves count their sums exactly). Quantizing x moves results
    // ~1e-2 of the sum of |terms|, and a wrong code or scale far more, so both would fail here.
    std::mt19937 rng(61);
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                          GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        const std::string type_name = ggml_type_name(type);
        CAPTURE(type_name);
        REQUIRE(cuda::gemm_q8_supports(type));
        const bool k_quant = ggml_type_info(type).block_size == 256;
        const bool offset_per_32 = type == GgmlType::Q4_1 || type == GgmlType::Q5_1 || type == GgmlType::Q4_K ||
                                   type == GgmlType::Q5_K;
        // 70 rows and up to 70 tokens: a whole and a partial tile of each; cols of 3 and 9 blocks (a partial
        // 4-block stage), or one and three super-blocks.
        for (int cols : {k_quant ? 256 : 96, k_quant ? 768 : 288}) {
            CAPTURE(cols);
            const int rows = 70, n_blocks = cols / 32;
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            std::vector<float> w(static_cast<size_t>(rows) * cols);
            for (int r = 0; r < rows; ++r)
                cpu::dequantize_row(type, W.data() + r * row_bytes, &w[static_cast<size_t>(r) * cols], cols);
            for (int n : {1, 5, 70}) {
                CAPTURE(n);
                const std::vector<float> x = test::random_floats(static_cast<int64_t>(n) * cols, rng);
                const size_t xq_row = cuda::q8_activation_row_bytes(GgmlType::Q8_0, cols);
                REQUIRE(xq_row == static_cast<size_t>(n_blocks) * 36);
                std::vector<uint8_t> xq(xq_row * n, 0xFF);
                cuda::quantize_activations(GgmlType::Q8_0, x.data(), cols, n, xq.data(), nullptr);
                std::vector<double> want(static_cast<size_t>(n) * rows), bound(want.size());
                for (int t = 0; t < n; ++t)
                    for (int r = 0; r < rows; ++r) {
                        double sum = 0.0, mag = 0.0, s_err = 0.0;
                        for (int b = 0; b < n_blocks; ++b) {
                            const uint8_t* xb = &xq[t * xq_row + 36 * b];
                            const double dx = half_at(xb);
                            int code_sum = 0;
                            for (int e = 0; e < 32; ++e) {
                                const int code = static_cast<int8_t>(xb[4 + e]);
                                const double m = element_offset(type, &W[r * row_bytes], 32 * b + e);
                                code_sum += code;
                                const double term = double{w[static_cast<size_t>(r) * cols + 32 * b + e]} * dx * code;
                                sum += term;
                                mag += std::abs(term) + std::abs(m * dx * code);
                            }
                            if (offset_per_32)
                                s_err += std::abs(element_offset(type, &W[r * row_bytes], 32 * b)) *
                                         std::abs(double{half_at(xb + 2)} - dx * code_sum);
                        }
                        want[t * rows + r] = sum;
                        bound[t * rows + r] = 1e-5 * mag + 1.001 * s_err + 1e-30;
                    }
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    std::vector<float> y(want.size(), std::numeric_limits<float>::quiet_NaN());
                    cuda::gemm_q8(type, W.data(), row_bytes, rows, cols, xq.data(), n, y.data(), nullptr);
                    size_t bad = y.size();
                    for (size_t i = 0; i < y.size() && bad == y.size(); ++i)
                        if (!(std::abs(double{y[i]} - want[i]) <= bound[i])) bad = i;
                    CHECK_MESSAGE(bad == y.size(), "element ", bad, " (token ", bad / rows, ", row ", bad % rows,
                                  "): got ", bad < y.size() ? y[bad] : 0.0f, ", want ",
                                  bad < y.size() ? want[bad] : 0.0, " +- ", bad < y.size() ? bound[bad] : 0.0);
                }
            }
        }
    }
}

TEST_CASE("cuda gemm_q8: types without an int8 route and bad shapes are refused") {
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) CHECK_FALSE(cuda::gemm_q8_supports(type));
    std::vector<uint8_t> W(18 * 4, 0), xq(36 * 4, 0);
    std::vector<float> y(16);
    CHECK_THROWS_AS(cuda::gemm_q8(GgmlType::F16, W.data(), 64, 1, 32, xq.data(), 1, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::gemm_q8(GgmlType::Q4_0, W.data(), 18, 1, 40, xq.data(), 1, y.data(), nullptr),
                    std::invalid_argument);  // not whole blocks
    CHECK_THROWS_AS(cuda::gemm_q8(GgmlType::Q4_0, W.data(), 18, 0, 32, xq.data(), 1, y.data(), nullptr),
                    std::invalid_argument);  // no rows
    CHECK_THROWS_AS(cuda::gemm_q8(GgmlType::Q4_0, W.data(), 18, 1, 32, xq.data() + 1, 1, y.data(), nullptr),
                    std::invalid_argument);  // xq not 4-byte aligned
}
