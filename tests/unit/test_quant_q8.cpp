// Tests of the 8-bit-activation path (cpu/quant_q8.h): the activation quantizers against their definition, every
// integer kernel (AVX2 and scalar) against a double-precision dot of the dequantized weights with the dequantized
// activations, and the batch invariance of the rows x tokens driver.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "error.h"
#include "random_blocks.h"

using namespace tandem;
using namespace tandem::cpu;
using namespace tandem::test;

namespace {

const GgmlType kIntegerTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                  GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

ActFormat expected_format(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_1: case GgmlType::Q5_1: return ActFormat::Q8_1;
        case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return ActFormat::Q8_0;
        default: return ActFormat::Q8_K;
    }
}

}  // namespace

TEST_CASE("q8 activations: codes are the rounded scaled values, scales and sums as defined") {
    std::mt19937 rng(8);
    for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K}) {
        const int64_t cols = 512;
        std::vector<float> x = random_floats(cols, rng);
        for (int j = 40; j < 72; ++j) x[j] = 0.0f;                    // an all-zero 32-block
        x[10] = 9.0f;    // Q8_K: the extreme (with its sign) maps to code -127, so d takes the opposite sign
        x[300] = -9.0f;
        std::vector<uint8_t> q(act_row_bytes(f, cols));
        quantize_activations(f, x.data(), q.data(), cols);
        std::vector<float> back(cols);
        dequantize_activations(f, q.data(), back.data(), cols);
        const int64_t bs = act_block_size(f);
        for (int64_t b = 0; b < cols / bs; ++b) {
            float amax = 0;
            for (int64_t j = 0; j < bs; ++j) amax = std::max(amax, std::fabs(x[b * bs + j]));
            const uint8_t* blk = q.data() + b * act_block_bytes(f);
            for (int64_t j = 0; j < bs; ++j) {
                // Half a step of error, plus the fp16 rounding of d (up to 127 codes x 2^-11 of d) for the
                // 32-element formats, whose codes are computed with the exact scale.
                const double step = amax / 127.0;
                const double d_rounding = f == ActFormat::Q8_K ? 0.0 : 127.0 * step * std::ldexp(1.0, -11);
                CHECK(std::fabs(back[b * bs + j] - x[b * bs + j]) <= 0.5 * step * 1.0001 + d_rounding + 1e-7);
            }
            if (f == ActFormat::Q8_1) {
                const auto* p = reinterpret_cast<const BlockQ8_1*>(blk);
                int sum = 0;
                for (int j = 0; j < 32; ++j) sum += p->qs[j];
                CHECK(p->s == fp32_to_fp16((amax / 127.0f) * static_cast<float>(sum)));
            }
            if (f == ActFormat::Q8_K) {
                const auto* p = reinterpret_cast<const BlockQ8_K*>(blk);
                for (int g = 0; g < 16; ++g) {
                    int sum = 0;
                    for (int j = 0; j < 16; ++j) sum += p->qs[16 * g + j];
                    CHECK(p->bsums[g] == sum);
                }
                // ggml's sign convention: q = round(x * -127 / max), max the signed extreme.
                CHECK(p->qs[b == 0 ? 10 : 300 - 256] == -127);
                CHECK((b == 0 ? p->d < 0.0f : p->d > 0.0f));
            }
        }
        // The all-zero block of the 32-element formats has d = 0 and zero codes.
        if (f != ActFormat::Q8_K)
            for (int j = 64; j < 72; ++j) CHECK(back[j] == 0.0f);
    }
}

