// Tests of CudaBackend (src/cuda/) on the CUDA emulation: the whole forward pass through the kernels of kernels/,
// compared with CpuBackend in fp32-activation mode on stories260K (f32, and requantized to q8_0 / q4_0): logits at
// every position through chunked prefill, decode steps, a cache truncate (speculative rollback) and more steps;
// long calls through the prefill path (GEMM + flash attention), whose chunking must not matter. Plus the memory
// plan's refusal when the device is too small. The emulated device is the CPU, so these run in CI.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
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

namespace {

std::vector<int> test_prompt(int n, int n_vocab) {
    std::vector<int> p = {1};
    for (int i = 1; i < n; ++i) p.push_back((i * 37 + 11) % n_vocab);
    return p;
}

// `prompt` fed in calls of the given sizes, then `n_decode` greedy decode steps (the CPU backend picks the tokens,
// so both backends follow the same text). Each call asks for the logits of its last kLogitRows positions (the
// matvec kernels dominate the emulated time: every warp reduction is a chain of shuffles), compared row by row with
// the CPU backend.
constexpr int kLogitRows = 2;
struct PrefillRun {
    std::vector<float> logits;  // every row the CUDA backend returned, in order
    Diff diff;
};
PrefillRun run_prefill(const Model& model, CudaPrefillOptions options, const std::vector<int>& calls, int n_decode,
                       int n_ctx) {
    const int n_vocab = model.config.n_vocab;
    CpuBackend cpu(model, 1, 64, cpu::Activations::Float);
    CudaBackend gpu(model, n_ctx, options);
    auto cpu_cache = cpu.new_cache(n_ctx);
    auto gpu_cache = gpu.new_cache(n_ctx);
    int total = 0;
    for (int n : calls) total += n;
    const std::vector<int> prompt = test_prompt(total, n_vocab);
    PrefillRun run;
    int next = 0, begin = 0;
    auto call = [&](std::span<const int> tokens) {
        const int n = std::min(kLogitRows, static_cast<int>(tokens.size()));
        std::vector<float> a(static_cast<size_t>(n) * n_vocab), b(a.size(), std::nanf(""));
        cpu.forward(tokens, *cpu_cache, n, a.data());
        gpu.forward(tokens, *gpu_cache, n, b.data());
        REQUIRE(gpu_cache->n_committed() == cpu_cache->n_committed());
        for (int i = 0; i < n; ++i)
            run.diff.add(&b[static_cast<size_t>(i) * n_vocab], &a[static_cast<size_t>(i) * n_vocab], n_vocab);
        run.logits.insert(run.logits.end(), b.begin(), b.end());
        const float* last = &a[static_cast<size_t>(n - 1) * n_vocab];
        next = static_cast<int>(std::max_element(last, last + n_vocab) - last);
    };
    for (int n : calls) {
        call(std::span<const int>(prompt.data() + begin, n));
        begin += n;
    }
    for (int i = 0; i < n_decode; ++i) {
        const int tok = next;
        call(std::span<const int>(&tok, 1));
    }
    return run;
}

// Every call longer than 16 tokens on the prefill path.
constexpr CudaPrefillOptions kPrefillFrom17 = {256, 16};

}  // namespace

TEST_CASE("cuda backend: prefills of 40 and 100 tokens through the GEMM and flash attention match the CPU backend") {
    for (const std::string& name : {std::string("f32"), std::string("q8_0"), std::string("q4_0")}) {
        CAPTURE(name);
        auto model = Model::load(name == "f32"    ? kData + "/stories260K.gguf"
                                 : name == "q8_0" ? requantized(GgmlType::Q8_0)
                                                  : requantized(GgmlType::Q4_0));
        // 40 tokens, then 100 more (the second chunk's queries attend to the first chunk's cache), then (f32) a
        // decode step (matvec + split-K) reading the cache the prefill path wrote.
        const PrefillRun run = run_prefill(*model, kPrefillFrom17, {40, 100}, name == "f32" ? 1 : 0, 160);
        MESSAGE("stories260K ", name, " prefill path: max |cuda - cpu| = ", run.diff.worst_abs, " (",
                run.diff.worst_rel, " of the logit range)");
        CHECK(run.diff.worst_rel <= 1e-2);
    }
}

