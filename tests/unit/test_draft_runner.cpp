// DraftRunner's contract with the speculative loop, checked directly on stories260K as its own (identical) draft:
// what its cache holds after the constructor, a proposal (catch-up, drafts, the p_min stop), drafting ahead (forced,
// auto, stopped by p_min) and settling (a right guess carried, a rejection or a wrong guess cut back, a carried
// proposal dropped), bit for bit against fresh prefills of the tokens it should hold; the proposals against the
// model's greedy continuation, and sampled proposals against the distributions they were drawn from.
// (Through the Generator: test_speculative.cpp and test_draft_ahead.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "cpu/cpu_backend.h"
#include "generate/draft_runner.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

GenerationParams greedy_params(int k_max, float p_min, int ahead) {
    GenerationParams p;
    p.sampler.temperature = 0;
    p.speculative.draft_min = 0;
    p.speculative.draft_max = k_max;
    p.speculative.p_min = p_min;
    p.speculative.draft_ahead = ahead;
    p.speculative.draft_vocab = 0;
    return p;
}

// The model's greedy continuation of `context`, n tokens.
std::vector<int> greedy_continuation(const Model& model, std::vector<int> context, int n) {
    CpuBackend backend(model, 1, 64);
    std::vector<int> out;
    std::vector<float> logits(static_cast<size_t>(model.config.n_vocab));
    for (int i = 0; i < n; ++i) {
        auto cache = backend.new_cache(256);
        backend.forward(context, *cache, 1, logits.data());
        const int t = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(t);
        context.push_back(t);
    }
    return out;
}

// How many of the first `tokens.size()` positions of `cache` differ from a fresh prefill of `tokens`; -1 when the
// cache holds another number of positions.
int differing_positions(const Model& model, const KvCache& cache, const std::vector<int>& tokens) {
    if (cache.n_committed() != static_cast<int>(tokens.size())) return -1;
    CpuBackend backend(model, 1, 64);
    auto fresh = backend.new_cache(256);
    backend.forward(tokens, *fresh, 0, nullptr);
    const auto& a = static_cast<const CpuKvCache&>(cache);
    const auto& b = static_cast<const CpuKvCache&>(*fresh);
    int differing = 0;
    for (int l = 0; l < model.config.n_layers; ++l)
        for (int pos = 0; pos < static_cast<int>(tokens.size()); ++pos) differing += !a.same_position(b, l, pos);
    return differing;
}

std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

const std::vector<int> kHeld = {1, 403, 407, 261, 378, 300};  // an earlier turn: positions 0..5 (base = 6)
const std::vector<int> kHistory = {1, 403, 407};               // this turn's prompt, the last one being cur
const int kBase = static_cast<int>(kHeld.size());

// The draft of most cases: the model on the CPU backend, its cache holding the earlier turn kHeld.
struct HeldDraft {
    const Model& model;
    CpuBackend backend;
    std::unique_ptr<KvCache> cache;
    explicit HeldDraft(const Model& m) : model(m), backend(m, 1, 64), cache(backend.new_cache(256)) {
        backend.forward(kHeld, *cache, 0, nullptr);
    }
    DraftModel draft() { return {&model, &backend, cache.get()}; }
};

}  // namespace

