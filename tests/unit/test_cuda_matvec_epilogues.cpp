// Tests of the matvec launches' last-block epilogues (kernels/matvec_kernels.cuh), run on the CPU emulation, each
// against the separate launches it replaces, byte for byte: SwiGLU's output quantized in the gate/up launch
// (matvec_swiglu with SwigluQuant), RoPE and the KV-cache write in the Q/K/V launch (matvec_qkv_rope), and the
// residual add with the next RMSNorm in the attn_output / ffn_down launch (matvec_add_rms_norm). Each counts its
// blocks in device memory that must be back at zero after the launch (graphs replay it), runs in two thread orders,
// and is checked for where it falls back to the separate launch (from captured launches). Outputs start as NaN (or
// 0xA5 bytes), so a row the epilogue forgot to write fails the comparison.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 11}};

using kernel_test::inv_freqs;
using kernel_test::kNaN;
using kernel_test::order_name;
using kernel_test::QkvRopeOut;
using kernel_test::QkvRopeShape;
using kernel_test::random_floats;
using kernel_test::rope_args;

}  // namespace

TEST_CASE("cuda matvec epilogues: matvec_swiglu quantizes its output for the next matvec bitwise as quantize_activations") {
    // SwigluQuant: on the 8-bit route with staged or persistent loads the last block-row to write a Q8_1 block's rows
    // quantizes it (16 block-rows counted); elsewhere, and for Q8_K, a quantize launch follows. Either
    // way the bytes of quantize_activations on the launch's fp32 output, the output itself bitwise the call without
    // SwigluQuant, and the counters back at zero (a graph replays the launch with them). Gate/up and the next
    // matvec of the same or another format: Q4_0 -> Q4_0 (Q8_1), Q4_K -> Q6_K (Q8_K), Q4_K -> Q4_0 (Q8_1). Tokens 13
    // launch 8 + 5 (the second launch's output rows and quantized rows start at token 8).
    std::mt19937 rng(61);
    struct Case {
        GgmlType type, next;
        int rows;
    };
    const Case cases[] = {{GgmlType::Q4_0, GgmlType::Q4_0, 96}, {GgmlType::Q4_K, GgmlType::Q6_K, 512},
                          {GgmlType::Q4_K, GgmlType::Q4_0, 64}};
    const int cols = 256;
    for (const Case& c : cases) {
        CAPTURE(std::string(ggml_type_name(c.type)));
        CAPTURE(std::string(ggml_type_name(c.next)));
        const size_t row_bytes = ggml_row_bytes(c.type, static_cast<uint64_t>(cols));
        const std::vector<uint8_t> Wg = test::random_weight_rows(c.type, c.rows, cols, rng);
        const std::vector<uint8_t> Wu = test::random_weight_rows(c.type, c.rows, cols, rng);
        std::vector<unsigned> counters(cuda::matvec_swiglu_counters(c.rows), 0u);
        for (int n : {1, 3, 5, 13}) {
            CAPTURE(n);
            const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
            std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(c.type, cols) * n);
            cuda::quantize_activations(c.type, x.data(), cols, n, xq.data(), nullptr);
            const size_t q_bytes = cuda::q8_activation_row_bytes(c.next, c.rows) * n;
            std::vector<float> want(static_cast<size_t>(n) * c.rows, kNaN);
            cuda::matvec_swiglu(c.type, Wg.data(), Wu.data(), row_bytes, c.rows, cols, x.data(), n, want.data(),
                                nullptr, cuda::MatvecLoads::Direct, xq.data());
            std::vector<uint8_t> want_q(q_bytes, 0xAB);
            cuda::quantize_activations(c.next, want.data(), c.rows, n, want_q.data(), nullptr);
            for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Staged, cuda::MatvecLoads::Persistent,
                                            cuda::MatvecLoads::Direct}) {
                CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    INFO("thread order " << std::string(order_name(o)));
                    std::vector<float> got(want.size(), kNaN);
                    std::vector<uint8_t> got_q(q_bytes, 0xAB);
                    cuda::matvec_swiglu(c.type, Wg.data(), Wu.data(), row_bytes, c.rows, cols, x.data(), n,
                                        got.data(), nullptr, loads, xq.data(),
                                        {c.next, got_q.data(), counters.data()});
                    CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
                    CHECK(got_q == want_q);
                    CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned v) { return v == 0; }));
                }
            }
        }
    }
    // Rows that are not whole blocks of the format, and the fp32 route on staged loads (it has no in-launch
    // quantizer: the quantize launch after it).
    const std::vector<uint8_t> W = test::random_weight_rows(GgmlType::Q4_0, 48, cols, rng);
    const std::vector<float> x = random_floats(cols, rng);
    std::vector<float> out(48);
    std::vector<uint8_t> q(cuda::q8_activation_row_bytes(GgmlType::Q4_0, 32) * 2);
    std::vector<unsigned> counters(cuda::matvec_swiglu_counters(48), 0u);
    CHECK_THROWS_WITH_AS(cuda::matvec_swiglu(GgmlType::Q4_0, W.data(), W.data(), ggml_row_bytes(GgmlType::Q4_0, cols),
                                             48, cols, x.data(), 1, out.data(), nullptr, cuda::MatvecLoads::Staged,
                                             nullptr, {GgmlType::Q4_K, q.data(), counters.data()}),
                         doctest::Contains("whole blocks"), std::invalid_argument);
    std::vector<float> want(32);
    std::vector<uint8_t> want_q(q.size()), got_q(q.size());
    cuda::matvec_swiglu(GgmlType::Q4_0, W.data(), W.data(), ggml_row_bytes(GgmlType::Q4_0, cols), 32, cols, x.data(),
                        1, want.data(), nullptr);
    cuda::quantize_activations(GgmlType::Q8_0, want.data(), 32, 1, want_q.data(), nullptr);
    cuda::matvec_swiglu(GgmlType::Q4_0, W.data(), W.data(), ggml_row_bytes(GgmlType::Q4_0, cols), 32, cols, x.data(),
                        1, out.data(), nullptr, cuda::MatvecLoads::Staged, nullptr,
                        {GgmlType::Q8_0, got_q.data(), counters.data()});
    CHECK(got_q == want_q);
}

