// Tests of the CPU numeric kernels: fp16 conversions, ggml block layouts and quantizers, vec_dot against a double
// reference, and matmul's batch invariance (bitwise equal results whatever the batch size, position, threads).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/matmul.h"
#include "cpu/quant_q8.h"
#include "cpu/quant.h"
#include "cpu/thread_pool.h"
#include "error.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define TEST_HAVE_F16C_TARGET 1
#endif

using namespace tandem;
using namespace tandem::cpu;

namespace {

#ifdef TEST_HAVE_F16C_TARGET
// The hardware conversions, called directly: this file is compiled without -mf16c, so the functions opt in, and the
// tests only call them when the CPU has F16C.
__attribute__((target("f16c"))) float f16c_to_fp32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t f16c_from_fp32(float f) {
    return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
bool have_f16c() { return __builtin_cpu_supports("f16c"); }
#endif

bool is_half_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }

// The value of a half from its definition, computed in double: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const double magnitude = e == 0 ? std::ldexp(m, -24) : e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25);
    return s ? -magnitude : magnitude;
}

const GgmlType kTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};

// Random floats whose magnitude changes from block to block (ggml blocks get their own scale) with an occasional
// zero block, quantized to `type`.
std::vector<uint8_t> random_row(GgmlType type, int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> log_scale(-3.0f, 2.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t b = 0; b * 32 < n; ++b) {
        const float scale = (b % 7 == 3) ? 0.0f : std::pow(10.0f, log_scale(rng));
        for (int64_t j = b * 32; j < std::min<int64_t>(n, b * 32 + 32); ++j) v[j] = normal(rng) * scale;
    }
    std::vector<uint8_t> row(ggml_row_bytes(type, static_cast<uint64_t>(n)));
    quantize_row(type, v.data(), row.data(), n);
    return row;
}

std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = normal(rng);
    return v;
}

std::vector<uint8_t> random_matrix(GgmlType type, int64_t cols, int64_t rows, std::mt19937& rng) {
    std::vector<uint8_t> m;
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t> row = random_row(type, cols, rng);
        m.insert(m.end(), row.begin(), row.end());
    }
    return m;
}

}  // namespace

// ---- fp16 --------------------------------------------------------------------------------------------------------

TEST_CASE("quant fp16: every half converts exactly and round-trips, in every implementation") {
    std::vector<uint16_t> halves(65536);
    for (uint32_t h = 0; h < 65536; ++h) halves[h] = static_cast<uint16_t>(h);
    std::vector<float> library(65536);  // tandem_core's F16 path (F16C when built with AVX2)
    dequantize_row(GgmlType::F16, halves.data(), library.data(), 65536);

    int mismatches = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = static_cast<uint16_t>(i);
        const float f = fp16_to_fp32_portable(h);
        if (is_half_nan(h)) {
            mismatches += !std::isnan(f) || !std::isnan(library[i]) || !is_half_nan(fp32_to_fp16_portable(f));
            continue;
        }
        const bool ok = f == half_value(h) && std::signbit(f) == ((h >> 15) != 0) &&
                        fp32_to_fp16_portable(f) == h && fp32_to_fp16(f) == h && fp16_to_fp32(h) == f &&
                        std::bit_cast<uint32_t>(library[i]) == std::bit_cast<uint32_t>(f);
        if (!ok && ++mismatches <= 5) FAIL_CHECK("half 0x" << std::hex << i << " converts to " << f);
    }
    CHECK(mismatches == 0);

#ifdef TEST_HAVE_F16C_TARGET
    if (have_f16c()) {
        int f16c_mismatches = 0;
        for (uint32_t i = 0; i < 65536; ++i) {
            const uint16_t h = static_cast<uint16_t>(i);
            const float hw = f16c_to_fp32(h), sw = fp16_to_fp32_portable(h);
            const bool ok = is_half_nan(h) ? std::isnan(hw) && std::isnan(sw)
                                           : std::bit_cast<uint32_t>(hw) == std::bit_cast<uint32_t>(sw) &&
                                                 f16c_from_fp32(hw) == fp32_to_fp16_portable(sw);
            f16c_mismatches += !ok;
        }
        CHECK(f16c_mismatches == 0);
    }
#endif
}

