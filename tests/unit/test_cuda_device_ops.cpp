// The op table through device memory: matvec, the prefill GEMM, the fp16 route (cuBLAS in the nvcc build), the
// embedding gather and restricted logits' matvecs (first rows into wider rows, rows by id) for every weight type,
// with inputs uploaded, outputs poisoned on the device and downloaded, each compared with a double-precision
// reference over the CPU's dequantized rows (or, for the restricted matvecs, bitwise with the whole matvec). Written
// only against kernels/device.h so that one source runs both ways: in tandem_tests on the emulation (small shapes,
// CI) and in tandem_cuda_device_tests on a real GPU (scripts/gpu-check), where the shapes are those of real models,
// odd row counts included, and cuBLAS takes the fp16 route.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/thread_pool.h"
#include "device.h"
#include "gguf/ggml_types.h"
#include "kernels.h"
#include "random_blocks.h"

using namespace tandem;

namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Shapes: (rows, cols). On the emulation every warp is fibers, so the shapes stay small there.
struct Shape {
    int rows, cols;
};
std::vector<Shape> shapes() {
    if (cuda::device_is_emulated()) return {{37, 256}, {64, 512}};
    return {{1536, 1536}, {8960 + 3, 1536}, {1539, 8960}, {32000, 2048}};
}

// The host's share of the suite, spread over its cores: on a GPU machine the random weights and the double
// references at real-model shapes are most of the run (the matvec case's alone took 43 s on one core of a 2-core
// development machine), and that machine's minutes are few. f(i) runs once for each i < n.
template <class F>
void parallel_for(int n, F&& f) {
    static cpu::ThreadPool pool(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) f(static_cast<int>(i));
    });
}

// test::random_weight_rows in chunks of rows generated in parallel, each from its own seed drawn from rng in order:
// the same weights for the same rng state, whatever the number of cores.
std::vector<uint8_t> random_weights(GgmlType type, int rows, int cols, std::mt19937& rng) {
    constexpr int kChunkRows = 256;
    const int n_chunks = (rows + kChunkRows - 1) / kChunkRows;
    std::vector<uint32_t> seeds(static_cast<size_t>(n_chunks));
    for (uint32_t& seed : seeds) seed = static_cast<uint32_t>(rng());
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
    parallel_for(n_chunks, [&](int c) {
        std::mt19937 chunk_rng(seeds[static_cast<size_t>(c)]);
        const int first = c * kChunkRows, n = std::min(kChunkRows, rows - first);
        const std::vector<uint8_t> part = test::random_weight_rows(type, n, cols, chunk_rng);
        std::memcpy(out.data() + static_cast<size_t>(first) * row_bytes, part.data(), part.size());
    });
    return out;
}

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    cuda::DeviceBuffer d(v.size() * sizeof(T));
    cuda::copy_to_device(d.get(), v.data(), d.size(), nullptr);
    return d;
}

// A device buffer of n floats, every byte 0xFF (a NaN pattern), so an element the kernel does not write fails.
cuda::DeviceBuffer poisoned_floats(size_t n) {
    cuda::DeviceBuffer d(n * sizeof(float));
    cuda::device_memset(d.get(), 0xFF, d.size(), nullptr);
    return d;
}

std::vector<float> download(const cuda::DeviceBuffer& d) {
    std::vector<float> v(d.size() / sizeof(float));
    cuda::copy_to_host(v.data(), d.get(), d.size(), nullptr);
    cuda::stream_synchronize(nullptr);
    return v;
}

// Which tokens of an n-token product the double reference checks: all of them on the emulation; on a GPU, where
// the products are large and the reference runs on one CPU core, the first two, one in the middle and the last.
std::vector<int> checked_tokens(int n) {
    std::vector<int> picks;
    if (cuda::device_is_emulated() || n <= 4) {
        for (int t = 0; t < n; ++t) picks.push_back(t);
    } else {
        picks = {0, 1, n / 2, n - 1};
    }
    return picks;
}

// The rows of `y` ([n][rows]) that `picks` names, in that order.
std::vector<float> picked_rows(const std::vector<float>& y, const std::vector<int>& picks, int rows) {
    std::vector<float> out;
    for (int t : picks) out.insert(out.end(), y.begin() + static_cast<ptrdiff_t>(t) * rows, y.begin() + static_cast<ptrdiff_t>(t + 1) * rows);
    return out;
}

