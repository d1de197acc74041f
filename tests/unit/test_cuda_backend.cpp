// Tests of CudaBackend (src/cuda/) on the CUDA emulation: the whole forward pass through the kernels of kernels/,
// compared with CpuBackend in fp32-activation mode on stories260K (f32, and requantized to q8_0 / q4_0): logits at
// every position through chunked prefill, decode steps, a cache truncate (speculative rollback) and more steps;
// long calls through the prefill path (GEMM + flash attention), whose chunking must not matter; CUDA graphs (bitwise
// the logits of direct launches, and captured / updated / replayed exactly when the design says); the q8_0 KV cache
// (within tolerance of the f16 one, in the memory plan); logits restricted to part of the vocabulary (bitwise the
// unrestricted ones where computed; a restricted draft on the device keeps the output). Plus the memory plan's refusal when the device is too small.
// The emulated device is the CPU, so these run in CI. The same file also builds into tandem_cuda_device_tests
// (TANDEM_TEST_REAL_DEVICE, nvcc builds only) against the real kernels: scripts/gpu-check runs it on a GPU, where
// the emulation's knobs (thread orders, a pretended memory size) are replaced by what a real device offers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/quant.h"
#include "cuda/cuda_backend.h"
#include "device.h"
#ifdef TANDEM_TEST_REAL_DEVICE
#include "real_device_shim.h"
#else
#include "emu/cuda_emu.h"
#endif
#include "error.h"
#include "generate/generator.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "app/environment.h"
#include "app/model_registry.h"
#include "convert/quantize_model.h"
#include "common/synthetic_model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

// Overridable, for tandem_cuda_device_tests run from another checkout path (scripts/gpu-check on a lent machine).
const std::string kData = std::getenv("TANDEM_TEST_DATA") ? std::getenv("TANDEM_TEST_DATA") : TANDEM_TEST_DATA;

// The worst row of a comparison: max |cuda - cpu| over the row divided by the CPU row's logit range.
struct Diff {
    double worst_rel = 0.0, worst_abs = 0.0;
    std::vector<double> row_rel;  // each row's largest difference, relative to its logit range
    double median_rel() const {
        std::vector<double> v = row_rel;
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    }
    void add(const float* cuda, const float* cpu, int n_vocab) {
        const auto [lo, hi] = std::minmax_element(cpu, cpu + n_vocab);
        double d = 0.0;
        for (int i = 0; i < n_vocab; ++i) {
            REQUIRE(std::isfinite(cuda[i]));
            d = std::max(d, static_cast<double>(std::abs(cuda[i] - cpu[i])));
        }
        worst_abs = std::max(worst_abs, d);
        row_rel.push_back(d / std::max(1e-6, static_cast<double>(*hi - *lo)));
        worst_rel = std::max(worst_rel, row_rel.back());
    }
};

// Options with fp32 activations for every type (tests of the float route on models whose type, Q4_0, measured faster
// with 8-bit activations).
CudaOptions fp32_route() {
    CudaOptions o;
    o.int8_activations = false;
    return o;
}

// Runs the same calls on both backends and compares every logit row they return. The schedule: a prefill of 37
// tokens in chunks of 20 and 17 (CUDA splits each into 16-token steps), 6 single-token decodes, a truncate back
// by 4 positions (a rejected draft), a 5-token verification-sized call, then 3 more decodes.
Diff compare_backends(const Model& model, int n_ctx, CudaOptions options = {},
                      cpu::Activations cpu_activations = cpu::Activations::Float, bool repack = true) {
    const int n_vocab = model.config.n_vocab;
    CpuBackend cpu(model, 1, 64, {.activations = cpu_activations, .repack = repack, .kv_type = CpuKvType::F16});
    CudaBackend gpu(model, n_ctx, {}, options);
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


// This test run's directory for model files (removed at exit).
std::string temp_dir() {
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-cuda-backend-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    return dir;
}

struct RemoveTempDir {
    ~RemoveTempDir() {
        std::error_code ec;
        std::filesystem::remove_all(temp_dir(), ec);
    }
} remove_temp_dir;

// q8_0 / q4_0 requantizations of stories260K, written once per test run.
std::string requantized(GgmlType type) {
    const std::string path = temp_dir() + "/" + ggml_type_name(type) + ".gguf";
    if (!std::filesystem::exists(path)) requantize_gguf(*GgufFile::open(kData + "/stories260K.gguf"), type).write(path);
    return path;
}

// A synthetic model of `shape` with matrices of `type`, written into the run's directory and loaded.
auto synthetic(const SyntheticShape& shape, GgmlType type, uint64_t seed) {
    const std::string path = temp_dir() + "/" + shape.name + ".gguf";
    write_synthetic_model(path, shape, type, seed);
    return Model::load(path);
}

}  // namespace

TEST_CASE("cuda backend: stories260K f32 logits match the CPU backend through prefill, decode and truncate") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const Diff d = compare_backends(*model, 64);
    MESSAGE("stories260K f32: max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel, " of the logit range)");
    // Both caches hold the same fp16 keys and values (the CPU's CpuKvType::F16); everything else is fp32 in a
    // different order. A last-bit difference that moves a key across an fp16 rounding boundary moves the logits
    // ~2e-5 of their range (measured 6.7e-6 worst): the bound leaves room for a few.
    CHECK(d.worst_rel <= 1e-3);
}

TEST_CASE("cuda backend: stories260K requantized to q8_0 and q4_0 matches the CPU backend on the fp32 route" * doctest::test_suite("emu-variants")) {
    // fp32 activations for both types (Q4_0's measured route is 8-bit: the test below holds it to the CPU's Int8).
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
        CAPTURE(std::string(ggml_type_name(type)));
        auto model = Model::load(requantized(type));
        const Diff d = compare_backends(*model, 48, fp32_route());
        const std::string name = std::string("stories260K ") + ggml_type_name(type);
        MESSAGE(name, ": max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel, " of the logit range)");
        CHECK(d.worst_rel <= 5e-3);  // measured 5.7e-5 (q8_0), 3.9e-4 (q4_0): fp16 rounding flips, as above
    }
}