TEST_CASE("cuda matvec epilogues: matvec_qkv_rope is bitwise matvec_multi followed by rope_kv_write") {
    // Q/K/V products with RoPE and the cache write in the launch's epilogue (the last block of each head applies
    // it) against the two calls: the same q (rotated), k and v, every byte of both caches, and the counters back at
    // zero (a graph replays the launch with them). Heads of 16, 32 and 64 (a tail past rope_dim), both pairings, a
    // float type, Q4_0 on both activation routes and Q6_K; 1, 3 and 13 tokens (the one-, four-
    // and eight-token kernels; 13: two launches, the second's positions start at token 8); the start position by
    // value and from device memory.
    // The epilogue reads the angles from rope_trig_table's table. Where it cannot run (persistent loads, heads of 6
    // rows, a Q8_0 cache, no table), the same result from a rope_kv_write launch after the matvec: read from
    // captured launches.
    std::mt19937 rng(71);
    struct Case {
        int n_heads, n_kv, hd, rope_dim;
        bool neox;
        cuda::KvType kv;
    };
    const Case cases[] = {{4, 2, 32, 32, false, cuda::KvType::F16},
                          {3, 1, 64, 32, true, cuda::KvType::F16},
                          {6, 2, 16, 16, true, cuda::KvType::F16},
                          {4, 2, 32, 32, true, cuda::KvType::Q8_0},
                          {5, 5, 6, 4, false, cuda::KvType::F16}};
    const int cols = 256, start = 37;
    int device_start = start;
    for (const Case& c : cases)
        for (GgmlType type : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q6_K}) {
            const bool fusable = c.hd % 4 == 0 && c.kv == cuda::KvType::F16;
            if (!fusable && type != GgmlType::Q4_0) continue;  // the fallback once is enough
            CAPTURE(c.hd);
            CAPTURE(c.neox);
            CAPTURE(c.kv == cuda::KvType::Q8_0);
            CAPTURE(std::string(ggml_type_name(type)));
            const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, capacity = start + 16 + 3;
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const int rows[] = {q_dim, kv_dim, kv_dim};
            std::vector<std::vector<uint8_t>> W;
            for (int r : rows) W.push_back(test::random_weight_rows(type, r, cols, rng));
            const std::vector<float> freq = inv_freqs(c.rope_dim, 10000.0f);
            const size_t cache_bytes = cuda::kv_row_bytes(c.kv, kv_dim) * capacity;
            std::vector<unsigned> counters(cuda::matvec_rope_counters({nullptr, nullptr, nullptr, nullptr, nullptr,
                                                                       nullptr, 1, 0, c.n_heads, c.n_kv, c.hd,
                                                                       c.rope_dim, cuda::RopeMode::AdjacentPairs}),
                                           0u);
            for (int n : {1, 3, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(GgmlType::Q4_0, cols) * n);
                cuda::quantize_activations(GgmlType::Q4_0, x.data(), cols, n, xq.data(), nullptr);
                for (bool int8 : {false, true}) {
                    if (int8 && type != GgmlType::Q4_0) continue;
                    for (cuda::MatvecLoads loads : cuda::kAllMatvecLoads) {
                        CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                        CAPTURE(int8);
                        // Outputs of one way: q, k, v and the caches (0xA5 bytes outside the step's rows).
                        using Out = QkvRopeOut;
                        const auto fresh = [&] { return Out(n, q_dim, kv_dim, cache_bytes); };
                        const QkvRopeShape shape{c.n_heads, c.n_kv, c.hd, c.rope_dim,
                                                 c.neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs,
                                                 c.kv};
                        std::vector<float> trig;
                        const auto args = [&](Out& o) {
                            return rope_args(o, shape, freq, n, start, n == 3 ? &device_start : nullptr, trig);
                        };
                        const auto targets = [&](Out& o) {
                            return std::vector<cuda::MatvecTarget>{{W[0].data(), row_bytes, q_dim, o.q.data(), nullptr},
                                                                   {W[1].data(), row_bytes, kv_dim, o.k.data(), nullptr},
                                                                   {W[2].data(), row_bytes, kv_dim, o.v.data(), nullptr}};
                        };
                        const void* xq_in = int8 ? xq.data() : nullptr;
                        Out want = fresh(), got = fresh();
                        cuda::matvec_multi(type, targets(want).data(), 3, cols, x.data(), n, nullptr, loads, xq_in);
                        cuda::rope_kv_write(args(want), nullptr);
                        trig.assign(cuda::rope_trig_floats(args(want)), kNaN);
                        cuda::rope_trig_table(args(want), trig.data(), nullptr);
                        for (const LaunchOptions& o : kTwoOrders) {
                            ScopedLaunchOptions scope(o);
                            INFO("thread order " << std::string(order_name(o)));
                            got = fresh();
                            cuda::matvec_qkv_rope(type, targets(got).data(), cols, x.data(), n, nullptr, loads, xq_in,
                                                  args(got), counters.data());
                            CHECK(std::memcmp(got.q.data(), want.q.data(), want.q.size() * 4) == 0);
                            CHECK(std::memcmp(got.k.data(), want.k.data(), want.k.size() * 4) == 0);
                            CHECK(std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4) == 0);
                            CHECK(got.kc == want.kc);
                            CHECK(got.vc == want.vc);
                            CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned v) { return v == 0; }));
                        }
                        CHECK(want.kc != std::vector<uint8_t>(cache_bytes, 0xA5));  // the step's rows were written
                        // One launch per 8 tokens, and a rope_kv_write launch only where the epilogue cannot run.
                        const bool in_launch = cuda::matvec_rope_in_launch(type, loads, args(got));
                        const bool persistent_kernel = loads == cuda::MatvecLoads::Persistent && type != GgmlType::F16;
                        cuda::RopeKvArgs no_table = args(got);
                        no_table.trig = nullptr;
                        CHECK_FALSE(cuda::matvec_rope_in_launch(type, loads, no_table));
                        CHECK(in_launch == (fusable && !persistent_kernel));
                        void* stream = tandem::emu::stream_create();
                        tandem::emu::begin_capture(stream);
                        cuda::matvec_qkv_rope(type, targets(got).data(), cols, x.data(), n, stream, loads, xq_in,
                                              args(got), counters.data());
                        const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
                        tandem::emu::stream_destroy(stream);
                        CHECK(graph.nodes.size() == static_cast<size_t>((n + 7) / 8 + (in_launch ? 0 : 1)));
                    }
                }
            }
        }
    // The targets must be rope's q, k and v, whole heads.
    std::vector<float> q(64), k(32), v(32), freq = inv_freqs(32, 10000.0f), x(256);
    std::vector<uint16_t> kc(32 * 4), vc(32 * 4);
    std::vector<uint8_t> w(64 * ggml_row_bytes(GgmlType::Q4_0, 256));
    std::vector<unsigned> counters(4, 0u);
    const size_t rb = ggml_row_bytes(GgmlType::Q4_0, 256);
    const cuda::RopeKvArgs a{q.data(), k.data(), v.data(), kc.data(), vc.data(), freq.data(), 1, 0, 2, 1, 32, 32,
                             cuda::RopeMode::NeoxHalves};
    const cuda::MatvecTarget swapped[] = {{w.data(), rb, 64, q.data(), nullptr},
                                          {w.data(), rb, 32, v.data(), nullptr},
                                          {w.data(), rb, 32, k.data(), nullptr}};
    CHECK_THROWS_WITH_AS(cuda::matvec_qkv_rope(GgmlType::Q4_0, swapped, 256, x.data(), 1, nullptr,
                                               cuda::MatvecLoads::Direct, nullptr, a, counters.data()),
                         doctest::Contains("rope's q, k and v"), std::invalid_argument);
    const cuda::MatvecTarget short_q[] = {{w.data(), rb, 48, q.data(), nullptr},
                                          {w.data(), rb, 32, k.data(), nullptr},
                                          {w.data(), rb, 32, v.data(), nullptr}};
    CHECK_THROWS_WITH_AS(cuda::matvec_qkv_rope(GgmlType::Q4_0, short_q, 256, x.data(), 1, nullptr,
                                               cuda::MatvecLoads::Direct, nullptr, a, counters.data()),
                         doctest::Contains("whole heads"), std::invalid_argument);
}