// y[t][r] in double from the CPU's dequantized rows for the tokens t in `picks` ([picks.size()][rows]); x optionally
// rounded to fp16 first (the fp16 route), and the weights too (`w_fp16`).
std::vector<double> reference(GgmlType type, const std::vector<uint8_t>& W, int rows, int cols,
                              const std::vector<float>& x, const std::vector<int>& picks, bool x_fp16, bool w_fp16) {
    const int n_tokens = static_cast<int>(picks.size());
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<float> xr = x;
    if (x_fp16)
        for (float& v : xr) v = cpu::fp16_to_fp32(cpu::fp32_to_fp16(v));
    std::vector<double> y(static_cast<size_t>(n_tokens) * rows);
    constexpr int kChunkRows = 64;
    parallel_for((rows + kChunkRows - 1) / kChunkRows, [&](int c) {
        std::vector<float> w(static_cast<size_t>(cols));
        for (int r = c * kChunkRows; r < std::min(rows, (c + 1) * kChunkRows); ++r) {
            cpu::dequantize_row(type, W.data() + static_cast<size_t>(r) * row_bytes, w.data(), cols);
            if (w_fp16)
                for (float& v : w) v = cpu::fp16_to_fp32(cpu::fp32_to_fp16(v));
            for (int t = 0; t < n_tokens; ++t) {
                double acc = 0;
                const float* xt = &xr[static_cast<size_t>(picks[t]) * cols];
                for (int k = 0; k < cols; ++k) acc += static_cast<double>(w[k]) * xt[k];
                y[static_cast<size_t>(t) * rows + r] = acc;
            }
        }
    });
    return y;
}

// ||got - want|| / ||want||, and whether every element is finite.
double relative_error(const std::vector<float>& got, const std::vector<double>& want, bool& all_finite) {
    double err = 0, ref = 0;
    all_finite = true;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) all_finite = false;
        err += (got[i] - want[i]) * (got[i] - want[i]);
        ref += want[i] * want[i];
    }
    return std::sqrt(err / std::max(ref, 1e-300));
}

}  // namespace

TEST_CASE("cuda ops through device memory: matvec and the prefill GEMM for every type against a double reference") {
    std::mt19937 rng(101);
    for (GgmlType type : kAllTypes) {
        for (const Shape& s : shapes()) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(s.rows);
            CAPTURE(s.cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(s.cols));
            const std::vector<uint8_t> W = random_weights(type, s.rows, s.cols, rng);
            const cuda::DeviceBuffer dW = upload(W);
            const int gemm_tokens = cuda::device_is_emulated() ? 5 : 77;
            const int n_x = std::max(gemm_tokens, 16);  // the matvec calls below take up to 16 tokens
            const std::vector<float> x = test::random_floats(static_cast<int64_t>(n_x) * s.cols, rng);
            const cuda::DeviceBuffer dx = upload(x);
            std::vector<int> first16(16);
            for (int t = 0; t < 16; ++t) first16[t] = t;
            const std::vector<double> ref16 = reference(type, W, s.rows, s.cols, x, first16, false, false);
            std::vector<float> split_alone;
            for (int n : {1, 3, 16}) {
                CAPTURE(n);
                cuda::DeviceBuffer dy = poisoned_floats(static_cast<size_t>(n) * s.rows);
                cuda::matvec(type, dW.get(), row_bytes, s.rows, s.cols, dx.as<float>(), n, dy.as<float>(), nullptr);
                const std::vector<float> y = download(dy);
                bool finite = false;
                const double e = relative_error(y, std::vector<double>(ref16.begin(), ref16.begin() + y.size()), finite);
                CHECK(finite);
                CHECK(e < 1e-5);  // fp32 sums of exactly dequantized products
                // Staged loads (--cuda-route matvec=staged) and the persistent grid (=persistent; on a GPU, blocks
                // walking several block-rows where the matrix has more rows than fit at once): bitwise the same sums.
                for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Staged, cuda::MatvecLoads::Persistent}) {
                    CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                    cuda::DeviceBuffer ds = poisoned_floats(static_cast<size_t>(n) * s.rows);
                    cuda::matvec(type, dW.get(), row_bytes, s.rows, s.cols, dx.as<float>(), n, ds.as<float>(), nullptr,
                                 0, loads);
                    const std::vector<float> ys = download(ds);
                    CHECK(std::memcmp(ys.data(), y.data(), y.size() * 4) == 0);
                }
                // Split rows (--cuda-route matvec=split; the float types load directly): another fixed order, as
                // close to the reference; the first token's sums bitwise those of the token alone (n = 1, the first
                // pass, kept in split_alone).
                cuda::DeviceBuffer dp = poisoned_floats(static_cast<size_t>(n) * s.rows);
                cuda::matvec(type, dW.get(), row_bytes, s.rows, s.cols, dx.as<float>(), n, dp.as<float>(), nullptr, 0,
                             cuda::MatvecLoads::Split);
                const std::vector<float> yp = download(dp);
                const double ep =
                    relative_error(yp, std::vector<double>(ref16.begin(), ref16.begin() + yp.size()), finite);
                CHECK(finite);
                CHECK(ep < 1e-5);
                if (n == 1) split_alone = yp;
                REQUIRE(split_alone.size() == static_cast<size_t>(s.rows));
                CHECK(std::memcmp(yp.data(), split_alone.data(), split_alone.size() * 4) == 0);  // token 0's rows
            }
            const std::vector<int> picks = checked_tokens(gemm_tokens);
            const std::vector<double> ref = reference(type, W, s.rows, s.cols, x, picks, false, false);
            cuda::DeviceBuffer dy = poisoned_floats(static_cast<size_t>(gemm_tokens) * s.rows);
            cuda::gemm(type, dW.get(), row_bytes, s.rows, s.cols, dx.as<float>(), gemm_tokens, dy.as<float>(), nullptr);
            bool finite = false;
            const double e = relative_error(picked_rows(download(dy), picks, s.rows), ref, finite);
            CHECK(finite);
            CHECK(e < 1e-5);
        }
    }
}

