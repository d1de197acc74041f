// Tests of logit rows given as candidates (src/candidates.*, Sampler's candidate overloads,
// Backend::forward_candidates): the plan's counts, the host selection against a full sort, the Sampler's picks and
// distributions from candidates bitwise equal to those from whole rows (random rows and settings, and a crafted
// case where fewer candidates than planned pick wrongly), the default and the CUDA backend's (emulated) candidates
// against their own logits, and the Generator's sampled output (plain and speculative) the same whether the
// target's rows come back whole or as candidates.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sample/candidates.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "model/model.h"
#include "backend_doubles.h"
#include "sample/sampler.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Ids of row[0, n) sorted by Sampler's order (NaN as -inf), the reference for the selections.
std::vector<int> full_order(const float* row, int n) {
    std::vector<int> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    auto v = [&](int i) { return std::isnan(row[i]) ? -kInf : row[i]; };
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return v(a) > v(b) || (v(a) == v(b) && a < b); });
    return ids;
}

// A row's candidates as plan_candidates asks for them, selected on the host.
struct Candidates {
    std::vector<float> top_logits, extra_logits;
    std::vector<int> top_ids, extra_ids;
    CandidateRow row() const { return {top_logits, top_ids, extra_ids, extra_logits}; }
};
Candidates candidates_of(const std::vector<float>& row, int best, const std::vector<int>& extra) {
    Candidates c;
    c.top_logits.resize(static_cast<size_t>(best));
    c.top_ids.resize(static_cast<size_t>(best));
    select_top_candidates(row.data(), row.size(), best, c.top_logits.data(), c.top_ids.data());
    c.extra_ids = extra;
    for (int id : extra) c.extra_logits.push_back(row[static_cast<size_t>(id)]);
    return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Random logits with ties (values on a coarse grid), and now and then NaN and infinities.
std::vector<float> random_row(int n, std::mt19937& rng, bool specials) {
    std::uniform_int_distribution<int> grid(-40, 40);
    std::uniform_real_distribution<float> fine(-8.0f, 8.0f);
    std::vector<float> row(static_cast<size_t>(n));
    const bool coarse = rng() % 2;
    for (float& x : row) x = coarse ? static_cast<float>(grid(rng)) * 0.25f : fine(rng);
    if (specials) {
        row[rng() % row.size()] = kNaN;
        row[rng() % row.size()] = -kInf;
        row[rng() % row.size()] = -0.0f;
        if (rng() % 4 == 0) row[rng() % row.size()] = kInf;
    }
    return row;
}

using test::CpuDraft;
using test::RowsBackend;

// Delegates to another backend, counting candidate calls; `whole_rows` makes the Generator take whole rows.
class Delegating : public Backend {
public:
    Delegating(Backend& inner, bool whole_rows) : inner_(inner), whole_rows_(whole_rows) {}
    std::string name() const override { return inner_.name(); }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override { return inner_.new_cache(n_ctx); }
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
        inner_.forward(tokens, cache, n_logits, logits);
    }
    void forward_argmax(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                        std::span<float> scratch) override {
        inner_.forward_argmax(tokens, cache, n_rows, ids, scratch);
    }
    void forward_candidates(std::span<const int> tokens, KvCache& cache, int n_rows, int k, std::span<const int> extra,
                            float* top_logits, int* top_ids, float* extra_logits, std::span<float> scratch) override {
        ++candidate_calls;
        candidate_rows += n_rows;
        inner_.forward_candidates(tokens, cache, n_rows, k, extra, top_logits, top_ids, extra_logits, scratch);
    }
    int max_candidates() const override { return whole_rows_ ? 0 : inner_.max_candidates(); }
    int candidate_calls = 0, candidate_rows = 0;

private:
    Backend& inner_;
    bool whole_rows_;
};

}  // namespace

