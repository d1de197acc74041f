// Tests of the persistent decode step (kernels.h decode_step, CudaOptions::persistent_step): one-token steps of the
// CUDA backend run every layer in one cooperative launch. Against the CPU backend on stories260K (f32, q8_0, q4_0,
// with Q/K/V biases) and on synthetic qwen2 models in llama.cpp's Q4_K_M mixture (Q4_K / Q6_K, Q5_0 / Q8_0, NeoX
// RoPE, GQA): logits within tolerance through prefill, decodes, a truncate and a verification call, with and without
// CUDA graphs; bitwise the same in two thread orders (a missing barrier shows as a difference, the shared memory
// being poisoned at every block start); on grids of 1..8 blocks (the rows, heads and key splits spread differently);
// as a draft, the speculative output equal to plain decoding; the switch that turns it on; rows staged through shared
// memory by either staged kernel bitwise the direct walk's (rows of several chunks, warps with no row in a phase);
// the 8-bit kernels (activations quantized in shared memory) against the CPU's 8-bit products; which kernel a
// model's types take.
// Also built into tandem_cuda_device_tests (TANDEM_TEST_REAL_DEVICE) for a GPU, where it is the real cooperative launch.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#ifdef TANDEM_TEST_REAL_DEVICE
#include "real_device_shim.h"
#else
#include "emu/cuda_emu.h"
#endif
#include "error.h"
#include "generate/generator.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "convert/quantize_model.h"
#include "common/synthetic_model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = std::getenv("TANDEM_TEST_DATA") ? std::getenv("TANDEM_TEST_DATA") : TANDEM_TEST_DATA;