TEST_CASE("cuda backend: the 8-bit matvec route stays with the CPU backend's Int8 logits (stories260K q8_0 and q4_0)" * doctest::test_suite("emu-variants")) {
    // CudaOptions::int8_activations: every block-type matvec of a step takes its input quantized as the CPU's Int8
    // matmul does, with the same integer sums (the kernel tests check both bitwise / to float rounding), and both
    // caches hold the same fp16 values. The model still cannot agree bitwise: sums in another order differ in their
    // last bit, and where that crosses a rounding boundary of an 8-bit code (or of the fp16 cache) the backends
    // quantize differently, one code moving the logits ~2e-3 of their range at that position and after (measured:
    // q8_0 1e-7, with no such crossing; q4_0 8.9e-3 worst, 3.3e-3 median). So the check is the backends' usual
    // agreement, and that the route is in use.
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0}) {
        CAPTURE(std::string(ggml_type_name(type)));
        auto model = Model::load(requantized(type));
        CudaOptions int8;
        int8.int8_activations = true;
        const Diff with_int8 = compare_backends(*model, 48, int8, cpu::Activations::Int8);
        const Diff fp32_vs_cpu_fp32 = compare_backends(*model, 48, fp32_route(), cpu::Activations::Float);
        const Diff int8_vs_cpu_fp32 = compare_backends(*model, 48, int8, cpu::Activations::Float);
        MESSAGE("stories260K ", std::string(ggml_type_name(type)), ": cuda int8 vs cpu int8: worst ",
                with_int8.worst_rel,
                ", median ", with_int8.median_rel(), " of the logit range; cuda fp32 vs cpu fp32: median ",
                fp32_vs_cpu_fp32.median_rel(), "; cuda int8 vs cpu fp32: median ", int8_vs_cpu_fp32.median_rel());
        CHECK(with_int8.worst_rel <= 2e-2);
        CHECK(with_int8.median_rel() <= 1e-2);
        // In use: quantizing the activations moves the logits ~10x more than the backends' float differences.
        CHECK(int8_vs_cpu_fp32.median_rel() > 5 * fp32_vs_cpu_fp32.median_rel());
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
                       int n_ctx, CudaOptions cuda_options = {},
                       cpu::Activations cpu_activations = cpu::Activations::Float) {
    const int n_vocab = model.config.n_vocab;
    CpuBackend cpu(model, 1, 64, {.activations = cpu_activations, .kv_type = CpuKvType::F16});
    CudaBackend gpu(model, n_ctx, options, cuda_options);
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

TEST_CASE("cuda backend: the int8 tensor-core prefill GEMM stays with the CPU backend's Int8 logits (q8_0 / q4_0 / q6_k)" * doctest::test_suite("emu-variants")) {
    // CudaOptions::int8_gemm: each prefill matmul's input quantized once to Q8_1 (for q8_0 / q4_0 the codes and d
    // of the CPU's Int8 matmul; the CPU gives k-quants Q8_K blocks of 256) and multiplied by kernels.h gemm_q8. As
    // with the 8-bit matvec route, the backends' usual agreement is the check, and the route must be in use: it
    // moves the logits well beyond the float route's differences from the CPU. Q6_K (a synthetic model; stories260K
    // has no whole 256-blocks) takes the route's two-scale path: two m16n8k16 per 32-element block. The random
    // synthetic model is more sensitive to 8-bit activations: a Q8_0 model of its shape (whose blocks are the CPU's
    // bitwise) moves 1.0e-2 of the logit range from either CPU route, its Q6_K model 1.7e-2 from the CPU's Int8
    // (Q8_K) and 1.3e-2 from its float logits; a misplaced scale or code moves them by far more than the bound.
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q6_K}) {
        CAPTURE(std::string(ggml_type_name(type)));
        const bool synthetic_model = type == GgmlType::Q6_K;
        auto model = synthetic_model ? synthetic({"q6k", 256, 512, 2, 4, 2, 512, 128}, type, 13)
                                     : Model::load(requantized(type));
        REQUIRE(model->weights.layers[0].wq.type == type);
        // The output projection after the chunk is a matvec: against the CPU's Int8 logits it takes 8-bit
        // activations too (the CPU's Int8 quantizes the head's input as well), against the CPU's float logits fp32
        // ones (Q4_0's measured matvec route is 8-bit), so that only the GEMM differs.
        CudaOptions int8 = fp32_route();
        int8.int8_gemm = true;
        CudaOptions int8_head = int8;
        int8_head.int8_activations = true;
        const PrefillRun with_int8 =
            run_prefill(*model, kPrefillFrom17, {100}, 0, 128, int8_head, cpu::Activations::Int8);
        const PrefillRun float_run = run_prefill(*model, kPrefillFrom17, {100}, 0, 128, fp32_route());
        const PrefillRun int8_vs_float = run_prefill(*model, kPrefillFrom17, {100}, 0, 128, int8);
        const std::string model_name =
            std::string(synthetic_model ? "synthetic " : "stories260K ") + ggml_type_name(type);
        MESSAGE(model_name, " prefill: cuda int8 GEMM vs cpu int8: worst ", with_int8.diff.worst_rel, ", median ",
                with_int8.diff.median_rel(), "; float GEMM vs cpu float: median ", float_run.diff.median_rel(),
                "; int8 GEMM vs cpu float: worst ", int8_vs_float.diff.worst_rel, ", median ",
                int8_vs_float.diff.median_rel());
        if (synthetic_model) {
            CHECK(with_int8.diff.worst_rel <= 3e-2);
            CHECK(int8_vs_float.diff.worst_rel <= 3e-2);
        } else {
            // The CPU's codes and scales, the same integer sums and the same fp16 cache: measured 8e-8 of the logit
            // range under the emulation. The bound leaves room for a few last bits that cross a code's rounding
            // boundary (~2e-3 each), as a GPU's tensor cores and FMA contraction may add.
            CHECK(with_int8.diff.worst_rel <= 1e-2);
        }
        CHECK(int8_vs_float.diff.median_rel() > 5 * float_run.diff.median_rel());
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
    CHECK(plan.describe().find(CudaBackend::use_blas(CudaOptions{}) ? "256-token prefill chunks, cuBLAS"
                                                       : "256-token prefill chunks, SIMT GEMM") != std::string::npos);
    if (!cuda::device_is_emulated()) {
        // A real device: a context whose KV cache alone outgrows the free memory is refused before any allocation.
        const size_t free_bytes = cuda::device_memory().free_bytes;
        const size_t per_position = CudaKvCache::bytes_needed(model->config.n_layers, 1, model->config.kv_dim());
        const int n_ctx = static_cast<int>(std::min<size_t>(free_bytes / per_position + 1024, 1u << 30));
        try {
            CudaBackend backend(*model, n_ctx);
            FAIL("the backend was created with a KV cache larger than the device's free memory");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHECK(msg.find("needs") != std::string::npos);
            CHECK(msg.find("free") != std::string::npos);
        }
        return;
    }
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

TEST_CASE("cuda backend: a target and draft that do not fit together are refused before either is made") {
    auto target = Model::load(kData + "/stories260K.gguf");
    auto draft = Model::load(requantized(GgmlType::Q8_0));
    const CudaMemoryPlan t = CudaBackend::plan(*target, 256), d = CudaBackend::plan(*draft, 256);
    if (!cuda::device_is_emulated()) {
        CudaBackend::check_pair_fits(t, d);  // two tiny models fit on any real device
        return;
    }
    struct Restore {
        ~Restore() { cuda::set_emulated_device_memory(0); }
    } restore;
    // Each alone fits; the two together do not, and the message names the sum and both plans.
    cuda::set_emulated_device_memory(t.total() + d.total() - 1);
    try {
        CudaBackend::check_pair_fits(t, d);
        FAIL("a pair larger than the device was accepted");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("the model with its draft needs") != std::string::npos);
        CHECK(msg.find("draft " + d.describe()) != std::string::npos);
        CHECK(msg.find("model " + t.describe()) != std::string::npos);
        CHECK(msg.find("free") != std::string::npos);
    }
    cuda::set_emulated_device_memory(t.total() + d.total());
    CudaBackend::check_pair_fits(t, d);
    CudaBackend a(*target, 256), b(*draft, 256);  // and the plans are what the backends check themselves
}

TEST_CASE("cuda backend: out-of-range token ids are an error, not a NaN row") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CudaBackend backend(*model, 8);
    auto cache = backend.new_cache(8);
    const std::vector<int> bad = {1, 100000};
    std::vector<float> logits(2 * model->config.n_vocab);
    CHECK_THROWS_AS(backend.forward(bad, *cache, 2, logits.data()), Error);
}

// The emulated backend on a real model against the CPU backend (fp32 activations): a prompt of up to 6 tokens in one
// call, then a decode of the argmax; the logits within 1% of the logit range, the same argmax. Slow under the
// emulation (every weight row is a warp of fibers). "real:" so that sanitizer runs (which skip real-model tests)
// skip it.
namespace {

void check_real_model_on_cuda(const std::string& name, const std::string& prompt, CudaOptions options = {}) {
    const auto path = installed_path(name);
    if (!path) FAIL("model " << name << " is missing from " << environment().models_dir << ": run scripts/fetch-models");
    auto model = Model::load(*path);
    const int n_vocab = model->config.n_vocab, n_ctx = 16;
    CpuBackend cpu(*model, 2, 16, {.activations = cpu::Activations::Float, .kv_type = CpuKvType::F16});
    CudaBackend gpu(*model, n_ctx, {}, options);
    auto cpu_cache = cpu.new_cache(n_ctx);
    auto gpu_cache = gpu.new_cache(n_ctx);
    const auto t0 = std::chrono::steady_clock::now();
    Diff diff;
    std::vector<int> tokens = model->tokenizer->encode(prompt, false);
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
    MESSAGE(name, ": max |cuda - cpu| = ", diff.worst_abs, " (", diff.worst_rel, " of the logit range), ", s, " s");
    CHECK(diff.worst_rel <= 1e-2);
    // The decode step's graph: the embedding, the norm, the step's RoPE angles, 5 kernels a layer (Q/K/V in one
    // launch with RoPE, also where their types differ), the output matvec; with the persistent step the embedding,
    // the angles, the persistent launch and the output matvec.
    if (options.persistent_step)
        CHECK(gpu.graph_stats().nodes == 4);
    else
        CHECK(gpu.graph_stats().nodes == 3 + 5 * model->config.n_layers + 1);
}

}  // namespace

// SmolLM2-135M: q4_1 matrices, q8_0 embedding, 30 layers, GQA 9/3 heads of 64 (~40 s).
TEST_CASE("real: cuda backend on SmolLM2-135M matches the CPU backend for a few tokens") {
    check_real_model_on_cuda("smollm2-135m-instruct-q4_1", "The capital of France is");
}

// The default draft, Qwen2.5-Coder-0.5B: qwen2 (Q/K/V biases, NeoX RoPE), GQA 14/2 heads of 64, llama.cpp's Q4_K_M
// mixture in 896-wide rows: Q5_0 matrices with Q8_0 attn_v in half the layers (one Q/K/V launch of two types), Q4_K /
// Q6_K ffn_down, a Q8_0 output over 151,936 ids. The real files cannot travel to a lent GPU; this is the kernels' run
// on it.
TEST_CASE("real: cuda backend on Qwen2.5-Coder-0.5B (the default draft) matches the CPU backend for a few tokens") {
    check_real_model_on_cuda("qwen2.5-coder-0.5b-instruct-q4_k_m", "def fibonacci(n):");
}