TEST_CASE("candidates: the plan counts top-k plus the window's distinct ids, or asks for whole rows") {
    SamplerParams p;
    p.temperature = 0.8f, p.top_k = 40, p.repeat_penalty = 1.0f, p.repeat_last_n = 64;
    std::vector<int> extra = {99};
    const std::vector<int> window = {5, 7, 5, 9, 7, 7};
    CHECK(plan_candidates(p, 1000, window, extra) == 40);
    CHECK(extra.empty());  // no penalty: the window does not matter
    p.repeat_penalty = 1.1f;
    CHECK(plan_candidates(p, 1000, window, extra) == 43);
    CHECK(extra == std::vector<int>{5, 7, 9});
    p.repeat_last_n = 0;
    CHECK(plan_candidates(p, 1000, window, extra) == 40);
    CHECK(extra.empty());
    p.repeat_last_n = 64;
    p.temperature = 0;  // greedy under a penalty: the argmax after it
    CHECK(plan_candidates(p, 1000, window, extra) == 4);
    p.temperature = 0.8f;
    p.top_k = 0;  // every id reaches the softmax
    CHECK(plan_candidates(p, 1000, window, extra) == 0);
    CHECK(extra.empty());
    p.top_k = 1000;
    CHECK(plan_candidates(p, 1000, window, extra) == 0);
    p.top_k = 999;
    CHECK(plan_candidates(p, 1000, window, extra) == 0);  // 999 + 3 > n_vocab
    p.top_k = kMaxCandidates - 3;
    CHECK(plan_candidates(p, 100000, window, extra) == kMaxCandidates);
    p.top_k = kMaxCandidates - 2;
    CHECK(plan_candidates(p, 100000, window, extra) == 0);
    p.top_k = 40;
    const std::vector<int> long_window(5000, 3);
    CHECK(plan_candidates(p, 100000, long_window, extra) == 0);
}

TEST_CASE("candidates: the host selection is the prefix of a full sort") {
    std::mt19937 rng(31);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 1 + static_cast<int>(rng() % 600);
        const std::vector<float> row = random_row(n, rng, trial % 2 == 0);
        const int k = 1 + static_cast<int>(rng() % static_cast<unsigned>(std::min(n, 300)));
        std::vector<float> logits(static_cast<size_t>(k), 7.0f);
        std::vector<int> ids(static_cast<size_t>(k), -7);
        select_top_candidates(row.data(), row.size(), k, logits.data(), ids.data());
        const std::vector<int> want = full_order(row.data(), n);
        REQUIRE(std::equal(ids.begin(), ids.end(), want.begin()));
        for (int j = 0; j < k; ++j) {
            const float raw = row[static_cast<size_t>(ids[j])], w = std::isnan(raw) ? -kInf : raw;
            REQUIRE(std::memcmp(&logits[j], &w, sizeof(float)) == 0);
        }
    }
}

TEST_CASE("sampler: picks and distributions from candidates are bitwise those from whole rows") {
    std::mt19937 rng(32);
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.7f};
    const float top_ps[] = {1.0f, 0.9f, 0.5f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    const float penalties[] = {1.0f, 1.3f, 0.7f};
    int compared = 0;
    for (int trial = 0; trial < 300; ++trial) {
        const int n_vocab = 2 + static_cast<int>(rng() % 3000);
        SamplerParams p;
        p.temperature = temps[rng() % 4];
        p.top_k = 1 + static_cast<int>(rng() % static_cast<unsigned>(std::min(n_vocab - 1, 60)));
        p.top_p = top_ps[rng() % 3];
        p.min_p = min_ps[rng() % 3];
        p.repeat_penalty = penalties[rng() % 3];
        p.repeat_last_n = static_cast<int>(rng() % 3) * 16;
        p.seed = rng();
        CAPTURE(trial);
        Sampler dense(p, n_vocab), sparse(p, n_vocab);
        std::vector<int> history;
        const int n_history = static_cast<int>(rng() % 80);
        for (int i = 0; i < n_history; ++i) history.push_back(static_cast<int>(rng() % static_cast<unsigned>(n_vocab)));
        for (int step = 0; step < 4; ++step) {
            const std::vector<float> row = random_row(n_vocab, rng, rng() % 3 == 0);
            const size_t L = std::min(history.size(), static_cast<size_t>(p.repeat_last_n));
            std::vector<int> extra;
            const int best = plan_candidates(p, n_vocab, std::span<const int>(history).last(L), extra);
            if (best == 0) break;
            const Candidates c = candidates_of(row, best, extra);
            std::vector<float> want(static_cast<size_t>(n_vocab)), got(want.size());
            bool threw = false;
            try {
                dense.distribution(row.data(), history, want.data());
            } catch (const Error&) {
                threw = true;  // every logit -inf: the candidates must fail the same way
            }
            if (threw) {
                CHECK_THROWS_AS(sparse.distribution(c.row(), history, got.data()), Error);
                break;
            }
            sparse.distribution(c.row(), history, got.data());
            REQUIRE(same_bits(want, got));
            // The sparse forms (from the row and from candidates): the same probabilities at every id.
            SparseDistribution from_row, from_candidates;
            dense.distribution(row.data(), history, from_row);
            sparse.distribution(c.row(), history, from_candidates);
            std::vector<float> spread_row(want.size(), 0.0f), spread_candidates(want.size(), 0.0f);
            for (size_t j = 0; j < from_row.ids.size(); ++j) spread_row[from_row.ids[j]] = from_row.probs[j];
            for (size_t j = 0; j < from_candidates.ids.size(); ++j)
                spread_candidates[from_candidates.ids[j]] = from_candidates.probs[j];
            REQUIRE(std::is_sorted(from_candidates.ids.begin(), from_candidates.ids.end()));
            REQUIRE(same_bits(want, spread_row));
            REQUIRE(same_bits(want, spread_candidates));
            const int64_t pos = static_cast<int64_t>(history.size());
            const int a = dense.sample(row.data(), history, pos), b = sparse.sample(c.row(), history, pos);
            REQUIRE(a == b);
            history.push_back(a);
            ++compared;
        }
    }
    CHECK(compared > 600);
}

