// Tests of matvec launches over targets of two weight types (kernels/matvec_kernels.cuh DotPair: Q and K of one
// type, V of another, as llama.cpp's Q4_K_M mixture makes them), run on the CPU emulation: matvec_multi and
// matvec_qkv_rope with a pair against each type's own launches, byte for byte, on both activation routes and every
// load, in two thread orders, with outputs that start as NaN (or 0xA5 bytes) so a row nobody wrote fails; the pairs
// one launch takes (matvec_types_fuse) and the refusals of the others.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu/cuda_emu.h"
#include "gguf/ggml_types.h"
#include "kernel_test_helpers.h"
#include "kernels.h"
#include "random_blocks.h"

using namespace tandem;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 5}};

using kernel_test::inv_freqs;
using kernel_test::kNaN;
using kernel_test::order_name;
using kernel_test::QkvRopeOut;
using kernel_test::QkvRopeShape;
using kernel_test::random_floats;
using kernel_test::rope_args;

// The two pairs with kernels, at widths their types take: Q4_K + Q6_K (whole super-blocks of 256) and Q5_0 + Q8_0
// (the Q4_K_M mixture's types for rows of 896 = 28 blocks of 32, as the Qwen2.5-0.5B draft's).
struct Pair {
    GgmlType type, last;
    int cols;
};
const Pair kPairs[] = {{GgmlType::Q4_K, GgmlType::Q6_K, 512}, {GgmlType::Q5_0, GgmlType::Q8_0, 96}};

// Three matrices that read the same x: the first two of `p.type`, the last of `p.last`, with biases.
struct Matrices {
    std::vector<std::vector<uint8_t>> W;
    std::vector<std::vector<float>> bias;
    size_t row_bytes[3];
    int rows[3];
};

Matrices make_matrices(const Pair& p, const int (&rows)[3], std::mt19937& rng) {
    Matrices m;
    for (int i = 0; i < 3; ++i) {
        const GgmlType t = i == 2 ? p.last : p.type;
        m.rows[i] = rows[i];
        m.row_bytes[i] = ggml_row_bytes(t, static_cast<uint64_t>(p.cols));
        m.W.push_back(test::random_weight_rows(t, rows[i], p.cols, rng));
        m.bias.push_back(random_floats(static_cast<size_t>(rows[i]), rng));
    }
    return m;
}

cuda::MatvecTarget target_of(const Matrices& m, int i, std::vector<float>& y) {
    const size_t k = static_cast<size_t>(i);
    return {m.W[k].data(), m.row_bytes[i], m.rows[i], y.data(), m.bias[k].data()};
}

}  // namespace

TEST_CASE("cuda matvec pairs: matvec_multi of two types is bitwise each type's own launch") {
    // Q and K in one type, V in the other: the pair's launch against matvec_multi of Q and K and of V alone (each
    // bitwise the separate matvecs with add_bias: test_cuda_kernels.cpp), the biases added in the launch. Row counts
    // that are and are not whole blocks of four warps (10 + 6 + 7: a block holds K rows and V rows, its warps walking
    // with different types); 1, 3 and 13 tokens (the one-, four- and eight-token kernels; 13: two launches); fp32 and
    // 8-bit activations (one quantized x serves both types: one format a pair); every load (persistent as staged).
    std::mt19937 rng(83);
    for (const Pair& p : kPairs)
        for (const auto& rows : {std::vector<int>{32, 8, 8}, std::vector<int>{10, 6, 7}}) {
            CAPTURE(std::string(ggml_type_name(p.type)));
            CAPTURE(rows[0]);
            REQUIRE(cuda::matvec_types_fuse(p.type, p.last));
            const Matrices m = make_matrices(p, {rows[0], rows[1], rows[2]}, rng);
            for (int n : {1, 3, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * p.cols, rng);
                std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(p.type, p.cols) * n);
                cuda::quantize_activations(p.type, x.data(), p.cols, n, xq.data(), nullptr);
                REQUIRE(cuda::q8_activation_format(p.type) == cuda::q8_activation_format(p.last));
                for (bool int8 : {false, true})
                    for (cuda::MatvecLoads loads : cuda::kAllMatvecLoads) {
                        CAPTURE(int8);
                        CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                        const void* xq_in = int8 ? xq.data() : nullptr;
                        std::vector<std::vector<float>> want, got;
                        for (int i = 0; i < 3; ++i)
                            want.emplace_back(static_cast<size_t>(n) * m.rows[i], kNaN);
                        const cuda::MatvecTarget qk[] = {target_of(m, 0, want[0]), target_of(m, 1, want[1])};
                        const cuda::MatvecTarget v = target_of(m, 2, want[2]);
                        cuda::matvec_multi(p.type, qk, 2, p.cols, x.data(), n, nullptr, loads, xq_in);
                        cuda::matvec_multi(p.last, &v, 1, p.cols, x.data(), n, nullptr, loads, xq_in);
                        for (const LaunchOptions& o : kTwoOrders) {
                            ScopedLaunchOptions scope(o);
                            INFO("thread order " << std::string(order_name(o)));
                            got.clear();
                            for (const std::vector<float>& w : want) got.emplace_back(w.size(), kNaN);
                            const cuda::MatvecTarget all[] = {target_of(m, 0, got[0]), target_of(m, 1, got[1]),
                                                              target_of(m, 2, got[2])};
                            cuda::matvec_multi({p.type, p.last}, all, 3, p.cols, x.data(), n, nullptr, loads, xq_in);
                            for (int i = 0; i < 3; ++i) {
                                CAPTURE(i);
                                const std::vector<float>& w = want[static_cast<size_t>(i)];
                                for (float f : w) REQUIRE(f == f);  // every reference row was written
                                CHECK(std::memcmp(got[static_cast<size_t>(i)].data(), w.data(), w.size() * 4) == 0);
                            }
                        }
                        // One launch per 8 tokens.
                        void* stream = tandem::emu::stream_create();
                        tandem::emu::begin_capture(stream);
                        const cuda::MatvecTarget all[] = {target_of(m, 0, got[0]), target_of(m, 1, got[1]),
                                                          target_of(m, 2, got[2])};
                        cuda::matvec_multi({p.type, p.last}, all, 3, p.cols, x.data(), n, stream, loads, xq_in);
                        const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
                        tandem::emu::stream_destroy(stream);
                        CHECK(graph.nodes.size() == static_cast<size_t>((n + 7) / 8));
                    }
            }
        }
}

