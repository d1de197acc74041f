// Tests of CudaBackend (src/cuda/) on the CUDA emulation: the whole forward pass through the kernels of kernels/,
// compared with CpuBackend in fp32-activation mode on stories260K (f32, and requantized to q8_0 / q4_0): logits at
// every position through chunked prefill, decode steps, a cache truncate (speculative rollback) and more steps.
// Plus the memory plan's refusal when the device is too small. The emulated device is the CPU, so these run in CI.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "device.h"
#include "error.h"
#include "gguf.h"
#include "model.h"
#include "model_registry.h"
#include "quantize_model.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

// The worst row of a comparison: max |cuda - cpu| over the row divided by the CPU row's logit range.
struct Diff {
    double worst_rel = 0.0, worst_abs = 0.0;
    void add(const float* cuda, const float* cpu, int n_vocab) {
        const auto [lo, hi] = std::minmax_element(cpu, cpu + n_vocab);
        double d = 0.0;
        for (int i = 0; i < n_vocab; ++i) {
            REQUIRE(std::isfinite(cuda[i]));
            d = std::max(d, static_cast<double>(std::abs(cuda[i] - cpu[i])));
        }
        worst_abs = std::max(worst_abs, d);
        worst_rel = std::max(worst_rel, d / std::max(1e-6, static_cast<double>(*hi - *lo)));
    }
};

// Runs the same calls on both backends and compares every logit row they return. The schedule: a prefill of 37
// tokens in chunks of 20 and 17 (CUDA splits each into 16-token steps), 6 single-token decodes, a truncate back
// by 4 positions (a rejected draft), a 5-token verification-sized call, then 3 more decodes.
Diff compare_backends(const Model& model, int n_ctx) {
    const int n_vocab = model.config.n_vocab;
    CpuBackend cpu(model, 1, 64, cpu::Activations::Float);
    CudaBackend gpu(model, n_ctx);
    auto cpu_cache = cpu.new_cache(n_ctx);
    auto gpu_cache = gpu.new_cache(n_ctx);
    Diff diff;
    std::vector<int> history;
    auto step = [&](std::vector<int> tokens) {
        const int n = static_cast<int>(tokens.size());
        std::vector<float> a(static_cast<size_t>(n) * n_vocab), b(a.size(), std::nanf(""));
        cpu.forward(tokens, *cpu_cache, n, a.data());
        gpu.forward(tokens, *gpu_cache, n, b.data());
        REQUIRE(gpu_cache->n_committed() == cpu_cache->n_committed());
        for (int i = 0; i < n; ++i) diff.add(&b[static_cast<size_t>(i) * n_vocab], &a[static_cast<size_t>(i) * n_vocab], n_vocab);
        // The next token: the CPU's argmax, so the run follows a plausible text.
        const float* last = &a[static_cast<size_t>(n - 1) * n_vocab];
        return static_cast<int>(std::max_element(last, last + n_vocab) - last);
    };
    std::vector<int> prompt = {1};
    for (int i = 1; i < 37; ++i) prompt.push_back((i * 37 + 11) % n_vocab);
    step(std::vector<int>(prompt.begin(), prompt.begin() + 20));
    int next = step(std::vector<int>(prompt.begin() + 20, prompt.end()));
    for (int i = 0; i < 6; ++i) next = step({next});
    const int keep = cpu_cache->n_committed() - 4;
    cpu_cache->truncate(keep);
    gpu_cache->truncate(keep);
    next = step({next, 5, 17, 300 % n_vocab, 42});
    for (int i = 0; i < 3; ++i) next = step({next});
    return diff;
}

// q8_0 / q4_0 requantizations of stories260K, written once per test run.
std::string requantized(GgmlType type) {
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-cuda-backend-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/" + ggml_type_name(type) + ".gguf";
    if (!std::filesystem::exists(path)) requantize_gguf(*GgufFile::open(kData + "/stories260K.gguf"), type).write(path);
    return path;
}

struct RemoveTempDir {
    ~RemoveTempDir() {
        std::error_code ec;
        std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("tandem-cuda-backend-" + std::to_string(getpid())), ec);
    }
} remove_temp_dir;

}  // namespace