TEST_CASE("cuda ops through device memory: persistent matvec blocks give bitwise the direct sums, SwiGLU and 8-bit too") {
    // --cuda-route matvec=persistent launches the blocks the device holds at once, each walking block-rows one after
    // another; with the SwiGLU epilogue its up sums alternate between two shared buffers, a race only real
    // concurrency could show (on a GPU these shapes give every block several block-rows: a 1.5B model's FFN, 8,960
    // rows of gate and up, and Q/K/V-like targets). Both activations; every row against the direct kernel's bits.
    std::mt19937 rng(71);
    const int rows = cuda::device_is_emulated() ? 37 : 8960, cols = cuda::device_is_emulated() ? 256 : 1536;
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        CAPTURE(std::string(ggml_type_name(type)));
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        const cuda::DeviceBuffer gate = upload(random_weights(type, rows, cols, rng));
        const cuda::DeviceBuffer up = upload(random_weights(type, rows, cols, rng));
        for (int n : {1, 5}) {
            CAPTURE(n);
            const cuda::DeviceBuffer dx = upload(test::random_floats(static_cast<int64_t>(n) * cols, rng));
            cuda::DeviceBuffer dxq(cuda::q8_activation_row_bytes(type, cols) * n);
            cuda::quantize_activations(type, dx.as<float>(), cols, n, dxq.get(), nullptr);
            for (bool int8 : {false, true}) {
                CAPTURE(int8);
                const void* xq = int8 ? dxq.get() : nullptr;
                const auto run = [&](cuda::MatvecLoads loads) {
                    cuda::DeviceBuffer g = poisoned_floats(static_cast<size_t>(n) * rows);
                    cuda::DeviceBuffer qkv = poisoned_floats(static_cast<size_t>(n) * rows);
                    cuda::DeviceBuffer k = poisoned_floats(static_cast<size_t>(n) * rows);
                    cuda::matvec_swiglu(type, gate.get(), up.get(), row_bytes, rows, cols, dx.as<float>(), n,
                                        g.as<float>(), nullptr, loads, xq);
                    const cuda::MatvecTarget targets[] = {{gate.get(), row_bytes, rows, qkv.as<float>(), nullptr},
                                                          {up.get(), row_bytes, rows, k.as<float>(), nullptr}};
                    cuda::matvec_multi(type, targets, 2, cols, dx.as<float>(), n, nullptr, loads, xq);
                    return std::vector<std::vector<float>>{download(g), download(qkv), download(k)};
                };
                const std::vector<std::vector<float>> want = run(cuda::MatvecLoads::Direct);
                const std::vector<std::vector<float>> got = run(cuda::MatvecLoads::Persistent);
                for (size_t i = 0; i < want.size(); ++i) {
                    CAPTURE(i);  // SwiGLU, gate, up
                    for (float v : want[i]) REQUIRE(std::isfinite(v));
                    CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4) == 0);
                }
            }
        }
    }
}