// The same with its decode step as one persistent launch (CudaOptions::persistent_step, the draft's under
// --cuda-route persistent-step=draft): every layer of the real draft's types and shapes through kernels.h decode_step.
TEST_CASE("real: the persistent decode step on Qwen2.5-Coder-0.5B (the default draft) matches the CPU backend") {
    CudaOptions options;
    options.persistent_step = true;
    check_real_model_on_cuda("qwen2.5-coder-0.5b-instruct-q4_k_m", "def fibonacci(n):", options);
}

// The default target, Qwen2.5-Coder-1.5B: heads of 128 (12 / 2), Q4_K with Q6_K attn_v in half the layers (one Q/K/V
// launch of two types) and Q6_K / Q4_K ffn_down, a Q6_K output of its own.
TEST_CASE("real: cuda backend on Qwen2.5-Coder-1.5B (the default target) matches the CPU backend for a few tokens") {
    check_real_model_on_cuda("qwen2.5-coder-1.5b-instruct-q4_k_m", "def fibonacci(n):");
}

// ---- CUDA graphs ------------------------------------------------------------------------------------------------

namespace {

// One call of a schedule, run on a backend: the logits it returned, and the graph counters after it.
struct Call {
    std::vector<float> logits;
    CudaGraphStats stats;
};

// The schedule of the graph tests on stories260K (n_ctx 48, splits of 4 positions, calls over 16 tokens on the
// prefill path), written so that the attention grid of the graphs changes: a 12-token call (3 splits: grid 4), five
// decodes (the fifth reaches 17 keys: grid 8), a truncate back to 14 positions and a decode (grid 4 again), a
// 5-token verification call, two decodes, a 20-token prefill-path call, a decode (43 keys: grid 16, capped at the
// cache's 12), a decode on a second cache and one more on the first.
std::vector<Call> run_graph_schedule(const Model& model, CudaOptions options, emu::LaunchOptions order) {
    const emu::ScopedLaunchOptions scope(order);
    const int n_vocab = model.config.n_vocab, n_ctx = 48;
    CudaBackend gpu(model, n_ctx, {256, 16}, options);
    auto cache = gpu.new_cache(n_ctx);
    auto other = gpu.new_cache(n_ctx);
    const std::vector<int> prompt = test_prompt(40, n_vocab);
    std::vector<Call> calls;
    int next = 0;
    auto call = [&](KvCache& kv, std::vector<int> tokens, int n_logits) {
        std::vector<float> logits(static_cast<size_t>(n_logits) * n_vocab, std::nanf(""));
        gpu.forward(tokens, kv, n_logits, logits.data());
        const float* last = &logits[static_cast<size_t>(n_logits - 1) * n_vocab];
        next = static_cast<int>(std::max_element(last, last + n_vocab) - last);
        calls.push_back({std::move(logits), gpu.graph_stats()});
    };
    call(*cache, std::vector<int>(prompt.begin(), prompt.begin() + 12), 12);
    for (int i = 0; i < 5; ++i) call(*cache, {next}, 1);
    cache->truncate(14);
    call(*cache, {next}, 1);
    call(*cache, {next, 7, 19, 300, 42}, 5);
    for (int i = 0; i < 2; ++i) call(*cache, {next}, 1);
    call(*cache, std::vector<int>(prompt.begin() + 20, prompt.end()), 2);
    call(*cache, {next}, 1);
    call(*other, {1}, 1);
    call(*cache, {next}, 1);
    REQUIRE(cache->n_committed() == 44);
    return calls;
}

// Every call's logits finite in `a` and bitwise equal in `b`.
void check_same_logits(const std::vector<Call>& a, const std::vector<Call>& b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        REQUIRE(a[i].logits.size() == b[i].logits.size());
        for (float x : a[i].logits) REQUIRE(std::isfinite(x));
        CHECK(std::memcmp(a[i].logits.data(), b[i].logits.data(), a[i].logits.size() * 4) == 0);
    }
}

}  // namespace

TEST_CASE("cuda backend: logits with CUDA graphs are bitwise those of direct launches, and graphs are reused") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CudaOptions graphs, direct;
    graphs.graphs = true;
    direct.graphs = false;
    graphs.attention_split = direct.attention_split = 4;
    // Different thread orders for the two runs: the kernels' results must not depend on them either.
    const std::vector<Call> g = run_graph_schedule(*model, graphs, {emu::ThreadOrder::Shuffled, 21});
    const std::vector<Call> d = run_graph_schedule(*model, direct, {emu::ThreadOrder::Forward, 0});
    check_same_logits(g, d);
    // Direct launches never capture.
    CHECK(d.back().stats.captures == 0);
    CHECK(d.back().stats.replays == 0);
    CHECK(d.back().stats.direct_steps == 14);

    // The graphs, call by call: (instantiations, updates, replays) after each.
    struct Want {
        int inst, upd, replays;
        const char* why;
    };
    const Want want[] = {
        {1, 0, 1, "12 tokens: a new shape, instantiated"},
        {2, 0, 2, "decode at 13 keys: a new shape"},
        {2, 0, 3, "decode: replayed, no capture"},
        {2, 0, 4, "decode: replayed"},
        {2, 0, 5, "decode at 16 keys: replayed (still 4 splits)"},
        {2, 1, 6, "decode at 17 keys: 8 splits, re-captured and updated in place"},
        {2, 2, 7, "after the truncate, 15 keys: 4 splits again, updated"},
        {3, 2, 8, "5-token verification: a new shape"},
        {3, 3, 9, "decode at 21 keys: 8 splits, updated"},
        {3, 3, 10, "decode: replayed"},
        {3, 3, 10, "20 tokens: the prefill path, launched directly"},
        {3, 4, 11, "decode at 43 keys: 12 splits (the cache's all), updated"},
        {3, 5, 12, "decode on another cache: updated (other cache addresses, 1 split)"},
        {3, 6, 13, "back on the first cache: updated"},
    };
    REQUIRE(g.size() == std::size(want));
    for (size_t i = 0; i < g.size(); ++i) {
        INFO(want[i].why);
        CHECK(g[i].stats.instantiations == want[i].inst);
        CHECK(g[i].stats.updates == want[i].upd);
        CHECK(g[i].stats.replays == want[i].replays);
        CHECK(g[i].stats.captures == want[i].inst + want[i].upd);
    }
    CHECK(g.back().stats.direct_steps == 1);
    // One graph replaces every launch of a step: embedding, norm, the step's RoPE angles, 5 layers of 5 kernels
    // (Q/K/V in one matvec with RoPE + KV write in its last blocks, attention (its last blocks combine the splits),
    // output matvec with the residual add and norm in its last block, gate/up with SwiGLU in one matvec, ffn_down
    // with the next add and norm), the output matvec.
    CHECK(g.back().stats.nodes == 3 + 5 * 5 + 1);
    MESSAGE("stories260K, 14 calls (13 short steps): ", g.back().stats.instantiations, " instantiations, ",
            g.back().stats.updates, " in-place updates, ", g.back().stats.replays, " replays of ",
            g.back().stats.nodes, "-node graphs");
}

TEST_CASE("cuda backend: staged and persistent matvec loads give bitwise the logits of direct loads" * doctest::test_suite("emu-variants")) {
    // The graph schedule (decodes, a verification call, a truncate, the prefill path, two caches) on stories260K
    // requantized to q4_0 and q8_0, whose matvecs are the block kernels that --cuda-route matvec=staged|persistent
    // change (persistent: the emulated device's 8 or 6 blocks walk the 16 to 128 block-rows of its matrices).
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        CAPTURE(std::string(ggml_type_name(type)));
        auto model = Model::load(requantized(type));
        CudaOptions direct = fp32_route();  // the 8-bit route's staged loads: check_int8_fusion
        direct.attention_split = 4;
        direct.matvec_loads = cuda::MatvecLoads::Direct;
        const std::vector<Call> d = run_graph_schedule(*model, direct, {emu::ThreadOrder::Forward, 0});
        for (cuda::MatvecLoads loads : {cuda::MatvecLoads::Staged, cuda::MatvecLoads::Persistent}) {
            CAPTURE(std::string(cuda::matvec_loads_name(loads)));
            CudaOptions other = direct;
            other.matvec_loads = loads;
            check_same_logits(run_graph_schedule(*model, other, {emu::ThreadOrder::Reverse, 0}), d);
        }
    }
}