TEST_CASE("draft runner: the constructor drops stale positions, a proposal catches up and drafts greedily") {
    auto model = Model::load(kData + "/stories260K.gguf");
    for (const bool stale : {false, true}) {
        CAPTURE(stale);
        CpuBackend backend(*model, 1, 64);
        auto cache = backend.new_cache(256);
        // Either 4 of the held tokens (the runner reads the other 2) or all 6 and 2 stale positions past them.
        const std::vector<int> fed = stale ? concat(kHeld, {9, 9}) : std::vector<int>(kHeld.begin(), kHeld.begin() + 4);
        backend.forward(fed, *cache, 0, nullptr);
        DraftRunner runner({model.get(), &backend, cache.get()}, greedy_params(4, 0.0f, 0), kBase, kHeld);
        CHECK(cache->n_committed() == std::min(static_cast<int>(fed.size()), kBase));

        std::vector<int> drafted;
        std::vector<SparseDistribution> q(4);
        SpeculativeStats st;
        const DraftRunner::Proposal r = runner.propose(3, kHistory, drafted, q, st);
        const std::vector<int> context = concat(kHeld, kHistory);
        CHECK(drafted == greedy_continuation(*model, context, 3));
        CHECK(r.steps == 3);  // the catch-up stands in for the step of cur, then drafted[0] and [1]
        CHECK(r.caught_up);   // more than two tokens read first
        CHECK(r.step_seconds == 0);  // a round after a long catch-up measures no draft step
        CHECK_FALSE(r.holds_last);
        CHECK(st.draft_s > 0);
        // The context and every draft but the last.
        CHECK(differing_positions(*model, *cache, concat(context, {drafted[0], drafted[1]})) == 0);
    }
}

TEST_CASE("draft runner: p_min stops a proposal after its first token, the cache holding that token too") {
    auto model = Model::load(kData + "/stories260K.gguf");
    HeldDraft d(*model);
    auto& cache = d.cache;
    // p_min above 1: no second token is ever confident enough; the first is proposed whatever its probability.
    DraftRunner runner(d.draft(), greedy_params(4, 1.5f, 0), kBase, kHeld);
    std::vector<int> drafted;
    std::vector<SparseDistribution> q(4);
    SpeculativeStats st;
    const DraftRunner::Proposal r = runner.propose(4, kHistory, drafted, q, st);
    const std::vector<int> context = concat(kHeld, kHistory);
    REQUIRE(drafted.size() == 1);
    CHECK(drafted == greedy_continuation(*model, context, 1));
    CHECK(r.holds_last);
    CHECK(r.steps == 2);
    CHECK(differing_positions(*model, *cache, concat(context, drafted)) == 0);
}

