// Tests of every GGUF weight type the CPU reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) against
// an independent implementation: the gguf Python package's numpy dequantizers, through the fixtures in
// tests/data/quant-reference/ (made by scripts/make-quant-fixtures.py, random valid blocks and rows of real models).
// Also: vec_dot against a double-precision dot of the reference values, SIMD against scalar, matmul's batch
// invariance for the block types, and the weights loader accepting each type.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "cpu/fp16.h"
#include "random_blocks.h"
#include "cpu/matmul.h"
#include "cpu/quant.h"
#include "cpu/thread_pool.h"
#include "error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model_config.h"
#include "common/synthetic_model.h"
#include "test_paths.h"
#include "model/weights.h"

using namespace tandem;
using namespace tandem::cpu;
using namespace tandem::test;

namespace {

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// The types without a quantizer in tandem, which the tests build from random valid blocks.
const GgmlType kBlockTypes[] = {GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,
                                GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

struct Fixture {
    std::string name;
    GgmlType type;
    int64_t n = 0;
    std::vector<uint8_t> raw;
    std::vector<float> expected;
};

// Format: "TQREF1\0\0", u32 type, u32 n, u32 byte count, the bytes, n float32 (see make-quant-fixtures.py).
Fixture read_fixture(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f.good());
    char magic[8];
    uint32_t head[3];
    f.read(magic, 8);
    f.read(reinterpret_cast<char*>(head), sizeof head);
    REQUIRE(std::memcmp(magic, "TQREF1\0\0", 8) == 0);
    Fixture fx;
    fx.name = path.filename().string();
    fx.type = static_cast<GgmlType>(head[0]);
    fx.n = head[1];
    fx.raw.resize(head[2]);
    fx.expected.resize(head[1]);
    f.read(reinterpret_cast<char*>(fx.raw.data()), head[2]);
    f.read(reinterpret_cast<char*>(fx.expected.data()), static_cast<std::streamsize>(head[1] * sizeof(float)));
    REQUIRE(f.good());
    REQUIRE(fx.raw.size() == ggml_row_bytes(fx.type, static_cast<uint64_t>(fx.n)));
    return fx;
}

std::vector<Fixture> all_fixtures() {
    std::vector<Fixture> out;
    for (const auto& e : std::filesystem::directory_iterator(std::string(TANDEM_TEST_DATA) + "/quant-reference"))
        if (e.path().extension() == ".bin") out.push_back(read_fixture(e.path()));
    std::sort(out.begin(), out.end(), [](const Fixture& a, const Fixture& b) { return a.name < b.name; });
    return out;
}

}  // namespace

TEST_CASE("quant types: the CPU supports every common GGUF type and quantizes only to the four it writes") {
    for (GgmlType t : kAllTypes) {
        CAPTURE(std::string(ggml_type_name(t)));
        CHECK(cpu_supports(t));
        CHECK(ggml_type_info(t).supported);
        const bool writes = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::Q8_0 || t == GgmlType::Q4_0;
        CHECK(cpu_can_quantize(t) == writes);
    }
    // The type table's `supported` (what Weights accepts at load) is exactly the set the CPU kernels handle.
    for (uint32_t id = 0; id < 64; ++id)
        if (const auto info = ggml_type_info(id)) {
            CAPTURE(info->name);
            CHECK(info->supported == cpu_supports(static_cast<GgmlType>(id)));
        }
    CHECK_FALSE(cpu_supports(GgmlType::Q8_K));
    CHECK_FALSE(cpu_supports(GgmlType::IQ4_XS));
    float x[256] = {};
    uint8_t buf[512] = {};
    try {
        quantize_row(GgmlType::Q4_K, x, buf, 256);
        FAIL("expected tandem::Error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("q4_K") != std::string::npos);
    }
    CHECK_THROWS_AS(quantize_row(GgmlType::BF16, x, buf, 8), Error);
    CHECK_THROWS_AS(dequantize_row(GgmlType::Q6_K, buf, x, 128), Error);  // half a super-block
    CHECK_THROWS_AS(vec_dot(GgmlType::Q5_K, 32, buf, x), Error);
}

TEST_CASE("quant types: dequantize_row equals the gguf package's numpy values bitwise") {
    // Exact, not within an ulp: each value is one or two float operations (d * sc, then * q and - m), done in the
    // same order and rounding as numpy (the products are kept from fusing with the subtraction).
    const std::vector<Fixture> fixtures = all_fixtures();
    std::map<GgmlType, int> random_per_type;
    for (const Fixture& fx : fixtures) {
        CAPTURE(fx.name);
        if (fx.name.find("-random") != std::string::npos) ++random_per_type[fx.type];
        std::vector<float> out(static_cast<size_t>(fx.n), NAN);
        dequantize_row(fx.type, fx.raw.data(), out.data(), fx.n);
        int mismatches = 0;
        for (int64_t i = 0; i < fx.n; ++i) {
            if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(fx.expected[i]) && ++mismatches <= 5)
                FAIL_CHECK("element " << i << ": " << out[i] << ", expected " << fx.expected[i]);
        }
        CHECK(mismatches == 0);
    }
    for (GgmlType t : kAllTypes) {
        CAPTURE(std::string(ggml_type_name(t)));
        CHECK(random_per_type[t] == 1);
    }
    MESSAGE(fixtures.size() << " reference fixtures checked");
}

