// Tests of the CUDA kernels (kernels/*.cu) run on the CPU emulation, each against a CPU reference: RMSNorm (+fused
// residual), SwiGLU, matvec for every weight type, RoPE + KV-cache write, embedding gather, split-K attention, the
// prefill GEMM for every weight type, the fp16 route (dequantize / convert to fp16, the SIMT mirror of the cuBLAS
// GEMM), tiled flash attention for prefill chunks, and the Q8_0 KV cache (its write and both attention kernels).
// Every shape runs in at least two thread orders, and every output buffer starts as NaN so that an element the
// kernel forgot to write fails the comparison. The matvec launches' epilogues (SwiGLU's quantize, RoPE, the residual
// add and RMSNorm in the launch) have their own file, test_cuda_matvec_epilogues.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "device.h"
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

const std::vector<LaunchOptions> kOrders = {{ThreadOrder::Forward, 0}, {ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 7}};
const std::vector<LaunchOptions> kTwoOrders = {{ThreadOrder::Reverse, 0}, {ThreadOrder::Shuffled, 11}};

using kernel_test::inv_freqs;
using kernel_test::kNaN;
using kernel_test::order_name;
using kernel_test::random_floats;

// |got - want| <= tol * max(|want|, floor) for every element, and no NaN. One CHECK per call, naming the first bad
// element, so that a failing thread order does not hide the others.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol, double floor = 1e-6) {
    REQUIRE(got.size() == want.size());
    size_t bad = got.size();
    for (size_t i = 0; i < got.size() && bad == got.size(); ++i)
        if (std::isnan(got[i]) || std::abs(got[i] - want[i]) > tol * std::max(std::abs(want[i]), floor)) bad = i;
    CHECK_MESSAGE(bad == got.size(), "element ", bad, ": got ", bad < got.size() ? got[bad] : 0.0f, ", want ",
                  bad < got.size() ? want[bad] : 0.0);
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        err += (got[i] - want[i]) * (got[i] - want[i]);
        ref += want[i] * want[i];
    }
    return ref > 0.0 ? err / ref : err;
}

// The CPU backend's RMSNorm, operation for operation (cpu_backend.cpp keeps its copy file-local).
void cpu_rms_norm(float* out, const float* x, const float* w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    ss /= static_cast<float>(n);
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

}  // namespace

TEST_CASE("cuda kernels: rms_norm and add_rms_norm match the CPU backend") {
    std::mt19937 rng(1);
    // Widths of whole float4s up to 16384 take the register kernel (1, 2 and 4 float4s a thread: 1000, 4096, 8192,
    // 16384), any other width or a misaligned row the loop kernel (37, 4099, 16388, and 256 one float past an
    // aligned address).
    struct Shape {
        int rows, cols, offset;
    };
    const Shape shapes[] = {{1, 32, 0}, {3, 37, 0},   {2, 256, 0},    {2, 256, 1},    {5, 1000, 0},
                            {1, 4099, 0}, {2, 4096, 0}, {1, 8192, 0}, {1, 16384, 0}, {1, 16388, 0}};
    for (const Shape& s : shapes) {
        const int rows = s.rows, cols = s.cols;
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(s.offset);
        const size_t n = static_cast<size_t>(rows) * cols;
        const std::vector<float> x_buf = random_floats(n + s.offset, rng, 3.0f);
        const std::vector<float> res_buf = random_floats(n + s.offset, rng);
        const std::vector<float> w_buf = random_floats(cols + s.offset, rng);
        const float *x = x_buf.data() + s.offset, *res = res_buf.data() + s.offset, *w = w_buf.data() + s.offset;
        {  // which kernel the shape takes, read from a captured (never replayed) launch
            std::vector<float> out(n + s.offset);
            void* stream = tandem::emu::stream_create();
            tandem::emu::begin_capture(stream);
            cuda::rms_norm(x, w, out.data() + s.offset, rows, cols, 1e-5f, stream);
            const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
            tandem::emu::stream_destroy(stream);
            const int n4 = cols / 4;
            const bool vec = cols % 4 == 0 && s.offset == 0 && cols <= 16384;
            const std::string want = !vec              ? "rms_norm_kernel<false>"
                                     : n4 <= 1024      ? "rms_norm_vec_kernel<false, 1>"
                                     : n4 <= 2048      ? "rms_norm_vec_kernel<false, 2>"
                                                       : "rms_norm_vec_kernel<false, 4>";
            REQUIRE(graph.nodes.size() == 1);
            CHECK(graph.nodes[0].name == want);
        }
        std::vector<float> ref(n), sum(n);
        for (size_t i = 0; i < n; ++i) sum[i] = x[i] + res[i];
        // Two orders for the widest rows: 1024-thread blocks are slow to emulate.
        for (const LaunchOptions& o : cols > 4096 ? kTwoOrders : kOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> out_buf(n + s.offset, kNaN);
            float* out = out_buf.data() + s.offset;
            cuda::rms_norm(x, w, out, rows, cols, 1e-5f, nullptr);
            for (int r = 0; r < rows; ++r) cpu_rms_norm(&ref[r * cols], &x[r * cols], w, cols, 1e-5f);
            check_close(std::vector<float>(out, out + n), std::vector<double>(ref.begin(), ref.end()), 1e-5, 1e-3);

            std::vector<float> xs_buf = x_buf;
            float* xs = xs_buf.data() + s.offset;
            std::fill(out_buf.begin(), out_buf.end(), kNaN);
            cuda::add_rms_norm(xs, res, w, out, rows, cols, 1e-5f, nullptr);
            CHECK(std::vector<float>(xs, xs + n) == sum);  // the residual add is one rounding: bitwise equal
            for (int r = 0; r < rows; ++r) cpu_rms_norm(&ref[r * cols], &sum[r * cols], w, cols, 1e-5f);
            check_close(std::vector<float>(out, out + n), std::vector<double>(ref.begin(), ref.end()), 1e-5, 1e-3);
        }
    }
}

TEST_CASE("cuda kernels: swiglu matches silu(gate) * up") {
    std::mt19937 rng(2);
    for (int n : {1, 37, 256, 5000}) {
        CAPTURE(n);
        const std::vector<float> g = random_floats(n, rng, 4.0f), u = random_floats(n, rng);
        std::vector<double> ref(n);
        for (int i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> out(n, kNaN);
            cuda::swiglu(g.data(), u.data(), out.data(), n, nullptr);
            check_close(out, ref, 1e-5, 1e-4);
        }
    }
}

TEST_CASE("cuda kernels: matvec matches dequantize_row and vec_dot_scalar for every type") {
    struct Case {
        GgmlType type;
        int rows, cols;
    };
    const Case cases[] = {
        {GgmlType::F32, 5, 37},   {GgmlType::F32, 33, 256},  {GgmlType::F16, 3, 37},   {GgmlType::F16, 9, 160},
        {GgmlType::Q8_0, 5, 96},  {GgmlType::Q8_0, 33, 256}, {GgmlType::Q4_0, 7, 96},  {GgmlType::Q4_0, 8, 512},
        {GgmlType::Q4_K, 3, 256}, {GgmlType::Q4_K, 6, 512},  {GgmlType::Q6_K, 5, 256}, {GgmlType::Q6_K, 4, 512},
        {GgmlType::BF16, 3, 37},  {GgmlType::BF16, 9, 160},  {GgmlType::Q4_1, 5, 96},  {GgmlType::Q4_1, 8, 512},
        {GgmlType::Q5_0, 7, 96},  {GgmlType::Q5_0, 4, 256},  {GgmlType::Q5_1, 5, 96},  {GgmlType::Q5_1, 9, 512},
        {GgmlType::Q2_K, 3, 256}, {GgmlType::Q2_K, 5, 512},  {GgmlType::Q3_K, 5, 256}, {GgmlType::Q3_K, 2, 512},
        {GgmlType::Q5_K, 3, 256}, {GgmlType::Q5_K, 6, 512},
    };
    std::mt19937 rng(3);
    for (const Case& c : cases) {
        CAPTURE(std::string(ggml_type_name(c.type)));
        CAPTURE(c.rows);
        CAPTURE(c.cols);
        REQUIRE(cuda::matvec_supports(c.type));
        const size_t row_bytes = ggml_row_bytes(c.type, static_cast<uint64_t>(c.cols));
        const std::vector<uint8_t> W = test::random_weight_rows(c.type, c.rows, c.cols, rng);
        std::vector<float> dq(static_cast<size_t>(c.rows) * c.cols);
        for (int r = 0; r < c.rows; ++r)
            cpu::dequantize_row(c.type, W.data() + r * row_bytes, &dq[static_cast<size_t>(r) * c.cols], c.cols);
        for (int n : {1, 3, 8, 13, 16}) {
            CAPTURE(n);
            const std::vector<float> x = random_floats(static_cast<size_t>(n) * c.cols, rng);
            std::vector<double> ref(static_cast<size_t>(n) * c.rows), bound(ref.size());
            std::vector<float> cpu_dot(ref.size());
            for (int t = 0; t < n; ++t)
                for (int r = 0; r < c.rows; ++r) {
                    double s = 0.0, a = 0.0;
                    for (int i = 0; i < c.cols; ++i) {
                        const double p = static_cast<double>(dq[static_cast<size_t>(r) * c.cols + i]) * x[t * c.cols + i];
                        s += p;
                        a += std::abs(p);
                    }
                    ref[t * c.rows + r] = s;
                    bound[t * c.rows + r] = a;
                    cpu_dot[t * c.rows + r] =
                        cpu::vec_dot_scalar(c.type, c.cols, W.data() + r * row_bytes, &x[t * c.cols]);
                }
            REQUIRE(nmse(cpu_dot, ref) < 1e-10);  // the reference and the CPU kernels agree on the layout
            for (const LaunchOptions& o : (n == 3 ? kOrders : kTwoOrders)) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
            INFO("thread order " << std::string(order_name(o)));
                std::vector<float> y(ref.size(), kNaN);
                cuda::matvec(c.type, W.data(), row_bytes, c.rows, c.cols, x.data(), n, y.data(), nullptr);
                for (size_t i = 0; i < y.size(); ++i) {
                    REQUIRE(!std::isnan(y[i]));
                    // fp32 accumulation: the error is bounded by a few ulps of the sum of |products|.
                    REQUIRE(std::abs(y[i] - ref[i]) <= 1e-5 * bound[i] + 1e-30);
                }
                CHECK(nmse(y, ref) < 1e-9);
            }
        }
    }
}

