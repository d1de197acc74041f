// Tests of the SIMD kernels of the legacy types (weight rows in the lanes: quant_q8_legacy_avx2.cpp and
// quant_q8_legacy_avx512.cpp): bitwise equality with the scalar kernel (dot_rows_scalar) for every (row, token), over
// matrix shapes, partial row groups, token tiles and row ranges, and with extreme codes. Their speed:
// build/tandem-kernel-bench --types q4_0,q4_1,q5_0,q5_1,q8_0.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "cpu/quant_q8_driver.h"
#include "q8_problem.h"
#include "random_blocks.h"

using namespace tandem;
using namespace tandem::cpu;
using namespace tandem::test;

namespace {

const GgmlType kLegacyTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0};

// The SIMD kernels this build and CPU run, with names for the messages.
std::vector<std::pair<const char*, DotRowsQ8Fn>> row_kernels(GgmlType type) {
    std::vector<std::pair<const char*, DotRowsQ8Fn>> out;
    if (auto f = q8_detail::legacy_q8_avx2_kernel(type)) out.emplace_back("avx2", f);
    if (avx512_kernels_enabled())
        if (auto f = q8_detail::legacy_q8_avx512_kernel(type)) out.emplace_back("avx512", f);
    return out;
}

using Problem = Q8Problem;

// The kernel over the given row ranges x token ranges (each a separate call), into a y with padding between the
// token rows (y_stride > rows) that must stay untouched.
std::vector<float> split_result(const Problem& p, DotRowsQ8Fn fn, const std::vector<int64_t>& row_cuts,
                                const std::vector<int64_t>& token_cuts, int64_t pad) {
    // Cuts past the end are clamped (empty ranges are skipped).
    auto clamp = [](std::vector<int64_t> c, int64_t n) {
        for (int64_t& v : c) v = std::min(v, n);
        return c;
    };
    return padded_split_result(p, clamp(row_cuts, p.rows), clamp(token_cuts, p.tokens), pad,
                               [&](int64_t r0, int64_t r1, const uint8_t* x, int64_t n, float* y, int64_t ys) {
                                   fn(p.w.data(), p.row_bytes, p.cols, r0, r1, x, p.xs, n, y, ys);
                               });
}

void check_bitwise(const std::vector<float>& got, const std::vector<float>& want, const Problem& p, const char* what) {
    check_q8_bitwise(got, want, p, what);
}

void check_all_splits(const Problem& p, DotRowsQ8Fn fn, const char* name) {
    const std::vector<float> want = scalar_q8_result(p);
    const int64_t R = p.rows, T = p.tokens;
    check_bitwise(split_result(p, fn, {0, R}, {0, T}, 0), want, p, name);
    check_bitwise(split_result(p, fn, {0, R}, {0, 1, 3, 7, 15, T}, 3), want, p, name);
    // Row ranges starting and ending inside a group of 8 (and 16), single tokens.
    std::vector<int64_t> rc{0};
    for (int64_t r : {int64_t{3}, int64_t{11}, int64_t{29}, R - 1})
        if (r > rc.back() && r < R) rc.push_back(r);
    rc.push_back(R);
    std::vector<int64_t> tc;
    for (int64_t t = 0; t <= T; ++t) tc.push_back(t);
    check_bitwise(split_result(p, fn, rc, tc, 5), want, p, name);
    check_bitwise(split_result(p, fn, rc, {0, 9, T}, 0), want, p, name);
}

}  // namespace

TEST_CASE("q8 legacy kernels: the SIMD kernels are bitwise the scalar kernel, any shape, tile and row range") {
    std::mt19937 rng(42);
    for (GgmlType type : kLegacyTypes) {
        const auto kernels = row_kernels(type);
#if defined(__x86_64__)
        // An x86 build of the library has AVX2 (the default TANDEM_AVX2): the AVX2 kernel must exist.
        CHECK(static_cast<bool>(q8_detail::legacy_q8_avx2_kernel(type)));
#endif
        for (int64_t cols : {32, 96, 896, 4128, 4864})
            for (int64_t rows : {1, 7, 8, 9, 67}) {
                if (cols >= 4128 && rows == 8) continue;  // keeps the scalar reference's time down
                const Problem p = make_q8_problem(type, rows, cols, 21, rng);
                for (const auto& [name, fn] : kernels) check_all_splits(p, fn, name);
            }
    }
}