TEST_CASE("draft runner: a right guess carries what was drafted after it, a wrong one is cut back") {
    auto model = Model::load(kData + "/stories260K.gguf");
    HeldDraft d(*model);
    auto& cache = d.cache;
    DraftRunner runner(d.draft(), greedy_params(4, 0.0f, 4), kBase, kHeld);
    const std::vector<int> truth = greedy_continuation(*model, concat(kHeld, kHistory), 16);
    std::vector<SparseDistribution> q(4);
    SpeculativeStats st;
    int target_polls = 0;
    const std::function<bool()> target_done = [&] {
        ++target_polls;
        return true;  // forced steps draft ahead whatever the target does
    };

    // Round 1: 3 drafts, then 4 tokens ahead: the guess of the target's next token and 3 after it.
    std::vector<int> history = kHistory, drafted;
    DraftRunner::Proposal r = runner.propose(3, history, drafted, q, st);
    REQUIRE(drafted == std::vector<int>(truth.begin(), truth.begin() + 3));
    runner.draft_ahead(history, drafted, r.holds_last, 100, target_done, st);
    CHECK(target_polls >= 4);
    CHECK(st.ahead_steps == 4);  // the last draft, the guess and two after it read
    const int committed = kBase + static_cast<int>(history.size()) - 1;  // the target's cache: all but cur
    runner.settle(committed + 1 + 3, /*all_accepted=*/true, truth[3]);
    CHECK(runner.ahead_count() == 4);
    CHECK(runner.carried() == 3);
    // The cache keeps the guess and what followed it (the last ahead token not read yet).
    const std::vector<int> read_ahead(truth.begin(), truth.begin() + 6);
    CHECK(differing_positions(*model, *cache, concat(concat(kHeld, kHistory), read_ahead)) == 0);

    // Round 2 proposes the carried tokens without a draft step of its own.
    history = concat(history, std::vector<int>(truth.begin(), truth.begin() + 4));  // 3 accepted + the target's token
    drafted.clear();
    r = runner.propose(3, history, drafted, q, st);
    CHECK(drafted == std::vector<int>(truth.begin() + 4, truth.begin() + 7));
    CHECK(r.steps == 0);
    CHECK(r.step_seconds == 0);
    CHECK(st.ahead_used == 3);
    CHECK(runner.carried() == 0);

    // The target rejects the last draft (its own token there: 7): the cache is cut back to what was kept.
    REQUIRE(truth[6] != 7);
    runner.draft_ahead(history, drafted, r.holds_last, 100, target_done, st);
    const int committed2 = kBase + static_cast<int>(history.size()) - 1;
    runner.settle(committed2 + 1 + 2, /*all_accepted=*/false, 7);
    CHECK(runner.ahead_count() == 4);
    CHECK(runner.carried() == 0);
    history = concat(history, {truth[4], truth[5], 7});
    const std::vector<int> kept(history.begin(), history.end() - 1);
    CHECK(differing_positions(*model, *cache, concat(kHeld, kept)) == 0);

    // Every draft accepted, but the target's token is not the draft's guess: cut back to what was kept.
    const std::vector<int> truth3 = greedy_continuation(*model, concat(kHeld, history), 3);
    const int wrong = (truth3[2] + 1) % model->config.n_vocab;
    drafted.clear();
    r = runner.propose(2, history, drafted, q, st);
    REQUIRE(drafted == std::vector<int>(truth3.begin(), truth3.begin() + 2));
    CHECK(r.steps == 2);
    CHECK_FALSE(r.caught_up);  // only cur was new
    runner.draft_ahead(history, drafted, r.holds_last, 100, target_done, st);
    const int committed3 = kBase + static_cast<int>(history.size()) - 1;
    runner.settle(committed3 + 1 + 2, /*all_accepted=*/true, wrong);
    CHECK(runner.ahead_count() == 4);
    CHECK(runner.carried() == 0);
    history = concat(history, {truth3[0], truth3[1], wrong});
    CHECK(differing_positions(*model, *cache, concat(kHeld, std::vector<int>(history.begin(), history.end() - 1))) ==
          0);

    // A right guess, then a round that proposes nothing from the draft (lookup, plain): the carried tokens go, the
    // draft keeps the target's token it had guessed.
    const std::vector<int> truth4 = greedy_continuation(*model, concat(kHeld, history), 6);
    drafted.clear();
    r = runner.propose(2, history, drafted, q, st);
    REQUIRE(drafted == std::vector<int>(truth4.begin(), truth4.begin() + 2));
    runner.draft_ahead(history, drafted, r.holds_last, 100, target_done, st);
    const int committed4 = kBase + static_cast<int>(history.size()) - 1;
    runner.settle(committed4 + 1 + 2, true, truth4[2]);
    CHECK(runner.carried() == 3);
    history = concat(history, std::vector<int>(truth4.begin(), truth4.begin() + 3));
    CHECK(differing_positions(*model, *cache, concat(concat(kHeld, history), {truth4[3], truth4[4]})) == 0);
    runner.drop_carried(kBase + static_cast<int>(history.size()) - 1);
    CHECK(runner.carried() == 0);
    CHECK(differing_positions(*model, *cache, concat(kHeld, history)) == 0);
}