TEST_CASE("cuda matvec pairs: matvec_qkv_rope of two types is bitwise the two types' launches and rope_kv_write") {
    // A qwen2 layer of the Q4_K_M mixture: Q and K in one type, V in the other, with biases, RoPE (NeoX halves and
    // adjacent pairs) and the fp16 cache write in the launch's epilogue, against matvec_multi of Q and K, of V,
    // then rope_kv_write: q (rotated), k, v and both caches byte for byte, the counters back at zero, one launch per
    // 8 tokens (persistent loads keep rope_kv_write's launch, as for one type). 13 tokens (two launches) on the two
    // kernels a pair has, direct and split: staged loads run the direct kernel (the matvec_multi test covers the
    // routing), and the sanitizer run pays for every launch.
    std::mt19937 rng(89);
    struct Heads {
        int n_heads, n_kv, hd;
        bool neox;
    };
    const Heads heads[] = {{4, 2, 32, true}, {6, 2, 16, false}};
    const int start = 21, capacity = start + 16;
    int device_start = start;
    for (const Pair& p : kPairs)
        for (const Heads& h : heads) {
            CAPTURE(std::string(ggml_type_name(p.type)));
            CAPTURE(h.hd);
            const int q_dim = h.n_heads * h.hd, kv_dim = h.n_kv * h.hd;
            const Matrices m = make_matrices(p, {q_dim, kv_dim, kv_dim}, rng);
            const std::vector<float> freq = inv_freqs(h.hd, 1e6f);
            const size_t cache_bytes = cuda::kv_row_bytes(cuda::KvType::F16, kv_dim) * capacity;
            const cuda::RopeMode mode = h.neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs;
            std::vector<unsigned> counters(cuda::matvec_rope_counters({nullptr, nullptr, nullptr, nullptr, nullptr,
                                                                       nullptr, 1, 0, h.n_heads, h.n_kv, h.hd, h.hd,
                                                                       mode}),
                                           0u);
            for (int n : {1, 3, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * p.cols, rng);
                std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(p.type, p.cols) * n);
                cuda::quantize_activations(p.type, x.data(), p.cols, n, xq.data(), nullptr);
                for (bool int8 : {false, true})
                    for (cuda::MatvecLoads loads : cuda::kAllMatvecLoads) {
                        const bool own_kernel = loads == cuda::MatvecLoads::Direct || loads == cuda::MatvecLoads::Split;
                        if (n == 13 && !own_kernel) continue;
                        CAPTURE(int8);
                        CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                        using Out = QkvRopeOut;
                        const auto fresh = [&] { return Out(n, q_dim, kv_dim, cache_bytes); };
                        const QkvRopeShape shape{h.n_heads, h.n_kv, h.hd, h.hd, mode, cuda::KvType::F16};
                        std::vector<float> trig;
                        const auto args = [&](Out& o) {
                            return rope_args(o, shape, freq, n, start, n == 3 ? &device_start : nullptr, trig);
                        };
                        const void* xq_in = int8 ? xq.data() : nullptr;
                        Out want = fresh(), got = fresh();
                        const cuda::MatvecTarget qk[] = {target_of(m, 0, want.q), target_of(m, 1, want.k)};
                        const cuda::MatvecTarget v = target_of(m, 2, want.v);
                        cuda::matvec_multi(p.type, qk, 2, p.cols, x.data(), n, nullptr, loads, xq_in);
                        cuda::matvec_multi(p.last, &v, 1, p.cols, x.data(), n, nullptr, loads, xq_in);
                        cuda::rope_kv_write(args(want), nullptr);
                        trig.assign(cuda::rope_trig_floats(args(want)), kNaN);
                        cuda::rope_trig_table(args(want), trig.data(), nullptr);
                        const auto qkv = [&](Out& o) {
                            return std::vector<cuda::MatvecTarget>{target_of(m, 0, o.q), target_of(m, 1, o.k),
                                                                   target_of(m, 2, o.v)};
                        };
                        for (const LaunchOptions& o : kTwoOrders) {
                            ScopedLaunchOptions scope(o);
                            INFO("thread order " << std::string(order_name(o)));
                            got = fresh();
                            cuda::matvec_qkv_rope({p.type, p.last}, qkv(got).data(), p.cols, x.data(), n, nullptr,
                                                  loads, xq_in, args(got), counters.data());
                            CHECK(std::memcmp(got.q.data(), want.q.data(), want.q.size() * 4) == 0);
                            CHECK(std::memcmp(got.k.data(), want.k.data(), want.k.size() * 4) == 0);
                            CHECK(std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4) == 0);
                            CHECK(got.kc == want.kc);
                            CHECK(got.vc == want.vc);
                            CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned c) { return c == 0; }));
                        }
                        CHECK(want.vc != std::vector<uint8_t>(cache_bytes, 0xA5));  // the step's rows were written
                        const bool in_launch = loads != cuda::MatvecLoads::Persistent;
                        CHECK(cuda::matvec_rope_in_launch(p.type, loads, args(got)) == in_launch);
                        void* stream = tandem::emu::stream_create();
                        tandem::emu::begin_capture(stream);
                        cuda::matvec_qkv_rope({p.type, p.last}, qkv(got).data(), p.cols, x.data(), n, stream, loads,
                                              xq_in, args(got), counters.data());
                        const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
                        tandem::emu::stream_destroy(stream);
                        CHECK(graph.nodes.size() == static_cast<size_t>((n + 7) / 8 + (in_launch ? 0 : 1)));
                    }
            }
        }
}

