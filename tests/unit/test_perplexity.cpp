// Tests of the llama.cpp-compatible perplexity (src/perplexity.*): on stories260K against a straightforward
// token-by-token computation written here, and the window rules (fresh cache per window, BOS replacement, only
// the second half scored, the ± formula) on a scripted fake backend where every number is known in closed form.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "model/model.h"
#include "app/environment.h"
#include "app/model_registry.h"
#include "generate/perplexity.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

const char* kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog, "
    "Max. One day, Lily saw a big red ball under a tree. She ran to get it, but Max was faster. They laughed and "
    "played together until the sun went down. Then they went home and had a warm bowl of soup with mom.";

// The reference: each window from an empty cache, one token per forward call, log-softmax in double.
struct Reference {
    std::vector<double> nll;
    std::vector<double> running;  // ppl after each window
};

Reference reference_perplexity(const Model& model, const std::vector<int>& tokens, int n_ctx, int n_windows,
                               int bos) {
    CpuBackend backend(*&model, 1, 1);
    const int n_vocab = model.config.n_vocab;
    Reference ref;
    std::vector<float> logits(n_vocab);
    for (int w = 0; w < n_windows; ++w) {
        auto cache = backend.new_cache(n_ctx);
        for (int pos = 0; pos < n_ctx - 1; ++pos) {
            int tok = tokens[static_cast<size_t>(w) * n_ctx + pos];
            if (pos == 0 && bos >= 0) tok = bos;
            backend.forward(std::span<const int>(&tok, 1), *cache, 1, logits.data());
            if (pos < n_ctx / 2) continue;
            double mx = logits[0];
            for (float l : logits) mx = std::max(mx, static_cast<double>(l));
            double sum = 0;
            for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
            const int next = tokens[static_cast<size_t>(w) * n_ctx + pos + 1];
            ref.nll.push_back(-(static_cast<double>(logits[next]) - mx - std::log(sum)));
        }
        double s = 0;
        for (double v : ref.nll) s += v;
        ref.running.push_back(std::exp(s / ref.nll.size()));
    }
    return ref;
}

// A backend whose logits are scripted: the row of the token at cache position p is all zeros except, when p is
// in `peaks`, a logit of `peak` on `peaks_token`. It records where every call started.
class MockCache : public KvCache {
public:
    explicit MockCache(int n) : KvCache(n) {}
};

class MockBackend : public Backend {
public:
    int n_vocab = 8;
    std::vector<int> peak_positions;
    int peak_token = 0;
    float peak = 3.0f;
    std::vector<std::pair<int, std::vector<int>>> calls;  // (start position, tokens)

    std::string name() const override { return "mock"; }
    std::unique_ptr<KvCache> new_cache(int n) override { return std::make_unique<MockCache>(n); }
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
        const int start = cache.n_committed();
        calls.emplace_back(start, std::vector<int>(tokens.begin(), tokens.end()));
        const int n = static_cast<int>(tokens.size());
        for (int i = n - n_logits; i < n; ++i) {
            float* row = logits + static_cast<size_t>(i - (n - n_logits)) * n_vocab;
            std::fill(row, row + n_vocab, 0.0f);
            for (int p : peak_positions)
                if (p == start + i) row[peak_token] = peak;
        }
        cache.commit_appended(n);
    }
};

}  // namespace

TEST_CASE("perplexity: stories260K equals a token-by-token computation") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> tokens = model->tokenizer->encode(kStory, true);
    REQUIRE(tokens.size() >= 64);
    for (int bos : {-1, model->tokenizer->bos()}) {
        for (int batch : {16, 5}) {
            CAPTURE(bos);
            CAPTURE(batch);
            PerplexityParams p;
            p.n_ctx = 16;
            p.batch = batch;
            p.bos = bos;
            const int n_windows = static_cast<int>(tokens.size()) / 16;
            CpuBackend backend(*model, 2, batch);
            auto cache = backend.new_cache(16);
            std::vector<double> seen;
            const PerplexityResult r = perplexity(backend, *cache, model->config.n_vocab, tokens, p,
                                                  [&](int k, double v) {
                                                      CHECK(k == static_cast<int>(seen.size()) + 1);
                                                      seen.push_back(v);
                                                  });
            const Reference ref = reference_perplexity(*model, tokens, 16, n_windows, bos);
            REQUIRE(r.n_windows == n_windows);
            REQUIRE(r.stats.count == static_cast<long>(ref.nll.size()));
            CHECK(r.stats.count == n_windows * 7);  // positions 8..14 of each 16-token window
            REQUIRE(seen.size() == ref.running.size());
            for (size_t k = 0; k < seen.size(); ++k) {
                CHECK(seen[k] == doctest::Approx(ref.running[k]).epsilon(1e-5));
                CHECK(r.running_ppl[k] == seen[k]);
            }
            double mean = 0, sq = 0;
            for (double v : ref.nll) mean += v, sq += v * v;
            const double n = static_cast<double>(ref.nll.size());
            mean /= n;
            const double err = std::exp(mean) * std::sqrt((sq / n - mean * mean) / (n - 1));
            CHECK(r.ppl() == doctest::Approx(std::exp(mean)).epsilon(1e-5));
            CHECK(r.error() == doctest::Approx(err).epsilon(1e-4));
            CHECK(r.ppl() > 1.0);
        }
    }
}