TEST_CASE("quant fp16: float to half rounds to nearest even, overflows to inf, keeps subnormals") {
    struct Case {
        float f;
        uint16_t h;
    };
    const Case cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0.5f, 0x3800},
        {65504.0f, 0x7BFF},               // largest finite half
        {65519.99f, 0x7BFF},              // just under the midpoint to 2^16
        {65520.0f, 0x7C00},               // the midpoint: ties to even = inf
        {1e10f, 0x7C00},
        {-INFINITY, 0xFC00},
        {std::ldexp(1.0f, -14), 0x0400},  // smallest normal
        {std::ldexp(1.0f, -24), 0x0001},  // smallest subnormal
        {std::ldexp(1.0f, -25), 0x0000},  // halfway to the smallest subnormal: ties to even = 0
        {std::ldexp(1.5f, -25), 0x0001},
        {std::ldexp(3.0f, -25), 0x0002},  // 1.5 units: ties to even = 2
        {std::ldexp(5.0f, -25), 0x0002},  // 2.5 units: ties to even = 2
        {1.0f + std::ldexp(1.0f, -11), 0x3C00},                           // tie between 1 and 1+2^-10: even
        {1.0f + std::ldexp(3.0f, -11), 0x3C02},                           // tie, rounds up to even
        {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3C01},  // just above the tie
        {std::ldexp(1.0f, -130), 0x0000},                                 // float subnormal
    };
    for (const Case& c : cases) {
        CAPTURE(c.f);
        CHECK(fp32_to_fp16_portable(c.f) == c.h);
        CHECK(fp32_to_fp16(c.f) == c.h);
        uint16_t library = 0;
        quantize_row(GgmlType::F16, &c.f, &library, 1);
        CHECK(library == c.h);
    }

    // Every midpoint between neighbouring finite halves, and random floats over the whole half range: the portable
    // code, the library's F16 row path and (when present) F16C all agree.
    std::vector<float> inputs;
    for (uint32_t h = 0; h < 0x7BFF; ++h) {
        const double mid = (half_value(static_cast<uint16_t>(h)) + half_value(static_cast<uint16_t>(h + 1))) / 2;
        inputs.push_back(static_cast<float>(mid));  // exact: a half has 11 significant bits, a float 24
        inputs.push_back(-static_cast<float>(mid));
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
    for (int i = 0; i < 200000; ++i) inputs.push_back(std::exp2(exponent(rng)) * (i % 2 ? 1.0f : -1.0f));

    std::vector<uint16_t> library(inputs.size());
    quantize_row(GgmlType::F16, inputs.data(), library.data(), static_cast<int64_t>(inputs.size()));
    int mismatches = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const uint16_t portable = fp32_to_fp16_portable(inputs[i]);
        bool ok = library[i] == portable;
#ifdef TEST_HAVE_F16C_TARGET
        if (have_f16c()) ok = ok && f16c_from_fp32(inputs[i]) == portable;
#endif
        if (!ok && ++mismatches <= 5) FAIL_CHECK("float " << inputs[i] << ": portable " << portable);
    }
    CHECK(mismatches == 0);
}

// ---- block layouts -------------------------------------------------------------------------------------------------

TEST_CASE("quant Q4_0: a hand-built block decodes to the values its layout defines") {
    // d = 0.5 is 0x3800 in binary16, stored little-endian. Byte j: low nibble j, high nibble 15 - j.
    uint8_t block[18] = {0x00, 0x38};
    for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float expected[32];
    for (int j = 0; j < 16; ++j) {
        expected[j] = (j - 8) * 0.5f;               // low nibbles are elements 0..15
        expected[j + 16] = ((15 - j) - 8) * 0.5f;   // high nibbles are elements 16..31
    }
    float decoded[32];
    dequantize_row(GgmlType::Q4_0, block, decoded, 32);
    for (int j = 0; j < 32; ++j) {
        CAPTURE(j);
        CHECK(decoded[j] == expected[j]);
        float unit[32] = {};
        unit[j] = 1.0f;  // a dot product with a unit vector picks one element, exactly
        CHECK(vec_dot(GgmlType::Q4_0, 32, block, unit) == expected[j]);
        CHECK(vec_dot_scalar(GgmlType::Q4_0, 32, block, unit) == expected[j]);
    }
    float ones[32];
    std::fill(ones, ones + 32, 1.0f);
    double sum = 0;
    for (float e : expected) sum += e;
    CHECK(vec_dot(GgmlType::Q4_0, 32, block, ones) == sum);  // small integers and halves: exact in any order
}