namespace {

// What speculative decoding relies on: a 5-token verification call after a 6-token prompt gives bitwise the logits of
// the same 5 tokens decoded one at a time (through CUDA graphs, both short calls).
void check_verification_bits(const Model& model, const CudaOptions& options) {
    const int n_vocab = model.config.n_vocab;
    CudaBackend gpu(model, 32, {}, options);
    auto together = gpu.new_cache(32), apart = gpu.new_cache(32);
    const std::vector<int> prompt = test_prompt(6, n_vocab), next = {17, 100, 5, 42, 99};
    std::vector<float> logits(static_cast<size_t>(5) * n_vocab, std::nanf("")), one(logits.size(), std::nanf(""));
    gpu.forward(prompt, *together, 1, logits.data());
    gpu.forward(prompt, *apart, 1, one.data());
    gpu.forward(next, *together, 5, logits.data());
    for (int i = 0; i < 5; ++i) gpu.forward(std::vector<int>{next[i]}, *apart, 1, one.data() + i * n_vocab);
    for (float v : logits) REQUIRE(std::isfinite(v));
    CHECK(std::memcmp(logits.data(), one.data(), logits.size() * 4) == 0);
}

}  // namespace

TEST_CASE("cuda backend: split matvec rows stay near the CPU backend and give a verification call the bits of single tokens" * doctest::test_suite("emu-variants")) {
    // --cuda-route matvec=split sums each row in another fixed order than the direct kernel (kernels.h). On a
    // synthetic one-layer Q4_0 model whose rows are 2 and 4 walk steps (Q/K/V, gate/up: 256 columns; ffn_down: 512),
    // so that the warps of a row really share it: on the fp32 route, logits within the backends' usual agreement
    // through prefill, decode, a truncate and a verification call (the kernel tests hold the 8-bit route to the
    // CPU's integer products); on both routes, through CUDA graphs, what speculative decoding relies on: a 5-token
    // verification call bitwise equal to the same 5 tokens decoded one at a time. (Split launches a block per row,
    // four times the direct kernel's emulated threads, so the test keeps to these; graphs against direct launches
    // are the capture's property, tested with the other loads.)
    auto model = synthetic({"split", 256, 512, 1, 4, 2, 320, 64}, GgmlType::Q4_0, 13);
    for (bool int8 : {false, true}) {
        CAPTURE(int8);
        CudaOptions split;
        split.attention_split = 4;
        split.matvec_loads = cuda::MatvecLoads::Split;
        split.int8_activations = int8;
        if (!int8) {
            const Diff d = compare_backends(*model, 48, split);
            MESSAGE("synthetic q4_0, split rows: max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel,
                    " of the logit range)");
            CHECK(d.worst_rel <= 1e-2);
        }
        check_verification_bits(*model, split);
    }
}

TEST_CASE("cuda backend: Q4_0's measured route (8-bit with staged loads) gives a verification call the bits of single tokens" * doctest::test_suite("emu-variants")) {
    // The route a Q4_0 model takes by default (cuda_backend.h measured_matvec_route), through CUDA graphs.
    auto model = synthetic({"split", 256, 512, 1, 4, 2, 320, 64}, GgmlType::Q4_0, 13);
    CudaOptions measured;
    measured.attention_split = 4;
    REQUIRE(measured.matvec_route(GgmlType::Q4_0).int8);
    REQUIRE(measured.matvec_route(GgmlType::Q4_0).loads == cuda::MatvecLoads::Staged);
    check_verification_bits(*model, measured);
}

namespace {

// The device-side picks of a few steps (argmax, argmax with confidence, top-k candidates with extra ids, restricted
// logits), as plain numbers to compare between two backends.
std::vector<float> run_device_picks(const Model& model, CudaOptions options) {
    const int V = model.config.n_vocab, k = 8;
    CudaBackend gpu(model, 32, {}, options);
    auto cache = gpu.new_cache(32);
    std::vector<float> out, scratch(static_cast<size_t>(4) * V);
    std::vector<int> ids(4);
    std::vector<float> probs(4), top(4 * k), extra_logits(4 * 2);
    std::vector<int> top_ids(4 * k);
    const std::vector<int> extra = {V - 1, 17};
    gpu.forward_argmax(test_prompt(6, V), *cache, 2, ids.data(), scratch);
    gpu.forward_argmax_confidence(std::vector<int>{ids[1], 5}, *cache, 2, ids.data(), probs.data(), scratch);
    gpu.forward_candidates(std::vector<int>{ids[1]}, *cache, 1, k, extra, top.data(), top_ids.data(), extra_logits.data(), scratch);
    gpu.restrict_logits(50, extra);
    std::vector<float> logits(static_cast<size_t>(2) * V);
    gpu.forward(std::vector<int>{top_ids[0], 9}, *cache, 2, logits.data());
    for (int i : ids) out.push_back(static_cast<float>(i));
    for (int i : top_ids) out.push_back(static_cast<float>(i));
    for (const std::vector<float>* v : {&probs, &top, &extra_logits, &logits}) out.insert(out.end(), v->begin(), v->end());
    return out;
}

}  // namespace

TEST_CASE("cuda backend: overlapping launches give the same bits and every kernel waits for its inputs" * doctest::test_suite("emu-variants")) {
    // CudaOptions::overlap_launches (programmatic dependent launch): on a GPU each kernel may start while the one
    // before it ends, and must wait on the device before touching what that one writes. The emulation runs them in
    // order, so the bits cannot differ here; what it checks is that every thread of every kernel launched on such a
    // stream waits (a launch fails otherwise). The graph schedule, the device picks and restricted logits walk every
    // kernel of the backend through that check: the fp32 route with direct loads (f32), and the 8-bit route with
    // staged loads, whose first weights are requested before the wait (q4_0; the staged kernel is one template for
    // both routes). On a GPU (tandem_cuda_device_tests) the comparison is the real check.
    struct Variant {
        const char* name;
        GgmlType type;
        cuda::MatvecLoads loads;
        bool int8;
    };
    for (const Variant& v : {Variant{"f32", GgmlType::F32, cuda::MatvecLoads::Direct, false},
                             Variant{"q4_0 8-bit staged", GgmlType::Q4_0, cuda::MatvecLoads::Staged, true}}) {
        CAPTURE(std::string(v.name));
        auto model = v.type == GgmlType::F32 ? Model::load(kData + "/stories260K.gguf") : Model::load(requantized(v.type));
        CudaOptions overlap, plain;
        overlap.attention_split = plain.attention_split = 4;
        overlap.matvec_loads = plain.matvec_loads = v.loads;
        overlap.int8_activations = plain.int8_activations = v.int8;
        overlap.overlap_launches = true;
        plain.overlap_launches = false;
        check_same_logits(run_graph_schedule(*model, overlap, {emu::ThreadOrder::Reverse, 0}),
                          run_graph_schedule(*model, plain, {emu::ThreadOrder::Forward, 0}));
        const std::vector<float> a = run_device_picks(*model, overlap), b = run_device_picks(*model, plain);
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cuda backend: the greedy picks in one launch are those of the two- and three-launch kernels") {
    // CudaOptions::one_launch_picks: argmax (and the draft's confidence) with the splits combined by each row's last
    // block. The device picks of a few steps (run_device_picks: ids, the confidences, top-k candidates, restricted
    // logits) against the separate launches: every id and logit the same, the confidences within float rounding.
    auto model = Model::load(requantized(GgmlType::Q4_0));
    CudaOptions one, separate;
    one.attention_split = separate.attention_split = 4;
    separate.one_launch_picks = false;
    REQUIRE(one.one_launch_picks);
    const std::vector<float> a = run_device_picks(*model, one), b = run_device_picks(*model, separate);
    REQUIRE(a.size() == b.size());
    const size_t probs_begin = 4 + 4 * 8, probs_end = probs_begin + 4;  // after ids(4) and top_ids(4 * k)
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        if (i >= probs_begin && i < probs_end)
            CHECK(std::abs(a[i] - b[i]) <= 1e-6f * std::abs(b[i]));
        else
            CHECK(std::memcmp(&a[i], &b[i], sizeof(float)) == 0);
    }
}