TEST_CASE("cuda kernels: staged matvec loads give bitwise the direct loads' sums, matvec and matvec_rows") {
    // Staged, each warp copies its row to shared memory in chunks of whole walk steps; the lanes then add the same
    // terms in the same order as with direct loads. The shapes: rows that start at every offset within a 16-byte
    // slot (row bytes not a multiple of 16), rows of one partial chunk, and rows of several chunks with a partial
    // last one (7680 columns: 240 legacy blocks, 30 super-blocks; every type's chunk is under 2 KiB). W is exactly
    // as long as its rows, so a staged read past the last row's end fails under ASan. 3 tokens: the four-token
    // kernel, whose walk (most types) has no exit and sums a dead slot from the last token's activations.
    const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
    std::mt19937 rng(41);
    for (GgmlType type : types) {
        const int block = ggml_type_info(type).block_size;
        for (int cols : {block == 32 ? 96 : 256, 512, 7680}) {
            const int rows = cols == 7680 ? 3 : 9;
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            const std::vector<int> picked = {rows - 1, 0, rows / 2};
            for (int n : {1, 3, 5, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                std::vector<float> direct(static_cast<size_t>(n) * rows, kNaN), picked_direct(direct.size(), kNaN);
                cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, direct.data(), nullptr);
                cuda::matvec_rows(type, W.data(), row_bytes, cols, picked.data(), 3, x.data(), n, picked_direct.data(),
                                  rows, nullptr);
                for (const LaunchOptions& o : kTwoOrders) {
                    ScopedLaunchOptions scope(o);
                    INFO("thread order " << std::string(order_name(o)));
                    std::vector<float> staged(direct.size(), kNaN), picked_staged(direct.size(), kNaN);
                    cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, staged.data(), nullptr, 0,
                                 cuda::MatvecLoads::Staged);
                    cuda::matvec_rows(type, W.data(), row_bytes, cols, picked.data(), 3, x.data(), n,
                                      picked_staged.data(), rows, nullptr, cuda::MatvecLoads::Staged);
                    for (float v : direct) REQUIRE(std::isfinite(v));
                    CHECK(std::memcmp(staged.data(), direct.data(), direct.size() * 4) == 0);
                    // NaN where no row was picked in both: compare bytes.
                    CHECK(std::memcmp(picked_staged.data(), picked_direct.data(), direct.size() * 4) == 0);
                }
            }
        }
    }
}