TEST_CASE("sampler: fewer candidates than planned would pick wrongly, and missing ones are errors") {
    // top-k 2 under a penalty of 2 on token 0: raw order 0 (5), 1 (4), 2 (3), 3 (2.6); after the penalty 0 falls to
    // 2.5, so the top 2 are {1, 2}. Candidates of only the raw top 2 (+ the window's id 0) would keep {1, 0}.
    SamplerParams p;
    p.temperature = 1.0f, p.top_k = 2, p.top_p = 1.0f, p.min_p = 0.0f, p.repeat_penalty = 2.0f, p.repeat_last_n = 8;
    const std::vector<float> row = {5.0f, 4.0f, 3.0f, 2.6f, -1.0f};
    const std::vector<int> history = {0};
    std::vector<int> extra;
    const int best = plan_candidates(p, 5, history, extra);
    CHECK(best == 3);
    Sampler s(p, 5);
    std::vector<float> want(5), got(5), short_got(5);
    s.distribution(row.data(), history, want.data());
    CHECK(want[1] > 0.0f);
    CHECK(want[2] > 0.0f);
    CHECK(want[0] == 0.0f);
    s.distribution(candidates_of(row, best, extra).row(), history, got.data());
    CHECK(same_bits(want, got));
    s.distribution(candidates_of(row, best - 1, extra).row(), history, short_got.data());
    CHECK(short_got[0] > 0.0f);  // what the plan's extra candidate prevents
    CHECK(!same_bits(want, short_got));

    // A window id that is not a candidate, and fewer candidates than k, are refused; the marks of a refused call
    // do not leak into the next one.
    CHECK_THROWS_AS(s.distribution(candidates_of(row, 3, {}).row(), std::vector<int>{4}, got.data()), Error);
    CHECK_THROWS_AS(s.distribution(candidates_of(row, 1, {}).row(), {}, got.data()), Error);
    Candidates bad = candidates_of(row, 3, {});
    bad.top_ids[2] = 5;  // outside the vocabulary
    CHECK_THROWS_AS(s.distribution(bad.row(), {}, got.data()), Error);
    s.distribution(candidates_of(row, best, extra).row(), history, got.data());
    CHECK(same_bits(want, got));
}