std::string temp_dir() {
    const std::string dir =
        std::filesystem::temp_directory_path() / ("tandem-decode-step-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    return dir;
}
struct RemoveTempDir {
    ~RemoveTempDir() {
        std::error_code ec;
        std::filesystem::remove_all(temp_dir(), ec);
    }
} remove_temp_dir;

std::unique_ptr<Model> stories(GgmlType type) {
    if (type == GgmlType::F32) return Model::load(kData + "/stories260K.gguf");
    const std::string path = temp_dir() + "/stories-" + ggml_type_name(type) + ".gguf";
    if (!std::filesystem::exists(path)) requantize_gguf(*GgufFile::open(kData + "/stories260K.gguf"), type).write(path);
    return Model::load(path);
}

// A two-layer qwen2 model in the Q4_K_M mixture: at dim 256 Q4_K with Q6_K attn_v / ffn_down in the second layer, at
// dim 96 (rows that are not whole super-blocks) Q5_0 with Q8_0; or in one type.
std::unique_ptr<Model> mixture(const char* name, int dim, int hidden = 256,
                               SyntheticTypes types = SyntheticTypes::Q4_K_M()) {
    const std::string path = temp_dir() + "/" + name + ".gguf";
    if (!std::filesystem::exists(path))
        write_synthetic_model(path, {name, dim, hidden, 2, 4, 2, 320, 64, false, "qwen2"}, types, 17);
    return Model::load(path);
}

CudaOptions persistent(int blocks = 0) {
    CudaOptions o;
    o.persistent_step = true;
    o.persistent_step_blocks = blocks;
    o.int8_activations = false;  // the step's walks read fp32 activations; the CPU side below is Float too
    o.attention_split = 4;       // the other steps' splits move within these short contexts
    return o;
}

// The logits of every call of a schedule (a 21-token prefill, 6 decodes, a truncate by 4, a 5-token verification
// call, 4 decodes), and how many steps took the persistent launch.
struct Run {
    std::vector<std::vector<float>> logits;
    int persistent_steps = 0;
    size_t graph_nodes = 0;  // in the graph replayed last
};
Run run_schedule(const Model& model, Backend& backend, const std::vector<int>* next_tokens = nullptr) {
    const int n_vocab = model.config.n_vocab, n_ctx = 48;
    auto cache = backend.new_cache(n_ctx);
    Run run;
    size_t call_index = 0;
    int next = 0;
    auto call = [&](std::vector<int> tokens) {
        const int n = static_cast<int>(tokens.size());
        std::vector<float> out(static_cast<size_t>(n) * n_vocab, std::nanf(""));
        backend.forward(tokens, *cache, n, out.data());
        const float* last = &out[static_cast<size_t>(n - 1) * n_vocab];
        // The next token: the reference run's argmax when given (so that both backends read the same text).
        next = next_tokens ? (*next_tokens)[call_index]
                           : static_cast<int>(std::max_element(last, last + n_vocab) - last);
        ++call_index;
        run.logits.push_back(std::move(out));
    };
    std::vector<int> prompt = {1};
    for (int i = 1; i < 21; ++i) prompt.push_back((i * 37 + 11) % n_vocab);
    call(prompt);
    for (int i = 0; i < 6; ++i) call({next});
    cache->truncate(cache->n_committed() - 4);
    call({next, 5, 17, 300 % n_vocab, 42});
    for (int i = 0; i < 4; ++i) call({next});
    if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {
        run.persistent_steps = cuda->graph_stats().persistent_steps;
        run.graph_nodes = cuda->graph_stats().nodes;
    }
    return run;
}

// The next tokens a run followed (each call's last argmax).
std::vector<int> argmaxes(const Run& run, int n_vocab) {
    std::vector<int> ids;
    for (const auto& l : run.logits) {
        const float* last = l.data() + l.size() - n_vocab;
        ids.push_back(static_cast<int>(std::max_element(last, last + n_vocab) - last));
    }
    return ids;
}

// The largest difference of any row from the reference's, relative to that row's logit range.
double worst_relative(const Run& got, const Run& want, int n_vocab) {
    REQUIRE(got.logits.size() == want.logits.size());
    double worst = 0.0;
    for (size_t c = 0; c < got.logits.size(); ++c) {
        REQUIRE(got.logits[c].size() == want.logits[c].size());
        for (size_t r = 0; r < got.logits[c].size() / n_vocab; ++r) {
            const float* a = &got.logits[c][r * n_vocab];
            const float* b = &want.logits[c][r * n_vocab];
            const auto [lo, hi] = std::minmax_element(b, b + n_vocab);
            double d = 0.0;
            for (int i = 0; i < n_vocab; ++i) {
                REQUIRE(std::isfinite(a[i]));
                d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
            }
            worst = std::max(worst, d / std::max(1e-6, static_cast<double>(*hi - *lo)));
        }
    }
    return worst;
}

#ifndef TANDEM_TEST_REAL_DEVICE
bool same_bits(const Run& a, const Run& b) {
    if (a.logits.size() != b.logits.size()) return false;
    for (size_t c = 0; c < a.logits.size(); ++c)
        if (a.logits[c].size() != b.logits[c].size() ||
            std::memcmp(a.logits[c].data(), b.logits[c].data(), a.logits[c].size() * 4) != 0)
            return false;
    return true;
}
#endif

// The persistent step on `model` against the CPU backend (fp32 activations, or 8-bit for the step's 8-bit kernels)
// and against the launches it replaces, with graphs and without, in two thread orders (or, without `variants`,
// once: graphs, forward order); within these fractions of the logit range.
// The defaults: both caches hold the same fp16 values (the CPU's CpuKvType::F16) and every sum is fp32 in another
// order; where a last bit moves a key or value across an fp16 rounding boundary the logits move ~2e-5 of their
// range (measured worst 6.6e-5 against the CPU, 4.4e-5 against the launches).
struct Tolerance {
    double cpu = 1e-3, launches = 1e-3;
};
void check_against_cpu(const Model& model, const std::string& name, CudaOptions options = persistent(),
                       cpu::Activations cpu_activations = cpu::Activations::Float, Tolerance tolerance = {},
                       bool variants = true) {
    CAPTURE(name);
    const int n_vocab = model.config.n_vocab;
    CpuBackend cpu(model, 1, 64, {.activations = cpu_activations, .kv_type = CpuKvType::F16});
    const Run want = run_schedule(model, cpu);
    const std::vector<int> next = argmaxes(want, n_vocab);
    CudaOptions usual = options;
    usual.persistent_step = false;
    CudaBackend plain_gpu(model, 48, {}, usual);
    const Run launches = run_schedule(model, plain_gpu, &next);
    CHECK(launches.persistent_steps == 0);
    for (bool graphs : {true, false}) {
        if (!graphs && !variants) break;
        CAPTURE(graphs);
        CudaOptions o = options;
        o.graphs = graphs;
        Run forward, reverse;
        {
            const emu::ScopedLaunchOptions order({emu::ThreadOrder::Forward, 0});
            CudaBackend gpu(model, 48, {}, o);
            forward = run_schedule(model, gpu, &next);
        }
        if (variants) {
            const emu::ScopedLaunchOptions order({emu::ThreadOrder::Reverse, 0});
            CudaBackend gpu(model, 48, {}, o);
            reverse = run_schedule(model, gpu, &next);
        }
        // Every one-token call (10 of the 12) took the persistent launch: directly, or recorded into the graph of
        // one-token steps, whose launches are then the embedding, the step's RoPE angles, the persistent launch and
        // the output matvec (on the 8-bit route after its input's quantization).
        const GgmlType head = model.weights.output.type;
        const bool quantized_head = o.matvec_route(head).int8 && cuda::matvec_q8_supports(head);
        if (graphs) {
            CHECK(forward.persistent_steps >= 1);
            CHECK(forward.graph_nodes == (quantized_head ? 5u : 4u));
        } else {
            CHECK(forward.persistent_steps == 10);
        }
        const double vs_cpu = worst_relative(forward, want, n_vocab);
        const double vs_launches = worst_relative(forward, launches, n_vocab);
        MESSAGE(name, (graphs ? " (graphs)" : " (direct)"), ": persistent step vs CPU ", vs_cpu,
                " of the logit range (the usual launches: ", worst_relative(launches, want, n_vocab),
                "); vs the usual launches ", vs_launches);
        CHECK(vs_cpu <= tolerance.cpu);
        CHECK(vs_launches <= tolerance.launches);
#ifndef TANDEM_TEST_REAL_DEVICE
        if (variants) CHECK(same_bits(forward, reverse));  // each sum's order is fixed by the grid, not by timing
#endif
    }
}

}  // namespace