TEST_CASE("quant types: vec_dot matches a double-precision dot of the reference values, SIMD and scalar") {
    std::mt19937 rng(77);
    for (const Fixture& fx : all_fixtures()) {
        CAPTURE(fx.name);
        const std::vector<float> x = random_floats(fx.n, rng);
        double ref = 0, magnitude = 0, x_abs = 0, w_max = 0;
        for (int64_t i = 0; i < fx.n; ++i) {
            ref += double(fx.expected[i]) * x[i];
            magnitude += std::fabs(double(fx.expected[i]) * x[i]);
            x_abs += std::fabs(x[i]);
            w_max = std::max(w_max, std::fabs(double(fx.expected[i])));
        }
        // The scalar kernel sums the exact reference values: error <= depth * 2^-24 * sum |w x|, with depth about
        // n / 32 + 48 (per-step partials, then the steps). The SIMD kernel computes d * sum(q x) - m * sum(x) for
        // types with a min, which adds the min's share, bounded by max |w| * sum |x| (the min is a decoded value
        // of the block, the one of code 0) at the same depth.
        const double eps = (fx.n / 32.0 + 48) * std::ldexp(1.0, -24);
        const float scalar = vec_dot_scalar(fx.type, fx.n, fx.raw.data(), x.data());
        const float simd = vec_dot(fx.type, fx.n, fx.raw.data(), x.data());
        CHECK(std::fabs(scalar - ref) <= eps * magnitude + 1e-30);
        CHECK(std::fabs(simd - ref) <= eps * (magnitude + 2 * w_max * x_abs) + 1e-30);
        CHECK(std::fabs(simd - scalar) <= 2 * eps * (magnitude + 2 * w_max * x_abs) + 1e-30);
        // A unit vector picks one element, which both kernels reproduce exactly when the type has no min.
        std::vector<float> unit(static_cast<size_t>(fx.n), 0.0f);
        const int64_t j = fx.n / 3;
        unit[static_cast<size_t>(j)] = 1.0f;
        CHECK(vec_dot_scalar(fx.type, fx.n, fx.raw.data(), unit.data()) == fx.expected[j]);
    }
}