TEST_CASE("q8 activations: every code is exactly round-half-to-even of x * id, clamped, ties included") {
    // The vector quantizers round, clamp and narrow 32 values at a time; this pins each byte (and Q8_1's sum) to
    // the scalar definition. A block whose extreme is 127 has id = 1 (or -1 for Q8_K, whose extreme maps to -127),
    // so x.5 values are exact ties.
    std::mt19937 rng(81);
    for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K}) {
        const int64_t cols = 1024;
        std::vector<float> x = random_floats(cols, rng);
        for (int j = 0; j < 64; ++j) x[j] = static_cast<float>(j % 16) - 7.5f;  // ties: -7.5 .. 7.5
        for (int j = 64; j < 96; ++j) x[j] = static_cast<float>(j - 80) + 0.5f;
        x[0] = 127.0f;  // block 0 (of any format) has the extreme 127
        x[32] = 127.0f;
        x[64] = 127.0f;
        std::vector<uint8_t> q(act_row_bytes(f, cols));
        quantize_activations(f, x.data(), q.data(), cols);
        const int64_t bs = act_block_size(f);
        for (int64_t b = 0; b < cols / bs; ++b) {
            const float* xb = x.data() + b * bs;
            float amax = 0.0f;
            for (int64_t j = 0; j < bs; ++j) amax = std::max(amax, std::fabs(xb[j]));
            const uint8_t* blk = q.data() + b * act_block_bytes(f);
            float id;
            const int8_t* qs;
            if (f == ActFormat::Q8_K) {
                int first = 0;
                while (std::fabs(xb[first]) != amax) ++first;
                id = -127.0f / xb[first];
                qs = reinterpret_cast<const BlockQ8_K*>(blk)->qs;
            } else {
                id = amax != 0.0f ? 127.0f / amax : 0.0f;
                qs = reinterpret_cast<const int8_t*>(blk + (f == ActFormat::Q8_1 ? 4 : 2));
            }
            int sum = 0, mismatches = 0;
            for (int64_t j = 0; j < bs; ++j) {
                const int want = std::clamp(static_cast<int>(std::nearbyint(xb[j] * id)), -127, 127);
                mismatches += qs[j] != want;
                sum += want;
            }
            CHECK_MESSAGE(mismatches == 0, "format ", static_cast<int>(f), " block ", b);
            if (f == ActFormat::Q8_1)
                CHECK(reinterpret_cast<const BlockQ8_1*>(blk)->s == fp32_to_fp16((amax / 127.0f) * static_cast<float>(sum)));
        }
        // The ties of block 0 went to even: 2.5 -> 2, -2.5 -> -2, 3.5 -> 4 (negated for Q8_K).
        const int8_t* q0 = reinterpret_cast<const int8_t*>(q.data() + (f == ActFormat::Q8_K ? 4 : f == ActFormat::Q8_1 ? 4 : 2));
        const int sign = f == ActFormat::Q8_K ? -1 : 1;
        CHECK(q0[10] == sign * 2);  // x = 2.5
        CHECK(q0[5] == sign * -2);  // x = -2.5
        CHECK(q0[11] == sign * 4);  // x = 3.5
    }
}

TEST_CASE("q8 kernels: every quantized type has one, and it matches a double-precision dot (AVX2 and scalar)") {
    std::mt19937 rng(88);
    for (GgmlType type : kIntegerTypes) {
        CAPTURE(std::string(ggml_type_name(type)));
        const Q8TypeKernels* k = find_q8_kernels(type);
        REQUIRE(k != nullptr);
        CHECK(k->act == expected_format(type));
        for (int64_t cols : {int64_t{256}, int64_t{768}, int64_t{4352}}) {
            CAPTURE(cols);
            const std::vector<uint8_t> W = random_blocks(type, cols, 1, rng);
            const std::vector<float> x = random_floats(cols, rng);
            std::vector<float> w(cols), xd(cols);
            dequantize_row(type, W.data(), w.data(), cols);
            std::vector<uint8_t> xq(act_row_bytes(k->act, cols));
            quantize_activations(k->act, x.data(), xq.data(), cols);
            dequantize_activations(k->act, xq.data(), xd.data(), cols);
            double ref = 0, magnitude = 0, x_abs = 0, w_max = 0;
            for (int64_t i = 0; i < cols; ++i) {
                ref += double(w[i]) * xd[i];
                magnitude += std::fabs(double(w[i]) * xd[i]);
                x_abs += std::fabs(xd[i]);
                w_max = std::max(w_max, std::fabs(double(w[i])));
            }
            // Integer sums are exact; the float combination of per-block (and per-sub-block) partials rounds at a
            // depth of about cols / 16 + 48, on products bounded by |w x| plus the mins' share (max |w| * sum |x|).
            // Q8_1 carries d * sum(q) rounded to fp16 (as llama.cpp does), which adds 2^-11 of the min's share.
            const double eps = (cols / 16.0 + 48) * std::ldexp(1.0, -24);
            double bound = eps * (magnitude + 2 * w_max * x_abs) + 1e-30;
            if (k->act == ActFormat::Q8_1) bound += std::ldexp(1.0, -10) * w_max * x_abs;
            const float simd = vec_dot_q8(type, cols, W.data(), x.data());
            const float scalar = vec_dot_q8_scalar(type, cols, W.data(), x.data());
            CHECK(std::fabs(simd - ref) <= bound);
            CHECK(std::fabs(scalar - ref) <= bound);
        }
    }
}