TEST_CASE("persistent decode step: stories260K (f32) matches the CPU backend and the usual launches") {
    check_against_cpu(*stories(GgmlType::F32), "stories260K f32");
}

TEST_CASE("persistent decode step: stories260K q8_0 and q4_0 with Q/K/V biases" * doctest::test_suite("emu-variants")) {
    check_against_cpu(*stories(GgmlType::Q8_0), "stories260K q8_0");
    auto model = stories(GgmlType::Q4_0);
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
    check_against_cpu(*model, "stories260K q4_0 with Q/K/V biases");
    // Q4_0's measured route, 8-bit activations: the step's rows on its 8-bit kernel (biases added to the integer
    // products), and the output head after the persistent launch quantizes its input itself (the launch rewrote
    // it; nothing may reuse an earlier quantization).
    CudaOptions int8 = persistent();
    int8.int8_activations = std::nullopt;
    check_against_cpu(*model, "stories260K q4_0 with Q/K/V biases, 8-bit", int8, cpu::Activations::Int8);
}

TEST_CASE("persistent decode step: the Q4_K_M mixture's types on qwen2 shapes (NeoX RoPE, GQA, biases)") {
    auto k_quants = mixture("step-q4k", 256);
    REQUIRE(k_quants->weights.layers[1].wv.type == GgmlType::Q6_K);
    check_against_cpu(*k_quants, "Q4_K / Q6_K, dim 256");
    auto legacy = mixture("step-q50", 96);
    REQUIRE(legacy->weights.layers[1].wv.type == GgmlType::Q8_0);
    check_against_cpu(*legacy, "Q5_0 / Q8_0, dim 96");
}