TEST_CASE("cuda kernels: persistent matvec blocks walk several block-rows and give bitwise the direct loads' sums") {
    // --cuda-route matvec=persistent launches only the blocks the device holds at once (the emulation reports one
    // SM: 8 blocks for one token, 6 for more), each walking every gridDim.x-th block-row and requesting the next
    // row's first chunk before decoding the current row's last. The shapes give blocks two to five block-rows: a
    // matrix of 70 rows (18 block-rows, the last half full), a picked subset of 41 rows, Q/K/V-like targets of 36,
    // 12 and 12 rows, and gate/up with SwiGLU of 37 rows (19 blocks of two pairs: the up sums' two buffers
    // alternate), on rows of one chunk and of several (7680 columns: 37 rows, whose one-token picked subset of 19
    // fits the staged kernel's 8 blocks and runs it, the test below). fp32 and 8-bit activations; every sum must
    // be the direct kernel's bits, and every row written.
    REQUIRE(cuda::multiprocessor_count() == 1);
    const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
    constexpr auto kDirect = cuda::MatvecLoads::Direct, kPersistent = cuda::MatvecLoads::Persistent;
    std::mt19937 rng(53);
    for (GgmlType type : types) {
        const int block = ggml_type_info(type).block_size;
        const bool fused_too = type == GgmlType::Q4_0 || type == GgmlType::Q4_K || type == GgmlType::Q6_K;
        for (int cols : {block == 32 ? 96 : 256, 7680}) {
            const int rows = cols == 7680 ? 37 : 70;
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            const std::vector<uint8_t> W2 = test::random_weight_rows(type, rows, cols, rng);
            std::vector<int> picked;
            for (int r = rows - 1; r >= 0; r -= 2) picked.push_back(r);
            const std::vector<int> qkv = {rows / 2, rows / 4, rows / 4};
            std::vector<std::vector<uint8_t>> W_qkv;  // each 16-byte aligned, as matvec requires
            for (int r : qkv) W_qkv.push_back(test::random_weight_rows(type, r, cols, rng));
            for (int n : {1, 3, 5, 13}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                std::vector<uint8_t> xq(cuda::q8_activation_row_bytes(type, cols) * n);
                cuda::quantize_activations(type, x.data(), cols, n, xq.data(), nullptr);
                for (bool int8 : {false, true}) {
                    CAPTURE(int8);
                    const void* xq_arg = int8 ? xq.data() : nullptr;
                    const auto run = [&](cuda::MatvecLoads loads) {
                        std::vector<std::vector<float>> out;
                        out.emplace_back(static_cast<size_t>(n) * rows, kNaN);
                        cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, out.back().data(), nullptr, 0,
                                     loads, xq_arg);
                        out.emplace_back(static_cast<size_t>(n) * rows, kNaN);
                        cuda::matvec_rows(type, W.data(), row_bytes, cols, picked.data(),
                                          static_cast<int>(picked.size()), x.data(), n, out.back().data(), rows,
                                          nullptr, loads, xq_arg);
                        if (!fused_too) return out;
                        std::vector<cuda::MatvecTarget> targets;
                        for (size_t i = 0; i < qkv.size(); ++i) {
                            out.emplace_back(static_cast<size_t>(n) * qkv[i], kNaN);
                            targets.push_back({W_qkv[i].data(), row_bytes, qkv[i], out.back().data(), nullptr});
                        }
                        cuda::matvec_multi(type, targets.data(), 3, cols, x.data(), n, nullptr, loads, xq_arg);
                        out.emplace_back(static_cast<size_t>(n) * rows, kNaN);
                        cuda::matvec_swiglu(type, W.data(), W2.data(), row_bytes, rows, cols, x.data(), n,
                                            out.back().data(), nullptr, loads, xq_arg);
                        return out;
                    };
                    const std::vector<std::vector<float>> want = run(kDirect);
                    for (size_t i = 0; i < want.size(); ++i)
                        for (size_t j = 0; j < want[i].size(); ++j)
                            REQUIRE(std::isnan(want[i][j]) == (i == 1 && static_cast<int>(j % rows) % 2 != (rows - 1) % 2));
                    for (const LaunchOptions& o : kTwoOrders) {
                        ScopedLaunchOptions scope(o);
                        INFO("thread order " << std::string(order_name(o)));
                        const std::vector<std::vector<float>> got = run(kPersistent);
                        for (size_t i = 0; i < want.size(); ++i) {
                            CAPTURE(i);  // matvec, matvec_rows, Q/K/V, gate/up with SwiGLU
                            CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4) == 0);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("cuda kernels: the persistent route runs the staged kernel where its blocks all fit at once") {
    // Persistent loads launch the staged kernel when its grid is a single wave (SMs x 8 blocks for one token, x 6
    // for more; the emulation reports one SM), since there each block has one block-row and the persistent budget
    // (6 or 5 blocks per SM) would give some blocks two; past that, the persistent kernel. Read from captured
    // launches (the kernel's name), then replayed: the sums are the direct kernel's bits either way. Block-rows:
    // 4 rows each, 2 (gate, up) pairs with SwiGLU; tokens 13 launch 8 + 5.
    REQUIRE(cuda::multiprocessor_count() == 1);
    std::mt19937 rng(59);
    const GgmlType type = GgmlType::Q4_0;
    const int cols = 64;
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    struct Case {
        int rows, n;
        bool swiglu, persistent;
    };
    const Case cases[] = {{32, 1, false, false}, {33, 1, false, true},  {24, 5, false, false}, {25, 5, false, true},
                          {24, 13, false, false}, {25, 13, false, true}, {16, 1, true, false},  {17, 1, true, true},
                          {12, 4, true, false},  {13, 4, true, true}};
    for (const Case& c : cases) {
        CAPTURE(c.rows);
        CAPTURE(c.n);
        CAPTURE(c.swiglu);
        const std::vector<uint8_t> W = test::random_weight_rows(type, c.rows, cols, rng);
        const std::vector<uint8_t> W2 = test::random_weight_rows(type, c.rows, cols, rng);
        const std::vector<float> x = random_floats(static_cast<size_t>(c.n) * cols, rng);
        const auto launch = [&](cuda::MatvecLoads loads, float* y, void* stream) {
            if (c.swiglu)
                cuda::matvec_swiglu(type, W.data(), W2.data(), row_bytes, c.rows, cols, x.data(), c.n, y, stream, loads);
            else
                cuda::matvec(type, W.data(), row_bytes, c.rows, cols, x.data(), c.n, y, stream, 0, loads);
        };
        std::vector<float> want(static_cast<size_t>(c.n) * c.rows, kNaN), got = want;
        launch(cuda::MatvecLoads::Direct, want.data(), nullptr);
        void* stream = tandem::emu::stream_create();
        tandem::emu::begin_capture(stream);
        launch(cuda::MatvecLoads::Persistent, got.data(), stream);
        const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
        const std::string name = c.persistent ? "matvec_persistent_kernel<Q4_0>" : "matvec_staged_kernel<Q4_0>";
        REQUIRE(graph.nodes.size() == (c.n > 8 ? 2u : 1u));
        for (const tandem::emu::GraphNode& node : graph.nodes) CHECK(node.name == name);
        tandem::emu::graph_launch(graph, stream);
        tandem::emu::stream_destroy(stream);
        CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
    }
}

TEST_CASE("cuda kernels: split matvec rows are within rounding of a double dot and bitwise alike for any token count") {
    // Split (--cuda-route matvec=split): a block's four warps share one row, each walking a contiguous range of whole
    // walk steps, and one thread per token adds the four partial sums in warp order. The widths: one walk step (the
    // other three warps idle), steps that do not divide by four (33 legacy blocks: ranges of 12, 12, 9 and none;
    // 5 super-blocks: 2, 2, 1, none), and 7680 columns. Each sum is another fp32 order than the direct kernel's, so
    // the check against the double reference is the direct one's; and the order depends on the row's width alone,
    // so a token's sums are bitwise the same whether it came in a call of 13 tokens (launches of 8 and 5), of 3 or
    // alone (the three instantiations), and a picked row (matvec_rows) is bitwise the whole matrix's.
    const GgmlType types[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
    constexpr auto kSplit = cuda::MatvecLoads::Split;
    std::mt19937 rng(44);
    for (GgmlType type : types) {
        const bool legacy = ggml_type_info(type).block_size == 32;
        for (int cols : {legacy ? 96 : 256, legacy ? 1056 : 1280, 7680}) {
            const int rows = cols == 7680 ? 3 : 5, n = 13;
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
            std::vector<float> dq(static_cast<size_t>(cols));
            const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
            std::vector<double> ref(static_cast<size_t>(n) * rows), bound(ref.size());
            for (int r = 0; r < rows; ++r) {
                cpu::dequantize_row(type, W.data() + r * row_bytes, dq.data(), cols);
                for (int t = 0; t < n; ++t) {
                    double sum = 0.0, abs_sum = 0.0;
                    for (int i = 0; i < cols; ++i) {
                        const double p = static_cast<double>(dq[i]) * x[static_cast<size_t>(t) * cols + i];
                        sum += p;
                        abs_sum += std::abs(p);
                    }
                    ref[static_cast<size_t>(t) * rows + r] = sum;
                    bound[static_cast<size_t>(t) * rows + r] = abs_sum;
                }
            }
            const std::vector<int> picked = {rows - 1, 0};
            for (const LaunchOptions& o : (cols == 7680 ? kTwoOrders : kOrders)) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                std::vector<float> y(ref.size(), kNaN);
                cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data(), n, y.data(), nullptr, 0, kSplit);
                for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::abs(y[i] - ref[i]) <= 1e-5 * bound[i] + 1e-30);
                // Tokens 4..6 in a call of 3, token 12 alone, every token's picked rows.
                std::vector<float> three(static_cast<size_t>(3) * rows, kNaN), one(rows, kNaN);
                cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data() + 4 * cols, 3, three.data(), nullptr, 0,
                             kSplit);
                cuda::matvec(type, W.data(), row_bytes, rows, cols, x.data() + 12 * cols, 1, one.data(), nullptr, 0,
                             kSplit);
                CHECK(std::memcmp(three.data(), y.data() + 4 * rows, three.size() * 4) == 0);
                CHECK(std::memcmp(one.data(), y.data() + 12 * rows, one.size() * 4) == 0);
                std::vector<float> picked_y(y.size(), kNaN), want(y.size(), kNaN);
                cuda::matvec_rows(type, W.data(), row_bytes, cols, picked.data(), 2, x.data(), n, picked_y.data(),
                                  rows, nullptr, kSplit);
                for (int t = 0; t < n; ++t)
                    for (int r : picked) want[static_cast<size_t>(t) * rows + r] = y[static_cast<size_t>(t) * rows + r];
                CHECK(std::memcmp(picked_y.data(), want.data(), want.size() * 4) == 0);  // NaN where not picked
            }
        }
    }
}

TEST_CASE("cuda kernels: matvec_multi is bitwise the separate matvecs, with add_bias where a target has a bias") {
    // Q/K/V-like targets (36, 12 and 12 rows; one without a bias) and gate/up-like ones (two of 20 rows) for a float
    // and two block types, each loads, 1 to 16 tokens (16: two launches of 8).
    std::mt19937 rng(43);
    for (GgmlType type : {GgmlType::F16, GgmlType::Q4_0, GgmlType::Q6_K}) {
        const int cols = 256;
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        for (const std::vector<int>& rows : {std::vector<int>{36, 12, 12}, std::vector<int>{20, 20}, std::vector<int>{9}}) {
            const int n_targets = static_cast<int>(rows.size());
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(n_targets);
            std::vector<std::vector<uint8_t>> W;
            std::vector<std::vector<float>> bias;
            for (int r : rows) {
                W.push_back(test::random_weight_rows(type, r, cols, rng));
                bias.push_back(random_floats(static_cast<size_t>(r), rng));
            }
            for (int n : {1, 3, 5, 16}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng);
                for (cuda::MatvecLoads loads :
                     {cuda::MatvecLoads::Direct, cuda::MatvecLoads::Staged, cuda::MatvecLoads::Split}) {
                    ScopedLaunchOptions scope(kTwoOrders[loads == cuda::MatvecLoads::Direct ? 0 : 1]);
                    std::vector<std::vector<float>> want, got;
                    std::vector<cuda::MatvecTarget> targets;
                    for (int i = 0; i < n_targets; ++i) {
                        want.emplace_back(static_cast<size_t>(n) * rows[i], kNaN);
                        got.emplace_back(static_cast<size_t>(n) * rows[i], kNaN);
                        cuda::matvec(type, W[i].data(), row_bytes, rows[i], cols, x.data(), n, want[i].data(), nullptr,
                                     0, loads);
                        const bool with_bias = i != 1;  // the second target has none
                        if (with_bias) cuda::add_bias(want[i].data(), bias[i].data(), n, rows[i], nullptr);
                        targets.push_back({W[i].data(), row_bytes, rows[i], got[i].data(),
                                           with_bias ? bias[i].data() : nullptr});
                    }
                    cuda::matvec_multi(type, targets.data(), n_targets, cols, x.data(), n, nullptr, loads);
                    for (int i = 0; i < n_targets; ++i) {
                        CAPTURE(i);
                        for (float v : want[i]) REQUIRE(std::isfinite(v));
                        CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4) == 0);
                    }
                }
            }
        }
    }
    std::vector<float> x(256), y(8);
    std::vector<uint8_t> w(8 * 144);
    const cuda::MatvecTarget t{w.data(), 144, 8, y.data(), nullptr};
    const cuda::MatvecTarget four[] = {t, t, t, t};
    CHECK_THROWS_AS(cuda::matvec_multi(GgmlType::Q4_0, four, 4, 256, x.data(), 1, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::matvec_multi(GgmlType::Q4_0, four, 0, 256, x.data(), 1, nullptr), std::invalid_argument);
}

TEST_CASE("cuda kernels: matvec_swiglu is bitwise matvec_multi followed by swiglu") {
    // Odd and even row counts (the last block of 21 rows has a gate/up pair without a row), 1 to 16 tokens (16: two
    // launches of 8), each loads, the fp32 route for a float and two block types and the 8-bit route for two.
    std::mt19937 rng(47);
    const int cols = 256;
    struct Case {
        GgmlType type;
        bool int8;
    };
    for (const Case c : {Case{GgmlType::F16, false}, Case{GgmlType::Q4_0, false}, Case{GgmlType::Q6_K, false},
                         Case{GgmlType::Q4_0, true}, Case{GgmlType::Q4_K, true}}) {
        CAPTURE(std::string(ggml_type_name(c.type)));
        CAPTURE(c.int8);
        const size_t row_bytes = ggml_row_bytes(c.type, static_cast<uint64_t>(cols));
        for (int rows : {20, 21}) {
            CAPTURE(rows);
            const std::vector<uint8_t> gate = test::random_weight_rows(c.type, rows, cols, rng);
            const std::vector<uint8_t> up = test::random_weight_rows(c.type, rows, cols, rng);
            for (int n : {1, 3, 5, 16}) {
                CAPTURE(n);
                const std::vector<float> x = random_floats(static_cast<size_t>(n) * cols, rng, 2.0f);
                std::vector<uint8_t> xq;
                if (c.int8) {
                    xq.resize(cuda::q8_activation_row_bytes(c.type, cols) * n);
                    cuda::quantize_activations(c.type, x.data(), cols, n, xq.data(), nullptr);
                }
                const void* xq_arg = c.int8 ? xq.data() : nullptr;
                for (cuda::MatvecLoads loads :
                     {cuda::MatvecLoads::Direct, cuda::MatvecLoads::Staged, cuda::MatvecLoads::Split}) {
                    ScopedLaunchOptions scope(kTwoOrders[loads == cuda::MatvecLoads::Direct ? 0 : 1]);
                    std::vector<float> g(static_cast<size_t>(n) * rows, kNaN), u(g.size(), kNaN), want(g.size(), kNaN);
                    const cuda::MatvecTarget targets[] = {{gate.data(), row_bytes, rows, g.data(), nullptr},
                                                          {up.data(), row_bytes, rows, u.data(), nullptr}};
                    cuda::matvec_multi(c.type, targets, 2, cols, x.data(), n, nullptr, loads, xq_arg);
                    cuda::swiglu(g.data(), u.data(), want.data(), static_cast<int64_t>(want.size()), nullptr);
                    std::vector<float> got(g.size(), kNaN);
                    cuda::matvec_swiglu(c.type, gate.data(), up.data(), row_bytes, rows, cols, x.data(), n, got.data(),
                                        nullptr, loads, xq_arg);
                    for (float v : want) REQUIRE(std::isfinite(v));
                    CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
                }
            }
        }
    }
}