TEST_CASE("quant Q8_0: a hand-built block decodes to the values its layout defines") {
    // d = 0.25 is 0x3400; element j = j * 8 - 128 (every other byte value range, -128 included).
    uint8_t block[34] = {0x00, 0x34};
    for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
    float decoded[32];
    dequantize_row(GgmlType::Q8_0, block, decoded, 32);
    for (int j = 0; j < 32; ++j) {
        CAPTURE(j);
        CHECK(decoded[j] == (j * 8 - 128) * 0.25f);
        float unit[32] = {};
        unit[j] = 1.0f;
        CHECK(vec_dot(GgmlType::Q8_0, 32, block, unit) == decoded[j]);
        CHECK(vec_dot_scalar(GgmlType::Q8_0, 32, block, unit) == decoded[j]);
    }
}

TEST_CASE("quant F16 and F32: rows are plain little-endian arrays") {
    const uint8_t f16[4] = {0x00, 0x3C, 0x00, 0xC1};  // 1.0, -2.5
    float out[2];
    dequantize_row(GgmlType::F16, f16, out, 2);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -2.5f);
    const float f32[3] = {1.5f, -3.0f, 0.25f};
    const float x[3] = {2.0f, 1.0f, 4.0f};
    CHECK(vec_dot(GgmlType::F32, 3, f32, x) == 1.0f);
    CHECK(vec_dot_scalar(GgmlType::F32, 3, f32, x) == 1.0f);
}

// ---- quantizers ---------------------------------------------------------------------------------------------------

TEST_CASE("quant reference quantizers: known answers") {
    SUBCASE("Q8_0: amax 127 gives d = 1 and the values themselves as codes") {
        float x[32];
        for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j * 4 - 127);
        BlockQ8_0 b;
        quantize_row(GgmlType::Q8_0, x, &b, 32);
        CHECK(b.d == 0x3C00);
        for (int j = 0; j < 32; ++j) CHECK(b.qs[j] == j * 4 - 127);
    }
    SUBCASE("Q4_0: the largest magnitude keeps its sign, d = max / -8") {
        float x[32];
        for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8) * 0.5f;  // max = -4 -> d = 0.5
        BlockQ4_0 b;
        quantize_row(GgmlType::Q4_0, x, &b, 32);
        CHECK(b.d == 0x3800);
        for (int j = 0; j < 16; ++j) CHECK(b.qs[j] == (j | (j << 4)));
        x[0] = 4.0f;  // +4 now comes first among the largest: d = -0.5, and x = -4 (8 * d) clamps to code 15
        quantize_row(GgmlType::Q4_0, x, &b, 32);
        CHECK(b.d == 0xB800);
        CHECK((b.qs[0] & 0xF) == 0);   // element 0: 4 / -0.5 = -8 -> code 0
        CHECK((b.qs[0] >> 4) == 15);   // element 16: -4 / -0.5 = 8 -> 16, clamped to 15
    }
    SUBCASE("zero blocks") {
        const float zeros[32] = {};
        BlockQ8_0 b8;
        BlockQ4_0 b4;
        quantize_row(GgmlType::Q8_0, zeros, &b8, 32);
        quantize_row(GgmlType::Q4_0, zeros, &b4, 32);
        CHECK(b8.d == 0);
        CHECK(b4.d == 0x8000);  // 0 / -8 is -0, as in ggml
        for (int j = 0; j < 32; ++j) CHECK(b8.qs[j] == 0);
        for (int j = 0; j < 16; ++j) CHECK(b4.qs[j] == 0x88);
    }
}