TEST_CASE("cuda backend: Q/K/V biases (qwen2) in the fused matvec match the CPU backend and separate launches" * doctest::test_suite("emu-variants")) {
    // stories260K q4_0 given random Q/K/V biases, as a qwen2 model carries them: the CUDA backend adds them inside
    // the fused Q/K/V launch; its logits must follow the CPU backend's (which adds them after its matmuls) and be
    // bitwise those of the separate launches + add_bias. Without biases the fused launches are compared too.
    // On the fp32 route (Q4_0's measured route is 8-bit, whose launches the node counts below do not describe).
    auto model = Model::load(requantized(GgmlType::Q4_0));
    const Diff plain = compare_backends(*model, 48, fp32_route());
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    std::vector<std::vector<float>> biases;
    for (LayerWeights& L : model->weights.layers)
        for (WeightView* b : {&L.bq, &L.bk, &L.bv}) {
            const int64_t width = (b == &L.bq ? L.wq : b == &L.bk ? L.wk : L.wv).rows;
            biases.emplace_back(static_cast<size_t>(width));
            for (float& v : biases.back()) v = normal(rng);
            *b = WeightView{biases.back().data(), GgmlType::F32, width, 1};
        }
    model->config.qkv_bias = true;
    const Diff d = compare_backends(*model, 48, fp32_route());
    MESSAGE("stories260K q4_0 with Q/K/V biases: max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel,
            " of the logit range; without biases ", plain.worst_rel, ")");
    CHECK(d.worst_rel <= 1e-2);
    CudaOptions fused = fp32_route(), separate = fp32_route();
    fused.attention_split = separate.attention_split = 4;
    separate.fused_matvecs = false;
    const std::vector<Call> f = run_graph_schedule(*model, fused, {emu::ThreadOrder::Forward, 0});
    const std::vector<Call> s = run_graph_schedule(*model, separate, {emu::ThreadOrder::Reverse, 0});
    check_same_logits(f, s);
    // Per layer: Q/K/V, their 3 bias adds and RoPE become one launch, gate, up and SwiGLU another, and the two
    // residual adds with their norms go into the attn_output and ffn_down launches (15 -> 5 kernels, and one for the
    // step's RoPE angles).
    CHECK(f.back().stats.nodes == 3 + 5 * 5 + 1);
    CHECK(s.back().stats.nodes == 2 + 5 * 15 + 1);
}

TEST_CASE("cuda backend: Q/K/V of two types (the Q4_K_M mixture) take one launch and give the bits of a launch per type" * doctest::test_suite("emu-variants")) {
    // Synthetic qwen2 models written with llama.cpp's Q4_K_M mixture (synthetic_model.h): two layers, the second's
    // attn_v (and ffn_down) in Q6_K beside Q4_K, or in 96-wide rows Q8_0 beside Q5_0, as half the layers of the
    // default models. Q/K/V of such a layer in one launch with RoPE in it (kernels.h matvec_types_fuse): logits near
    // the CPU backend's, and through CUDA graphs bitwise those of a launch per type (qkv_type_pairs off) and of
    // unfused launches, on the fp32 route (these types' measured one) and the 8-bit route; with split rows, a
    // verification call bitwise its tokens one at a time. The second layer is 5 kernels, as the first.
    struct Mix {
        const char* name;
        int dim;
        GgmlType q, v;
    };
    for (const Mix& mix : {Mix{"mix-q4k", 256, GgmlType::Q4_K, GgmlType::Q6_K},
                           Mix{"mix-q50", 96, GgmlType::Q5_0, GgmlType::Q8_0}}) {
        CAPTURE(std::string(mix.name));
        const std::string path = temp_dir() + "/" + mix.name + ".gguf";
        write_synthetic_model(path, {mix.name, mix.dim, 256, 2, 4, 2, 320, 64, false, "qwen2"},
                              SyntheticTypes::Q4_K_M(), 17);
        auto model = Model::load(path);
        const auto& layers = model->weights.layers;
        REQUIRE(layers[0].wv.type == mix.q);
        REQUIRE(layers[1].wq.type == mix.q);
        REQUIRE(layers[1].wv.type == mix.v);
        const Diff d = compare_backends(*model, 48, fp32_route());
        MESSAGE(std::string(mix.name), ": max |cuda - cpu| = ", d.worst_abs, " (", d.worst_rel, " of the logit range)");
        CHECK(d.worst_rel <= 1e-2);
        for (bool int8 : {false, true}) {
            CAPTURE(int8);
            CudaOptions pairs, per_type, separate;
            for (CudaOptions* o : {&pairs, &per_type, &separate}) {
                o->attention_split = 4;
                o->int8_activations = int8;
            }
            per_type.qkv_type_pairs = false;
            separate.fused_matvecs = false;
            const std::vector<Call> f = run_graph_schedule(*model, pairs, {emu::ThreadOrder::Forward, 0});
            const std::vector<Call> t = run_graph_schedule(*model, per_type, {emu::ThreadOrder::Reverse, 0});
            check_same_logits(f, t);
            check_same_logits(f, run_graph_schedule(*model, separate, {emu::ThreadOrder::Reverse, 0}));
            if (!int8) {
                // The embedding, the norm, the step's RoPE angles, 5 kernels a layer, the output matvec; a launch
                // per type: Q and K, V, and RoPE's launch in the second layer (2 more).
                CHECK(f.back().stats.nodes == 3 + 2 * 5 + 1);
                CHECK(t.back().stats.nodes == 3 + 5 + 7 + 1);
            }
            CudaOptions split = pairs;
            split.matvec_loads = cuda::MatvecLoads::Split;
            check_verification_bits(*model, split);
        }
    }
}

namespace {

// The 8-bit route with fused kernels (the producers quantize their output) against unfused launches with staged
// loads, through CUDA graphs in two thread orders: bitwise the same logits, and the launches of the last step's
// graph counted. Returns the two options.
std::pair<CudaOptions, CudaOptions> check_int8_fusion(const Model& model, int fused_nodes, int separate_nodes,
                                                      std::optional<cuda::MatvecLoads> fused_loads = {},
                                                      const CudaOptions& base = {}) {
    CudaOptions fused = base, separate = base;
    if (fused_loads) fused.matvec_loads = *fused_loads;
    fused.attention_split = separate.attention_split = 4;
    fused.int8_activations = separate.int8_activations = true;
    separate.fused_matvecs = false;
    separate.matvec_loads = cuda::MatvecLoads::Staged;
    const std::vector<Call> f = run_graph_schedule(model, fused, {emu::ThreadOrder::Forward, 0});
    const std::vector<Call> s = run_graph_schedule(model, separate, {emu::ThreadOrder::Reverse, 0});
    check_same_logits(f, s);
    CHECK(f.back().stats.nodes == fused_nodes);
    CHECK(s.back().stats.nodes == separate_nodes);
    return {fused, separate};
}

}  // namespace

TEST_CASE("cuda backend: 8-bit activations quantized inside the norms are bitwise those of separate launches" * doctest::test_suite("emu-variants")) {
    // With int8_activations and fused kernels the RMSNorms that feed Q/K/V, gate/up and the output also write
    // their output quantized (the matvecs read it without a quantize launch); unfused, every matvec input has its
    // own quantize launch. The same bits either way, through CUDA graphs, in two thread orders, with staged loads
    // on one side; and the launches counted.
    auto model = Model::load(requantized(GgmlType::Q4_0));
    // Per layer (stories260K: ffn_down stays f16, with no 8-bit route, so SwiGLU runs in the gate/up launch): fused,
    // the 5 kernels of the fp32 route and a quantize for the attention output (and the step's RoPE angles);
    // separate, the 12 kernels of unfused launches and a quantize for each of Q, K, V, O, gate and up; plus the
    // output projection's quantize.
    check_int8_fusion(*model, 3 + 5 * (5 + 1) + 1, 2 + 5 * (12 + 6) + 2);
}

TEST_CASE("cuda backend: 8-bit activations in a k-quant model: fused into the norms and SwiGLU with the same bits" * doctest::test_suite("emu-variants")) {
    // A synthetic Q4_K model (every matrix of whole 256-blocks, so ffn_down takes the route too and SwiGLU writes
    // its quantized output): fused against unfused + staged loads through CUDA graphs, bitwise, with the launches
    // counted; and a short call whose logits are its last 2 rows (the output reads the final norm's quantized rows
    // at an offset) against the same call unfused.
    auto model = synthetic({"k256", 256, 512, 2, 4, 2, 512, 64}, GgmlType::Q4_K, 7);
    REQUIRE(model->weights.layers[0].w_down.type == GgmlType::Q4_K);
    REQUIRE(model->weights.output.type == GgmlType::Q4_K);
    // Per layer: fused, the 5 kernels of the fp32 route (and the step's RoPE angles), a quantize launch after the
    // gate/up launch for ffn_down (Q8_K: the gate/up launch quantizes only Q8_1 itself, whatever its loads) and the
    // attention output's quantize; separate, 12 and a quantize for each of Q, K, V, O, gate, up and down; plus the
    // output projection's quantize. With persistent loads RoPE has its own launch again (6 kernels, no angles), and
    // the norms stay in the matvec launches (they take the staged kernel; the norms' Q8_K output included).
    const auto [fused, separate] = check_int8_fusion(*model, 3 + 2 * (6 + 1) + 1, 2 + 2 * (12 + 7) + 2);
    check_int8_fusion(*model, 2 + 2 * (7 + 1) + 1, 2 + 2 * (12 + 7) + 2, cuda::MatvecLoads::Persistent);
    const int n_vocab = model->config.n_vocab;
    std::vector<std::vector<float>> last_rows;
    for (const CudaOptions& o : {fused, separate}) {
        CudaBackend gpu(*model, 32, {}, o);
        auto cache = gpu.new_cache(32);
        const std::vector<int> tokens = {1, 17, 42, 99, 5, 250};
        last_rows.emplace_back(static_cast<size_t>(2) * n_vocab, std::nanf(""));
        gpu.forward(tokens, *cache, 2, last_rows.back().data());
        for (float v : last_rows.back()) REQUIRE(std::isfinite(v));
    }
    CHECK(std::memcmp(last_rows[0].data(), last_rows[1].data(), last_rows[0].size() * 4) == 0);
}