TEST_CASE("persistent decode step: 8-bit activations match the CPU's 8-bit products and the 8-bit launches") {
    // Each kernel of two 8-bit walks on a model of its types, with rows of several chunks, so that a chunk's
    // activations are found at its offset in the Q8_1 / Q8_K row (ffn_down of 4096 columns: Q4_0 in 112 + 16 blocks;
    // of 2048: Q8_0 in 56 + 8; of 3584: Q4_K in 12 + 2, Q6_K in 9 + 5); Q5_K_M's types keep fp32 rows. Graphs on
    // and off and two thread orders (the quantizing warps' barrier) on the first only: the emulation's time.
    using cuda::DecodeStepRows;
    CudaOptions int8 = persistent();
    int8.int8_activations = true;
    struct Case {
        std::string name;
        std::unique_ptr<Model> model;
        DecodeStepRows rows;
    };
    std::vector<Case> cases;
    cases.push_back({"Q4_0, ffn_down of 4096", mixture("step-int8-q40", 64, 4096, SyntheticTypes(GgmlType::Q4_0)),
                     DecodeStepRows::Int8Q4_0});
    cases.push_back({"Q8_0, ffn_down of 2048", mixture("step-int8-q80", 64, 2048, SyntheticTypes(GgmlType::Q8_0)),
                     DecodeStepRows::Int8Q4_0});
    cases.push_back({"Q4_K / Q6_K, ffn_down of 3584", mixture("step-int8-q4k", 256, 3584), DecodeStepRows::Int8Q4K});
    REQUIRE(cases[2].model->weights.layers[0].w_down.type == GgmlType::Q4_K);
    REQUIRE(cases[2].model->weights.layers[1].w_down.type == GgmlType::Q6_K);
    for (const Case& c : cases) {
        const auto plan = CudaBackend::persistent_step_plan(*c.model, int8);
        REQUIRE(plan);
        CHECK(plan->rows == c.rows);
        CHECK(CudaBackend::describe_persistent_step(*c.model, int8).find("8-bit activations") != std::string::npos);
        // Against the 8-bit launches it replaces: the same walks on the same codes (a norm's other order moves an
        // fp32 value by an ulp, which Q8_1's fp16 scale mostly absorbs: measured 0 for Q4_0 / Q8_0, 1.4e-7 for
        // Q4_K / Q6_K). Against the CPU's 8-bit products: the same codes except where a last bit crosses a code's
        // rounding boundary, one code moving the logits ~2e-3 of their range (measured 2.4e-3 Q4_0, 1e-7 Q8_0,
        // 3e-4 Q4_K / Q6_K), so that bound is looser.
        check_against_cpu(*c.model, c.name + ", 8-bit", int8, cpu::Activations::Int8, {1e-2, 1e-5},
                          &c == &cases.front());
    }
}

TEST_CASE("persistent decode step: grids of 1 to 8 blocks give the same text within float rounding") {
    // One block does every row, head and split itself; more spread them (and split the keys into more parts).
    auto model = stories(GgmlType::F32);
    const int n_vocab = model->config.n_vocab;
    CpuBackend cpu(*model, 1, 64, {.activations = cpu::Activations::Float, .kv_type = CpuKvType::F16});
    const Run want = run_schedule(*model, cpu);
    const std::vector<int> next = argmaxes(want, n_vocab);
    for (int blocks : {1, 3, 8}) {
        CAPTURE(blocks);
        CudaBackend gpu(*model, 48, {}, persistent(blocks));
        const Run got = run_schedule(*model, gpu, &next);
        CHECK(got.persistent_steps > 0);
        CHECK(worst_relative(got, want, n_vocab) <= 1e-2);
        CHECK(argmaxes(got, n_vocab) == next);
    }
}

TEST_CASE("persistent decode step: a draft taking it keeps the speculative output that of plain decoding") {
    // The target on the CPU (the emulation is slow), the draft the same model on the device with the persistent
    // step: its proposals are the target's own greedy picks to float rounding, so nearly all are accepted, and the
    // output is the target's whatever they are.
    auto model = stories(GgmlType::F32);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    auto run = [&](bool speculative) {
        CpuBackend target(*model, 1, 64);
        CudaBackend draft(*model, 64, {}, persistent());
        auto cache = target.new_cache(64), draft_cache = draft.new_cache(64);
        GenerationParams p;
        p.n_predict = 16;
        p.sampler.temperature = 0;
        p.speculative.draft_min = p.speculative.draft_max = 4;
        p.speculative.p_min = 0;
        Generator gen(*model, target, *cache,
                      speculative ? DraftModel{model.get(), &draft, draft_cache.get()} : DraftModel{});
        const GenerationStats stats = gen.generate(prompt, p, [](std::string_view) { return true; });
        if (speculative) CHECK(draft.graph_stats().persistent_steps > 0);
        return stats;
    };
    const GenerationStats plain = run(false), speculative = run(true);
    CHECK(speculative.generated == plain.generated);
    CHECK(speculative.spec.drafted > 0);
    CHECK(speculative.spec.accepted * 10 >= speculative.spec.drafted * 9);
}

TEST_CASE("persistent decode step: off by default, and a model the kernel cannot take keeps the usual launches") {
    // Off by default, and a model the kernel cannot take (here: a q8_0 KV cache) keeps the usual launches.
    auto model = stories(GgmlType::F32);
    CHECK(!CudaOptions{}.persistent_step);
    CudaOptions q8 = persistent();
    q8.kv_type = cuda::KvType::Q8_0;
    CHECK(!CudaBackend::persistent_step_plan(*model, q8));
    const auto plan = CudaBackend::persistent_step_plan(*model, persistent());
    REQUIRE(plan);
    // An f32 model's rows are walked directly either way: it takes the kernel without the stage.
    CHECK(plan->rows == cuda::DecodeStepRows::Direct);
    CHECK(CudaBackend::describe_persistent_step(*model, persistent()).find("walked directly") != std::string::npos);
}