TEST_CASE("cuda matvec pairs: only the pairs with kernels fuse, and a pair needs a last target of its own") {
    CHECK(cuda::matvec_types_fuse(GgmlType::Q4_K, GgmlType::Q6_K));
    CHECK(cuda::matvec_types_fuse(GgmlType::Q5_0, GgmlType::Q8_0));
    CHECK(cuda::matvec_types_fuse(GgmlType::Q4_0, GgmlType::Q4_0));
    CHECK_FALSE(cuda::matvec_types_fuse(GgmlType::Q6_K, GgmlType::Q4_K));  // the order matters: V is the last
    CHECK_FALSE(cuda::matvec_types_fuse(GgmlType::Q4_K, GgmlType::Q8_0));  // two activation formats
    CHECK_FALSE(cuda::matvec_types_fuse(GgmlType::Q5_K, GgmlType::Q6_K));
    std::mt19937 rng(97);
    const Pair p = kPairs[0];
    const Matrices m = make_matrices(p, {8, 8, 8}, rng);
    const std::vector<float> x = random_floats(static_cast<size_t>(p.cols), rng);
    std::vector<float> y(8);
    const cuda::MatvecTarget one = target_of(m, 2, y);
    CHECK_THROWS_WITH_AS(cuda::matvec_multi({p.type, p.last}, &one, 1, p.cols, x.data(), 1, nullptr),
                         doctest::Contains("pair of types"), std::invalid_argument);
    const cuda::MatvecTarget two[] = {target_of(m, 0, y), target_of(m, 2, y)};
    CHECK_THROWS_WITH_AS(cuda::matvec_multi({GgmlType::Q4_K, GgmlType::Q8_0}, two, 2, p.cols, x.data(), 1, nullptr),
                         doctest::Contains("pair of types"), std::invalid_argument);
    // Each type's shape rules still hold: Q5_0 + Q8_0 rows of whole 32-blocks, not 80 columns.
    CHECK_THROWS_WITH_AS(cuda::matvec_multi({GgmlType::Q5_0, GgmlType::Q8_0}, two, 2, 80, x.data(), 1, nullptr),
                         doctest::Contains("whole blocks of 32"), std::invalid_argument);
}
