// Tests of greedy picks without logits (Backend::forward_argmax): the default implementation follows Sampler's
// greedy rule (NaN as -inf, ties to the lower id), CudaBackend's device argmax equals the host argmax of its own
// logits, and the Generator's greedy output (plain decoding and speculative verification) is the same whether it
// goes through forward_argmax or through logits and the Sampler, on the CPU backend and on the emulated CUDA one.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "backend_doubles.h"
#include "convert/quantize_model.h"
#include "sample/sampler.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

using test::CpuDraft;
using test::RowsBackend;

// Delegates to another backend and counts which entry point the Generator used.
class Counting : public Backend {
public:
    explicit Counting(Backend& inner) : inner_(inner) {}
    std::string name() const override { return inner_.name(); }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override { return inner_.new_cache(n_ctx); }
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
        ++forwards;
        inner_.forward(tokens, cache, n_logits, logits);
    }
    void forward_argmax(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                        std::span<float> scratch) override {
        ++argmax_calls;
        argmax_rows += n_rows;
        inner_.forward_argmax(tokens, cache, n_rows, ids, scratch);
    }
    int forwards = 0, argmax_calls = 0, argmax_rows = 0;

private:
    Backend& inner_;
};

std::string requantized_q8_0() {
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-greedy-ids-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/q8_0.gguf";
    if (!std::filesystem::exists(path))
        requantize_gguf(*GgufFile::open(kData + "/stories260K.gguf"), GgmlType::Q8_0).write(path);
    return path;
}
struct RemoveTempDir {
    ~RemoveTempDir() {
        std::error_code ec;
        std::filesystem::remove_all(
            std::filesystem::temp_directory_path() / ("tandem-greedy-ids-" + std::to_string(getpid())), ec);
    }
} remove_temp_dir;

struct Run {
    std::vector<int> tokens;
    GenerationStats stats;
    int forwards = 0, argmax_calls = 0, argmax_rows = 0;
};

// Greedy generation of n tokens after `prompt` on `backend` (wrapped to count its calls); with `draft`, speculative
// with exactly k drafts a round, so that every verification call scores k + 1 positions.
Run generate(const Model& model, Backend& backend, const std::vector<int>& prompt, int n, float repeat_penalty,
             int repeat_last_n, const Model* draft = nullptr, int k = 0, float p_min = 0.0f) {
    Counting counting(backend);
    auto cache = counting.new_cache(64);
    CpuDraft d(draft, 64);
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0;
    p.sampler.repeat_penalty = repeat_penalty;
    p.sampler.repeat_last_n = repeat_last_n;
    p.speculative.draft_min = p.speculative.draft_max = k;
    p.speculative.p_min = p_min;
    Generator gen(model, counting, *cache, d.draft);
    Run run;
    run.stats = gen.generate(prompt, p, [](std::string_view) { return true; });
    run.tokens = run.stats.generated;
    run.forwards = counting.forwards;
    run.argmax_calls = counting.argmax_calls;
    run.argmax_rows = counting.argmax_rows;
    return run;
}

// Greedy with nothing else reading the logits goes through forward_argmax; a repeat penalty with an empty window
// (which changes nothing) keeps the logits + Sampler path. The two must give the same tokens; the counts show that
// each run really took its path for every decode step / verification.
void check_paths_agree(const Model& model, Backend& backend, const std::vector<int>& prompt, int n,
                       const Model* draft, int k, float p_min = 0.0f) {
    const Run ids = generate(model, backend, prompt, n, 1.0f, 64, draft, k, p_min);
    const Run logits = generate(model, backend, prompt, n, 1.3f, 0, draft, k, p_min);
    REQUIRE(ids.tokens.size() == static_cast<size_t>(n));
    CHECK(ids.tokens == logits.tokens);
    CHECK(logits.argmax_calls == 0);
    CHECK(ids.argmax_calls == ids.stats.n_decode_forwards);
    CHECK(ids.argmax_calls > 0);
    // Prefill only (every decode step or verification went through forward_argmax), one forward per prompt chunk.
    CHECK(ids.forwards == 1);
    CHECK(logits.forwards == 1 + logits.stats.n_decode_forwards);
    if (draft) {
        CHECK(ids.stats.spec.drafted > 0);
        // Rounds of k drafts score k + 1 rows (the last rounds may be cut short by the tokens still wanted).
        CHECK(ids.argmax_rows > 2 * ids.argmax_calls);
        CHECK(ids.stats.spec.accepted == logits.stats.spec.accepted);
        // The draft's confidence (forward_argmax_confidence on one path, the Sampler and a softmax of the whole row
        // on the other) cut the proposals at the same places.
        CHECK(ids.stats.spec.drafted == logits.stats.spec.drafted);
    } else {
        CHECK(ids.argmax_rows == ids.argmax_calls);
    }
}

}  // namespace