TEST_CASE("cuda backend: 8-bit activations in a Q4_0 model: the attention output quantized by its combine and SwiGLU's by the gate/up launch" * doctest::test_suite("emu-variants")) {
    // A synthetic Q4_0 model with 64-wide heads: each head's output is two whole Q8_1 blocks, so attention's combine
    // writes attn_output's quantized input and no quantize launch is left in a layer. Fused against unfused +
    // staged loads through CUDA graphs, bitwise, with the launches counted.
    auto model = synthetic({"q32", 256, 512, 2, 4, 2, 512, 64}, GgmlType::Q4_0, 11);
    REQUIRE(model->weights.layers[0].wo.type == GgmlType::Q4_0);
    REQUIRE(model->weights.layers[0].w_down.type == GgmlType::Q4_0);
    REQUIRE(model->config.head_dim == 64);
    // Per layer: fused, the 5 kernels of the fp32 route (and the step's RoPE angles), ffn_down's input quantized by
    // the gate/up launch's last blocks (Q4_0's measured loads are staged) and the norms' Q8_1 output by the
    // attn_output and ffn_down launches' last blocks; separate, 12 and a quantize for each of Q, K, V, O, gate, up
    // and down; plus the output projection's quantize. Direct loads quantize after the gate/up launch: one more.
    check_int8_fusion(*model, 3 + 2 * 5 + 1, 2 + 2 * (12 + 7) + 2);
    check_int8_fusion(*model, 3 + 2 * 6 + 1, 2 + 2 * (12 + 7) + 2, cuda::MatvecLoads::Direct);
    // gate_up_quantizes false (--cuda-route gate-up-q8=0): the quantize launch after the staged gate/up launch.
    CudaOptions base;
    base.gate_up_quantizes = false;
    check_int8_fusion(*model, 3 + 2 * 6 + 1, 2 + 2 * (12 + 7) + 2, {}, base);
    // qkv_rope false too (--cuda-route qkv-rope=0): RoPE's own launch after the Q/K/V launch, and no angles.
    base.qkv_rope = false;
    check_int8_fusion(*model, 2 + 2 * 7 + 1, 2 + 2 * (12 + 7) + 2, {}, base);
    // matvec_norm false too (--cuda-route matvec-norm=0): an add_rms_norm launch after attn_output and ffn_down.
    base.matvec_norm = false;
    check_int8_fusion(*model, 2 + 2 * 9 + 1, 2 + 2 * (12 + 7) + 2, {}, base);
}

TEST_CASE("cuda backend: matvec_loads overrides every type's loads") {
    CHECK_FALSE(CudaOptions{}.matvec_loads.has_value());  // each type's measured loads
    CudaOptions o;
    o.matvec_loads = cuda::MatvecLoads::Staged;
    CHECK(o.matvec_route(GgmlType::Q4_K).loads == cuda::MatvecLoads::Staged);
    o.matvec_loads = cuda::MatvecLoads::Direct;
    CHECK(o.matvec_route(GgmlType::Q4_0).loads == cuda::MatvecLoads::Direct);
}

// The defaults a GPU measured (cuda_backend.h measured_matvec_route): Q4_0 8-bit and staged, the rest fp32 and
// direct; the two switches override each half for every type.
TEST_CASE("cuda backend: each weight type takes its measured matvec route unless a switch overrides it") {
    const CudaOptions measured;
    CHECK(measured.matvec_route(GgmlType::Q4_0).int8);
    CHECK(measured.matvec_route(GgmlType::Q4_0).loads == cuda::MatvecLoads::Staged);
    for (GgmlType t : {GgmlType::F16, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K,
                       GgmlType::Q6_K}) {
        CAPTURE(std::string(ggml_type_name(t)));
        CHECK_FALSE(measured.matvec_route(t).int8);
        CHECK(measured.matvec_route(t).loads == cuda::MatvecLoads::Direct);
    }
    CHECK_FALSE(fp32_route().matvec_route(GgmlType::Q4_0).int8);
    CHECK(fp32_route().matvec_route(GgmlType::Q4_0).loads == cuda::MatvecLoads::Staged);  // loads still measured
    CHECK(describe_matvec_routes(measured) ==
          "fp32 activations, direct loads (q4_0: 8-bit activations, staged loads)");
    CudaOptions overridden;
    overridden.int8_activations = true;  // --cuda-route int8=1
    CHECK(overridden.matvec_route(GgmlType::Q4_K).int8);
    CHECK(overridden.matvec_route(GgmlType::Q4_K).loads == cuda::MatvecLoads::Direct);
    CHECK(describe_matvec_routes(overridden) ==
          "8-bit activations, direct loads (q4_0: 8-bit activations, staged loads)");
    overridden.matvec_loads = cuda::MatvecLoads::Split;  // --cuda-route matvec=split
    CHECK(describe_matvec_routes(overridden) == "8-bit activations, split loads");
}