TEST_CASE("backend: the default forward_candidates selects from its own rows") {
    std::mt19937 rng(33);
    const int n_vocab = 300, n_rows = 3;
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < n_rows; ++r) rows.push_back(random_row(n_vocab, rng, true));
    RowsBackend backend(rows);
    auto cache = backend.new_cache(16);
    const std::vector<int> tokens(5, 1), extra = {7, 299, 0, 300, -1};
    const int k = 20;
    std::vector<float> top(n_rows * k), extra_logits(n_rows * extra.size()), scratch(n_rows * n_vocab);
    std::vector<int> ids(top.size());
    backend.forward_candidates(tokens, *cache, n_rows, k, extra, top.data(), ids.data(), extra_logits.data(), scratch);
    CHECK(cache->n_committed() == 5);
    for (int r = 0; r < n_rows; ++r) {
        CAPTURE(r);
        const std::vector<int> want = full_order(rows[r].data(), n_vocab);
        CHECK(std::equal(ids.begin() + r * k, ids.begin() + (r + 1) * k, want.begin()));
        for (size_t j = 0; j < 3; ++j) {
            const float w = rows[r][static_cast<size_t>(extra[j])], g = extra_logits[r * extra.size() + j];
            CHECK((g == w || (std::isnan(g) && std::isnan(w))));
        }
        CHECK(std::isnan(extra_logits[r * extra.size() + 3]));  // outside the vocabulary
        CHECK(std::isnan(extra_logits[r * extra.size() + 4]));
    }
}

TEST_CASE("cuda backend: device candidates equal a selection from the backend's own logits") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const int n_vocab = model->config.n_vocab;
    std::vector<int> prompt = {1};
    for (int i = 1; i < 60; ++i) prompt.push_back((i * 37 + 11) % n_vocab);
    const std::vector<int> extra = {3, 400, 17, 3, n_vocab - 1};
    for (bool graphs : {true, false}) {
        CAPTURE(graphs);
        CudaOptions o;
        o.graphs = graphs;
        CudaBackend gpu(*model, 64, {256, 16}, o);
        CHECK(gpu.max_candidates() == kMaxCandidates);
        auto with_logits = gpu.new_cache(64), with_candidates = gpu.new_cache(64);
        // (tokens, rows, k): 6 tokens with every row; a decode with the largest k; a 4-token verification; 20
        // tokens on the prefill path with 18 rows (two groups of the output projection, so that the second group's
        // candidates land after the first's).
        auto call = [&](std::span<const int> tokens, int rows, int k, std::span<const int> ex) {
            CAPTURE(k);
            std::vector<float> logits(static_cast<size_t>(rows) * n_vocab), scratch(logits.size(), kNaN);
            std::vector<float> top(static_cast<size_t>(rows) * k, kNaN), extra_logits(rows * ex.size(), -7.0f);
            std::vector<int> ids(top.size(), -7);
            gpu.forward(tokens, *with_logits, rows, logits.data());
            gpu.forward_candidates(tokens, *with_candidates, rows, k, ex, top.data(), ids.data(), extra_logits.data(),
                                   scratch);
            CHECK(with_candidates->n_committed() == with_logits->n_committed());
            for (int r = 0; r < rows; ++r) {
                CAPTURE(r);
                const float* row = &logits[static_cast<size_t>(r) * n_vocab];
                std::vector<float> want_top(static_cast<size_t>(k));
                std::vector<int> want_ids(static_cast<size_t>(k));
                select_top_candidates(row, n_vocab, k, want_top.data(), want_ids.data());
                REQUIRE(std::equal(want_ids.begin(), want_ids.end(), ids.begin() + r * k));
                REQUIRE(std::equal(want_top.begin(), want_top.end(), top.begin() + r * k));
                for (size_t j = 0; j < ex.size(); ++j) REQUIRE(extra_logits[r * ex.size() + j] == row[ex[j]]);
            }
            CHECK(std::all_of(scratch.begin(), scratch.end(), [](float x) { return std::isnan(x); }));  // untouched
            return ids[static_cast<size_t>(rows - 1) * k];
        };
        const std::span<const int> p(prompt);
        int next = call(p.subspan(0, 6), 6, 40, extra);
        next = call(std::span<const int>(&next, 1), 1, kMaxCandidates, {});
        const std::vector<int> verify = {next, 3, 300, 17};
        call(verify, 4, 1, extra);
        // The prefill path launches kernel by kernel whether graphs are on or not: once is enough.
        if (graphs) call(p.subspan(6, 20), 18, 45, extra);
        std::vector<float> top(kMaxCandidates + 1);
        std::vector<int> ids(top.size());
        CHECK_THROWS_AS(gpu.forward_candidates(verify, *with_candidates, 1, kMaxCandidates + 1, {}, top.data(),
                                               ids.data(), nullptr, {}),
                        Error);
    }
}

