// Tests of matvec's 8-bit-activation route (kernels/matvec_q8.cu) on the CPU emulation: the activation quantizers
// against the CPU backend's (bitwise), the integer products of every block type against the CPU's integer kernels
// (cpu/quant_q8.h: the same integer sums, so only float rounding apart), staged loads and matvec_multi bitwise
// the direct single launches, and the shapes it refuses. Two thread orders each; outputs start as NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "emu/cuda_emu.h"
#include "gguf/ggml_types.h"
#include "kernels.h"
#include "random_blocks.h"

using namespace tandem;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 5}};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

const GgmlType kQ8Types[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                             GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& f : v) f = normal(rng);
    return v;
}

// The device's quantized rows: n tokens of q8_activation_row_bytes each, filled with 0xFF first (a byte the
// kernel forgets stays visible).
std::vector<uint8_t> quantize_on_device(GgmlType type, const std::vector<float>& x, int cols, int n) {
    std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(type, cols) * static_cast<size_t>(n), 0xFF);
    cuda::quantize_activations(type, x.data(), cols, n, xq.data(), nullptr);
    return xq;
}

}  // namespace

TEST_CASE("cuda q8: quantize_activations gives bitwise the CPU backend's blocks") {
    // Q8_K: the CPU's Q8_K blocks. The 32-element types: Q8_1 blocks, the CPU's Q8_1 (Q4_1, Q5_1) and, without s,
    // its Q8_0 (d then the codes) for Q4_0, Q5_0, Q8_0. The inputs include an all-zero block, a block whose largest
    // magnitudes tie with opposite signs (the first one sets Q8_K's sign), and halfway cases of the rounding.
    std::mt19937 rng(51);
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q6_K}) {
        const cpu::Q8TypeKernels* k = cpu::find_q8_kernels(type);
        REQUIRE(k != nullptr);
        for (int cols : {256, 768}) {
            for (int n : {2, 3}) {
                const std::string type_name = ggml_type_name(type);
        CAPTURE(type_name);
                CAPTURE(cols);
                CAPTURE(n);
                std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                REQUIRE(x.size() >= 512);
                for (int i = 0; i < 256; ++i) x[i] = 0.0f;  // an all-zero block (and super-block)
                x[256 + 3] = -4.0f;                          // ties of largest magnitude, the negative one first
                x[256 + 200] = 4.0f;
                x[256 + 40] = 4.0f * 0.5f / 127.0f;          // (x * 127 / 4) is exactly 0.5: round half to even
                x[256 + 41] = 4.0f * 1.5f / 127.0f;
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    const std::vector<uint8_t> got = quantize_on_device(type, x, cols, n);
                    const size_t row = cuda::q8_activation_row_bytes(type, cols);
                    for (int t = 0; t < n; ++t) {
                        CAPTURE(t);
                        std::vector<uint8_t> want(cpu::act_row_bytes(k->act, cols));
                        cpu::quantize_activations(k->act, &x[static_cast<size_t>(t) * cols], want.data(), cols);
                        const uint8_t* g = got.data() + t * row;
                        if (k->act == cpu::ActFormat::Q8_0) {  // device blocks are Q8_1: compare d and the codes
                            REQUIRE(row == static_cast<size_t>(cols / 32) * 36);
                            for (int b = 0; b < cols / 32; ++b) {
                                CHECK(std::memcmp(g + 36 * b, want.data() + 34 * b, 2) == 0);
                                CHECK(std::memcmp(g + 36 * b + 4, want.data() + 34 * b + 2, 32) == 0);
                            }
                        } else {
                            REQUIRE(want.size() == row);
                            CHECK(std::memcmp(g, want.data(), row) == 0);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("cuda q8: the integer route matches the CPU's integer kernels for every block type") {
    // The CPU's vec_dot_q8_scalar is the definition (cpu/quant_q8_legacy.cpp, cpu/quant_q8_kquants.cpp). Each
    // kernel product has the same integer sums and differs only in the order of its float terms: within 2e-6 of
    // the sum of |term|. Quantizing x costs ~1e-2 of that, so the float route or a wrong code would fail here.
    std::mt19937 rng(52);
    for (GgmlType type : kQ8Types) {
        const int block = ggml_type_info(type).block_size;
        for (int cols : {block == 32 ? 96 : 256, block == 32 ? 352 : 1280}) {
            const int rows = 11;
            const std::string type_name = ggml_type_name(type);
        CAPTURE(type_name);
            CAPTURE(cols);
            REQUIRE(cuda::matvec_q8_supports(type));
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            std::vector<float> dq(static_cast<size_t>(rows) * cols);
            for (int r = 0; r < rows; ++r)
                cpu::dequantize_row(type, W.data() + r * row_bytes, &dq[static_cast<size_t>(r) * cols], cols);
            for (int n : {1, 3, 6, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                std::vector<float> want(static_cast<size_t>(n) * rows);
                std::vector<double> bound(want.size());
                for (int t = 0; t < n; ++t)
                    for (int r = 0; r < rows; ++r) {
                        const float* xt = &x[static_cast<size_t>(t) * cols];
                        want[t * rows + r] = cpu::vec_dot_q8_scalar(type, cols, W.data() + r * row_bytes, xt);
                        double a = 0.0;
                        for (int i = 0; i < cols; ++i) a += std::abs(double{dq[static_cast<size_t>(r) * cols + i]} * xt[i]);
                        bound[t * rows + r] = a;
                    }
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    const std::vector<uint8_t> xq = quantize_on_device(type, x, cols, n);
                    // Split rows add the same integer-scaled terms in another float order: the same bound.
                    const auto loads = &o == &kTwoOrders[0] ? cuda::MatvecLoads::Direct : cuda::MatvecLoads::Split;
                    CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                    std::vector<float> y(want.size(), kNaN);
                    cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, y.data(), nullptr, 0, loads,
                                 xq.data());
                    size_t bad = y.size();
                    for (size_t i = 0; i < y.size() && bad == y.size(); ++i)
                        if (!(std::abs(double{y[i]} - want[i]) <= 2e-6 * bound[i] + 1e-30)) bad = i;
                    CHECK_MESSAGE(bad == y.size(), "element ", bad, ": got ", bad < y.size() ? y[bad] : 0.0f,
                                  ", CPU ", bad < y.size() ? want[bad] : 0.0f);
                }
            }
        }
    }
}

TEST_CASE("cuda q8: staged loads, matvec_rows and matvec_multi are bitwise the matvec of their loads") {
    // The staged kernel decodes a shared-memory copy in whole walk steps (rows of one partial chunk and of several,
    // 7680 columns): bitwise the direct matvec. Split rows add their warps' partial sums in another fixed order: the
    // split matvec is the reference of its own matvec_rows and matvec_multi, and a token alone gets the bits it got
    // in a call of 5 or 16. matvec_rows computes picked rows with the same sum; matvec_multi Q/K/V-like targets
    // with a bias where add_bias would add it.
    std::mt19937 rng(53);
    for (GgmlType type : kQ8Types) {
        const int block = ggml_type_info(type).block_size;
        for (int cols : {block == 32 ? 96 : 256, 7680}) {
            const int rows = cols == 7680 ? 3 : 9;
            const std::string type_name = ggml_type_name(type);
            CAPTURE(type_name);
            CAPTURE(cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            const std::vector<uint8_t> W2 = test::random_weight_rows(type, 2, cols, rng);
            const std::vector<float> bias = random_floats(2, rng);
            const std::vector<int> picked = {rows - 1, 0, rows / 2};
            for (int n : {1, 3, 5, 16}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                const std::vector<uint8_t> xq = quantize_on_device(type, x, cols, n);
                // The references of a loads: the matrix, the biased two-row target, the picked rows.
                struct Reference {
                    std::vector<float> y, y2, picked;
                };
                const auto reference = [&](cuda::MatvecLoads loads) {
                    Reference ref{std::vector<float>(static_cast<size_t>(n) * rows, kNaN),
                                  std::vector<float>(static_cast<size_t>(n) * 2, kNaN),
                                  std::vector<float>(static_cast<size_t>(n) * rows, kNaN)};
                    cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, ref.y.data(), nullptr, 0, loads,
                                 xq.data());
                    cuda::matvec(type, W2.data(), row_bytes, 2, cols, x.data(), n, ref.y2.data(), nullptr, 0, loads,
                                 xq.data());
                    cuda::add_bias(ref.y2.data(), bias.data(), n, 2, nullptr);
                    for (int t = 0; t < n; ++t)
                        for (int r : picked) {
                            const size_t i = static_cast<size_t>(t) * rows + r;
                            ref.picked[i] = ref.y[i];
                        }
                    for (float v : ref.y) REQUIRE(std::isfinite(v));
                    return ref;
                };
                const Reference direct = reference(cuda::MatvecLoads::Direct);
                const Reference split = reference(cuda::MatvecLoads::Split);
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    for (cuda::MatvecLoads loads :
                         {cuda::MatvecLoads::Direct, cuda::MatvecLoads::Staged, cuda::MatvecLoads::Split}) {
                        CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                        const Reference& want = loads == cuda::MatvecLoads::Split ? split : direct;
                        std::vector<float> y(want.y.size(), kNaN), y2(want.y2.size(), kNaN);
                        std::vector<float> picked_y(want.y.size(), kNaN);
                        if (loads == cuda::MatvecLoads::Staged) {
                            cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, y.data(), nullptr, 0,
                                         loads, xq.data());
                            CHECK(std::memcmp(y.data(), want.y.data(), want.y.size() * 4) == 0);
                        }
                        if (loads == cuda::MatvecLoads::Split && n > 1) {  // the last token alone
                            std::vector<float> one(rows, kNaN);
                            const size_t xq_row = cuda::q8_activation_row_bytes(type, cols);
                            cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), 1, one.data(), nullptr, 0,
                                         loads, xq.data() + (n - 1) * xq_row);
                            CHECK(std::memcmp(one.data(), want.y.data() + (n - 1) * rows, one.size() * 4) == 0);
                        }
                        cuda::matvec_rows(type, W.data(), row_bytes, cols, picked.data(), 3, x.data(), n,
                                          picked_y.data(), rows, nullptr, loads, xq.data());
                        CHECK(std::memcmp(picked_y.data(), want.picked.data(), want.y.size() * 4) == 0);
                        std::fill(y.begin(), y.end(), kNaN);
                        const cuda::MatvecTarget targets[] = {{W.data(), row_bytes, rows, y.data(), nullptr},
                                                              {W2.data(), row_bytes, 2, y2.data(), bias.data()}};
                        cuda::matvec_multi(type, targets, 2, cols, x.data(), n, nullptr, loads, xq.data());
                        CHECK(std::memcmp(y.data(), want.y.data(), want.y.size() * 4) == 0);
                        CHECK(std::memcmp(y2.data(), want.y2.data(), want.y2.size() * 4) == 0);
                    }
                }
            }
        }
    }
}