TEST_CASE("cuda backend: restricted logits are the unrestricted ones on the kept ids and -inf elsewhere") {
    // A draft's output projection under restrict_logits (see the CPU backend's test in test_model.cpp): the first
    // n_first rows and the extra ids are computed, bitwise as without the restriction; the greedy picks on the device
    // choose among them; lifting it gives the unrestricted logits again. With graphs, which must be captured again
    // when the restriction's launch changes (not for every new id), and without.
    auto model = Model::load(kData + "/stories260K.gguf");
    const int V = model->config.n_vocab, n_first = 100;
    const std::vector<int> extra = {V - 1, 300, 5, 300, 177};  // unsorted, a repeat, one below n_first
    auto kept = [&](int id) { return id < n_first || id == V - 1 || id == 300 || id == 177; };
    for (const bool graphs : {true, false}) {
        CAPTURE(graphs);
        CudaOptions options;
        options.graphs = graphs;
        CudaBackend full(*model, 64, {}, options), restricted(*model, 64, {}, options);
        auto cache_a = full.new_cache(64), cache_b = restricted.new_cache(64);
        // Graphs of the two step shapes used below (2 tokens, 1 token) captured unrestricted first, so that the
        // restriction has something to invalidate.
        for (const std::vector<int>& warm : std::vector<std::vector<int>>{{1, 403}, {407}}) {
            const int n = static_cast<int>(warm.size());
            std::vector<float> a(static_cast<size_t>(n) * V), b(a.size());
            full.forward(warm, *cache_a, n, a.data());
            restricted.forward(warm, *cache_b, n, b.data());
            REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
        const int captures_before = restricted.graph_stats().captures;

        // Steps of both shapes on both backends: the kept ids bitwise, the others -inf.
        auto check_steps = [&](auto&& is_kept, int n_kept) {
            int same = 0, minus_inf = 0, rows = 0;
            for (const std::vector<int>& step : std::vector<std::vector<int>>{{261, 378}, {432}}) {
                const int n = static_cast<int>(step.size());
                std::vector<float> want(static_cast<size_t>(n) * V), got(want.size(), std::nanf(""));
                full.forward(step, *cache_a, n, want.data());
                restricted.forward(step, *cache_b, n, got.data());
                for (size_t i = 0; i < got.size(); ++i) {
                    if (is_kept(static_cast<int>(i % V))) same += std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
                    else minus_inf += got[i] == -std::numeric_limits<float>::infinity();
                }
                rows += n;
            }
            CHECK(same == rows * n_kept);
            CHECK(minus_inf == rows * (V - n_kept));
        };
        REQUIRE(restricted.restrict_logits(n_first, extra));
        check_steps(kept, n_first + 3);
        // Each shape captured again once (the first count and the ids' launch capacity are launch arguments).
        if (graphs) CHECK(restricted.graph_stats().captures == captures_before + 2);
        // More ids within the capacity (16): read through the pointer, no capture. Past it: once more per shape.
        std::vector<int> wider = extra;
        for (int id = 400; id < 413; ++id) wider.push_back(id);  // 16 extra ids
        auto kept_wider = [&](int id) { return kept(id) || (id >= 400 && id < 413); };
        REQUIRE(restricted.restrict_logits(n_first, wider));
        check_steps(kept_wider, n_first + 16);
        if (graphs) CHECK(restricted.graph_stats().captures == captures_before + 2);
        wider.push_back(413);
        REQUIRE(restricted.restrict_logits(n_first, wider));
        check_steps([&](int id) { return kept_wider(id) || id == 413; }, n_first + 17);
        if (graphs) CHECK(restricted.graph_stats().captures == captures_before + 4);
        // A restriction of no first rows pads by repeating an id (the same bits written twice).
        REQUIRE(restricted.restrict_logits(0, std::vector<int>{V - 1, 7}));
        check_steps([&](int id) { return id == V - 1 || id == 7; }, 2);
        REQUIRE(restricted.restrict_logits(n_first, extra));

        // Greedy picks on the device, under the restriction: the best kept id of the host's logits.
        const std::vector<int> probe = {300, 5};
        std::vector<float> logits(2 * static_cast<size_t>(V));
        auto cache_c = restricted.new_cache(64);
        restricted.forward(probe, *cache_c, 2, logits.data());
        cache_c->truncate(0);
        int ids[2] = {-7, -7};
        std::vector<float> scratch;
        restricted.forward_argmax(probe, *cache_c, 2, ids, scratch);
        for (int r = 0; r < 2; ++r) {
            CHECK(kept(ids[r]));
            CHECK(ids[r] == Backend::argmax_row(&logits[static_cast<size_t>(r) * V], static_cast<size_t>(V)));
        }

        // Lifted: bitwise the unrestricted backend's again.
        REQUIRE(restricted.restrict_logits(V, {}));
        const std::vector<int> more = {286, 300};
        std::vector<float> c(2 * static_cast<size_t>(V)), d(c.size());
        full.forward(more, *cache_a, 2, c.data());
        restricted.forward(more, *cache_b, 2, d.data());
        CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cuda backend: a draft on the device restricted to part of the vocabulary keeps the output") {
    // The generator's use of restrict_logits (--draft-vocab) with the draft on the device: the target itself as the
    // draft, so that unrestricted every proposal is accepted, and restricted to ids below 200 and the context's it
    // must miss where the target picks an id it cannot see. (The target runs on the CPU, as the emulation is slow;
    // on these 12 tokens the two backends' greedy picks agree.)
    auto model = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    auto run = [&](bool speculative, int draft_vocab) {
        CpuBackend target(*model, 1, 64);
        CudaBackend draft(*model, 64);
        auto cache = target.new_cache(64), draft_cache = draft.new_cache(64);
        GenerationParams p;
        p.n_predict = 12;
        p.sampler.temperature = 0;
        p.speculative.draft_min = p.speculative.draft_max = 4;
        p.speculative.p_min = 0;
        p.speculative.draft_vocab = draft_vocab;
        Generator gen(*model, target, *cache,
                      speculative ? DraftModel{model.get(), &draft, draft_cache.get()} : DraftModel{});
        return gen.generate(prompt, p, [](std::string_view) { return true; });
    };
    const GenerationStats plain = run(false, 0);
    const GenerationStats restricted = run(true, 200), unrestricted = run(true, 0);
    std::vector<int> context = prompt;
    int unseeable = 0;  // generated ids >= 200 new to the context: the draft cannot have proposed them
    for (int id : plain.generated) {
        if (id >= 200 && std::find(context.begin(), context.end(), id) == context.end()) ++unseeable;
        context.push_back(id);
    }
    REQUIRE(unseeable > 0);  // the test would show nothing otherwise
    CHECK(restricted.generated == plain.generated);
    CHECK(unrestricted.generated == plain.generated);
    CHECK(restricted.spec.drafted > 0);
    CHECK(restricted.spec.accepted < restricted.spec.drafted);
    CHECK(unrestricted.spec.accepted == unrestricted.spec.drafted);
}

TEST_CASE("cuda backend: graphs false (--cuda-route graphs=0) turns the graphs off") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CHECK(CudaOptions{}.graphs);
    CudaOptions options;
    options.graphs = false;
    CudaBackend gpu(*model, 8, {}, options);
    CHECK_FALSE(gpu.options().graphs);
    auto cache = gpu.new_cache(8);
    std::vector<float> logits(model->config.n_vocab);
    const std::vector<int> tokens = {1, 200};
    gpu.forward(tokens, *cache, 1, logits.data());
    CHECK(gpu.graph_stats().replays == 0);
    CHECK(gpu.graph_stats().direct_steps == 1);
}

// ---- the Q8_0 KV cache (--kv-type q8_0) ------------------------------------------------------------------------------

namespace {

// An independent reference for --kv-type q8_0: the llama forward pass in double, one token at a time, whose keys
// and values are stored as a Q8_0 cache stores them (rounded to float after RoPE, quantized by cpu::quantize_row,
// ggml's reference quantizer, and read back dequantized). Llama only (no biases), any weight type.
class Q8KvReference {
public:
    explicit Q8KvReference(const Model& m) : m_(m), c_(m.config), k_(c_.n_layers), v_(c_.n_layers) {
        for (int i = 0; i < c_.rope_dim / 2; ++i)
            inv_freq_.push_back(static_cast<float>(std::pow(static_cast<double>(c_.rope_theta), -2.0 * i / c_.rope_dim)));
    }
    int n_past() const { return static_cast<int>(k_[0].size()) / c_.kv_dim(); }
    void truncate(int n) {
        for (int l = 0; l < c_.n_layers; ++l) {
            k_[l].resize(static_cast<size_t>(n) * c_.kv_dim());
            v_[l].resize(static_cast<size_t>(n) * c_.kv_dim());
        }
    }
    // Appends `token` at the next position; returns its logits.
    std::vector<double> step(int token) {
        const Weights& w = m_.weights;
        const int pos = n_past(), hd = c_.head_dim, kv_dim = c_.kv_dim(), group = c_.n_heads / c_.n_kv_heads;
        std::vector<double> x = row(w.token_embd, token);
        for (int l = 0; l < c_.n_layers; ++l) {
            const LayerWeights& L = w.layers[l];
            const std::vector<double> xb = rms_norm(x, L.attn_norm);
            std::vector<double> q = matvec(L.wq, xb), k = matvec(L.wk, xb), v = matvec(L.wv, xb);
            rope(q, c_.n_heads, pos);
            rope(k, c_.n_kv_heads, pos);
            store(k_[l], k);
            store(v_[l], v);
            std::vector<double> att(c_.q_dim(), 0.0);
            for (int h = 0; h < c_.n_heads; ++h) {
                const int kvh = h / group;
                std::vector<double> s(pos + 1);
                double mx = -INFINITY, sum = 0.0;
                for (int t = 0; t <= pos; ++t) {
                    double d = 0.0;
                    for (int e = 0; e < hd; ++e) d += q[h * hd + e] * k_[l][static_cast<size_t>(t) * kv_dim + kvh * hd + e];
                    s[t] = d / std::sqrt(static_cast<double>(hd));
                    mx = std::max(mx, s[t]);
                }
                for (double& e : s) sum += (e = std::exp(e - mx));
                for (int t = 0; t <= pos; ++t)
                    for (int e = 0; e < hd; ++e)
                        att[h * hd + e] += s[t] / sum * v_[l][static_cast<size_t>(t) * kv_dim + kvh * hd + e];
            }
            const std::vector<double> o = matvec(L.wo, att);
            for (int i = 0; i < c_.dim; ++i) x[i] += o[i];
            const std::vector<double> xf = rms_norm(x, L.ffn_norm);
            std::vector<double> g = matvec(L.w_gate, xf);
            const std::vector<double> u = matvec(L.w_up, xf);
            for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
            const std::vector<double> d = matvec(L.w_down, g);
            for (int i = 0; i < c_.dim; ++i) x[i] += d[i];
        }
        return matvec(w.output, rms_norm(x, w.output_norm));
    }

private:
    std::vector<double> row(const WeightView& w, int r) const {
        std::vector<float> f(static_cast<size_t>(w.cols));
        cpu::dequantize_row(w.type, w.row(r), f.data(), w.cols);
        return {f.begin(), f.end()};
    }
    std::vector<double> matvec(const WeightView& w, const std::vector<double>& x) const {
        std::vector<double> y(static_cast<size_t>(w.rows));
        for (int r = 0; r < w.rows; ++r) {
            const std::vector<double> wr = row(w, r);
            double s = 0.0;
            for (size_t i = 0; i < x.size(); ++i) s += wr[i] * x[i];
            y[r] = s;
        }
        return y;
    }
    std::vector<double> rms_norm(const std::vector<double>& x, const WeightView& weight) const {
        double ss = 0.0;
        for (double e : x) ss += e * e;
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_eps);
        const std::vector<double> wt = row(weight, 0);
        std::vector<double> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = wt[i] * x[i] * scale;
        return out;
    }
    // The backends' angles: float(pos) * inv_freq[i] and float cos / sin.
    void rope(std::vector<double>& x, int n_heads, int pos) const {
        const bool neox = c_.rope_style == RopeStyle::Neox;
        for (int h = 0; h < n_heads; ++h)
            for (int i = 0; i < c_.rope_dim / 2; ++i) {
                const float angle = static_cast<float>(pos) * inv_freq_[i];
                const double cs = std::cos(angle), sn = std::sin(angle);
                double& a = x[h * c_.head_dim + (neox ? i : 2 * i)];
                double& b = x[h * c_.head_dim + (neox ? i + c_.rope_dim / 2 : 2 * i + 1)];
                const double a0 = a, b0 = b;
                a = a0 * cs - b0 * sn;
                b = a0 * sn + b0 * cs;
            }
    }
    void store(std::vector<float>& cache, const std::vector<double>& x) const {
        const std::vector<float> f(x.begin(), x.end());
        std::vector<uint8_t> q(cuda::kv_row_bytes(cuda::KvType::Q8_0, c_.kv_dim()));
        cpu::quantize_row(GgmlType::Q8_0, f.data(), q.data(), c_.kv_dim());
        const size_t at = cache.size();
        cache.resize(at + f.size());
        cpu::dequantize_row(GgmlType::Q8_0, q.data(), cache.data() + at, c_.kv_dim());
    }

    const Model& m_;
    const ModelConfig& c_;
    std::vector<float> inv_freq_;
    std::vector<std::vector<float>> k_, v_;  // per layer: [position][kv_dim], dequantized
};

}  // namespace