TEST_CASE("quant Q4_0: quantize_row is the scalar reference byte for byte") {
    // Random blocks at scales from 1e-4 to 1e4, and the cases the SIMD version must get right the scalar way: the
    // first of several elements of largest magnitude keeps its sign (+a before -a and the reverse), all zeros and
    // negative zeros (d = -0), a single non-zero, and elements on the rounding boundaries x/d + 8.5 = k.
    std::mt19937 rng(43);
    const int64_t n = 32 * 600;
    std::vector<float> x = random_floats(n, rng);
    for (int64_t b = 0; b < 300; ++b)
        for (int j = 0; j < 32; ++j) x[b * 32 + j] *= std::pow(10.0f, static_cast<float>(b % 9) - 4.0f);
    std::uniform_int_distribution<int> pos(0, 31);
    for (int64_t b = 300; b < 600; ++b) {
        float* blk = &x[b * 32];
        switch (b % 6) {
            case 0: {  // ties of |x|, both signs, the first decides
                const float a = 3.0f + static_cast<float>(b);
                const int i = pos(rng), k = pos(rng);
                blk[i] = (b % 12 == 0) ? a : -a;
                blk[k] = -blk[i];
                break;
            }
            case 1: std::fill(blk, blk + 32, 0.0f); break;
            case 2: std::fill(blk, blk + 32, -0.0f); break;
            case 3: std::fill(blk, blk + 32, 0.0f), blk[pos(rng)] = -1e-3f; break;
            case 4:  // multiples of d/2 with d = -1 (max -8): x/d + 8.5 on and next to integers
                for (int j = 0; j < 32; ++j) blk[j] = 0.5f * static_cast<float>((j * 7) % 33 - 16);
                blk[pos(rng)] = -8.0f;
                break;
            default:
                for (int j = 0; j < 32; ++j) blk[j] = std::nextafter(blk[j], 0.0f);
        }
    }
    std::vector<BlockQ4_0> got(static_cast<size_t>(n / 32)), want(static_cast<size_t>(n / 32));
    quantize_row(GgmlType::Q4_0, x.data(), got.data(), n);
    quantize_row_q4_0_scalar(x.data(), want.data(), n);
    int differing = 0;
    for (size_t b = 0; b < got.size(); ++b) {
        if (std::memcmp(&got[b], &want[b], sizeof(BlockQ4_0)) == 0) continue;
        if (++differing <= 3) FAIL_CHECK("block " << b << " differs (d " << got[b].d << " vs " << want[b].d << ")");
    }
    CHECK(differing == 0);
}

TEST_CASE("quant Q8_0 and Q4_0: random rows decode within the quantization step") {
    std::mt19937 rng(42);
    const int64_t n = 32 * 257;
    for (int trial = 0; trial < 4; ++trial) {
        std::vector<float> x = random_floats(n, rng);
        for (int64_t b = 0; b < n / 32; ++b)
            for (int j = 0; j < 32; ++j) x[b * 32 + j] *= std::pow(10.0f, static_cast<float>(b % 9) - 4.0f);

        // Q8_0: |x - q * d16| <= |x - q * d| + |q| |d - d16| <= d / 2 + 127 |d - d16| (codes use the fp32 d, the
        // block stores it rounded to fp16).
        std::vector<BlockQ8_0> q8(static_cast<size_t>(n / 32));
        std::vector<float> back(static_cast<size_t>(n));
        quantize_row(GgmlType::Q8_0, x.data(), q8.data(), n);
        dequantize_row(GgmlType::Q8_0, q8.data(), back.data(), n);
        int bad = 0;
        for (int64_t b = 0; b < n / 32; ++b) {
            float amax = 0;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
            const float d = amax / 127.0f;
            const float d16 = fp16_to_fp32_portable(fp32_to_fp16_portable(d));
            bad += q8[b].d != fp32_to_fp16_portable(d);
            const double bound = 0.5 * d * (1 + 1e-6) + 127.0 * std::fabs(d - d16);
            for (int j = 0; j < 32; ++j) bad += std::fabs(double(x[b * 32 + j]) - back[b * 32 + j]) > bound;
        }
        CHECK(bad == 0);

        // Q4_0: codes are trunc(x/d + 8.5), i.e. x/d rounded, except that x/d above 7.5 (the side opposite the
        // largest magnitude) is clamped to 7, so errors reach |d| there. The element with the largest magnitude
        // decodes to -8 * d16.
        std::vector<BlockQ4_0> q4(static_cast<size_t>(n / 32));
        quantize_row(GgmlType::Q4_0, x.data(), q4.data(), n);
        dequantize_row(GgmlType::Q4_0, q4.data(), back.data(), n);
        bad = 0;
        for (int64_t b = 0; b < n / 32; ++b) {
            float amax = 0, max = 0;
            for (int j = 0; j < 32; ++j)
                if (amax < std::fabs(x[b * 32 + j])) {
                    amax = std::fabs(x[b * 32 + j]);
                    max = x[b * 32 + j];
                }
            const float d = max / -8.0f;
            const float d16 = fp16_to_fp32_portable(fp32_to_fp16_portable(d));
            bad += q4[b].d != fp32_to_fp16_portable(d);
            for (int j = 0; j < 32; ++j) {
                const double v = x[b * 32 + j];
                const double step = (d != 0 && v / d > 7.5) ? std::fabs(d) : 0.5 * std::fabs(d);
                const double bound = step * (1 + 1e-5) + 8.0 * std::fabs(d - d16);
                bad += std::fabs(v - back[b * 32 + j]) > bound;
            }
        }
        CHECK(bad == 0);
    }
}