TEST_CASE("perplexity: windows start from an empty cache, BOS replaces their first token, only halves are scored") {
    MockBackend backend;
    std::vector<int> tokens;
    for (int i = 0; i < 16 * 3 + 5; ++i) tokens.push_back(i % 8);  // 3 whole windows and a dropped tail
    auto cache = backend.new_cache(16);
    PerplexityParams p;
    p.n_ctx = 16;
    p.batch = 6;
    p.bos = 7;

    SUBCASE("uniform logits: every scored token costs log(8)") {
        const PerplexityResult r = perplexity(backend, *cache, 8, tokens, p);
        CHECK(r.n_windows == 3);
        CHECK(r.stats.count == 3 * 7);
        CHECK(r.ppl() == doctest::Approx(8.0));
        CHECK(r.error() < 1e-6);  // no variance (up to rounding, as in llama.cpp)
        // Each window: calls at positions 0, 6, 12 over the window's own tokens, the first one replaced by BOS.
        REQUIRE(backend.calls.size() == 9);
        for (int w = 0; w < 3; ++w) {
            std::vector<int> fed;
            for (int c = 0; c < 3; ++c) {
                CHECK(backend.calls[w * 3 + c].first == c * 6);
                fed.insert(fed.end(), backend.calls[w * 3 + c].second.begin(), backend.calls[w * 3 + c].second.end());
            }
            REQUIRE(fed.size() == 16);
            CHECK(fed[0] == 7);
            for (int i = 1; i < 16; ++i) CHECK(fed[i] == tokens[w * 16 + i]);
        }
    }

    SUBCASE("a peak at position first-1 or n_ctx-1 is never scored; at first or n_ctx-2 it is") {
        // Every token is 5 here, so a peak on token 5 lowers the NLL of whichever prediction it lands on.
        std::vector<int> fives(48, 5);
        backend.peak_token = 5;
        backend.peak_positions = {7, 15};
        CHECK(perplexity(backend, *cache, 8, fives, p).ppl() == doctest::Approx(8.0));
        backend.peak_positions = {8, 14};
        const PerplexityResult r = perplexity(backend, *cache, 8, fives, p);
        // Per window: 5 predictions at log(8), 2 at log(7 + e^3) - 3.
        const double low = std::log(7.0 + std::exp(3.0)) - 3.0, high = std::log(8.0);
        const double mean = (5 * high + 2 * low) / 7;
        const double var = (5 * high * high + 2 * low * low) / 7 - mean * mean;
        CHECK(r.stats.count == 21);
        CHECK(r.ppl() == doctest::Approx(std::exp(mean)).epsilon(1e-6));
        CHECK(r.error() == doctest::Approx(std::exp(mean) * std::sqrt(var / 20)).epsilon(1e-5));
        for (double v : r.running_ppl) CHECK(v == doctest::Approx(std::exp(mean)).epsilon(1e-6));
    }
}

TEST_CASE("perplexity: window count and the errors of a short text") {
    PerplexityParams p;
    p.n_ctx = 512;
    CHECK(perplexity_windows(1024, p) == 2);
    CHECK(perplexity_windows(8029, p) == 15);
    p.n_chunks = 6;
    CHECK(perplexity_windows(8029, p) == 6);
    CHECK_THROWS_AS(perplexity_windows(1023, p), Error);  // llama.cpp needs 2 * n_ctx tokens
    p.n_ctx = 2;
    CHECK_THROWS_AS(perplexity_windows(100, p), Error);
}