TEST_CASE("q8 legacy kernels: extreme codes (activations +-127, weight codes at their ends)") {
    std::mt19937 rng(7);
    for (GgmlType type : kLegacyTypes) {
        const auto kernels = row_kernels(type);
        const Q8TypeKernels* k = find_q8_kernels(type);
        const GgmlTypeInfo info = ggml_type_info(type);
        const int64_t cols = 256, rows = 19, tokens = 11;
        for (int variant = 0; variant < 3; ++variant) {
            Problem p = make_q8_problem(type, rows, cols, tokens, rng);
            // Weights: every code byte 0xFF (all-ones nibbles / fifth bits: the largest unsigned codes, Q8_0: -1),
            // 0x00, or (Q8_0) 0x80 = -128 in alternate rows; the scales stay as drawn.
            const std::vector<size_t> scales = scale_offsets(type);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t b = 0; b < cols / 32; ++b) {
                    uint8_t* blk = p.w.data() + r * p.row_bytes + b * info.type_size;
                    const uint8_t fill = variant == 0 ? 0xFF : variant == 1 ? (r % 2 ? 0x80 : 0xFF) : (r % 2 ? 0x00 : 0x80);
                    for (size_t i = 0; i < info.type_size; ++i)
                        if (std::find(scales.begin(), scales.end(), i) == scales.end() &&
                            std::find(scales.begin(), scales.end(), i - 1) == scales.end())
                            blk[i] = fill;
                }
            // Activations: codes all +127, all -127, or random signs of 127, with s consistent for Q8_1.
            std::uniform_int_distribution<int> coin(0, 1);
            for (int64_t t = 0; t < tokens; ++t)
                for (int64_t b = 0; b < cols / 32; ++b) {
                    uint8_t* blk = p.xq.data() + t * p.xs + b * act_block_bytes(k->act);
                    const size_t qs = k->act == ActFormat::Q8_1 ? 4 : 2;
                    int sum = 0;
                    for (int j = 0; j < 32; ++j) {
                        const int8_t q = t % 3 == 0 ? 127 : t % 3 == 1 ? -127 : (coin(rng) ? 127 : -127);
                        std::memcpy(blk + qs + j, &q, 1);
                        sum += q;
                    }
                    uint16_t d;
                    std::memcpy(&d, blk, 2);
                    if (k->act == ActFormat::Q8_1) {
                        const uint16_t s = fp32_to_fp16(fp16_to_fp32(d) * static_cast<float>(sum));
                        std::memcpy(blk + 2, &s, 2);
                    }
                }
            for (const auto& [name, fn] : kernels) check_all_splits(p, fn, name);
        }
    }
}

TEST_CASE("q8 legacy kernels: batch invariance (a token alone, or in any batch, gives the same bits)") {
    std::mt19937 rng(3);
    for (GgmlType type : kLegacyTypes)
        for (const auto& [name, fn] : row_kernels(type)) {
            const Problem p = make_q8_problem(type, 45, 4864, 37, rng);
            std::vector<float> batch(static_cast<size_t>(p.rows * p.tokens));
            fn(p.w.data(), p.row_bytes, p.cols, 0, p.rows, p.xq.data(), p.xs, p.tokens, batch.data(), p.rows);
            for (int64_t t = 0; t < p.tokens; t += 5) {
                std::vector<float> alone(static_cast<size_t>(p.rows));
                fn(p.w.data(), p.row_bytes, p.cols, 0, p.rows, p.xq.data() + t * p.xs, p.xs, 1, alone.data(),
                   p.rows);
                CHECK(std::memcmp(alone.data(), batch.data() + t * p.rows, alone.size() * sizeof(float)) == 0);
                // One row at a time, in the middle of a group.
                std::vector<float> one(static_cast<size_t>(p.rows));  // y is indexed by the absolute row
                fn(p.w.data(), p.row_bytes, p.cols, 13, 14, p.xq.data() + t * p.xs, p.xs, 1, one.data(), p.rows);
                CHECK(std::memcmp(&one[13], &batch[t * p.rows + 13], sizeof(float)) == 0);
            }
        }
}