TEST_CASE("quant rejects unsupported types and partial blocks") {
    float x[64] = {};
    uint8_t buf[256] = {};
    CHECK(cpu_supports(GgmlType::Q4_0));
    CHECK(cpu_supports(GgmlType::Q8_0));
    CHECK(cpu_supports(GgmlType::F16));
    CHECK(cpu_supports(GgmlType::F32));
    // The i-quants are not supported (yet); quantizing is only offered for F32, F16, Q8_0 and Q4_0.
    CHECK_FALSE(cpu_supports(GgmlType::IQ2_XXS));
    CHECK_FALSE(cpu_supports(GgmlType::IQ4_NL));
    CHECK_THROWS_AS(quantize_row(GgmlType::Q6_K, x, buf, 64), Error);
    CHECK_THROWS_AS(dequantize_row(GgmlType::IQ4_NL, buf, x, 64), Error);
    CHECK_THROWS_AS(vec_dot(GgmlType::IQ4_NL, 64, buf, x), Error);
    CHECK_THROWS_AS(quantize_row(GgmlType::Q8_0, x, buf, 48), Error);
    CHECK_THROWS_AS(vec_dot(GgmlType::Q4_0, 40, buf, x), Error);
}

// ---- vec_dot ------------------------------------------------------------------------------------------------------

TEST_CASE("quant vec_dot matches a double-precision reference, SIMD and scalar") {
    std::mt19937 rng(1234);
    for (GgmlType type : kTypes) {
        std::vector<int64_t> sizes = {32, 64, 4096, 4128};
        if (type == GgmlType::F32 || type == GgmlType::F16)
            for (int64_t n : {1, 7, 33, 172, 4100}) sizes.push_back(n);  // any length: exercises the tails
        for (int64_t n : sizes) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(n);
            const std::vector<uint8_t> row = random_row(type, n, rng);
            const std::vector<float> x = random_floats(n, rng);
            std::vector<float> w(static_cast<size_t>(n));
            dequantize_row(type, row.data(), w.data(), n);
            double ref = 0, magnitude = 0;
            for (int64_t i = 0; i < n; ++i) {
                ref += double(w[i]) * x[i];
                magnitude += std::fabs(double(w[i]) * x[i]);
            }
            // Float summation error is at most (depth of the summation) * 2^-24 * sum |w x|; both kernels sum
            // 32-element steps into per-step partials and then add the steps, so the depth is about n / 32 + 48.
            const double tolerance = (n / 32.0 + 48) * std::ldexp(1.0, -24) * magnitude + 1e-30;
            const float simd = vec_dot(type, n, row.data(), x.data());
            const float scalar = vec_dot_scalar(type, n, row.data(), x.data());
            CHECK(std::fabs(simd - ref) <= tolerance);
            CHECK(std::fabs(scalar - ref) <= tolerance);
            // Deterministic: the same call gives the same bits.
            const float again = vec_dot(type, n, row.data(), x.data());
            CHECK(std::memcmp(&simd, &again, sizeof simd) == 0);
        }
    }
}

// ---- matmul -------------------------------------------------------------------------------------------------------