TEST_CASE("cuda ops through device memory: Q/K/V of two types in one launch give bitwise each type's own launch") {
    // The pairs of llama.cpp's Q4_K_M mixture (kernels.h matvec_types_fuse) at the default models' Q/K/V shapes on a
    // GPU (Qwen2.5-1.5B: Q4_K Q and K beside a Q6_K V, 1536 wide; the 0.5B draft: Q5_0 beside Q8_0, 896 wide),
    // small ones on the emulation: matvec_multi of the three against Q and K in one launch and V in another, with
    // biases, both activation routes, direct and split rows (staged and persistent run a pair on the direct kernel).
    std::mt19937 rng(79);
    const bool emulated = cuda::device_is_emulated();
    struct Shape {
        GgmlType type, last;
        int cols, q_rows, kv_rows;
    };
    for (const Shape& sh : {Shape{GgmlType::Q4_K, GgmlType::Q6_K, emulated ? 256 : 1536, emulated ? 24 : 1536,
                                  emulated ? 8 : 256},
                            Shape{GgmlType::Q5_0, GgmlType::Q8_0, emulated ? 96 : 896, emulated ? 24 : 896,
                                  emulated ? 8 : 128}}) {
        CAPTURE(std::string(ggml_type_name(sh.type)));
        const int rows[] = {sh.q_rows, sh.kv_rows, sh.kv_rows};
        std::vector<cuda::DeviceBuffer> W, bias;
        size_t row_bytes[3];
        for (int i = 0; i < 3; ++i) {
            const GgmlType t = i == 2 ? sh.last : sh.type;
            row_bytes[i] = ggml_row_bytes(t, static_cast<uint64_t>(sh.cols));
            W.push_back(upload(random_weights(t, rows[i], sh.cols, rng)));
            bias.push_back(upload(test::random_floats(rows[i], rng)));
        }
        for (int n : {1, 5}) {
            CAPTURE(n);
            const cuda::DeviceBuffer dx = upload(test::random_floats(static_cast<int64_t>(n) * sh.cols, rng));
            cuda::DeviceBuffer dxq(cuda::q8_activation_row_bytes(sh.type, sh.cols) * n);
            cuda::quantize_activations(sh.type, dx.as<float>(), sh.cols, n, dxq.get(), nullptr);
            for (bool int8 : {false, true})
                for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Direct, cuda::MatvecLoads::Split}) {
                    CAPTURE(int8);
                    CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                    const void* xq = int8 ? dxq.get() : nullptr;
                    const auto run = [&](bool one_launch) {
                        std::vector<cuda::DeviceBuffer> y;
                        std::vector<cuda::MatvecTarget> t;
                        for (int i = 0; i < 3; ++i) {
                            y.push_back(poisoned_floats(static_cast<size_t>(n) * rows[i]));
                            t.push_back({W[i].get(), row_bytes[i], rows[i], y.back().as<float>(), bias[i].as<float>()});
                        }
                        if (one_launch) {
                            cuda::matvec_multi({sh.type, sh.last}, t.data(), 3, sh.cols, dx.as<float>(), n, nullptr,
                                               loads, xq);
                        } else {
                            cuda::matvec_multi(sh.type, t.data(), 2, sh.cols, dx.as<float>(), n, nullptr, loads, xq);
                            cuda::matvec_multi(sh.last, t.data() + 2, 1, sh.cols, dx.as<float>(), n, nullptr, loads,
                                               xq);
                        }
                        std::vector<std::vector<float>> out;
                        for (const cuda::DeviceBuffer& b : y) out.push_back(download(b));
                        return out;
                    };
                    const std::vector<std::vector<float>> want = run(false), got = run(true);
                    for (size_t i = 0; i < want.size(); ++i) {
                        CAPTURE(i);  // Q, K, V
                        for (float v : want[i]) REQUIRE(std::isfinite(v));
                        CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4) == 0);
                    }
                }
        }
    }
}