TEST_CASE("cuda backend: prefill chunking does not change the logits") {
    auto model = Model::load(requantized(GgmlType::Q8_0));
    // One call of 100 tokens in one chunk; the same call cut into chunks of 32 (the last one, which returns the
    // logits, 4 tokens); calls of 40 + 60. Then a decode step on each cache. The SIMT GEMM and the flash attention
    // are batch-invariant, so under the emulation the prefill path agrees with itself bitwise (cuBLAS may pick
    // other algorithms per shape: on a GPU only within tolerance).
    const size_t row = static_cast<size_t>(model->config.n_vocab);
    const PrefillRun one = run_prefill(*model, kPrefillFrom17, {100}, 1, 128);
    const PrefillRun small = run_prefill(*model, {32, 16}, {100}, 1, 128);
    const PrefillRun two = run_prefill(*model, kPrefillFrom17, {40, 60}, 0, 128);
    REQUIRE(one.logits.size() == (kLogitRows + 1) * row);
    REQUIRE(small.logits.size() == one.logits.size());
    REQUIRE(two.logits.size() == 2 * kLogitRows * row);
    CHECK(std::memcmp(one.logits.data(), small.logits.data(), one.logits.size() * 4) == 0);
    CHECK(std::memcmp(one.logits.data(), two.logits.data() + kLogitRows * row, kLogitRows * row * 4) == 0);
    CHECK(one.diff.worst_rel <= 1e-2);
    CHECK(two.diff.worst_rel <= 1e-2);
    // The default options: a 100-token call takes the prefill path, bitwise the same as above. (That calls of up
    // to 64 tokens keep the matvec path is what compare_backends' 20- and 17-token calls run through.)
    const PrefillRun def100 = run_prefill(*model, {}, {100}, 0, 128);
    CHECK(std::memcmp(def100.logits.data(), one.logits.data(), def100.logits.size() * 4) == 0);
}

TEST_CASE("cuda backend: a prefill call returns the logits of its last n_logits tokens only") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const int n_vocab = model->config.n_vocab;
    const std::vector<int> prompt = test_prompt(90, n_vocab);
    CudaBackend gpu(*model, 96, kPrefillFrom17);
    auto all_cache = gpu.new_cache(96);
    // 17 rows (two groups of the 16-row output matvec), 2 rows, then none at all.
    std::vector<float> all(static_cast<size_t>(17) * n_vocab);
    gpu.forward(prompt, *all_cache, 17, all.data());
    auto cache = gpu.new_cache(96);
    std::vector<float> last(static_cast<size_t>(2) * n_vocab + 1, std::nanf(""));
    gpu.forward(prompt, *cache, 2, last.data());
    CHECK(std::memcmp(last.data(), all.data() + static_cast<size_t>(15) * n_vocab, 2 * n_vocab * 4) == 0);
    CHECK(std::isnan(last.back()));
    cache->truncate(0);
    gpu.forward(prompt, *cache, 0, nullptr);
    CHECK(cache->n_committed() == 90);
}

TEST_CASE("cuda backend: the memory plan refuses a device that is too small, naming both figures") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const CudaMemoryPlan plan = CudaBackend::plan(*model, 256);
    CHECK(plan.weights >= model->weights.bytes_per_token() / 2);
    CHECK(plan.kv_cache == CudaKvCache::bytes_needed(model->config.n_layers, 256, model->config.kv_dim()));
    // The scratch holds one prefill chunk of activations: a longer chunk needs more, and describe() says which.
    CHECK(CudaBackend::plan(*model, 256, {512, 64}).scratch > plan.scratch);
    CHECK(CudaBackend::plan(*model, 256, {16, 64}).scratch < plan.scratch);
    CHECK(plan.describe().find("256-token prefill chunks, SIMT GEMM") != std::string::npos);
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