TEST_CASE("quant types: fp32-activation matmul is batch invariant and equals vec_dot for every block type") {
    const Activations F = Activations::Float;
    std::mt19937 rng(515);
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2)};
    const int64_t kMaxTokens = 12;
    for (GgmlType type : kBlockTypes) {
        const int64_t bs = ggml_type_info(type).block_size;
        std::vector<std::pair<int64_t, int64_t>> shapes;  // (cols, rows)
        for (int64_t rows : {3, 17}) shapes.push_back({bs, rows});
        shapes.push_back({bs * 3, 17});
        shapes.push_back({bs == 32 ? 4128 : 4352, 130});  // several row chunks of the prefill loop
        for (auto [cols, rows] : shapes) {
            CAPTURE(std::string(ggml_type_name(type)));
            CAPTURE(cols);
            CAPTURE(rows);
            const std::vector<uint8_t> W = random_blocks(type, cols, rows, rng);
            const std::vector<float> x = random_floats(cols * kMaxTokens, rng);
            const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));

            // Reference: each token alone, one thread; and it equals vec_dot, bitwise.
            std::vector<float> single(static_cast<size_t>(rows * kMaxTokens));
            for (int64_t t = 0; t < kMaxTokens; ++t)
                matmul(type, W.data(), cols, rows, x.data() + t * cols, 1, single.data() + t * rows, pools[0], F);
            int dot_mismatches = 0;
            for (int64_t t = 0; t < kMaxTokens; ++t)
                for (int64_t r = 0; r < rows; ++r) {
                    const float d = vec_dot(type, cols, W.data() + r * row_bytes, x.data() + t * cols);
                    dot_mismatches += std::memcmp(&d, &single[t * rows + r], sizeof d) != 0;
                }
            CHECK(dot_mismatches == 0);

            int mismatches = 0;
            for (ThreadPool& pool : pools)
                for (int64_t n = 1; n <= 9; ++n)
                    for (int64_t first : {int64_t{0}, kMaxTokens - n}) {
                        std::vector<float> y(static_cast<size_t>(rows * n), NAN);
                        matmul(type, W.data(), cols, rows, x.data() + first * cols, n, y.data(), pool, F);
                        mismatches += std::memcmp(y.data(), single.data() + first * rows, y.size() * sizeof(float)) != 0;
                    }
            CHECK(mismatches == 0);

            std::vector<float> y(static_cast<size_t>(rows * 9));
            matmul_rows(type, W.data(), cols, rows, x.data(), 9, y.data(), 0, rows / 2, F);
            matmul_rows(type, W.data(), cols, rows, x.data(), 9, y.data(), rows / 2, rows, F);
            CHECK(std::memcmp(y.data(), single.data(), y.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("quant types: the weights loader accepts a model whose matrices are of each type") {
    // The "tiny" synthetic model (f32), with every 2-D tensor rewritten as random valid blocks of the type
    // (all its matrix rows are multiples of 256).
    const auto shape = synthetic_preset("tiny");
    REQUIRE(shape);
    const std::filesystem::path dir = std::filesystem::temp_directory_path();
    const std::string base = (dir / ("tandem-qt-" + std::to_string(::getpid()) + "-base.gguf")).string();
    const std::string typed = (dir / ("tandem-qt-" + std::to_string(::getpid()) + "-typed.gguf")).string();
    write_synthetic_model(base, *shape, GgmlType::F32, 3);
    std::mt19937 rng(8);
    for (GgmlType type : kAllTypes) {
        CAPTURE(std::string(ggml_type_name(type)));
        {
            const auto in = GgufFile::open(base);
            GgufWriter w;
            for (const auto& [key, value] : in->metadata())
                if (key != "general.alignment") w.add_value(key, value);
            for (const GgufTensorInfo& t : in->tensors()) {
                std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
                if (t.n_dims == 2) {
                    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
                    REQUIRE(cols % 256 == 0);
                    std::vector<uint8_t> data;
                    if (cpu_can_quantize(type) || type == GgmlType::BF16) {
                        // Real values for the types tandem writes (and BF16, whose any bits are valid but NaN).
                        const float* src = reinterpret_cast<const float*>(t.data);
                        data.resize(ggml_row_bytes(type, static_cast<uint64_t>(cols)) * rows);
                        if (type == GgmlType::BF16)
                            for (int64_t i = 0; i < cols * rows; ++i) {
                                const uint16_t h = static_cast<uint16_t>(std::bit_cast<uint32_t>(src[i]) >> 16);
                                std::memcpy(data.data() + 2 * i, &h, 2);
                            }
                        else
                            quantize_row(type, src, data.data(), cols * rows);
                    } else {
                        data = random_blocks(type, cols, rows, rng);
                    }
                    w.add_tensor(t.name, type, dims, std::move(data));
                } else {
                    w.add_tensor(t.name, t.type, dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
                }
            }
            w.write(typed);
        }
        const auto f = GgufFile::open(typed);
        const ModelConfig config = ModelConfig::from_gguf(*f);
        Weights weights;
        CHECK_NOTHROW(weights = Weights::from_gguf(*f, config));
        CHECK(weights.layers.size() == static_cast<size_t>(config.n_layers));
        CHECK(weights.layers[0].w_up.type == type);
    }
    std::filesystem::remove(base);
    std::filesystem::remove(typed);
}

TEST_CASE("quant types: synthetic models of the types tandem cannot write have random codes at the wanted scale") {
    // tandem-bench --make-synthetic 7b --type q4_k: the GPU benchmarks' k-quant models. Each matrix must come out
    // at RMS 1/sqrt(cols), like the quantized types', and BF16 without NaN patterns.
    const auto shape = synthetic_preset("tiny");
    REQUIRE(shape);
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tandem-qt-" + std::to_string(::getpid()) + "-codes.gguf")).string();
    for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                          GgmlType::BF16}) {
        CAPTURE(std::string(ggml_type_name(type)));
        write_synthetic_model(path, *shape, type, 4);
        const auto f = GgufFile::open(path);
        int matrices = 0;
        for (const GgufTensorInfo& t : f->tensors()) {
            if (t.n_dims != 2 || t.type != type) continue;
            ++matrices;
            const int64_t cols = static_cast<int64_t>(t.ne[0]);
            std::vector<float> row(static_cast<size_t>(cols));
            double ss = 0;
            const int64_t rows = std::min<int64_t>(static_cast<int64_t>(t.ne[1]), 8);
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_row(type, t.data + r * ggml_row_bytes(type, static_cast<uint64_t>(cols)), row.data(), cols);
                for (float v : row) {
                    REQUIRE(std::isfinite(v));
                    ss += static_cast<double>(v) * v;
                }
            }
            const double rms_times_sqrt_cols = std::sqrt(ss / static_cast<double>(rows * cols) * static_cast<double>(cols));
            CAPTURE(t.name);
            CHECK(rms_times_sqrt_cols > 0.7);
            CHECK(rms_times_sqrt_cols < 1.4);
        }
        CHECK(matrices >= 7 * shape->n_layers);
    }
    std::filesystem::remove(path);
}