#ifndef TANDEM_TEST_REAL_DEVICE
TEST_CASE("persistent decode step: rows staged through shared memory give the direct walk's bits") {
    // Staged (the default) and direct walks add the same terms in the same order, so the logits are the same bits.
    // The models: one chunk per row (stories260K), rows of several chunks (ffn_down of 2560 columns: Q6_K in 9-block
    // chunks; of 1920: Q8_0 in 56-block chunks, whose rows start at 8 bytes into a 16-byte slot every other row), and
    // a model narrower than the grid's 64 warps (dim 32: in attn_output and ffn_down half the warps have no row and
    // request the next phase's first row themselves); then Q5_K_M's mixture at dim 96 through the second staged
    // kernel (ffn_down of 3072: Q5_K in 11 + 1 blocks, Q6_K in 9 + 3; the other rows in the fallbacks Q5_1 and Q8_0;
    // heads of 24 in that kernel's attention for 64); grids of 3 and 8 blocks.
    using cuda::DecodeStepRows;
    struct Case {
        std::string name;
        std::unique_ptr<Model> model;
        DecodeStepRows rows;
    };
    std::vector<Case> cases;
    cases.push_back({"stories260K q8_0", stories(GgmlType::Q8_0), DecodeStepRows::StagedQ4K});
    cases.push_back({"stories260K q4_0", stories(GgmlType::Q4_0), DecodeStepRows::StagedQ4K});
    cases.push_back({"Q4_K / Q6_K, ffn_down of 2560", mixture("step-q4k-wide", 256, 2560), DecodeStepRows::StagedQ4K});
    cases.push_back({"Q5_0 / Q8_0, ffn_down of 1920", mixture("step-q50-wide", 96, 1920), DecodeStepRows::StagedQ4K});
    cases.push_back({"Q4_1, dim 32", mixture("step-q41-narrow", 32, 64, SyntheticTypes(GgmlType::Q4_1)),
                     DecodeStepRows::StagedQ4K});
    cases.push_back({"Q5_1 / Q8_0 / Q5_K / Q6_K, dim 96", mixture("step-q51", 96, 3072, SyntheticTypes::Q5_K_M()),
                     DecodeStepRows::StagedQ5K});
    REQUIRE(cases[2].model->weights.layers[1].w_down.type == GgmlType::Q6_K);
    REQUIRE(cases[3].model->weights.layers[1].w_down.type == GgmlType::Q8_0);
    REQUIRE(cases[4].model->weights.layers[0].wo.type == GgmlType::Q4_1);
    const LayerWeights* q5 = cases[5].model->weights.layers.data();
    REQUIRE(q5[0].wq.type == GgmlType::Q5_1);
    REQUIRE(q5[1].wv.type == GgmlType::Q8_0);
    REQUIRE(q5[0].w_down.type == GgmlType::Q5_K);
    REQUIRE(q5[1].w_down.type == GgmlType::Q6_K);
    REQUIRE(cases[5].model->config.head_dim == 24);
    for (const Case& c : cases) {
        for (int blocks : {3, 8}) {
            CAPTURE(c.name);
            CAPTURE(blocks);
            CudaOptions staged = persistent(blocks), direct = staged;
            direct.matvec_loads = cuda::MatvecLoads::Direct;
            REQUIRE(CudaBackend::persistent_step_plan(*c.model, staged)->rows == c.rows);
            REQUIRE(CudaBackend::persistent_step_plan(*c.model, direct)->rows == DecodeStepRows::Direct);
            CudaBackend staged_gpu(*c.model, 48, {}, staged), direct_gpu(*c.model, 48, {}, direct);
            const Run a = run_schedule(*c.model, staged_gpu), b = run_schedule(*c.model, direct_gpu);
            CHECK(a.persistent_steps > 0);
            CHECK(same_bits(a, b));
        }
    }
}
#endif