TEST_CASE("perplexity: token_nll matches a double log-softmax") {
    const std::vector<float> logits = {1.0f, -2.0f, 3.5f, 0.25f, 100.0f, -100.0f};
    double mx = 100.0, sum = 0;
    for (float l : logits) sum += std::exp(l - mx);
    for (int t = 0; t < 6; ++t) CHECK(token_nll(logits, t) == doctest::Approx(-(logits[t] - mx - std::log(sum))));
}

namespace {

// Perplexity of an installed real model over the first `windows` 512-token windows of gpl-3.txt, tokenized as
// llama.cpp's `llama-perplexity -f` does (one trailing newline dropped, no BOS for these models).
double real_model_perplexity(const std::string& name, int windows) {
    const auto path = installed_path(name);
    if (!path) FAIL("model " << name << " is missing from " << environment().models_dir << ": run scripts/fetch-models");
    auto model = Model::load(*path);
    std::ifstream in(kData + "/gpl-3.txt", std::ios::binary);
    REQUIRE(in.good());
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    // As llama-perplexity (and tandem-perplexity): a model that adds BOS (Gemma) gets it at the start of the text
    // and in place of every window's first token; the others (Qwen, SmolLM2) get none.
    const bool add_bos = model->tokenizer->add_bos() && model->tokenizer->bos() >= 0;
    const std::vector<int> tokens = model->tokenizer->encode(text, add_bos);
    PerplexityParams p;
    p.n_ctx = 512;
    p.n_chunks = windows;
    p.bos = add_bos ? model->tokenizer->bos() : -1;
    CpuBackend backend(*model, 2, 512, {.kv_type = CpuKvType::F16});  // as llama-perplexity's default cache
    auto cache = backend.new_cache(512);
    const PerplexityResult r = perplexity(backend, *cache, model->config.n_vocab, tokens, p);
    CHECK(r.stats.count == 255 * windows);
    return r.ppl();
}

}  // namespace

// llama.cpp build 11312 `llama-perplexity -c 512 -b 512` on the same file (shared/reference/README.md gives the
// value after each window). One window keeps each test to seconds; tandem-perplexity --chunks 6 gives all six.
TEST_CASE("real: perplexity: SmolLM2-135M on gpl-3.txt is within 1% of llama.cpp's (first window)") {
    const double ppl = real_model_perplexity("smollm2-135m-instruct-q4_1", 1);
    MESSAGE("SmolLM2-135M gpl-3.txt window 1: tandem " << ppl << ", llama.cpp 16.3211");
    CHECK(ppl == doctest::Approx(16.3211).epsilon(0.01));
}

TEST_CASE("real: perplexity: Gemma 3 270M on gpl-3.txt is within 1% of llama.cpp's (all six windows)") {
    // Six windows: the sliding-window layers (512 positions) then see their whole window filled. tandem-perplexity
    // gives the same (per window: 12.9503 13.8371 13.7837 15.1021 14.8518 14.4860 on this project's AMD EPYC).
    const double ppl = real_model_perplexity("gemma-3-270m-q4_k_m", 6);
    MESSAGE("Gemma 3 270M gpl-3.txt 6 windows: tandem " << ppl << ", llama.cpp 14.5455");
    CHECK(ppl == doctest::Approx(14.5455).epsilon(0.01));
}

TEST_CASE("real: perplexity: Qwen2.5-Coder-0.5B on gpl-3.txt is within 1% of llama.cpp's (first window)") {
    const double ppl = real_model_perplexity("qwen2.5-coder-0.5b-instruct-q4_k_m", 1);
    MESSAGE("Qwen2.5-Coder-0.5B gpl-3.txt window 1: tandem " << ppl << ", llama.cpp 4.8351");
    CHECK(ppl == doctest::Approx(4.8351).epsilon(0.01));
}

TEST_CASE("real: perplexity: Qwen2.5-Coder-1.5B on gpl-3.txt is within 1% of llama.cpp's (first window)") {
    const double ppl = real_model_perplexity("qwen2.5-coder-1.5b-instruct-q4_k_m", 1);
    MESSAGE("Qwen2.5-Coder-1.5B gpl-3.txt window 1: tandem " << ppl << ", llama.cpp 1.5760");
    CHECK(ppl == doctest::Approx(1.5760).epsilon(0.01));
}