TEST_CASE("cuda kernels: matvec rejects what it cannot do") {
    std::vector<float> x(64), y(2);
    std::vector<uint8_t> w(2 * 64 * 4);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::IQ4_NL, w.data(), 18, 2, 64, x.data(), 1, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::F32, w.data(), 256, 2, 64, x.data(), 17, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::Q8_0, w.data(), 34, 2, 40, x.data(), 1, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::matvec(GgmlType::F32, w.data(), 256, 2, 64, x.data(), 1, y.data(), nullptr, 1),
                    std::invalid_argument);  // output rows narrower than the matrix's
}

namespace {

// cpu_backend.cpp's rope(), operation for operation.
void cpu_rope(float* vec, int n_heads, int head_dim, int rope_dim, bool neox, int pos, const float* inv_freq) {
    for (int h = 0; h < n_heads; ++h) {
        float* v = vec + h * head_dim;
        for (int i = 0; i < rope_dim / 2; ++i) {
            const float angle = static_cast<float>(pos) * inv_freq[i];
            const float c = std::cos(angle), s = std::sin(angle);
            const int a = neox ? i : 2 * i, b = neox ? i + rope_dim / 2 : 2 * i + 1;
            const float v0 = v[a], v1 = v[b];
            v[a] = v0 * c - v1 * s;
            v[b] = v0 * s + v1 * c;
        }
    }
}

}  // namespace

TEST_CASE("cuda kernels: RoPE (both pairings) fused with the fp16 KV-cache write") {
    struct Case {
        int n_heads, n_kv, hd, rope_dim, n_tok, start;
    };
    // The last two spread a token over several blocks (3584 and 1152 items of 256 threads; the second with a tail
    // past rope_dim).
    const Case cases[] = {{3, 1, 32, 32, 1, 0}, {4, 2, 64, 32, 5, 17}, {5, 5, 16, 10, 3, 1000},
                          {32, 8, 128, 128, 2, 5}, {16, 4, 96, 64, 2, 3}};
    std::mt19937 rng(4);
    for (const Case& c : cases)
        for (bool neox : {false, true}) {
            CAPTURE(c.n_heads);
            CAPTURE(c.hd);
            CAPTURE(neox);
            const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, capacity = c.start + c.n_tok + 2;
            const std::vector<float> q0 = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
            const std::vector<float> k = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng);
            const std::vector<float> v = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng);
            const std::vector<float> freq = inv_freqs(c.rope_dim, 10000.0f);
            std::vector<float> q_ref = q0, k_ref = k;
            for (int i = 0; i < c.n_tok; ++i) {
                cpu_rope(&q_ref[i * q_dim], c.n_heads, c.hd, c.rope_dim, neox, c.start + i, freq.data());
                cpu_rope(&k_ref[i * kv_dim], c.n_kv, c.hd, c.rope_dim, neox, c.start + i, freq.data());
            }
            for (const LaunchOptions& o : kTwoOrders) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
            INFO("thread order " << std::string(order_name(o)));
                std::vector<float> q = q0;
                std::vector<uint16_t> kc(static_cast<size_t>(capacity) * kv_dim, 0xFFFF),
                    vc(static_cast<size_t>(capacity) * kv_dim, 0xFFFF);
                cuda::RopeKvArgs a{q.data(), k.data(), v.data(), kc.data(), vc.data(), freq.data(), c.n_tok, c.start,
                                   c.n_heads, c.n_kv, c.hd, c.rope_dim,
                                   neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs};
                cuda::rope_kv_write(a, nullptr);
                check_close(q, std::vector<double>(q_ref.begin(), q_ref.end()), 1e-5, 1e-2);
                for (int p = 0; p < capacity; ++p)
                    for (int e = 0; e < kv_dim; ++e) {
                        const size_t ci = static_cast<size_t>(p) * kv_dim + e;
                        const int i = p - c.start;
                        if (i < 0 || i >= c.n_tok) {  // positions outside the step stay untouched
                            REQUIRE(kc[ci] == 0xFFFF);
                            REQUIRE(vc[ci] == 0xFFFF);
                            continue;
                        }
                        REQUIRE(vc[ci] == fp32_to_fp16(v[i * kv_dim + e]));
                        // The rotated fp32 values may differ in the last bit, so their halves by one ulp.
                        const float want = k_ref[i * kv_dim + e], got = fp16_to_fp32(kc[ci]);
                        REQUIRE(std::abs(got - want) <= 1e-3f * std::max(std::abs(want), 1e-2f));
                    }
            }
        }
}

TEST_CASE("cuda kernels: embedding gather dequantizes rows of every matvec type") {
    std::mt19937 rng(5);
    const int n_vocab = 11;
    const std::vector<int> tokens = {3, 0, 10, 3, 7};
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                          GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                          GgmlType::Q5_K, GgmlType::Q6_K})
        for (int dim : {32, 96, 37, 512}) {
            REQUIRE(cuda::embedding_supports(type));
            if (dim % static_cast<int>(ggml_type_info(type).block_size)) continue;
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(dim);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(dim));
            const std::vector<uint8_t> table = test::random_weight_rows(type, n_vocab, dim, rng);
            std::vector<double> ref;
            for (int t : tokens) {
                std::vector<float> row(dim);
                cpu::dequantize_row(type, table.data() + t * row_bytes, row.data(), dim);
                ref.insert(ref.end(), row.begin(), row.end());
            }
            for (const LaunchOptions& o : kTwoOrders) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
            INFO("thread order " << std::string(order_name(o)));
                std::vector<float> out(tokens.size() * dim, kNaN);
                cuda::embedding(type, table.data(), row_bytes, n_vocab, dim, tokens.data(),
                                static_cast<int>(tokens.size()), out.data(), nullptr);
                check_close(out, ref, 1e-6);
            }
        }
    std::vector<float> table(32 * 4, 1.0f), out(32, 0.0f);
    const int bad = 4, tokens_ok[1] = {1};
    cuda::embedding(GgmlType::F32, table.data(), 32 * 4, 4, 32, &bad, 1, out.data(), nullptr);
    CHECK(std::isnan(out[0]));
    CHECK(std::isnan(out[31]));
    // Rows that are not whole blocks of the type are refused: a k-quant's are 256 wide, so 288 (nine 32s) is not.
    std::vector<uint8_t> kq(4 * 2 * 144);
    std::vector<float> wide(288);
    CHECK_THROWS_AS(cuda::embedding(GgmlType::Q4_K, kq.data(), 2 * 144, 4, 288, tokens_ok, 1, wide.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::embedding(GgmlType::Q8_0, kq.data(), 34, 4, 40, tokens_ok, 1, wide.data(), nullptr),
                    std::invalid_argument);
}

namespace {

// Causal GQA softmax attention in double over a cache of float values (fp16 or Q8_0 dequantized): query i
// (position start + i) attends to 0..start + i, or with a window to the last `window` of those; scores scaled by
// `scale` (0: 1 / sqrt(hd)), then soft-capped to softcap * tanh(s / softcap) where softcap > 0.
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& kc,
                                        const std::vector<float>& vc, int n_heads, int n_kv, int hd, int start,
                                        int n_tok, int window = 0, double scale = 0.0, double softcap = 0.0) {
    const int q_dim = n_heads * hd, kv_dim = n_kv * hd;
    std::vector<double> ref(static_cast<size_t>(n_tok) * q_dim);
    if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int i = 0; i < n_tok; ++i)
        for (int h = 0; h < n_heads; ++h) {
            const int kvh = h / (n_heads / n_kv);
            const int first = window > 0 ? std::max(0, start + i - window + 1) : 0;
            std::vector<double> s(start + i + 1);
            double mx = -INFINITY, sum = 0.0;
            for (int t = first; t <= start + i; ++t) {
                double d = 0.0;
                for (int e = 0; e < hd; ++e)
                    d += q[static_cast<size_t>(i) * q_dim + h * hd + e] * kc[static_cast<size_t>(t) * kv_dim + kvh * hd + e];
                s[t] = d * scale;
                if (softcap > 0.0) s[t] = softcap * std::tanh(s[t] / softcap);
                mx = std::max(mx, s[t]);
            }
            for (int t = first; t <= start + i; ++t) sum += (s[t] = std::exp(s[t] - mx));
            for (int e = 0; e < hd; ++e) {
                double o = 0.0;
                for (int t = first; t <= start + i; ++t)
                    o += s[t] / sum * vc[static_cast<size_t>(t) * kv_dim + kvh * hd + e];
                ref[static_cast<size_t>(i) * q_dim + h * hd + e] = o;
            }
        }
    return ref;
}

// The same over an fp16 cache.
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<uint16_t>& kc,
                                        const std::vector<uint16_t>& vc, int n_heads, int n_kv, int hd, int start,
                                        int n_tok, int window = 0, double scale = 0.0, double softcap = 0.0) {
    std::vector<float> k(kc.size()), v(vc.size());
    for (size_t i = 0; i < kc.size(); ++i) k[i] = fp16_to_fp32(kc[i]), v[i] = fp16_to_fp32(vc[i]);
    return attention_reference(q, k, v, n_heads, n_kv, hd, start, n_tok, window, scale, softcap);
}

}  // namespace