TEST_CASE("persistent decode step: each staged kernel takes its types, a model with Q3_K rows the direct walk") {
    using cuda::DecodeStepRows;
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                       GgmlType::Q4_K, GgmlType::Q6_K}) {
        CHECK(cuda::decode_step_stages(DecodeStepRows::StagedQ4K, t));
        CHECK(cuda::decode_step_stages(DecodeStepRows::StagedQ5K, t));
    }
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1}) {
        CHECK(cuda::decode_step_stages(DecodeStepRows::StagedQ4K, t));
        CHECK_FALSE(cuda::decode_step_stages(DecodeStepRows::StagedQ5K, t));
    }
    CHECK_FALSE(cuda::decode_step_stages(DecodeStepRows::StagedQ4K, GgmlType::Q5_K));
    CHECK(cuda::decode_step_stages(DecodeStepRows::StagedQ5K, GgmlType::Q5_K));
    for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K}) {
        CHECK_FALSE(cuda::decode_step_stages(DecodeStepRows::StagedQ4K, t));
        CHECK_FALSE(cuda::decode_step_stages(DecodeStepRows::StagedQ5K, t));
        CHECK(cuda::decode_step_stages(DecodeStepRows::Direct, t));
    }
    // Neither staged kernel has a Q2_K or Q3_K walk (with them ptxas spilled it): such a model's step walks its
    // rows directly.
    auto model = mixture("step-q3k", 256, 256, SyntheticTypes(GgmlType::Q3_K));
    REQUIRE(model->weights.layers[0].wq.type == GgmlType::Q3_K);
    const auto plan = CudaBackend::persistent_step_plan(*model, persistent());
    REQUIRE(plan);
    CHECK(plan->rows == DecodeStepRows::Direct);
    CHECK(CudaBackend::describe_persistent_step(*model, persistent()).find("walked directly") != std::string::npos);
    // The 8-bit kernels: two types each; a model of other types keeps fp32 rows with 8-bit activations asked for
    // (the real draft's Q5_0 / Q8_0 beside Q4_K / Q6_K), and a model of Q4_0 rows takes 8-bit rows by default (Q4_0's
    // measured route).
    const std::pair<DecodeStepRows, std::vector<GgmlType>> int8_sets[] = {
        {DecodeStepRows::Int8Q4_0, {GgmlType::Q4_0, GgmlType::Q8_0}},
        {DecodeStepRows::Int8Q4K, {GgmlType::Q4_K, GgmlType::Q6_K}}};
    for (const auto& [rows, takes] : int8_sets) {
        CHECK(cuda::decode_step_int8(rows));
        for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0,
                           GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
            CAPTURE(ggml_type_name(t));
            CHECK(cuda::decode_step_stages(rows, t) ==
                  (ggml_is_float_type(t) || std::find(takes.begin(), takes.end(), t) != takes.end()));
        }
    }
    CHECK_FALSE(cuda::decode_step_int8(DecodeStepRows::StagedQ4K));
    CudaOptions int8 = persistent();
    int8.int8_activations = true;
    auto draft_like = mixture("step-q50", 96);
    REQUIRE(draft_like->weights.layers[0].wq.type == GgmlType::Q5_0);
    REQUIRE(draft_like->weights.layers[0].w_down.type == GgmlType::Q4_K);
    CHECK(CudaBackend::persistent_step_plan(*draft_like, int8)->rows == DecodeStepRows::StagedQ4K);
    auto q5_k_m = mixture("step-int8-q5k", 256, 256, SyntheticTypes::Q5_K_M());
    REQUIRE(q5_k_m->weights.layers[0].wq.type == GgmlType::Q5_K);
    CHECK(CudaBackend::persistent_step_plan(*q5_k_m, int8)->rows == DecodeStepRows::StagedQ5K);
    CudaOptions measured = persistent();
    measured.int8_activations = std::nullopt;
    CHECK(CudaBackend::persistent_step_plan(*stories(GgmlType::Q4_0), measured)->rows == DecodeStepRows::Int8Q4_0);
    CHECK(CudaBackend::persistent_step_plan(*stories(GgmlType::Q4_0), persistent())->rows ==
          DecodeStepRows::StagedQ4K);
    CHECK(CudaBackend::persistent_step_plan(*stories(GgmlType::Q8_0), measured)->rows == DecodeStepRows::StagedQ4K);
    const int n_vocab = model->config.n_vocab;
    CpuBackend cpu(*model, 1, 64, {.activations = cpu::Activations::Float, .kv_type = CpuKvType::F16});
    const Run want = run_schedule(*model, cpu);
    const std::vector<int> next = argmaxes(want, n_vocab);
    CudaBackend gpu(*model, 48, {}, persistent());
    const Run got = run_schedule(*model, gpu, &next);
    CHECK(got.persistent_steps > 0);
    CHECK(worst_relative(got, want, n_vocab) <= 1e-2);
}