namespace {

struct Run {
    std::vector<int> tokens;
    GenerationStats stats;
    int candidate_calls = 0, candidate_rows = 0, draft_candidate_calls = 0;
};

// Sampled generation of n tokens (top-k 40, a penalty over the last 16 tokens) after `prompt`; with `draft`,
// speculative with k drafts a round; the rows of target and draft whole (`whole_rows`) or as candidates.
Run sampled(const Model& model, Backend& backend, bool whole_rows, const std::vector<int>& prompt, int n,
            const Model* draft = nullptr, int k = 0, bool whole_rows_param = false) {
    Delegating target(backend, whole_rows);
    auto cache = target.new_cache(96);
    CpuDraft d(draft, 96);
    std::unique_ptr<Delegating> draft_rows;  // the draft's rows also whole or as candidates
    if (draft) {
        draft_rows = std::make_unique<Delegating>(*d.backend, whole_rows);
        d.draft.backend = draft_rows.get();
    }
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0.9f;
    p.sampler.top_k = 40;
    p.sampler.repeat_penalty = 1.15f;
    p.sampler.repeat_last_n = 16;
    p.sampler.seed = 77;
    p.speculative.draft_min = p.speculative.draft_max = k;
    p.speculative.p_min = 0;
    p.whole_rows = whole_rows_param;
    Generator gen(model, target, *cache, d.draft);
    Run run;
    run.stats = gen.generate(prompt, p, [](std::string_view) { return true; });
    run.tokens = run.stats.generated;
    run.candidate_calls = target.candidate_calls;
    run.candidate_rows = target.candidate_rows;
    if (draft_rows) run.draft_candidate_calls = draft_rows->candidate_calls;
    return run;
}

void check_rows_and_candidates_agree(const Model& model, Backend& backend, const std::vector<int>& prompt, int n,
                                     const Model* draft, int k) {
    const Run whole = sampled(model, backend, true, prompt, n, draft, k);
    const Run cand = sampled(model, backend, false, prompt, n, draft, k);
    REQUIRE(whole.tokens.size() == static_cast<size_t>(n));
    CHECK(cand.tokens == whole.tokens);
    CHECK(whole.candidate_calls == 0);
    CHECK(cand.candidate_calls == cand.stats.n_decode_forwards);  // every decode step / verification
    CHECK(cand.candidate_calls > 0);
    if (draft) {
        CHECK(cand.stats.spec.drafted > 0);
        CHECK(cand.stats.spec.accepted == whole.stats.spec.accepted);
        CHECK(cand.candidate_rows > cand.candidate_calls);
        CHECK(whole.draft_candidate_calls == 0);
        CHECK(cand.draft_candidate_calls >= cand.stats.spec.drafted);  // every draft row
    }
}

}  // namespace

TEST_CASE("generator: sampled output through candidates equals whole rows on the CPU backend") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend(*model, 1, 96);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    SUBCASE("GenerationParams::whole_rows asks for no candidates, and changes no token") {
        const Run cand = sampled(*model, backend, false, prompt, 30, model.get(), 4);
        const Run param = sampled(*model, backend, false, prompt, 30, model.get(), 4, true);
        CHECK(cand.candidate_calls > 0);
        CHECK(param.candidate_calls == 0);
        CHECK(param.draft_candidate_calls == 0);
        CHECK(param.tokens == cand.tokens);
    }
    SUBCASE("plain decoding") { check_rows_and_candidates_agree(*model, backend, prompt, 40, nullptr, 0); }
    SUBCASE("speculative, 4 drafts a round") {
        // The draft is the target itself on its own backend: its proposals are often accepted, so rows of
        // accepted and rejected drafts both occur.
        check_rows_and_candidates_agree(*model, backend, prompt, 40, model.get(), 4);
    }
}

TEST_CASE("cuda backend: sampled output through device candidates equals whole rows") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CudaBackend gpu(*model, 96);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    SUBCASE("plain decoding") { check_rows_and_candidates_agree(*model, gpu, prompt, 10, nullptr, 0); }
    SUBCASE("speculative, 3 drafts a round") { check_rows_and_candidates_agree(*model, gpu, prompt, 10, model.get(), 3); }
}