TEST_CASE("backend: the default forward_argmax picks as Sampler's greedy rule does") {
    const std::vector<std::vector<float>> rows = {
        {0.5f, 2.0f, -1.0f, 2.0f, 1.0f},        // a tie: the lower id
        {kNaN, 0.1f, kNaN, 0.1f, -kInf},        // NaN is -inf; then the tie
        {-3.0f, -kInf, kInf, kNaN, kInf},       // +inf wins, the first of two
        {-0.0f, 0.0f, -1.0f, -2.0f, -0.0f},     // -0 == +0: the lower id
        {-kInf, kNaN, -kInf, kNaN, -kInf},      // nothing above -inf: -1 (Sampler throws)
        {-7.0f, -6.0f, -5.0f, -4.0f, -3.5f},
    };
    RowsBackend backend(rows);
    auto cache = backend.new_cache(16);
    const int n = static_cast<int>(rows.size());
    std::vector<int> tokens(8, 3), ids(n, -7);
    std::vector<float> scratch(static_cast<size_t>(n) * 5, kNaN);
    backend.forward_argmax(tokens, *cache, n, ids.data(), scratch);
    CHECK(cache->n_committed() == 8);
    CHECK(ids == std::vector<int>{1, 1, 2, 0, -1, 4});
    SamplerParams greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy, 5);
    for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        if (ids[r] < 0)
            CHECK_THROWS_AS(sampler.sample(rows[r].data(), {}, 0), Error);
        else
            CHECK(sampler.sample(rows[r].data(), {}, 0) == ids[r]);
    }
    // No rows: just the forward.
    backend.forward_argmax(tokens, *cache, 0, ids.data(), {});
    CHECK(cache->n_committed() == 16);
}