TEST_CASE("cuda q8: RMSNorm's quantized output is bitwise quantize_activations of its fp32 output") {
    // rms_norm / add_rms_norm with xq, for a Q8_1 type (Q4_0: quantized from registers by groups of eight lanes) and a
    // Q8_K one (Q4_K: the warps quantize the row they just wrote, after a barrier); rows of one and of several
    // 256-blocks, with one, two and four float4s a thread (8,448: 2,112 float4s on 544 threads, so the last eight
    // groups of the fourth slot are past the row).
    std::mt19937 rng(55);
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_K}) {
        for (int cols : {256, 1280, 4608, 8448}) {
            const int rows = 3;
            const std::string type_name = ggml_type_name(type);
            CAPTURE(type_name);
            CAPTURE(cols);
            const std::vector<float> x = random_floats(static_cast<size_t>(rows) * cols, rng);
            const std::vector<float> res = random_floats(x.size(), rng), w = random_floats(static_cast<size_t>(cols), rng);
            for (bool add : {false, true}) {
                CAPTURE(add);
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    std::vector<float> xs = x, out(x.size(), kNaN);
                    std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(type, cols) * rows, 0xFF);
                    if (add)
                        cuda::add_rms_norm(xs.data(), res.data(), w.data(), out.data(), rows, cols, 1e-5f, nullptr,
                                           type, xq.data());
                    else
                        cuda::rms_norm(xs.data(), w.data(), out.data(), rows, cols, 1e-5f, nullptr, type, xq.data());
                    std::vector<float> plain(x.size(), kNaN);
                    std::vector<float> xs2 = x;
                    if (add)
                        cuda::add_rms_norm(xs2.data(), res.data(), w.data(), plain.data(), rows, cols, 1e-5f, nullptr);
                    else
                        cuda::rms_norm(xs2.data(), w.data(), plain.data(), rows, cols, 1e-5f, nullptr);
                    CHECK(std::memcmp(out.data(), plain.data(), out.size() * 4) == 0);
                    const std::vector<uint8_t> want = quantize_on_device(type, plain, cols, rows);
                    CHECK(xq == want);
                }
            }
        }
    }
    std::vector<float> x(96), out(96);
    std::vector<uint8_t> xq(512);
    CHECK_THROWS_AS(cuda::rms_norm(x.data(), x.data(), out.data(), 1, 96, 1e-5f, nullptr, GgmlType::Q4_K, xq.data()),
                    std::invalid_argument);  // 96 columns are not whole Q8_K blocks
    CHECK_THROWS_AS(cuda::rms_norm(x.data(), x.data(), out.data(), 1, 96, 1e-5f, nullptr, GgmlType::F16, xq.data()),
                    std::invalid_argument);  // no 8-bit route
    CHECK(cuda::q8_activation_format(GgmlType::Q5_1) == cuda::Q8Format::Q8_1);
    CHECK(cuda::q8_activation_format(GgmlType::Q3_K) == cuda::Q8Format::Q8_K);
    CHECK(cuda::q8_activation_format(GgmlType::BF16) == cuda::Q8Format::None);
}