TEST_CASE("matmul equals vec_dot (or vec_dot_q8 with 8-bit activations) row by row, bitwise") {
    std::mt19937 rng(99);
    ThreadPool pool(2);
    struct Shape {
        int64_t cols, rows, tokens;
    };
    for (Activations act : {Activations::Int8, Activations::Float})
    for (GgmlType type : kTypes) {
        std::vector<Shape> shapes = {{32, 3, 1}, {96, 17, 7}, {4128, 5, 6}, {2048, 300, 12}};
        if (type == GgmlType::F32 || type == GgmlType::F16) shapes.push_back({172, 9, 5});
        for (const Shape& s : shapes) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(act == Activations::Int8);
            CAPTURE(s.cols);
            CAPTURE(s.rows);
            const std::vector<uint8_t> W = random_matrix(type, s.cols, s.rows, rng);
            const std::vector<float> x = random_floats(s.cols * s.tokens, rng);
            std::vector<float> y(static_cast<size_t>(s.rows * s.tokens), NAN);
            matmul(type, W.data(), s.cols, s.rows, x.data(), s.tokens, y.data(), pool, act);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(s.cols));
            int mismatches = 0;
            for (int64_t t = 0; t < s.tokens; ++t)
                for (int64_t r = 0; r < s.rows; ++r) {
                    const void* row = W.data() + r * row_bytes;
                    const float* xt = x.data() + t * s.cols;
                    const float expect = uses_int8(type, act) ? vec_dot_q8(type, s.cols, row, xt)
                                                              : vec_dot(type, s.cols, row, xt);
                    mismatches += std::memcmp(&expect, &y[t * s.rows + r], sizeof expect) != 0;
                }
            CHECK(mismatches == 0);
        }
    }
}

TEST_CASE("matmul is batch invariant: bitwise equal per token for any batch size, position and thread count") {
    std::mt19937 rng(2024);
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
    const int64_t kBatchSizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33};
    const int64_t kMaxTokens = 40;
    for (Activations act : {Activations::Int8, Activations::Float})
    for (GgmlType type : kTypes) {
        std::vector<std::pair<int64_t, int64_t>> shapes;  // (cols, rows)
        for (int64_t rows : {3, 17})
            for (int64_t cols : {32, 96, 4128}) shapes.push_back({cols, rows});
        shapes.push_back({4128, 130});  // several row chunks of the prefill loop
        if (type == GgmlType::F32 || type == GgmlType::F16) shapes.push_back({172, 17});
        for (auto [cols, rows] : shapes) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(act == Activations::Int8);
            CAPTURE(cols);
            CAPTURE(rows);
            const std::vector<uint8_t> W = random_matrix(type, cols, rows, rng);
            const std::vector<float> x = random_floats(cols * kMaxTokens, rng);

            // Reference: each token alone, one thread.
            std::vector<float> single(static_cast<size_t>(rows * kMaxTokens));
            for (int64_t t = 0; t < kMaxTokens; ++t)
                matmul(type, W.data(), cols, rows, x.data() + t * cols, 1, single.data() + t * rows, pools[0], act);

            int mismatches = 0;
            for (ThreadPool& pool : pools) {
                for (int64_t n : kBatchSizes) {
                    if (rows == 130 && n > 9) continue;  // keeps the sanitizer build quick; the loop is the same
                    // Start the batch at different tokens so each token takes different places in the tiles.
                    for (int64_t first : {int64_t{0}, kMaxTokens - n}) {
                        std::vector<float> y(static_cast<size_t>(rows * n), NAN);
                        matmul(type, W.data(), cols, rows, x.data() + first * cols, n, y.data(), pool, act);
                        const float* expect = single.data() + first * rows;
                        mismatches += std::memcmp(y.data(), expect, y.size() * sizeof(float)) != 0;
                    }
                }
            }
            CHECK(mismatches == 0);

            // matmul_rows over a split of the rows gives the same bits too.
            std::vector<float> y(static_cast<size_t>(rows * 9));
            matmul_rows(type, W.data(), cols, rows, x.data(), 9, y.data(), 0, rows / 2, act);
            matmul_rows(type, W.data(), cols, rows, x.data(), 9, y.data(), rows / 2, rows, act);
            CHECK(std::memcmp(y.data(), single.data(), y.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("matmul rejects unsupported types and bad shapes") {
    ThreadPool pool(1);
    std::vector<uint8_t> W(1024);
    std::vector<float> x(64), y(64);
    CHECK_THROWS_AS(matmul(GgmlType::IQ2_XXS, W.data(), 256, 1, x.data(), 1, y.data(), pool), Error);
    CHECK_THROWS_AS(matmul(GgmlType::Q4_0, W.data(), 48, 1, x.data(), 1, y.data(), pool), Error);
    CHECK_THROWS_AS(matmul_rows(GgmlType::Q8_0, W.data(), 32, 2, x.data(), 1, y.data(), 0, 3), Error);
    matmul(GgmlType::F32, W.data(), 16, 0, x.data(), 1, y.data(), pool);  // empty shapes are fine
    matmul(GgmlType::F32, W.data(), 16, 2, x.data(), 0, y.data(), pool);
}