TEST_CASE("cuda matvec epilogues: matvec_add_rms_norm is bitwise matvec followed by add_rms_norm") {
    // The attn_output / ffn_down product with the residual add and the next RMSNorm in the launch's last block,
    // against the two calls: the same products, residual stream, norm output and quantized output (Q8_1 or Q8_K),
    // byte for byte, and the counter back at zero (a graph replays the launch with it). The epilogue runs the
    // register kernel's order with a matvec block's four warps, so the widths cover its layouts: one and two
    // float4s a thread with a partly idle last warp (64, 136, 4104, 8200), a whole block of 1024 threads (4096,
    // 8192 with two a thread), Q8_1 and Q8_K outputs. Where it cannot run (3 tokens, a width not a multiple of 4,
    // no counter), the same result from an add_rms_norm launch after the matvec: read from captured launches.
    std::mt19937 rng(83);
    struct Case {
        int rows;
        GgmlType q8_for;  // F32: no quantized output
        int n_tok;
    };
    const Case cases[] = {{64, GgmlType::F32, 1},   {64, GgmlType::Q4_0, 1},  {136, GgmlType::F32, 1},
                          {896, GgmlType::Q4_0, 1}, {1280, GgmlType::Q4_K, 1}, {4104, GgmlType::F32, 1},
                          {4096, GgmlType::Q4_0, 1}, {8200, GgmlType::F32, 1}, {8192, GgmlType::Q4_K, 1},
                          {70, GgmlType::F32, 1},   {896, GgmlType::Q4_0, 3}};
    const int cols = 256;
    const float eps = 1e-6f;
    unsigned counter = 0;
    for (const Case& c : cases) {
        CAPTURE(c.rows);
        CAPTURE(c.n_tok);
        CAPTURE(std::string(ggml_type_name(c.q8_for)));
        const size_t n = static_cast<size_t>(c.n_tok) * c.rows;
        const std::vector<float> x = random_floats(static_cast<size_t>(c.n_tok) * cols, rng);
        const std::vector<float> residual = random_floats(n, rng, 3.0f), weight = random_floats(c.rows, rng);
        const bool quant = c.q8_for != GgmlType::F32;
        const size_t xq_bytes = quant ? cuda::q8_activation_row_bytes(c.q8_for, c.rows) * c.n_tok : 0;
        std::vector<uint8_t> xq_in(cuda::q8_activation_row_bytes(GgmlType::Q4_0, cols) * c.n_tok);
        cuda::quantize_activations(GgmlType::Q4_0, x.data(), cols, c.n_tok, xq_in.data(), nullptr);
        const bool big = c.rows > 1280;  // fewer ways for the widest: each launch emulates thousands of warps
        for (GgmlType type : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q6_K}) {
            const std::vector<uint8_t> W = test::random_weight_rows(type, c.rows, cols, rng);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            for (bool int8 : {false, true}) {
                if (int8 && type != GgmlType::Q4_0) continue;
                for (cuda::MatvecLoads loads : cuda::kAllMatvecLoads) {
                    if (type == GgmlType::F16 && loads != cuda::MatvecLoads::Direct) continue;  // always direct
                    if (big && type != GgmlType::F16 &&
                        loads != (int8 ? cuda::MatvecLoads::Staged : cuda::MatvecLoads::Split))
                        continue;
                    CAPTURE(std::string(ggml_type_name(type)));
                    CAPTURE(int8);
                    CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                    struct Out {
                        std::vector<float> y, x, out;
                        std::vector<uint8_t> xq;
                    };
                    const auto fresh = [&] {
                        return Out{std::vector<float>(n, kNaN), residual, std::vector<float>(n, kNaN),
                                   std::vector<uint8_t>(xq_bytes, 0xA5)};
                    };
                    const auto args = [&](Out& o) {
                        return cuda::AddRmsNormArgs{o.x.data(), weight.data(), o.out.data(), eps, c.q8_for,
                                                    quant ? o.xq.data() : nullptr};
                    };
                    const void* xq = int8 ? xq_in.data() : nullptr;
                    Out want = fresh();
                    cuda::matvec(type, W.data(), row_bytes, c.rows, cols, x.data(), c.n_tok, want.y.data(), nullptr,
                                 0, loads, xq);
                    cuda::add_rms_norm(want.x.data(), want.y.data(), weight.data(), want.out.data(), c.n_tok, c.rows,
                                       eps, nullptr, c.q8_for, quant ? want.xq.data() : nullptr);
                    for (const LaunchOptions& o : kTwoOrders) {
                        ScopedLaunchOptions scope(o);
                        INFO("thread order " << std::string(order_name(o)));
                        Out got = fresh();
                        cuda::matvec_add_rms_norm(type, W.data(), row_bytes, c.rows, cols, x.data(), c.n_tok,
                                                  got.y.data(), nullptr, loads, xq, args(got), &counter);
                        CHECK(std::memcmp(got.y.data(), want.y.data(), n * 4) == 0);
                        CHECK(std::memcmp(got.x.data(), want.x.data(), n * 4) == 0);
                        CHECK(std::memcmp(got.out.data(), want.out.data(), n * 4) == 0);
                        CHECK(got.xq == want.xq);
                        CHECK(counter == 0u);
                    }
                    CHECK(want.x != residual);  // the residual stream was written
                    // One launch where the epilogue runs, else the add_rms_norm launch after it; without a counter
                    // always two.
                    Out got = fresh();
                    const bool in_launch =
                        cuda::matvec_norm_in_launch(type, xq, c.rows, c.n_tok, got.y.data(), args(got));
                    CHECK(in_launch == (c.n_tok == 1 && c.rows % 4 == 0));
                    for (unsigned* cnt : {&counter, static_cast<unsigned*>(nullptr)}) {
                        void* stream = tandem::emu::stream_create();
                        tandem::emu::begin_capture(stream);
                        cuda::matvec_add_rms_norm(type, W.data(), row_bytes, c.rows, cols, x.data(), c.n_tok,
                                                  got.y.data(), stream, loads, xq, args(got), cnt);
                        const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
                        tandem::emu::stream_destroy(stream);
                        CHECK(graph.nodes.size() == (in_launch && cnt ? 1u : 2u));
                    }
                }
            }
        }
    }
    // A misaligned row takes the separate launch (the register kernel's layout needs 16-byte rows), as does a row
    // wider than the register kernel's.
    std::vector<float> buf(72, 1.0f), w(64, 1.0f);
    const cuda::AddRmsNormArgs shifted{buf.data() + 4, w.data(), buf.data() + 4, eps};
    CHECK_FALSE(cuda::matvec_norm_in_launch(GgmlType::Q4_0, nullptr, 64, 1, buf.data() + 1, shifted));
    CHECK_FALSE(cuda::matvec_norm_in_launch(GgmlType::Q4_0, nullptr, 16388, 1, buf.data(),
                                            {buf.data(), w.data(), buf.data(), eps}));
}