TEST_CASE("cuda q8: SwiGLU's quantized output is bitwise quantize_activations of its fp32 output") {
    std::mt19937 rng(56);
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q6_K}) {
        const int cols = 768, rows = 3;
        const std::string type_name = ggml_type_name(type);
        CAPTURE(type_name);
        const std::vector<float> gate = random_floats(static_cast<size_t>(rows) * cols, rng);
        const std::vector<float> up = random_floats(gate.size(), rng);
        std::vector<float> plain(gate.size(), kNaN);
        cuda::swiglu(gate.data(), up.data(), plain.data(), static_cast<int64_t>(gate.size()), nullptr);
        const std::vector<uint8_t> want = quantize_on_device(type, plain, cols, rows);
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            std::vector<float> out = gate;  // in place, as the backend runs it
            std::vector<uint8_t> xq(want.size(), 0xFF);
            cuda::swiglu(out.data(), up.data(), out.data(), static_cast<int64_t>(out.size()), nullptr, type, xq.data());
            CHECK(std::memcmp(out.data(), plain.data(), out.size() * 4) == 0);
            CHECK(xq == want);
        }
    }
    std::vector<float> v(96);
    std::vector<uint8_t> xq(512);
    CHECK_THROWS_AS(cuda::swiglu(v.data(), v.data(), v.data(), 96, nullptr, GgmlType::Q4_K, xq.data()),
                    std::invalid_argument);  // not whole Q8_K blocks
    CHECK_THROWS_AS(cuda::swiglu(v.data(), v.data(), v.data(), 96, nullptr, GgmlType::F16, xq.data()),
                    std::invalid_argument);
}