namespace {

// attention() again with split counters, where the split kernel's last block of each (token, head) combines: the
// same bits as `want` (the combine kernel's), and the counters back at zero, twice (a replayed graph reuses them).
void check_fused_combine(cuda::AttentionArgs a, const std::vector<float>& want, size_t workspace_floats) {
    std::vector<unsigned> counters(static_cast<size_t>(a.n_tokens) * a.n_heads, 0);
    a.split_counters = counters.data();
    for (int round = 0; round < 2; ++round) {
        std::vector<float> out(want.size(), kNaN), ws(workspace_floats, kNaN);
        a.out = out.data();
        a.workspace = ws.data();
        cuda::attention(a, nullptr);
        CHECK(std::memcmp(out.data(), want.data(), want.size() * 4) == 0);
        CHECK(std::all_of(counters.begin(), counters.end(), [](unsigned c) { return c == 0; }));
    }
    // The output quantized for the 8-bit route by the combine (Q8_1 blocks where 32 divides the head; never Q8_K),
    // by either combine: bitwise quantize_activations of `want`, the fp32 output unchanged.
    const int row = a.n_heads * a.head_dim;
    if (!cuda::attention_quantizes_for(GgmlType::Q4_0, a.head_dim)) {  // Q8_1 blocks that would span heads
        std::vector<uint8_t> q(cuda::q8_activation_row_bytes(GgmlType::Q4_0, (row + 31) / 32 * 32) * a.n_tokens);
        cuda::AttentionArgs b = a;
        b.q8_for = GgmlType::Q4_0;
        b.q8_out = q.data();
        CHECK_THROWS_AS(cuda::attention(b, nullptr), std::invalid_argument);
    }
    for (GgmlType q8_for : {GgmlType::Q4_0, GgmlType::Q6_K}) {
        if (!cuda::attention_quantizes_for(q8_for, a.head_dim)) continue;
        CAPTURE(std::string(ggml_type_name(q8_for)));
        const size_t row_bytes = cuda::q8_activation_row_bytes(q8_for, row);
        std::vector<uint8_t> q_want(row_bytes * a.n_tokens);
        cuda::quantize_activations(q8_for, want.data(), row, a.n_tokens, q_want.data(), nullptr);
        for (const bool fused : {true, false}) {
            CAPTURE(fused);
            std::vector<float> out(want.size(), kNaN), ws(workspace_floats, kNaN);
            std::vector<uint8_t> q(q_want.size(), 0xFF);
            cuda::AttentionArgs b = a;
            b.out = out.data();
            b.workspace = ws.data();
            b.split_counters = fused ? counters.data() : nullptr;
            b.q8_for = q8_for;
            b.q8_out = q.data();
            cuda::attention(b, nullptr);
            CHECK(std::memcmp(out.data(), want.data(), want.size() * 4) == 0);
            CHECK(q == q_want);
        }
    }
}

}  // namespace

TEST_CASE("cuda kernels: split-K attention over an fp16 cache matches causal GQA softmax attention") {
    struct Case {
        int n_heads, n_kv, hd, start, n_tok, split;
    };
    const Case cases[] = {{4, 2, 32, 0, 1, 16}, {3, 1, 64, 37, 3, 16}, {2, 2, 128, 100, 1, 32}, {6, 3, 32, 5, 4, 3},
                          {2, 1, 256, 9, 2, 64},
                          // Head sizes below / between the warp multiples (stories260K has 8).
                          {8, 4, 8, 20, 5, 7},  {2, 1, 16, 3, 16, 64}, {3, 3, 48, 11, 2, 5}};
    std::mt19937 rng(6);
    for (const Case& c : cases) {
        CAPTURE(c.n_heads);
        CAPTURE(c.hd);
        CAPTURE(c.start);
        CAPTURE(c.n_tok);
        const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, n_pos = c.start + c.n_tok;
        const std::vector<float> q = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
        std::vector<uint16_t> kc(static_cast<size_t>(n_pos) * kv_dim), vc(kc.size());
        for (uint16_t& h : kc) h = fp32_to_fp16(random_floats(1, rng)[0]);
        for (uint16_t& h : vc) h = fp32_to_fp16(random_floats(1, rng)[0]);
        const std::vector<double> ref = attention_reference(q, kc, vc, c.n_heads, c.n_kv, c.hd, c.start, c.n_tok);
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> out(ref.size(), kNaN);
            std::vector<float> ws(cuda::attention_workspace_floats(c.n_tok, c.start, c.n_heads, c.hd, c.split), kNaN);
            cuda::AttentionArgs a{q.data(), kc.data(), vc.data(), out.data(), ws.data(), c.n_tok, c.start,
                                  c.n_heads, c.n_kv, c.hd, c.split};
            cuda::attention(a, nullptr);
            // Outputs are convex combinations of values ~N(0,1): an absolute tolerance relative to 1.
            for (size_t i = 0; i < out.size(); ++i) {
                REQUIRE(!std::isnan(out[i]));
                REQUIRE(std::abs(out[i] - ref[i]) <= 2e-6);
            }
            check_fused_combine(a, out, ws.size());
        }
    }
}

TEST_CASE("cuda kernels: RoPE + KV write and split-K attention read the start position from device memory") {
    // What a replayed CUDA graph relies on: with device_start_pos set, the by-value start_pos is ignored (RoPE) or
    // only a bound that sizes the grid (attention, whose extra splits must return without a trace), and the
    // results are bitwise those of a launch given the real position by value.
    struct Case {
        int n_heads, n_kv, hd, start, n_tok, split, bound;
    };
    const Case cases[] = {{4, 2, 32, 37, 3, 16, 37},  {4, 2, 32, 37, 3, 16, 100}, {8, 4, 8, 5, 1, 4, 60},
                          {2, 1, 64, 0, 16, 8, 47},   {3, 3, 48, 70, 2, 64, 300}};
    std::mt19937 rng(12);
    for (const Case& c : cases) {
        CAPTURE(c.hd);
        CAPTURE(c.start);
        CAPTURE(c.n_tok);
        CAPTURE(c.bound);
        const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, capacity = c.bound + c.n_tok;
        const std::vector<float> q0 = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
        const std::vector<float> k = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng);
        const std::vector<float> v = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng);
        const std::vector<float> freq = inv_freqs(c.hd, 10000.0f);
        // Earlier positions of the cache: random, as a previous step would have left them.
        std::vector<uint16_t> kc0(static_cast<size_t>(capacity) * kv_dim, 0x7E00), vc0(kc0.size(), 0x7E00);
        for (size_t i = 0; i < static_cast<size_t>(c.start) * kv_dim; ++i) {
            kc0[i] = fp32_to_fp16(random_floats(1, rng)[0]);
            vc0[i] = fp32_to_fp16(random_floats(1, rng)[0]);
        }
        const int device_pos = c.start;  // "device memory" is host memory under the emulation
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            struct Result {
                std::vector<float> q, out;
                std::vector<uint16_t> kc, vc;
            };
            auto run = [&](bool from_device) {
                Result r{q0, std::vector<float>(static_cast<size_t>(c.n_tok) * q_dim, kNaN), kc0, vc0};
                cuda::RopeKvArgs ra{r.q.data(), k.data(), v.data(), r.kc.data(), r.vc.data(), freq.data(), c.n_tok,
                                    from_device ? c.bound + 3 : c.start, c.n_heads, c.n_kv, c.hd, c.hd,
                                    cuda::RopeMode::NeoxHalves};
                if (from_device) ra.device_start_pos = &device_pos;
                cuda::rope_kv_write(ra, nullptr);
                const int grid_pos = from_device ? c.bound : c.start;
                std::vector<float> ws(cuda::attention_workspace_floats(c.n_tok, grid_pos, c.n_heads, c.hd, c.split),
                                      kNaN);
                cuda::AttentionArgs aa{r.q.data(), r.kc.data(), r.vc.data(), r.out.data(), ws.data(), c.n_tok,
                                       grid_pos, c.n_heads, c.n_kv, c.hd, c.split};
                if (from_device) aa.device_start_pos = &device_pos;
                cuda::attention(aa, nullptr);
                // The splits past the device position return before they count themselves.
                if (from_device) check_fused_combine(aa, r.out, ws.size());
                return r;
            };
            const Result by_value = run(false), from_device = run(true);
            CHECK(from_device.q == by_value.q);
            CHECK(from_device.kc == by_value.kc);  // the same positions written, nothing else touched
            CHECK(from_device.vc == by_value.vc);
            for (float x : from_device.out) REQUIRE(!std::isnan(x));
            CHECK(std::memcmp(from_device.out.data(), by_value.out.data(), by_value.out.size() * 4) == 0);
            if (c.bound == c.start) continue;
            // The positions the device int names, not the by-value start_pos, were written.
            const size_t past = static_cast<size_t>(c.start + c.n_tok) * kv_dim;
            CHECK(std::all_of(from_device.kc.begin() + static_cast<std::ptrdiff_t>(past), from_device.kc.end(),
                              [](uint16_t h) { return h == 0x7E00; }));
        }
    }
}

namespace {

// y[t][r] = sum_k W[r][k] x[t][k] in double over dequantized rows, and the bound sum_k |W[r][k] x[t][k]| that
// scales the fp32 rounding error.
void gemm_reference(const std::vector<float>& w, const std::vector<float>& x, int rows, int cols, int n,
                    std::vector<double>& ref, std::vector<double>& bound) {
    ref.assign(static_cast<size_t>(n) * rows, 0.0);
    bound.assign(ref.size(), 0.0);
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
            double s = 0.0, a = 0.0;
            for (int i = 0; i < cols; ++i) {
                const double p = static_cast<double>(w[static_cast<size_t>(r) * cols + i]) * x[static_cast<size_t>(t) * cols + i];
                s += p;
                a += std::abs(p);
            }
            ref[static_cast<size_t>(t) * rows + r] = s;
            bound[static_cast<size_t>(t) * rows + r] = a;
        }
}

std::vector<float> dequantize_matrix(GgmlType type, const std::vector<uint8_t>& W, int rows, int cols) {
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<float> dq(static_cast<size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r)
        cpu::dequantize_row(type, W.data() + r * row_bytes, &dq[static_cast<size_t>(r) * cols], cols);
    return dq;
}

void check_gemm(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& bound) {
    REQUIRE(y.size() == ref.size());
    size_t bad = y.size();
    for (size_t i = 0; i < y.size() && bad == y.size(); ++i)
        if (std::isnan(y[i]) || std::abs(y[i] - ref[i]) > 1e-5 * bound[i] + 1e-30) bad = i;
    CHECK_MESSAGE(bad == y.size(), "element ", bad, ": got ", bad < y.size() ? y[bad] : 0.0f, ", want ",
                  bad < y.size() ? ref[bad] : 0.0);
}

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

}  // namespace