TEST_CASE("cuda backend: a q8_0 KV cache matches a reference that quantizes K/V the same way, and stays near f16") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const int n_vocab = model->config.n_vocab, n_ctx = 40;
    CudaOptions q8;
    q8.kv_type = cuda::KvType::Q8_0;
    // Calls over 16 tokens on the prefill path: the flash attention reads the Q8_0 cache as well as split-K. The
    // default options otherwise: graphs on.
    CudaBackend f16_backend(*model, n_ctx, {256, 16}), q8_backend(*model, n_ctx, {256, 16}, q8);
    auto f16_cache = f16_backend.new_cache(n_ctx), q8_cache = q8_backend.new_cache(n_ctx);
    CHECK(static_cast<CudaKvCache&>(*q8_cache).type() == cuda::KvType::Q8_0);
    CHECK(static_cast<CudaKvCache&>(*f16_cache).type() == cuda::KvType::F16);
    Q8KvReference ref(*model);
    // The CPU backend with its own q8_0 cache (the same bytes: ggml's Q8_0 of the same keys and values).
    CpuBackend cpu_q8(*model, 1, 64, {.activations = cpu::Activations::Float, .kv_type = CpuKvType::Q8_0});
    auto cpu_q8_cache = cpu_q8.new_cache(n_ctx);
    Diff q8_vs_ref, f16_vs_ref, q8_vs_f16, q8_vs_cpu_q8;
    int same_argmax = 0, rows = 0, next = 0;
    auto call = [&](std::vector<int> tokens, int n_logits) {
        const int n = static_cast<int>(tokens.size());
        const size_t size = static_cast<size_t>(n_logits) * n_vocab;
        std::vector<float> a(size, std::nanf("")), b(size, std::nanf(""));
        f16_backend.forward(tokens, *f16_cache, n_logits, a.data());
        q8_backend.forward(tokens, *q8_cache, n_logits, b.data());
        std::vector<float> c(size);
        cpu_q8.forward(tokens, *cpu_q8_cache, n_logits, c.data());
        for (int row = 0; row < n_logits; ++row)
            q8_vs_cpu_q8.add(&b[static_cast<size_t>(row) * n_vocab], &c[static_cast<size_t>(row) * n_vocab], n_vocab);
        for (int i = 0; i < n; ++i) {
            const std::vector<double> r = ref.step(tokens[i]);
            const int row = i - (n - n_logits);
            if (row < 0) continue;
            const std::vector<float> rf(r.begin(), r.end());
            const float* fa = &a[static_cast<size_t>(row) * n_vocab];
            const float* fb = &b[static_cast<size_t>(row) * n_vocab];
            q8_vs_ref.add(fb, rf.data(), n_vocab);
            f16_vs_ref.add(fa, rf.data(), n_vocab);
            q8_vs_f16.add(fb, fa, n_vocab);
            same_argmax += Backend::argmax_row(fa, n_vocab) == Backend::argmax_row(fb, n_vocab);
            ++rows;
        }
        next = Backend::argmax_row(&a[size - n_vocab], n_vocab);
    };
    const std::vector<int> prompt = test_prompt(20, n_vocab);
    call(prompt, 3);
    for (int i = 0; i < 4; ++i) call({next}, 1);
    f16_cache->truncate(22);
    q8_cache->truncate(22);
    cpu_q8_cache->truncate(22);
    ref.truncate(22);
    call({next, 5, 17, 300}, 4);
    for (int i = 0; i < 2; ++i) call({next}, 1);
    REQUIRE(ref.n_past() == q8_cache->n_committed());
    MESSAGE("stories260K, q8_0 KV: vs the Q8_0 reference ", q8_vs_ref.worst_rel, " of the logit range (the f16 cache: ",
            f16_vs_ref.worst_rel, "); vs the f16 cache ", q8_vs_f16.worst_rel, " (max |diff| ", q8_vs_f16.worst_abs,
            "); argmax agrees with f16 on ", same_argmax, " of ", rows, " rows; vs the CPU's q8_0 cache ",
            q8_vs_cpu_q8.worst_rel);
    // The Q8_0 cache is what the reference's quantization predicts: a key whose float value lands near a rounding
    // boundary may take the neighbouring code (the GPU's sums differ from the reference's in the last bits), which
    // is the only slack. The f16 cache, without that quantization, is far from this reference.
    // (Measured: 1.5e-7 of the range, i.e. no code differs; the f16 cache is 2e-2 away.)
    CHECK(q8_vs_ref.worst_rel <= 1e-3);
    // The CPU backend's q8_0 cache holds the same bytes: the same slack (a code on a boundary) and nothing more.
    CHECK(q8_vs_cpu_q8.worst_rel <= 1e-3);
    CHECK(f16_vs_ref.worst_rel > 10 * q8_vs_ref.worst_rel);
    // Against the f16 cache: 8-bit keys and values in blocks that each span four of stories260K's 8-wide heads cost
    // 1-3% of the logit range on this model (about 40 times the f16 cache's own error against the CPU's fp32).
    CHECK(q8_vs_f16.worst_rel <= 5e-2);
    CHECK(same_argmax >= rows - 1);
}

TEST_CASE("cuda backend: the memory plan counts the q8_0 KV cache, and a width that is not whole blocks is refused") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const ModelConfig& c = model->config;
    CudaOptions q8;
    q8.kv_type = cuda::KvType::Q8_0;
    const CudaMemoryPlan f16_plan = CudaBackend::plan(*model, 256), q8_plan = CudaBackend::plan(*model, 256, {}, q8);
    // 34 bytes per 32 values instead of 64.
    CHECK(q8_plan.kv_cache == 2 * static_cast<size_t>(c.n_layers) * 256 * (c.kv_dim() / 32) * 34);
    CHECK(q8_plan.kv_cache * 64 == f16_plan.kv_cache * 34);
    CHECK(q8_plan.total() == f16_plan.total() - f16_plan.kv_cache + q8_plan.kv_cache);
    CHECK(q8_plan.describe().find("q8_0") != std::string::npos);
    CHECK(f16_plan.describe().find("f16") != std::string::npos);
    CHECK(parse_kv_type("q8_0") == cuda::KvType::Q8_0);
    CHECK(parse_kv_type("f16") == cuda::KvType::F16);
    CHECK_FALSE(parse_kv_type("q4_0").has_value());
    if (cuda::device_is_emulated()) {
        // The plan is what gets allocated: a device of exactly the q8_0 plan's size takes the q8_0 backend and
        // its cache, and refuses the f16 one.
        struct Restore {
            ~Restore() { cuda::set_emulated_device_memory(0); }
        } restore;
        cuda::set_emulated_device_memory(q8_plan.total());
        CHECK_THROWS_AS(CudaBackend(*model, 256), Error);
        CudaBackend backend(*model, 256, {}, q8);
        CHECK(backend.new_cache(256) != nullptr);
    }

    // A model whose keys are 3 heads of 8 (24 values a position): not whole Q8_0 blocks.
    auto odd = synthetic({"kv24", 48, 64, 1, 6, 3, 300, 64}, GgmlType::F32, 5);
    REQUIRE(odd->config.kv_dim() == 24);
    try {
        CudaBackend backend(*odd, 16, {}, q8);
        FAIL("a q8_0 cache of 24-value rows was accepted");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("multiple of 32") != std::string::npos);
    }
    CudaBackend f16_ok(*odd, 16);  // the fp16 cache takes any width
    CHECK(f16_ok.new_cache(16) != nullptr);
}