TEST_CASE("cuda ops through device memory: matvec_swiglu's in-launch quantization matches a quantize launch byte for byte") {
    // On the 8-bit route with staged or persistent loads the last block to write an activation block's SwiGLU rows
    // quantizes them (an atomic count and __threadfence on each side: a missing fence, or a stale L1 line of rows
    // another SM wrote, shows only on a GPU). At a 1.5B model's FFN there (8,960 rows: 280 Q8_1 blocks), against the
    // direct kernel's output quantized by quantize_activations; the counters zero after. (Q4_K gate/up with a Q4_0
    // ffn_down: the Q8_1 output from the Q4_K kernels.)
    std::mt19937 rng(73);
    const int rows = cuda::device_is_emulated() ? 64 : 8960, cols = cuda::device_is_emulated() ? 256 : 1536;
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_K}) {
        CAPTURE(std::string(ggml_type_name(type)));
        const GgmlType next = GgmlType::Q4_0;
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        const cuda::DeviceBuffer gate = upload(random_weights(type, rows, cols, rng));
        const cuda::DeviceBuffer up = upload(random_weights(type, rows, cols, rng));
        cuda::DeviceBuffer counters(cuda::matvec_swiglu_counters(rows) * sizeof(unsigned));
        cuda::device_memset(counters.get(), 0, counters.size(), nullptr);
        for (int n : {1, 5}) {
            CAPTURE(n);
            const cuda::DeviceBuffer dx = upload(test::random_floats(static_cast<int64_t>(n) * cols, rng));
            cuda::DeviceBuffer dxq(cuda::q8_activation_row_bytes(type, cols) * n);
            cuda::quantize_activations(type, dx.as<float>(), cols, n, dxq.get(), nullptr);
            const size_t q_bytes = cuda::q8_activation_row_bytes(next, rows) * n;
            cuda::DeviceBuffer want = poisoned_floats(static_cast<size_t>(n) * rows);
            cuda::DeviceBuffer want_q = poisoned_floats(q_bytes / 4);
            cuda::matvec_swiglu(type, gate.get(), up.get(), row_bytes, rows, cols, dx.as<float>(), n, want.as<float>(),
                                nullptr, cuda::MatvecLoads::Direct, dxq.get());
            cuda::quantize_activations(next, want.as<float>(), rows, n, want_q.get(), nullptr);
            for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Staged, cuda::MatvecLoads::Persistent}) {
                CAPTURE(std::string(cuda::matvec_loads_name(loads)));
                cuda::DeviceBuffer got = poisoned_floats(static_cast<size_t>(n) * rows);
                cuda::DeviceBuffer got_q = poisoned_floats(q_bytes / 4);
                cuda::matvec_swiglu(type, gate.get(), up.get(), row_bytes, rows, cols, dx.as<float>(), n,
                                    got.as<float>(), nullptr, loads, dxq.get(),
                                    {next, got_q.get(), counters.as<unsigned>()});
                const std::vector<float> y = download(got), y_want = download(want);
                CHECK(std::memcmp(y.data(), y_want.data(), y.size() * 4) == 0);
                const std::vector<float> q = download(got_q), q_want = download(want_q);
                CHECK(std::memcmp(q.data(), q_want.data(), q.size() * 4) == 0);
                const std::vector<float> c = download(counters);
                CHECK(std::all_of(c.begin(), c.end(), [](float v) { return std::bit_cast<uint32_t>(v) == 0u; }));
            }
        }
    }
}