TEST_CASE("cuda kernels: prefill GEMM matches dequantize_row and a double dot for every type") {
    std::mt19937 rng(7);
    for (GgmlType type : kAllTypes) {
        REQUIRE(cuda::gemm_supports(type));
        const int block = static_cast<int>(ggml_type_info(type).block_size);
        // Rows not a multiple of the 64-row tile, tokens not a multiple of the 64-token tile; for the plain types a
        // row length that is not a multiple of the 32-wide k step either (and not of 8: the scalar x loads).
        struct Shape {
            int rows, cols, n;
        };
        const Shape shapes[] = {{70, block == 1 ? 37 : block == 32 ? 96 : 256, 17},
                                {33, block == 256 ? 512 : 160, 100},
                                {128, block == 256 ? 256 : 64, 33}};
        for (const Shape& sh : shapes) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(sh.rows);
            CAPTURE(sh.cols);
            CAPTURE(sh.n);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(sh.cols));
            const std::vector<uint8_t> W = test::random_weight_rows(type, sh.rows, sh.cols, rng);
            const std::vector<float> x = random_floats(static_cast<size_t>(sh.n) * sh.cols, rng);
            std::vector<double> ref, bound;
            gemm_reference(dequantize_matrix(type, W, sh.rows, sh.cols), x, sh.rows, sh.cols, sh.n, ref, bound);
            std::vector<float> first;
            for (const LaunchOptions& o : kTwoOrders) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                std::vector<float> y(ref.size(), kNaN);
                cuda::gemm(type, W.data(), row_bytes, sh.rows, sh.cols, x.data(), sh.n, y.data(), nullptr);
                check_gemm(y, ref, bound);
                if (first.empty()) first = y;
                else CHECK(std::memcmp(first.data(), y.data(), y.size() * 4) == 0);  // the order changes nothing
            }
            // Batch invariance: the last tokens alone give bitwise the same rows.
            const int tail = sh.n / 3 + 1;
            std::vector<float> y(static_cast<size_t>(tail) * sh.rows, kNaN);
            cuda::gemm(type, W.data(), row_bytes, sh.rows, sh.cols, x.data() + static_cast<size_t>(sh.n - tail) * sh.cols,
                       tail, y.data(), nullptr);
            CHECK(std::memcmp(y.data(), first.data() + static_cast<size_t>(sh.n - tail) * sh.rows, y.size() * 4) == 0);
        }
    }
}

TEST_CASE("cuda kernels: gemm rejects what it cannot do") {
    std::vector<float> x(64), y(2);
    std::vector<uint8_t> w(2 * 64 * 4);
    CHECK_THROWS_AS(cuda::gemm(GgmlType::IQ4_NL, w.data(), 18, 2, 64, x.data(), 1, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(cuda::gemm(GgmlType::Q8_0, w.data(), 34, 2, 40, x.data(), 1, y.data(), nullptr),
                    std::invalid_argument);
    std::vector<float> x288(288);
    CHECK_THROWS_AS(cuda::gemm(GgmlType::Q4_K, w.data(), 2 * 144, 2, 288, x288.data(), 1, y.data(), nullptr),
                    std::invalid_argument);  // a k-quant row is whole 256-element blocks
    CHECK_THROWS_AS(cuda::gemm(GgmlType::F32, w.data(), 256, 2, 64, x.data(), 0, y.data(), nullptr),
                    std::invalid_argument);
    CHECK_FALSE(cuda::blas_available());  // the emulation has no cuBLAS
    CHECK_THROWS_AS(cuda::blas_create(nullptr), std::invalid_argument);
}

TEST_CASE("cuda kernels: dequantize_f16 and convert_f16 round like fp32_to_fp16") {
    std::mt19937 rng(8);
    for (GgmlType type : kAllTypes) {
        const int block = static_cast<int>(ggml_type_info(type).block_size);
        const int rows = 7, cols = block == 256 ? 512 : block == 32 ? 96 : 37, row0 = 2, n_rows = 4;
        CAPTURE(std::string(ggml_type_name(type)));
        const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
        const std::vector<uint8_t> W = test::random_weight_rows(type, rows, cols, rng);
        const std::vector<float> dq = dequantize_matrix(type, W, rows, cols);
        ScopedLaunchOptions scope(kTwoOrders[1]);
        std::vector<uint16_t> out(static_cast<size_t>(n_rows) * cols + 3, 0x7E00);  // fp16 NaN
        cuda::dequantize_f16(type, W.data(), row_bytes, row0, n_rows, cols, out.data(), nullptr);
        for (size_t i = 0; i < static_cast<size_t>(n_rows) * cols; ++i) {
            const float want = fp16_to_fp32(fp32_to_fp16(dq[row0 * static_cast<size_t>(cols) + i]));
            const float got = fp16_to_fp32(out[i]);
            // The device's fp32 value may differ from dequantize_row's in the last bit, which can move a tie.
            REQUIRE(std::abs(got - want) <= std::abs(want) * 0x1p-10f + 1e-30f);
        }
        CHECK(out[static_cast<size_t>(n_rows) * cols] == 0x7E00);  // nothing past the tile
    }
    std::vector<float> x = random_floats(1000, rng, 100.0f);
    x[3] = 70000.0f;
    x[4] = -1e-8f;
    std::vector<uint16_t> h(x.size(), 0x7E00);
    cuda::convert_f16(x.data(), x.size(), h.data(), nullptr);
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(h[i] == fp32_to_fp16(x[i]));
}

TEST_CASE("cuda kernels: the fp16 GEMM route (the emulated mirror of cuBLAS) matches a double dot of fp16 operands") {
    std::mt19937 rng(9);
    struct Case {
        GgmlType type;
        int rows, cols, n;
        size_t tile_elems;  // small tiles: several dequantize + GEMM rounds, and a short last one
    };
    const Case cases[] = {{GgmlType::F32, 70, 37, 33, 0},         {GgmlType::F16, 70, 40, 17, 0},
                          {GgmlType::Q8_0, 70, 96, 100, 32 * 96}, {GgmlType::Q4_0, 33, 64, 17, 1000000},
                          {GgmlType::Q4_K, 65, 256, 40, 20 * 256}, {GgmlType::Q6_K, 9, 512, 65, 4 * 512 + 7}};
    for (const Case& c : cases) {
        CAPTURE(std::string(ggml_type_name(c.type)));
        CAPTURE(c.rows);
        CAPTURE(c.n);
        const size_t row_bytes = ggml_row_bytes(c.type, static_cast<uint64_t>(c.cols));
        const std::vector<uint8_t> W = test::random_weight_rows(c.type, c.rows, c.cols, rng);
        const std::vector<float> x = random_floats(static_cast<size_t>(c.n) * c.cols, rng);
        std::vector<uint16_t> x16(x.size());
        cuda::convert_f16(x.data(), x.size(), x16.data(), nullptr);
        // F32 weights are multiplied in fp32 (no fp16 rounding of either operand); everything else in fp16.
        std::vector<float> w = dequantize_matrix(c.type, W, c.rows, c.cols), xr = x;
        if (c.type != GgmlType::F32) {
            for (float& v : w) v = fp16_to_fp32(fp32_to_fp16(v));
            for (float& v : xr) v = fp16_to_fp32(fp32_to_fp16(v));
        }
        std::vector<double> ref, bound;
        gemm_reference(w, xr, c.rows, c.cols, c.n, ref, bound);
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> y(ref.size(), kNaN);
            std::vector<uint16_t> tile(std::max<size_t>(c.tile_elems, 1), 0x7E00);
            cuda::gemm_via_f16(nullptr, c.type, W.data(), row_bytes, c.rows, c.cols, x.data(), x16.data(), c.n,
                               y.data(), tile.data(), c.tile_elems, nullptr);
            check_gemm(y, ref, bound);
        }
    }
    std::vector<uint8_t> W = test::random_weight_rows(GgmlType::Q8_0, 2, 64, rng);
    std::vector<float> x(64), y(2);
    std::vector<uint16_t> x16(64), tile(63);
    CHECK_THROWS_AS(cuda::gemm_via_f16(nullptr, GgmlType::Q8_0, W.data(), 68, 2, 64, x.data(), x16.data(), 1,
                                       y.data(), tile.data(), tile.size(), nullptr),
                    std::invalid_argument);  // a tile shorter than a row
}

TEST_CASE("cuda kernels: tiled flash attention for prefill chunks matches causal GQA softmax attention") {
    struct Case {
        int n_heads, n_kv, hd, start, n_tok;
    };
    // Head sizes of every tile configuration (32, 64, 128, 256) and between them (8: stories260K, 80, 96), chunks
    // that are not multiples of the query tile, and chunks after earlier positions.
    const Case cases[] = {{4, 2, 64, 0, 37},  {2, 1, 128, 50, 33}, {3, 1, 80, 7, 40}, {2, 2, 256, 20, 17},
                          {8, 4, 8, 0, 100},  {6, 3, 96, 64, 65},  {2, 1, 32, 3, 1},  {4, 4, 64, 31, 70}};
    std::mt19937 rng(10);
    for (const Case& c : cases) {
        CAPTURE(c.n_heads);
        CAPTURE(c.hd);
        CAPTURE(c.start);
        CAPTURE(c.n_tok);
        const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, n_pos = c.start + c.n_tok;
        const std::vector<float> q = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
        // Keys with some scale, so the softmax is peaked and the running max really moves between tiles.
        std::vector<uint16_t> kc(static_cast<size_t>(n_pos + 5) * kv_dim, 0x7E00), vc(kc.size(), 0x7E00);
        for (size_t i = 0; i < static_cast<size_t>(n_pos) * kv_dim; ++i) {
            kc[i] = fp32_to_fp16(random_floats(1, rng, 3.0f)[0]);
            vc[i] = fp32_to_fp16(random_floats(1, rng)[0]);
        }
        // Positions past the chunk stay NaN: a kernel reading beyond its causal range would show.
        const std::vector<double> ref = attention_reference(q, kc, vc, c.n_heads, c.n_kv, c.hd, c.start, c.n_tok);
        std::vector<float> first;
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> out(ref.size(), kNaN);
            cuda::AttentionArgs a{q.data(), kc.data(), vc.data(), out.data(), nullptr, c.n_tok, c.start,
                                  c.n_heads, c.n_kv, c.hd, 0};
            cuda::attention_prefill(a, nullptr);
            for (size_t i = 0; i < out.size(); ++i) {
                REQUIRE(!std::isnan(out[i]));
                // Scores up to ~10 (keys of scale 3) put ~1e-6 of fp32 rounding into exp(): a looser bound than
                // split-K's unit-scale test.
                REQUIRE(std::abs(out[i] - ref[i]) <= 5e-6);
            }
            if (first.empty()) first = out;
        }
        // A query's result does not depend on its tile: the last tokens as a chunk of their own, bitwise.
        const int tail = c.n_tok / 2 + 1, skip = c.n_tok - tail;
        std::vector<float> out(static_cast<size_t>(tail) * q_dim, kNaN);
        cuda::AttentionArgs a{q.data() + static_cast<size_t>(skip) * q_dim, kc.data(), vc.data(), out.data(), nullptr,
                              tail, c.start + skip, c.n_heads, c.n_kv, c.hd, 0};
        cuda::attention_prefill(a, nullptr);
        CHECK(std::memcmp(out.data(), first.data() + static_cast<size_t>(skip) * q_dim, out.size() * 4) == 0);
    }
    std::vector<float> q(8), out(8);
    std::vector<uint16_t> kc(8), vc(8);
    cuda::AttentionArgs bad{q.data(), kc.data(), vc.data(), out.data(), nullptr, 1, 0, 3, 2, 8, 0};
    CHECK_THROWS_AS(cuda::attention_prefill(bad, nullptr), std::invalid_argument);
    bad = {q.data(), kc.data(), vc.data(), out.data(), nullptr, 1, 0, 1, 1, 300, 0};
    CHECK_THROWS_AS(cuda::attention_prefill(bad, nullptr), std::invalid_argument);
}