TEST_CASE("cuda backend: stories260K f32 logits match the CPU backend through prefill, decode and truncate") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const Diff d = compare_backends(*model, 64);
    MESSAGE("stories260K f32: max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel, " of the logit range)");
    // fp16 keys and values are the only deliberate rounding; everything else is fp32 in a different order.
    CHECK(d.worst_rel <= 1e-2);
}

TEST_CASE("cuda backend: stories260K requantized to q8_0 and q4_0 matches the CPU backend") {
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
        CAPTURE(std::string(ggml_type_name(type)));
        auto model = Model::load(requantized(type));
        const Diff d = compare_backends(*model, 48);
        const std::string name = std::string("stories260K ") + ggml_type_name(type);
        MESSAGE(name, ": max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel, " of the logit range)");
        CHECK(d.worst_rel <= 1e-2);
    }
}

TEST_CASE("cuda backend: the memory plan refuses a device that is too small, naming both figures") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const CudaMemoryPlan plan = CudaBackend::plan(*model, 256);
    CHECK(plan.weights >= model->weights.bytes_per_token() / 2);
    CHECK(plan.kv_cache == CudaKvCache::bytes_needed(model->config.n_layers, 256, model->config.kv_dim()));
    struct Restore {
        ~Restore() { cuda::set_emulated_device_memory(0); }
    } restore;
    cuda::set_emulated_device_memory(plan.total() - 1);
    try {
        CudaBackend backend(*model, 256);
        FAIL("the backend was created on a device that is too small");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("needs") != std::string::npos);
        CHECK(msg.find("free") != std::string::npos);
        CHECK(msg.find("KV cache") != std::string::npos);
    }
    // Fits with a shorter context; a larger cache later is refused the same way.
    cuda::set_emulated_device_memory(plan.total());
    CudaBackend backend(*model, 256);
    CHECK_THROWS_AS(backend.new_cache(100000), Error);
    CHECK(backend.new_cache(256) != nullptr);
}

TEST_CASE("cuda backend: out-of-range token ids are an error, not a NaN row") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CudaBackend backend(*model, 8);
    auto cache = backend.new_cache(8);
    const std::vector<int> bad = {1, 100000};
    std::vector<float> logits(2 * model->config.n_vocab);
    CHECK_THROWS_AS(backend.forward(bad, *cache, 2, logits.data()), Error);
}

// The emulated backend on a real model: SmolLM2-135M (q4_1 matrices, q8_0 embedding, 30 layers, GQA 9/3 heads of
// 64). Slow under the emulation (every weight row is a warp of fibers): a 5-token prefill and one decode, ~40 s.
// "real:" so that sanitizer runs (which skip real-model tests) skip it.
TEST_CASE("real: cuda backend on SmolLM2-135M matches the CPU backend for a few tokens") {
    const auto path = installed_path("smollm2-135m-instruct-q4_1");
    if (!path) FAIL("model smollm2-135m-instruct-q4_1 is missing from " << models_dir() << ": run scripts/fetch-models");
    auto model = Model::load(*path);
    const int n_vocab = model->config.n_vocab, n_ctx = 16;
    CpuBackend cpu(*model, 2, 16, cpu::Activations::Float);
    CudaBackend gpu(*model, n_ctx);
    auto cpu_cache = cpu.new_cache(n_ctx);
    auto gpu_cache = gpu.new_cache(n_ctx);
    const auto t0 = std::chrono::steady_clock::now();
    Diff diff;
    std::vector<int> tokens = model->tokenizer->encode("The capital of France is", false);
    tokens.resize(std::min<size_t>(tokens.size(), 6));
    for (int round = 0; round < 2; ++round) {
        std::vector<float> a(static_cast<size_t>(n_vocab)), b(a.size(), std::nanf(""));
        cpu.forward(tokens, *cpu_cache, 1, a.data());
        gpu.forward(tokens, *gpu_cache, 1, b.data());
        diff.add(b.data(), a.data(), n_vocab);
        CHECK(std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin());
        tokens = {static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin())};
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("SmolLM2-135M: max |cuda - cpu| = ", diff.worst_abs, " (", diff.worst_rel, " of the logit range), ", s,
            " s");
    CHECK(diff.worst_rel <= 1e-2);
}