TEST_CASE("cuda ops through device memory: matvec_add_rms_norm's in-launch norm matches the separate launches byte for byte") {
    // The last block of the attn_output / ffn_down launch adds the rows every block wrote into the residual stream and
    // normalizes them (an atomic count and __threadfence on each side: a missing fence, or a stale L1 line of rows
    // another SM wrote, shows only on a GPU). At a 1.5B model's ffn_down (1,536 rows of 8,960) and a 7B model's
    // attn_output (4,096 of 4,096) there, on the default pair's routes (Q4_K fp32 direct, Q4_0 8-bit staged, with
    // the Q8_1 output for the next matvec), against matvec + add_rms_norm; the counter zero after.
    std::mt19937 rng(97);
    const bool emu = cuda::device_is_emulated();
    const Shape sizes[] = {{emu ? 64 : 1536, emu ? 512 : 8960}, {emu ? 128 : 4096, emu ? 256 : 4096}};
    cuda::DeviceBuffer counter(sizeof(unsigned));
    cuda::device_memset(counter.get(), 0, counter.size(), nullptr);
    for (const Shape& shape : sizes)
        for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q4_0}) {
            const int rows = shape.rows, cols = shape.cols;
            CAPTURE(rows);
            CAPTURE(std::string(ggml_type_name(type)));
            const bool int8 = type == GgmlType::Q4_0;
            const cuda::MatvecLoads loads = int8 ? cuda::MatvecLoads::Staged : cuda::MatvecLoads::Direct;
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const cuda::DeviceBuffer W = upload(random_weights(type, rows, cols, rng));
            const cuda::DeviceBuffer dx = upload(test::random_floats(cols, rng));
            const std::vector<float> residual = test::random_floats(rows, rng);
            const cuda::DeviceBuffer weight = upload(test::random_floats(rows, rng));
            cuda::DeviceBuffer dxq(cuda::q8_activation_row_bytes(type, cols));
            cuda::quantize_activations(type, dx.as<float>(), cols, 1, dxq.get(), nullptr);
            const void* xq = int8 ? dxq.get() : nullptr;
            const size_t q_floats = int8 ? cuda::q8_activation_row_bytes(GgmlType::Q4_0, rows) / 4 : 1;
            const auto run = [&](bool fused, cuda::DeviceBuffer& y, cuda::DeviceBuffer& x, cuda::DeviceBuffer& out,
                                 cuda::DeviceBuffer& q) {
                const cuda::AddRmsNormArgs args{x.as<float>(), weight.as<float>(), out.as<float>(), 1e-6f,
                                                int8 ? GgmlType::Q4_0 : GgmlType::F32, int8 ? q.get() : nullptr};
                if (fused) {
                    REQUIRE(cuda::matvec_norm_in_launch(type, xq, rows, 1, y.as<float>(), args));
                    cuda::matvec_add_rms_norm(type, W.get(), row_bytes, rows, cols, dx.as<float>(), 1, y.as<float>(),
                                              nullptr, loads, xq, args, counter.as<unsigned>());
                } else {
                    cuda::matvec(type, W.get(), row_bytes, rows, cols, dx.as<float>(), 1, y.as<float>(), nullptr, 0,
                                 loads, xq);
                    cuda::add_rms_norm(args.x, y.as<float>(), args.weight, args.out, 1, rows, args.eps, nullptr,
                                       args.q8_for, args.xq);
                }
            };
            cuda::DeviceBuffer y0 = poisoned_floats(rows), x0 = upload(residual), out0 = poisoned_floats(rows),
                               q0 = poisoned_floats(q_floats);
            cuda::DeviceBuffer y1 = poisoned_floats(rows), x1 = upload(residual), out1 = poisoned_floats(rows),
                               q1 = poisoned_floats(q_floats);
            run(false, y0, x0, out0, q0);
            run(true, y1, x1, out1, q1);
            for (auto [a, b] : {std::pair{&y0, &y1}, {&x0, &x1}, {&out0, &out1}, {&q0, &q1}}) {
                const std::vector<float> want = download(*a), got = download(*b);
                CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
            }
            const std::vector<float> c = download(counter);
            CHECK(std::bit_cast<uint32_t>(c[0]) == 0u);
        }
}

TEST_CASE("cuda ops through device memory: the int8 tensor-core GEMM for every type it takes against a double reference") {
    // gemm_q8 on device buffers: on a GPU, the real mma.sync with the fragment layout the emulation assumes (a wrong
    // layout pairs codes of different rows and k, an error of order 1). Quantizing x to 8 bits moves the products
    // 5e-3 to 8e-3 of their norm here (emulated shapes); the bound leaves room for that, not for a misplaced code.
    std::mt19937 rng(103);
    for (GgmlType type : kAllTypes) {
        if (!cuda::gemm_q8_supports(type)) continue;
        for (const Shape& s : shapes()) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(s.rows);
            CAPTURE(s.cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(s.cols));
            const int n = cuda::device_is_emulated() ? 5 : 77;
            const std::vector<uint8_t> W = random_weights(type, s.rows, s.cols, rng);
            const std::vector<float> x = test::random_floats(static_cast<int64_t>(n) * s.cols, rng);
            const cuda::DeviceBuffer dW = upload(W), dx = upload(x);
            cuda::DeviceBuffer dxq(cuda::q8_activation_row_bytes(GgmlType::Q8_0, s.cols) * n);
            cuda::quantize_activations(GgmlType::Q8_0, dx.as<float>(), s.cols, n, dxq.get(), nullptr);
            cuda::DeviceBuffer dy = poisoned_floats(static_cast<size_t>(n) * s.rows);
            cuda::gemm_q8(type, dW.get(), row_bytes, s.rows, s.cols, dxq.get(), n, dy.as<float>(), nullptr);
            const std::vector<int> picks = checked_tokens(n);
            const std::vector<double> ref = reference(type, W, s.rows, s.cols, x, picks, false, false);
            bool finite = false;
            const double e = relative_error(picked_rows(download(dy), picks, s.rows), ref, finite);
            CHECK(finite);
            CHECK(e < 2e-2);
        }
    }
}