TEST_CASE("cuda kernels: sliding-window and soft-capped attention, split-K and tiled prefill, match their definition") {
    // Windows shorter than a split, spanning splits, of one key, and longer than the context; prefill windows shorter
    // than a query tile (32), so that rows of one tile start their keys in different key tiles, and key tiles wholly
    // before a tile's windows are skipped. Cache positions before the first window hold NaN: reading one would show.
    // Each case also with gemma2's soft-capping of the scores, at a cap that bends them (|s| up to ~4).
    struct Case {
        int n_heads, n_kv, hd, start, n_tok, split, window;
        float scale;
    };
    const Case cases[] = {{4, 1, 32, 40, 3, 8, 5, 0.0f},    {2, 2, 64, 70, 2, 16, 40, 0.125f},
                          {3, 1, 32, 9, 4, 4, 1, 0.0f},     {2, 1, 16, 5, 6, 64, 100, 0.3f},
                          {4, 2, 32, 0, 70, 16, 7, 0.0625f}, {2, 1, 64, 33, 40, 16, 20, 0.0f}};
    std::mt19937 rng(17);
    for (const Case& c : cases) {
        CAPTURE(c.hd);
        CAPTURE(c.start);
        CAPTURE(c.n_tok);
        CAPTURE(c.window);
        const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, n_pos = c.start + c.n_tok;
        const std::vector<float> q = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
        std::vector<uint16_t> kc(static_cast<size_t>(n_pos) * kv_dim), vc(kc.size());
        for (uint16_t& h : kc) h = fp32_to_fp16(random_floats(1, rng, 2.0f)[0]);
        for (uint16_t& h : vc) h = fp32_to_fp16(random_floats(1, rng)[0]);
        const int never_read = std::max(0, c.start - c.window + 1);  // before every query's window
        for (const float softcap : {0.0f, 1.5f})
        for (const LaunchOptions& o : kTwoOrders) {
            CAPTURE(softcap);
            const std::vector<double> ref =
                attention_reference(q, kc, vc, c.n_heads, c.n_kv, c.hd, c.start, c.n_tok, c.window, c.scale, softcap);
            std::vector<uint16_t> kn = kc, vn = vc;  // NaN where no query reads
            std::fill(kn.begin(), kn.begin() + static_cast<size_t>(never_read) * kv_dim, uint16_t{0x7E00});
            std::fill(vn.begin(), vn.begin() + static_cast<size_t>(never_read) * kv_dim, uint16_t{0x7E00});
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            std::vector<float> out(ref.size(), kNaN);
            std::vector<float> ws(cuda::attention_workspace_floats(c.n_tok, c.start, c.n_heads, c.hd, c.split), kNaN);
            cuda::AttentionArgs a{q.data(), kn.data(), vn.data(), out.data(), ws.data(), c.n_tok, c.start,
                                  c.n_heads, c.n_kv, c.hd, c.split};
            a.window = c.window;
            a.scale = c.scale;
            if (softcap > 0.0f) a.softcap = softcap, a.inv_softcap = 1.0f / softcap;
            cuda::attention(a, nullptr);
            for (size_t i = 0; i < out.size(); ++i) REQUIRE(std::abs(out[i] - ref[i]) <= 5e-6);
            check_fused_combine(a, out, ws.size());
            std::vector<float> pre(ref.size(), kNaN);
            a.out = pre.data();
            a.workspace = nullptr;
            cuda::attention_prefill(a, nullptr);
            for (size_t i = 0; i < pre.size(); ++i) REQUIRE(std::abs(pre[i] - ref[i]) <= 5e-6);
        }
    }
}

TEST_CASE("cuda kernels: QK-norm in place, GeGLU, the embedding scale, RoPE's amplitude and soft-capping match their definitions") {
    std::mt19937 rng(23);
    for (int cols : {8, 32, 100, 256}) {  // heads of every width up to the kernel's 256
        CAPTURE(cols);
        const int rows = 7;
        const std::vector<float> x = random_floats(static_cast<size_t>(rows) * cols, rng, 3.0f);
        const std::vector<float> w = random_floats(cols, rng);
        std::vector<double> ref(x.size());
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < cols; ++i) ss += static_cast<double>(x[r * cols + i]) * x[r * cols + i];
            const double inv = 1.0 / std::sqrt(ss / cols + 1e-6);
            for (int i = 0; i < cols; ++i) ref[r * cols + i] = w[i] * inv * x[r * cols + i];
        }
        std::vector<float> y = x;
        cuda::rms_norm_in_place(y.data(), w.data(), rows, cols, 1e-6f, nullptr);
        check_close(y, ref, 1e-5, 1e-5);
    }
    std::vector<float> wide(300), w(300);
    CHECK_THROWS_AS(cuda::rms_norm_in_place(wide.data(), w.data(), 1, 300, 1e-6f, nullptr), std::invalid_argument);
    for (int n : {1, 37, 5000}) {
        CAPTURE(n);
        const std::vector<float> g = random_floats(n, rng, 6.0f), u = random_floats(n, rng);
        std::vector<double> ref(n), scaled(n);
        for (int i = 0; i < n; ++i) {
            const double x = g[i];
            ref[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
            scaled[i] = 8.0 * g[i];
        }
        std::vector<float> out(n, kNaN);
        cuda::geglu(g.data(), u.data(), out.data(), n, nullptr);
        check_close(out, ref, 1e-5, 1e-5);
        std::vector<float> s = g;
        cuda::scale(s.data(), n, 8.0f, nullptr);
        check_close(s, scaled, 0, 0);
    }
    // gemma2's soft-capped logits: rows 7 floats apart, 5 of them capped; -inf (a restricted id) stays -inf.
    std::vector<float> rows = random_floats(3 * 7, rng, 40.0f);
    rows[2] = -INFINITY;
    std::vector<double> want(rows.begin(), rows.end());
    for (int r = 0; r < 3; ++r)
        for (int j = 0; j < 5; ++j)
            if (rows[r * 7 + j] != -INFINITY) want[r * 7 + j] = 30.0 * std::tanh(rows[r * 7 + j] / 30.0);
    cuda::soft_cap(rows.data(), 3, 7, 5, 30.0f, nullptr);
    check_close(rows, want, 1e-5, 1e-6);
    CHECK(rows[2] == -INFINITY);
    // RoPE's amplitude on the rotated (leading) dims of each head only.
    std::vector<float> heads = random_floats(5 * 16, rng), want_heads = heads;
    for (int r = 0; r < 5; ++r)
        for (int d = 0; d < 12; ++d) want_heads[r * 16 + d] *= 1.19f;
    cuda::scale_leading(heads.data(), 5, 16, 12, 1.19f, nullptr);
    CHECK(heads == want_heads);
}

// ---- the Q8_0 KV cache ------------------------------------------------------------------------------------------

namespace {

constexpr size_t kQ8Block = 34;  // bytes of a ggml block_q8_0

// A cache of `positions` rows of kv_dim values quantized to Q8_0 by the CPU (cpu::quantize_row, ggml's reference
// quantizer), and the same rows dequantized.
struct Q8Cache {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};
Q8Cache random_q8_cache(int positions, int capacity, int kv_dim, std::mt19937& rng, float scale) {
    const size_t row = cuda::kv_row_bytes(cuda::KvType::Q8_0, kv_dim);
    Q8Cache c{std::vector<uint8_t>(row * capacity, 0xFF), std::vector<float>(static_cast<size_t>(capacity) * kv_dim, kNaN)};
    for (int p = 0; p < positions; ++p) {
        const std::vector<float> x = random_floats(kv_dim, rng, scale);
        cpu::quantize_row(GgmlType::Q8_0, x.data(), &c.bytes[p * row], kv_dim);
        cpu::dequantize_row(GgmlType::Q8_0, &c.bytes[p * row], &c.values[static_cast<size_t>(p) * kv_dim], kv_dim);
    }
    return c;
}

}  // namespace