TEST_CASE("cuda q8: the float types ignore quantized x, and bad shapes are refused") {
    std::mt19937 rng(54);
    const int cols = 64, rows = 3;
    const std::vector<uint8_t> W = test::random_weight_rows(GgmlType::F16, rows, cols, rng);
    const std::vector<float> x = random_floats(cols, rng);
    std::vector<uint8_t> garbage(256, 0x7F);
    std::vector<float> plain(rows, kNaN), with_xq(rows, kNaN);
    cuda::matvec(GgmlType::F16, W.data(), cols * 2, rows, cols, x.data(), 1, plain.data(), nullptr);
    cuda::matvec(GgmlType::F16, W.data(), cols * 2, rows, cols, x.data(), 1, with_xq.data(), nullptr, 0,
                 cuda::MatvecLoads::Direct, garbage.data());
    CHECK(std::memcmp(plain.data(), with_xq.data(), rows * 4) == 0);
    CHECK_FALSE(cuda::matvec_q8_supports(GgmlType::F16));
    CHECK_FALSE(cuda::matvec_q8_supports(GgmlType::F32));
    CHECK_THROWS_AS(cuda::q8_activation_row_bytes(GgmlType::F16, 64), std::invalid_argument);
    CHECK_THROWS_AS(cuda::q8_activation_row_bytes(GgmlType::Q4_K, 96), std::invalid_argument);  // not whole blocks
    CHECK(cuda::q8_activation_row_bytes(GgmlType::Q4_0, 96) == 3 * 36);
    CHECK(cuda::q8_activation_row_bytes(GgmlType::Q6_K, 512) == 2 * 292);
    std::vector<float> xs(512);
    std::vector<uint8_t> xq(4 * 292 + 4);
    CHECK_THROWS_AS(cuda::quantize_activations(GgmlType::Q4_0, xs.data(), 96, 0, xq.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::quantize_activations(GgmlType::Q4_0, xs.data(), 96, 1, xq.data() + 1, nullptr),
                    std::invalid_argument);  // xq not 4-byte aligned
    const std::vector<uint8_t> Wq = test::random_weight_rows(GgmlType::Q4_0, 2, 96, rng);
    std::vector<float> y(2);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::Q4_0, Wq.data(), 54, 2, 96, xs.data(), 1, y.data(), nullptr, 0,
                                 cuda::MatvecLoads::Direct, xq.data() + 2),
                    std::invalid_argument);
    // Q4_K / Q5_K's walk reads 16-byte words: a row stride that is not a multiple of 16 (padded rows) is refused
    // on the 8-bit route; the fp32 route takes it.
    const std::vector<uint8_t> Wk = test::random_weight_rows(GgmlType::Q4_K, 2, 256, rng);
    std::vector<uint8_t> padded(2 * 148);
    for (int r = 0; r < 2; ++r) std::memcpy(padded.data() + r * 148, Wk.data() + r * 144, 144);
    std::vector<uint8_t> xk(292);
    cuda::quantize_activations(GgmlType::Q4_K, xs.data(), 256, 1, xk.data(), nullptr);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::Q4_K, padded.data(), 148, 2, 256, xs.data(), 1, y.data(), nullptr, 0,
                                 cuda::MatvecLoads::Direct, xk.data()),
                    std::invalid_argument);
    CHECK_NOTHROW(cuda::matvec(GgmlType::Q4_K, padded.data(), 148, 2, 256, xs.data(), 1, y.data(), nullptr));
}