TEST_CASE("cuda ops through device memory: the fp16 GEMM route (cuBLAS on a GPU) against fp16-rounded operands") {
    std::mt19937 rng(102);
    const cuda::Stream stream = cuda::stream_create();
    cuda::BlasHandle* blas = cuda::blas_available() ? cuda::blas_create(stream) : nullptr;
    const std::string route = blas ? "fp16 route on cuBLAS" : "fp16 route on the SIMT mirror of cuBLAS";
    MESSAGE(route);
    // On a GPU the route must be cuBLAS (loaded with dlopen): a library that failed to load would otherwise pass
    // unnoticed through the SIMT mirror.
    if (!cuda::device_is_emulated()) CHECK_MESSAGE(blas != nullptr, "cuBLAS could not be loaded on a real device");
    for (GgmlType type : kAllTypes) {
        for (const Shape& s : shapes()) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(s.rows);
            CAPTURE(s.cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(s.cols));
            const int n = cuda::device_is_emulated() ? 6 : 300;
            const std::vector<uint8_t> W = random_weights(type, s.rows, s.cols, rng);
            const std::vector<float> x = test::random_floats(static_cast<int64_t>(n) * s.cols, rng);
            const cuda::DeviceBuffer dW = upload(W), dx = upload(x);
            cuda::DeviceBuffer dx16(x.size() * 2);
            cuda::convert_f16(dx.as<float>(), x.size(), dx16.as<uint16_t>(), stream);
            // A tile smaller than the matrix, so that the route walks several tiles (and a partial last one).
            const size_t tile_elems = static_cast<size_t>(s.cols) * (s.rows / 3 + 1);
            cuda::DeviceBuffer tile(tile_elems * 2);
            cuda::DeviceBuffer dy(static_cast<size_t>(n) * s.rows * 4);
            cuda::device_memset(dy.get(), 0xFF, dy.size(), stream);
            cuda::gemm_via_f16(blas, type, dW.get(), row_bytes, s.rows, s.cols, dx.as<float>(), dx16.as<uint16_t>(), n,
                               dy.as<float>(), tile.as<uint16_t>(), tile_elems, stream);
            cuda::stream_synchronize(stream);
            // F32 weights and their activations stay fp32 (an fp32 GEMM); everything else is fp16 x fp16.
            const bool f32 = type == GgmlType::F32;
            const std::vector<int> picks = checked_tokens(n);
            const std::vector<double> ref = reference(type, W, s.rows, s.cols, x, picks, !f32, !f32);
            bool finite = false;
            const double e = relative_error(picked_rows(download(dy), picks, s.rows), ref, finite);
            MESSAGE(std::string(ggml_type_name(type)), " ", s.rows, "x", s.cols, ": relative error ", e);
            CHECK(finite);
            // fp32 accumulation of exact products; TF32 (cuBLAS may pick it for fp32) is ~3e-4.
            CHECK(e < (f32 && blas ? 1e-3 : 1e-5));
        }
    }
    cuda::blas_destroy(blas);
    cuda::stream_destroy(stream);
}

// Within one rounding of the row's largest value: nvcc may fuse a dequantization's multiply and subtract into one
// fma, the host compiler does not.
TEST_CASE("cuda ops through device memory: embedding rows of every type are the CPU's dequantized rows") {
    std::mt19937 rng(103);
    for (GgmlType type : kAllTypes) {
        CAPTURE(std::string(ggml_type_name(type)));
        const int n_vocab = cuda::device_is_emulated() ? 50 : 32000, dim = cuda::device_is_emulated() ? 256 : 2048;
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(dim));
        const std::vector<uint8_t> table = random_weights(type, n_vocab, dim, rng);
        const std::vector<int> tokens = {0, n_vocab - 1, 7, 7, n_vocab / 2};
        const cuda::DeviceBuffer dt = upload(table), dtok = upload(tokens);
        cuda::DeviceBuffer out = poisoned_floats(tokens.size() * dim);
        cuda::embedding(type, dt.get(), row_bytes, n_vocab, dim, dtok.as<int>(), static_cast<int>(tokens.size()),
                        out.as<float>(), nullptr);
        const std::vector<float> got = download(out);
        std::vector<float> want(static_cast<size_t>(dim));
        for (size_t i = 0; i < tokens.size(); ++i) {
            cpu::dequantize_row(type, table.data() + static_cast<size_t>(tokens[i]) * row_bytes, want.data(), dim);
            float amax = 0;
            for (float v : want) amax = std::max(amax, std::abs(v));
            int bad = 0;
            for (int e = 0; e < dim; ++e)
                if (!(std::abs(got[i * dim + e] - want[e]) <= 1e-6f * amax)) ++bad;
            CHECK(bad == 0);
        }
    }
}