TEST_CASE("q8 kernels: the driver is batch invariant (any token count, place in the batch, row range)") {
    std::mt19937 rng(515);
    const int64_t kMaxTokens = 13;
    for (GgmlType type : kIntegerTypes) {
        const Q8TypeKernels* k = find_q8_kernels(type);
        REQUIRE(k != nullptr);
        const int64_t bs = std::max<int64_t>(ggml_type_info(type).block_size, act_block_size(k->act));
        for (auto [cols, rows] : {std::pair<int64_t, int64_t>{bs, 5}, {bs * 3, 17}, {bs == 32 ? 4128 : 4352, 130}}) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            const std::vector<uint8_t> W = random_blocks(type, cols, rows, rng);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<float> x = random_floats(cols * kMaxTokens, rng);
            const size_t xs = act_row_bytes(k->act, cols);
            std::vector<uint8_t> xq(xs * kMaxTokens);
            for (int64_t t = 0; t < kMaxTokens; ++t) quantize_activations(k->act, &x[t * cols], &xq[t * xs], cols);
            for (DotRowsQ8Fn fn : {k->dot_rows, k->dot_rows_scalar, k->dot_rows_avx2, k->dot_rows_avx512}) {
                if (!fn) continue;
                std::vector<float> single(rows * kMaxTokens);
                for (int64_t t = 0; t < kMaxTokens; ++t)
                    fn(W.data(), row_bytes, cols, 0, rows, &xq[t * xs], xs, 1, &single[t * rows], rows);
                int mismatches = 0;
                for (int64_t n = 2; n <= kMaxTokens; ++n)
                    for (int64_t first : {int64_t{0}, kMaxTokens - n}) {
                        std::vector<float> y(rows * n, NAN);
                        fn(W.data(), row_bytes, cols, 0, rows / 2, &xq[first * xs], xs, n, y.data(), rows);
                        fn(W.data(), row_bytes, cols, rows / 2, rows, &xq[first * xs], xs, n, y.data(), rows);
                        mismatches += std::memcmp(y.data(), &single[first * rows], y.size() * sizeof(float)) != 0;
                    }
                CHECK(mismatches == 0);
            }
        }
    }
}

TEST_CASE("q8 kernels: the AVX-512 VNNI kernels are bitwise equal to the AVX2 ones") {
    std::mt19937 rng(2048);
    const int64_t kMaxTokens = 21;
    int checked = 0;
    for (GgmlType type : kIntegerTypes) {
        const Q8TypeKernels* k = find_q8_kernels(type);
        REQUIRE(k != nullptr);
        if (!k->dot_rows_avx512 || !k->dot_rows_avx2) {
            MESSAGE(std::string(ggml_type_name(type)) << ": no AVX-512 VNNI kernel on this build or CPU, not compared");
            continue;
        }
        ++checked;
        const int64_t bs = std::max<int64_t>(ggml_type_info(type).block_size, act_block_size(k->act));
        for (auto [cols, rows] : {std::pair<int64_t, int64_t>{bs, 3}, {bs * 3, 19}, {bs == 32 ? 4128 : 4352, 67}}) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            const std::vector<uint8_t> W = random_blocks(type, cols, rows, rng);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            // Extreme activations too: rows of one repeated magnitude drive every code to +-127.
            std::vector<float> x = random_floats(cols * kMaxTokens, rng);
            for (int64_t i = 0; i < cols; ++i) x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
            const size_t xs = act_row_bytes(k->act, cols);
            std::vector<uint8_t> xq(xs * kMaxTokens);
            for (int64_t t = 0; t < kMaxTokens; ++t) quantize_activations(k->act, &x[t * cols], &xq[t * xs], cols);
            for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{16}, kMaxTokens}) {
                CAPTURE(n);
                std::vector<float> a(rows * n, NAN), b(rows * n, -1.0f);
                k->dot_rows_avx2(W.data(), row_bytes, cols, 0, rows, xq.data(), xs, n, a.data(), rows);
                k->dot_rows_avx512(W.data(), row_bytes, cols, 0, rows, xq.data(), xs, n, b.data(), rows);
                CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
            }
        }
    }
    MESSAGE("AVX-512 VNNI kernels compared with AVX2: " << checked << " types");
}

TEST_CASE("q8 kernels: types without an integer kernel and bad lengths are errors") {
    CHECK(find_q8_kernels(GgmlType::F32) == nullptr);
    CHECK(find_q8_kernels(GgmlType::F16) == nullptr);
    CHECK(find_q8_kernels(GgmlType::BF16) == nullptr);
    float x[512] = {};
    uint8_t row[1024] = {};
    CHECK_THROWS_AS(vec_dot_q8(GgmlType::F32, 32, row, x), Error);
    CHECK_THROWS_AS(vec_dot_q8(GgmlType::Q4_K, 128, row, x), Error);
}