TEST_CASE("cuda kernels: RoPE + KV write into a Q8_0 cache quantizes exactly as ggml's quantize_row_q8_0") {
    struct Case {
        int n_heads, n_kv, hd, rope_dim, n_tok, start;
    };
    // kv_dim 32 (one block a row), 128 (heads of two blocks), 32 with heads of 8 (stories260K: four heads a
    // block), 64 with a tail past rope_dim, 160 (heads of 80 straddling blocks), and 1024 with 32 heads (a token
    // spread over 8 blocks for Q and 4 for K/V).
    const Case cases[] = {{3, 1, 32, 32, 1, 0}, {4, 2, 64, 32, 5, 17}, {8, 4, 8, 8, 3, 100}, {4, 4, 16, 10, 3, 1000},
                          {4, 2, 80, 64, 2, 9}, {32, 8, 128, 128, 2, 5}};
    std::mt19937 rng(13);
    for (const Case& c : cases)
        for (bool neox : {false, true}) {
            CAPTURE(c.n_heads);
            CAPTURE(c.hd);
            CAPTURE(c.n_tok);
            CAPTURE(neox);
            const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, capacity = c.start + c.n_tok + 2;
            const size_t row = cuda::kv_row_bytes(cuda::KvType::Q8_0, kv_dim);
            REQUIRE(row == kv_dim / 32 * kQ8Block);
            const std::vector<float> q0 = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
            std::vector<float> k = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng, 2.0f);
            const std::vector<float> v = random_floats(static_cast<size_t>(c.n_tok) * kv_dim, rng);
            k[3] = 0.0f;  // a few exact values: zero, and a block's own max
            if (kv_dim > 40) k[40] = -4.5f;
            const std::vector<float> freq = inv_freqs(c.rope_dim, 10000.0f);
            const cuda::RopeMode mode = neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs;
            std::vector<float> q_ref = q0;
            for (int i = 0; i < c.n_tok; ++i)
                cpu_rope(&q_ref[i * q_dim], c.n_heads, c.hd, c.rope_dim, neox, c.start + i, freq.data());
            for (const LaunchOptions& o : kTwoOrders) {
                ScopedLaunchOptions scope(o);
                INFO("thread order " << std::string(order_name(o)));
                std::vector<float> q = q0;
                std::vector<uint8_t> kc(row * capacity, 0xFF), vc(kc.size(), 0xFF);
                cuda::RopeKvArgs a{q.data(), k.data(), v.data(), kc.data(), vc.data(), freq.data(), c.n_tok, c.start,
                                   c.n_heads, c.n_kv, c.hd, c.rope_dim, mode, cuda::KvType::Q8_0};
                cuda::rope_kv_write(a, nullptr);
                check_close(q, std::vector<double>(q_ref.begin(), q_ref.end()), 1e-5, 1e-2);
                // The kernel's own rotation of K: the same launch with the keys as queries (n_heads = n_kv).
                std::vector<float> k_rot = k;
                std::vector<uint8_t> scratch_k(row * capacity), scratch_v(row * capacity);
                cuda::RopeKvArgs as_q{k_rot.data(), k.data(), v.data(), scratch_k.data(), scratch_v.data(),
                                      freq.data(), c.n_tok, c.start, c.n_kv, c.n_kv, c.hd, c.rope_dim, mode,
                                      cuda::KvType::Q8_0};
                cuda::rope_kv_write(as_q, nullptr);
                for (int p = 0; p < capacity; ++p) {
                    const int i = p - c.start;
                    const uint8_t* krow = &kc[p * row];
                    const uint8_t* vrow = &vc[p * row];
                    if (i < 0 || i >= c.n_tok) {  // positions outside the step stay untouched
                        REQUIRE(std::all_of(krow, krow + row, [](uint8_t b) { return b == 0xFF; }));
                        REQUIRE(std::all_of(vrow, vrow + row, [](uint8_t b) { return b == 0xFF; }));
                        continue;
                    }
                    std::vector<uint8_t> want_k(row), want_v(row);
                    cpu::quantize_row(GgmlType::Q8_0, &k_rot[static_cast<size_t>(i) * kv_dim], want_k.data(), kv_dim);
                    cpu::quantize_row(GgmlType::Q8_0, &v[static_cast<size_t>(i) * kv_dim], want_v.data(), kv_dim);
                    CHECK(std::memcmp(krow, want_k.data(), row) == 0);  // bitwise: scales and codes
                    CHECK(std::memcmp(vrow, want_v.data(), row) == 0);
                    // And the keys are the CPU's RoPE within the quantization error: half a step, plus the codes
                    // (up to 127) times the fp16 rounding of d (2^-11 relative), the codes coming from the fp32 d.
                    std::vector<float> k_ref(k.begin() + static_cast<std::ptrdiff_t>(i) * kv_dim,
                                             k.begin() + static_cast<std::ptrdiff_t>(i + 1) * kv_dim),
                        k_deq(kv_dim);
                    cpu_rope(k_ref.data(), c.n_kv, c.hd, c.rope_dim, neox, p, freq.data());
                    cpu::dequantize_row(GgmlType::Q8_0, krow, k_deq.data(), kv_dim);
                    for (int e = 0; e < kv_dim; ++e) {
                        const float d = fp16_to_fp32(static_cast<uint16_t>(krow[e / 32 * kQ8Block] |
                                                                           krow[e / 32 * kQ8Block + 1] << 8));
                        REQUIRE(std::abs(k_deq[e] - k_ref[e]) <= (0.5f + 127.0f / 2048.0f) * d * 1.01f + 1e-6f);
                    }
                }
            }
        }
    // A row that is not whole blocks is refused.
    std::vector<float> q(80), k(80), v(80), f(4);
    std::vector<uint8_t> kc(200), vc(200);
    cuda::RopeKvArgs bad{q.data(), k.data(), v.data(), kc.data(), vc.data(), f.data(), 1, 0, 5, 5, 16, 8,
                         cuda::RopeMode::AdjacentPairs, cuda::KvType::Q8_0};
    CHECK_THROWS_AS(cuda::rope_kv_write(bad, nullptr), std::invalid_argument);
    CHECK_FALSE(cuda::kv_type_supports(cuda::KvType::Q8_0, 80));
    CHECK(cuda::kv_type_supports(cuda::KvType::F16, 80));
}

TEST_CASE("cuda kernels: split-K and flash prefill attention over a Q8_0 cache match attention over its values") {
    struct Case {
        int n_heads, n_kv, hd, start, n_tok, split;
    };
    // Every head-size template of both kernels, heads narrower than a block (8: stories260K) and heads straddling
    // blocks (80), decode-sized and prefill-sized calls.
    const Case cases[] = {{4, 2, 32, 0, 1, 16},  {3, 1, 64, 37, 3, 16}, {2, 2, 128, 60, 2, 32}, {2, 1, 256, 9, 17, 64},
                          {8, 4, 8, 20, 5, 7},   {4, 2, 80, 11, 34, 5}, {8, 4, 8, 0, 40, 64}};
    std::mt19937 rng(14);
    for (const Case& c : cases) {
        CAPTURE(c.n_heads);
        CAPTURE(c.hd);
        CAPTURE(c.start);
        CAPTURE(c.n_tok);
        const int q_dim = c.n_heads * c.hd, kv_dim = c.n_kv * c.hd, n_pos = c.start + c.n_tok;
        const std::vector<float> q = random_floats(static_cast<size_t>(c.n_tok) * q_dim, rng);
        // Positions past the call stay 0xFF (NaN scales): a kernel reading beyond its causal range would show.
        const Q8Cache kc = random_q8_cache(n_pos, n_pos + 3, kv_dim, rng, 3.0f);
        const Q8Cache vc = random_q8_cache(n_pos, n_pos + 3, kv_dim, rng, 1.0f);
        const std::vector<double> ref =
            attention_reference(q, kc.values, vc.values, c.n_heads, c.n_kv, c.hd, c.start, c.n_tok);
        for (const LaunchOptions& o : kTwoOrders) {
            ScopedLaunchOptions scope(o);
            INFO("thread order " << std::string(order_name(o)));
            for (bool prefill : {false, true}) {
                CAPTURE(prefill);
                std::vector<float> out(ref.size(), kNaN);
                std::vector<float> ws(cuda::attention_workspace_floats(c.n_tok, c.start, c.n_heads, c.hd, c.split),
                                      kNaN);
                cuda::AttentionArgs a{q.data(), kc.bytes.data(), vc.bytes.data(), out.data(), ws.data(), c.n_tok,
                                      c.start, c.n_heads, c.n_kv, c.hd, c.split, cuda::KvType::Q8_0};
                if (prefill)
                    cuda::attention_prefill(a, nullptr);
                else
                    cuda::attention(a, nullptr);
                // Values of unit scale, scores up to ~10 (keys of scale 3): the prefill bound of the fp16 test.
                for (size_t i = 0; i < out.size(); ++i) {
                    REQUIRE(!std::isnan(out[i]));
                    REQUIRE(std::abs(out[i] - ref[i]) <= 5e-6);
                }
                if (!prefill) check_fused_combine(a, out, ws.size());
            }
        }
    }
    std::vector<float> q(8), out(8);
    std::vector<uint8_t> kc(64), vc(64);
    cuda::AttentionArgs bad{q.data(), kc.data(), vc.data(), out.data(), out.data(), 1, 0, 5, 5, 16, 4,
                            cuda::KvType::Q8_0};
    CHECK_THROWS_AS(cuda::attention(bad, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::attention_prefill(bad, nullptr), std::invalid_argument);
}