// Restricted logits (CudaBackend::restrict_logits): the first rows of the output matrix written into rows as wide
// as the vocabulary, the extra ids' rows picked by id, -inf over the rest. Every value computed must be the bit
// pattern of the whole matvec's, and nothing else written.
TEST_CASE("cuda ops through device memory: matvec into wider rows, matvec_rows and the column fill") {
    std::mt19937 rng(107);
    for (GgmlType type : kAllTypes) {
        CAPTURE(std::string(ggml_type_name(type)));
        const int rows = cuda::device_is_emulated() ? 37 : 32003, cols = cuda::device_is_emulated() ? 256 : 2048;
        const int first = rows / 3;
        const size_t stride = static_cast<size_t>(rows) + 5;  // past the matrix's rows: must stay untouched too
        const std::vector<int> picked = {rows - 1, first, rows - 2, first + 3};  // unsorted, as any order works
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        const std::vector<uint8_t> W = random_weights(type, rows, cols, rng);
        const cuda::DeviceBuffer dW = upload(W), dpicked = upload(picked);
        for (int n : {1, 5, 13}) {
            CAPTURE(n);
            const cuda::DeviceBuffer dx = upload(test::random_floats(static_cast<int64_t>(n) * cols, rng));
            cuda::DeviceBuffer dwhole = poisoned_floats(static_cast<size_t>(n) * rows);
            cuda::matvec(type, dW.get(), row_bytes, rows, cols, dx.as<float>(), n, dwhole.as<float>(), nullptr);
            cuda::DeviceBuffer dy = poisoned_floats(static_cast<size_t>(n) * stride);
            cuda::matvec(type, dW.get(), row_bytes, first, cols, dx.as<float>(), n, dy.as<float>(), nullptr, stride);
            cuda::matvec_rows(type, dW.get(), row_bytes, cols, dpicked.as<int>(), static_cast<int>(picked.size()),
                              dx.as<float>(), n, dy.as<float>(), stride, nullptr);
            const std::vector<float> whole = download(dwhole), y = download(dy);
            int same = 0, untouched = 0;
            for (int t = 0; t < n; ++t)
                for (size_t r = 0; r < stride; ++r) {
                    const float got = y[t * stride + r];
                    if (r < static_cast<size_t>(first) || std::count(picked.begin(), picked.end(), r) > 0)
                        same += std::memcmp(&got, &whole[static_cast<size_t>(t) * rows + r], sizeof got) == 0;
                    else
                        untouched += std::isnan(got);
                }
            CHECK(same == n * (first + static_cast<int>(picked.size())));
            CHECK(untouched == n * (static_cast<int>(stride) - first - static_cast<int>(picked.size())));
        }
    }
    // The fill: columns [begin, end) of every row, nothing else.
    const int n_rows = 3, begin = 5, end = 41;
    const size_t stride = 48;
    cuda::DeviceBuffer d = poisoned_floats(n_rows * stride);
    cuda::fill_columns(d.as<float>(), n_rows, stride, begin, end, -INFINITY, nullptr);
    const std::vector<float> got = download(d);
    int filled = 0, untouched = 0;
    for (int r = 0; r < n_rows; ++r)
        for (size_t j = 0; j < stride; ++j) {
            const float v = got[r * stride + j];
            if (j >= static_cast<size_t>(begin) && j < static_cast<size_t>(end)) filled += v == -INFINITY;
            else untouched += std::isnan(v);
        }
    CHECK(filled == n_rows * (end - begin));
    CHECK(untouched == n_rows * (static_cast<int>(stride) - (end - begin)));
    CHECK_THROWS_AS(cuda::fill_columns(d.as<float>(), 1, 8, 2, 9, 0.0f, nullptr), std::invalid_argument);
}