TEST_CASE("cuda matvec epilogues: matvec_add_rms_norm for every weight type and route: bitwise and in one launch where it says") {
    // Every matvec type on both activation routes (where it has the 8-bit one) with direct and staged loads: the
    // same bytes as matvec + add_rms_norm, and one launch exactly where matvec_norm_in_launch says so (the types
    // whose walks have no room for the epilogue, Q5_K and 8-bit Q6_K, take the separate launch; a launch asked of a
    // walk without it throws).
    std::mt19937 rng(89);
    const int rows = 64, cols = 256;
    const float eps = 1e-5f;
    const std::vector<float> x = random_floats(cols, rng), residual = random_floats(rows, rng, 2.0f),
                             weight = random_floats(rows, rng);
    unsigned counter = 0;
    int fused = 0, separate = 0;
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                          GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                          GgmlType::Q5_K, GgmlType::Q6_K}) {
        CAPTURE(std::string(ggml_type_name(type)));
        const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        for (bool int8 : {false, true}) {
            if (int8 && !cuda::matvec_q8_supports(type)) continue;
            std::vector<uint8_t> xq_buf;
            if (int8) {
                xq_buf.resize(cuda::q8_activation_row_bytes(type, cols));
                cuda::quantize_activations(type, x.data(), cols, 1, xq_buf.data(), nullptr);
            }
            const void* xq = int8 ? xq_buf.data() : nullptr;
            // Q8_1 output for the next matvec (a Q4_0 one).
            const size_t out_q8 = cuda::q8_activation_row_bytes(GgmlType::Q4_0, rows);
            for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Direct, cuda::MatvecLoads::Staged}) {
                CAPTURE(int8);
                CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                std::vector<float> want_y(rows, kNaN), want_x = residual, want_out(rows, kNaN);
                std::vector<uint8_t> want_q(out_q8, 0xA5);
                cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), 1, want_y.data(), nullptr, 0, loads, xq);
                cuda::add_rms_norm(want_x.data(), want_y.data(), weight.data(), want_out.data(), 1, rows, eps, nullptr,
                                   GgmlType::Q4_0, want_q.data());
                std::vector<float> y(rows, kNaN), xs = residual, out(rows, kNaN);
                std::vector<uint8_t> q(out_q8, 0xA5);
                const cuda::AddRmsNormArgs args{xs.data(), weight.data(), out.data(), eps, GgmlType::Q4_0, q.data()};
                const bool in_launch = cuda::matvec_norm_in_launch(type, xq, rows, 1, y.data(), args);
                CHECK(in_launch == !(type == GgmlType::Q5_K || (int8 && type == GgmlType::Q6_K)));
                (in_launch ? fused : separate) += 1;
                void* stream = tandem::emu::stream_create();
                tandem::emu::begin_capture(stream);
                cuda::matvec_add_rms_norm(type, W.data(), row_bytes, rows, cols, x.data(), 1, y.data(), stream, loads,
                                          xq, args, &counter);
                const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
                tandem::emu::stream_destroy(stream);
                CHECK(graph.nodes.size() == (in_launch ? 1u : 2u));
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    INFO("thread order " << std::string(order_name(o)));
                    std::fill(y.begin(), y.end(), kNaN);
                    std::fill(out.begin(), out.end(), kNaN);
                    std::fill(q.begin(), q.end(), 0xA5);
                    xs = residual;
                    cuda::matvec_add_rms_norm(type, W.data(), row_bytes, rows, cols, x.data(), 1, y.data(), nullptr,
                                              loads, xq, args, &counter);
                    CHECK(std::memcmp(y.data(), want_y.data(), rows * 4) == 0);
                    CHECK(std::memcmp(xs.data(), want_x.data(), rows * 4) == 0);
                    CHECK(std::memcmp(out.data(), want_out.data(), rows * 4) == 0);
                    CHECK(q == want_q);
                    CHECK(counter == 0u);
                }
            }
        }
    }
    CHECK(fused == 2 * (13 + 10) - 2 * 3);
    CHECK(separate == 2 * 3);
}