TEST_CASE("backend: the default forward_argmax_confidence adds 1 / sum(exp(l - max))") {
    const std::vector<std::vector<float>> rows = {
        {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f, -3.0f, 1.5f, 0.25f},  // more than one SIMD lane group, and a tie
        {-kInf, 3.0f, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
        {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
    };
    RowsBackend backend(rows);
    auto cache = backend.new_cache(16);
    std::vector<int> tokens(3, 1), ids(3, -7);
    std::vector<float> top(3, -7.0f), scratch(3 * 9, kNaN);
    backend.forward_argmax_confidence(tokens, *cache, 3, ids.data(), top.data(), scratch);
    CHECK(ids == std::vector<int>{1, 1, -1});
    double sum = 0.0;
    for (float l : rows[0]) sum += std::exp(static_cast<double>(l) - 2.0);
    CHECK(std::abs(top[0] - 1.0 / sum) <= 1e-6 / sum);
    CHECK(top[1] == 1.0f);
    CHECK(std::isnan(top[2]));
}

TEST_CASE("generator: greedy output through forward_argmax equals logits + Sampler on the CPU backend") {
    auto model = Model::load(kData + "/stories260K.gguf");
    auto draft = Model::load(requantized_q8_0());
    CpuBackend backend(*model, 1, 64);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    SUBCASE("plain decoding") { check_paths_agree(*model, backend, prompt, 40, nullptr, 0); }
    SUBCASE("speculative, 4 drafts a round") { check_paths_agree(*model, backend, prompt, 40, draft.get(), 4); }
    SUBCASE("speculative, up to 6 drafts while the draft is confident") {
        const Run run = generate(*model, backend, prompt, 40, 1.0f, 64, draft.get(), 6, 0.9f);
        CHECK(run.stats.spec.drafted < 6 * (run.stats.spec.rounds - run.stats.spec.plain_steps));  // some were cut
        check_paths_agree(*model, backend, prompt, 40, draft.get(), 6, 0.9f);
    }
}

TEST_CASE("cuda backend: device argmax ids (and confidences) equal the host's from the backend's own logits") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const int n_vocab = model->config.n_vocab;
    std::vector<int> prompt = {1};
    for (int i = 1; i < 60; ++i) prompt.push_back((i * 37 + 11) % n_vocab);
    for (bool graphs : {true, false}) {
        CAPTURE(graphs);
        CudaOptions o;
        o.graphs = graphs;
        // Calls over 16 tokens on the prefill path, so that its argmax (16 rows at a time) runs too.
        CudaBackend gpu(*model, 64, {256, 16}, o);
        auto with_logits = gpu.new_cache(64), with_ids = gpu.new_cache(64);
        int picks = 0;
        // (tokens, rows): 6 tokens with every row; a decode; a 4-token verification; 20 tokens on the prefill path
        // with 18 rows (two groups of the output projection).
        // With `confidence`, forward_argmax_confidence, whose probabilities are checked against a double softmax of
        // the logits.
        auto call = [&](std::span<const int> tokens, int rows, bool confidence) {
            std::vector<float> logits(static_cast<size_t>(rows) * n_vocab), scratch(logits.size(), kNaN);
            std::vector<int> ids(rows, -7);
            std::vector<float> top(rows, -7.0f);
            gpu.forward(tokens, *with_logits, rows, logits.data());
            if (confidence)
                gpu.forward_argmax_confidence(tokens, *with_ids, rows, ids.data(), top.data(), scratch);
            else
                gpu.forward_argmax(tokens, *with_ids, rows, ids.data(), scratch);
            CHECK(with_ids->n_committed() == with_logits->n_committed());
            for (int r = 0; r < rows; ++r) {
                CAPTURE(r);
                const float* row = &logits[static_cast<size_t>(r) * n_vocab];
                REQUIRE(ids[r] == Backend::argmax_row(row, n_vocab));
                if (confidence) {
                    double sum = 0.0;
                    for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - row[ids[r]]);
                    CHECK(std::abs(top[r] - 1.0 / sum) <= 1e-6 / sum);
                } else {
                    CHECK(top[r] == -7.0f);
                }
            }
            CHECK(std::all_of(scratch.begin(), scratch.end(), [](float x) { return std::isnan(x); }));  // untouched
            picks += rows;
            return ids.back();
        };
        const std::span<const int> p(prompt);
        int next = call(p.subspan(0, 6), 6, false);
        next = call(std::span<const int>(&next, 1), 1, true);
        const std::vector<int> verify = {next, 3, 300, 17};
        call(verify, 4, false);
        call(p.subspan(6, 20), 18, true);
        CHECK(picks == 29);
        if (graphs) CHECK(gpu.graph_stats().replays > 0);
    }
}

TEST_CASE("cuda backend: greedy generation through forward_argmax equals logits + Sampler" * doctest::test_suite("emu-variants")) {
    // The emulated target (graphs on), a CPU draft: every verification call scores 4 positions on the device.
    auto model = Model::load(kData + "/stories260K.gguf");
    auto draft = Model::load(requantized_q8_0());
    CudaBackend gpu(*model, 64);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    SUBCASE("plain decoding") { check_paths_agree(*model, gpu, prompt, 8, nullptr, 0); }
    SUBCASE("speculative, 3 drafts a round") { check_paths_agree(*model, gpu, prompt, 10, draft.get(), 3); }
    // And the text is the CPU backend's.
    CpuBackend cpu(*model, 1, 64);
    CHECK(generate(*model, gpu, prompt, 8, 1.0f, 64).tokens == generate(*model, cpu, prompt, 8, 1.0f, 64).tokens);
}