TEST_CASE("draft runner: drafting ahead stops at p_min from its third token, and so does the carried proposal") {
    // p_min above 1: the guess and the token after it are drafted whatever their probability (the guess is not a
    // proposal; the next round's first proposal never stops), the third is not.
    auto model = Model::load(kData + "/stories260K.gguf");
    HeldDraft d(*model);
    DraftRunner runner(d.draft(), greedy_params(4, 1.5f, 4), kBase, kHeld);
    const std::vector<int> truth = greedy_continuation(*model, concat(kHeld, kHistory), 4);
    std::vector<SparseDistribution> q(4);
    SpeculativeStats st;
    std::vector<int> history = kHistory, drafted;
    DraftRunner::Proposal r = runner.propose(3, history, drafted, q, st);
    REQUIRE(drafted.size() == 1);
    REQUIRE(r.holds_last);
    runner.draft_ahead(history, drafted, r.holds_last, 100, [] { return true; }, st);
    CHECK(st.ahead_steps == 2);  // the last draft was read already: the guess and the token after it are
    const int committed = kBase + static_cast<int>(history.size()) - 1;
    runner.settle(committed + 2, true, truth[1]);
    CHECK(runner.ahead_count() == 2);
    REQUIRE(runner.carried() == 1);
    // The carried token is proposed and, stopped by p_min when it was drafted, nothing after it.
    history = concat(history, {truth[0], truth[1]});
    drafted.clear();
    r = runner.propose(3, history, drafted, q, st);
    CHECK(drafted == std::vector<int>{truth[2]});
    CHECK(r.steps == 0);
    CHECK(st.ahead_used == 1);
}

TEST_CASE("draft runner: auto drafting ahead steps only while the target works") {
    auto model = Model::load(kData + "/stories260K.gguf");
    HeldDraft d(*model);
    DraftRunner runner(d.draft(), greedy_params(8, 0.0f, -1), kBase, kHeld);
    CHECK_FALSE(runner.drafts_ahead_of(d.backend));  // auto, and the CPU backend computes in the call
    std::vector<int> drafted;
    std::vector<SparseDistribution> q(8);
    SpeculativeStats st;
    const DraftRunner::Proposal r = runner.propose(2, kHistory, drafted, q, st);
    int polls = 0;
    runner.draft_ahead(kHistory, drafted, r.holds_last, 100, [&] { return ++polls > 3; }, st);
    CHECK(polls == 4);
    CHECK(st.ahead_steps == 3);
    runner.settle(static_cast<int>(kHeld.size() + kHistory.size()) + 2, false, 0);
    CHECK(runner.ahead_count() == 3);
}

TEST_CASE("draft runner: sampled drafting draws each proposal from the distribution it leaves in q") {
    auto model = Model::load(kData + "/stories260K.gguf");
    for (const uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(seed);
        HeldDraft d(*model);
        GenerationParams p = greedy_params(4, 0.0f, 0);
        p.sampler.temperature = 1.5f;
        p.sampler.seed = seed;
        DraftRunner runner(d.draft(), p, kBase, kHeld);
        std::vector<int> drafted;
        std::vector<SparseDistribution> q(4);
        SpeculativeStats st;
        runner.propose(4, kHistory, drafted, q, st);
        REQUIRE(drafted.size() == 4);
        // q[i] is the draft's distribution after the context and drafted[0..i-1] (whole rows here, read in the
        // runner's chunks: its catch-up, then a token at a time), and drafted[i] is in it.
        std::vector<int> context = concat(kHeld, kHistory);
        Sampler reference(p.sampler, model->config.n_vocab);
        std::vector<float> logits(static_cast<size_t>(model->config.n_vocab));
        HeldDraft fresh(*model);
        fresh.backend.forward(kHistory, *fresh.cache, 1, logits.data());
        for (size_t i = 0; i < drafted.size(); ++i) {
            CAPTURE(i);
            if (i > 0) fresh.backend.forward(std::span<const int>(&drafted[i - 1], 1), *fresh.cache, 1, logits.data());
            SparseDistribution expected;
            reference.distribution(logits.data(), context, expected);
            CHECK(q[i].ids == expected.ids);
            CHECK(q[i].probs == expected.probs);
            CHECK(std::find(q[i].ids.begin(), q[i].ids.end(), drafted[i]) != q[i].ids.end());
            context.push_back(drafted[i]);
        }
        CHECK(differing_positions(*model, *d.cache, std::vector<int>(context.begin(), context.end() - 1)) == 0);
    }
}
