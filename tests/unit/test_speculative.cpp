// Speculative decoding on stories260K: greedy output equal to plain decoding (and to llama2.c's goldens) with
// drafts that agree and that disagree, prompt lookup, KV rollback, the vocabulary check, the draft-length
// controller, and losslessness at temperature > 0 by an exact chi-square test; all of it again under a grammar.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "common/synthetic_model.h"
#include "convert/llama2c.h"
#include "convert/quantize_model.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "generate/speculative.h"
#include "gguf/gguf_writer.h"
#include "grammar/constraint.h"
#include "model/model.h"
#include "reference_files.h"
#include "spec_test_models.h"
#include "test_paths.h"
#include "text/vocab_check.h"

using namespace tandem;
using test::chi_square;
using test::drafts;

namespace {

const std::string kData = TANDEM_TEST_DATA;

struct Run {
    std::vector<int> tokens;  // generated ids
    std::string text;         // the streamed text
    GenerationStats stats;
};

// Generates with `target` (and `draft_path` if given) and returns the generated ids (EOS excluded).
Run generate(const Model& target, const std::string& draft_path, const std::vector<int>& prompt,
             GenerationParams params, std::optional<GgmlType> draft_requant = std::nullopt) {
    CpuBackend backend(target, 1, 64);
    auto cache = backend.new_cache(256);
    std::unique_ptr<Model> draft_model;
    std::unique_ptr<CpuBackend> draft_backend;
    std::unique_ptr<KvCache> draft_cache;
    DraftModel draft;
    if (!draft_path.empty()) {
        draft_model = Model::load(draft_path);
        draft_backend =
            std::make_unique<CpuBackend>(*draft_model, 1, 64, CpuBackendOptions{.requantize_to = draft_requant});
        draft_cache = draft_backend->new_cache(256);
        draft = {draft_model.get(), draft_backend.get(), draft_cache.get()};
    }
    Generator gen(target, backend, *cache, draft);
    Run run;
    run.stats = gen.generate(prompt, params, [&](std::string_view t) {
        run.text.append(t);
        return true;
    });
    run.tokens = run.stats.generated;
    return run;
}

GenerationParams greedy_params(int n) {
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0;
    return p;
}

}  // namespace

TEST_CASE("speculative: greedy output with a draft equals plain decoding for every reference prompt") {
    auto target = Model::load(kData + "/stories260K.gguf");
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    for (const auto& c : cases) {
        const int n = static_cast<int>(c.generated_ids.size()) - (c.generated_ids.back() == 1 ? 1 : 0);
        const Run plain = generate(*target, "", c.prompt_ids, greedy_params(n));
        std::vector<int> golden = c.generated_ids;
        if (golden.back() == 1) golden.pop_back();  // llama2.c stops at BOS; tandem does not treat BOS as a stop
        REQUIRE(plain.tokens == golden);
        for (const std::string& draft : {drafts().q8_0, drafts().q4_0, drafts().q80bin}) {
            for (bool lookup : {false, true}) {
                GenerationParams p = greedy_params(n);
                p.speculative.lookup = lookup;
                p.speculative.draft_min = 1;  // always draft, so verification really runs
                const Run spec = generate(*target, draft, c.prompt_ids, p);
                INFO("prompt '" << c.prompt << "', draft " << draft << ", lookup " << lookup);
                CHECK(spec.tokens == golden);
                CHECK(spec.text == plain.text);
                CHECK(spec.stats.spec.drafted > 0);
            }
        }
        GenerationParams p = greedy_params(n);
        p.speculative.lookup = true;
        const Run lookup_only = generate(*target, "", c.prompt_ids, p);
        CHECK(lookup_only.tokens == plain.tokens);
        p.speculative.draft_min = 1;  // propose whenever something matches
        const Run lookup_always = generate(*target, "", c.prompt_ids, p);
        CHECK(lookup_always.tokens == plain.tokens);
        CHECK(lookup_always.stats.spec.drafted > 0);
        CHECK(lookup_always.stats.spec.accepted > 0);  // stories repeat themselves
    }
}

TEST_CASE("speculative: a draft requantized at load keeps the output, and really differs from its file") {
    if (!cpu::RepackedMatrix::available(GgmlType::Q4_0)) {
        MESSAGE("Q4_0: no repacked kernel on this build or CPU, drafts are not requantized, not checked");
        return;
    }
    auto target = Model::load(kData + "/stories260K.gguf");
    // The f32 model's copies as Q4_0 (the matrices 64 wide; the FFN's down projection, 172 wide, stays f32): an
    // eighth of the bytes.
    CpuBackend as_file(*target, 1, 64), requantized(*target, 1, 64, {.requantize_to = GgmlType::Q4_0});
    as_file.wait_for_repacking();
    requantized.wait_for_repacking();
    CHECK(requantized.repacked_bytes() > 0);
    CHECK(requantized.repacked_bytes() * 4 < target->weights.bytes_per_token());
    // Restricted logits: the extra ids' rows are requantized like the rest, so each allowed id's logit is the one
    // the unrestricted requantized model gives it.
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    const int V = target->config.n_vocab;
    std::vector<float> full(static_cast<size_t>(V)), restricted(static_cast<size_t>(V)),
        file_logits(static_cast<size_t>(V));
    {
        auto c1 = requantized.new_cache(64), c2 = requantized.new_cache(64), c3 = as_file.new_cache(64);
        requantized.forward(prompt, *c1, 1, full.data());
        const std::vector<int> extra = {300, 411, 499};
        requantized.restrict_logits(200, extra);
        requantized.forward(prompt, *c2, 1, restricted.data());
        requantized.restrict_logits(V, {});
        as_file.forward(prompt, *c3, 1, file_logits.data());
        for (int id = 0; id < V; ++id) {
            const bool allowed = id < 200 || std::find(extra.begin(), extra.end(), id) != extra.end();
            if (allowed)
                CHECK(restricted[static_cast<size_t>(id)] == full[static_cast<size_t>(id)]);
            else
                CHECK(std::isinf(restricted[static_cast<size_t>(id)]));
        }
        CHECK(full != file_logits);  // the requantized weights are not the file's
    }
    // Greedy output with the requantized draft is the target's, for every reference prompt; and the draft, the
    // target itself but requantized, is rejected now and then (the same draft unrequantized never is: see "a draft
    // identical to the target is always accepted").
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    for (const auto& c : cases) {
        const int n = static_cast<int>(c.generated_ids.size()) - (c.generated_ids.back() == 1 ? 1 : 0);
        std::vector<int> golden = c.generated_ids;
        if (golden.back() == 1) golden.pop_back();
        GenerationParams p = greedy_params(n);
        p.speculative.draft_min = 1;
        const Run spec = generate(*target, kData + "/stories260K.gguf", c.prompt_ids, p, GgmlType::Q4_0);
        INFO("prompt '" << c.prompt << "'");
        CHECK(spec.tokens == golden);
        CHECK(spec.stats.spec.drafted > 0);
    }
    GenerationParams p = greedy_params(150);
    p.speculative.draft_min = 5;
    p.speculative.draft_max = 5;
    p.speculative.p_min = 0;
    const Run spec = generate(*target, kData + "/stories260K.gguf", prompt, p, GgmlType::Q4_0);
    CHECK(spec.tokens == generate(*target, "", prompt, greedy_params(150)).tokens);
    CHECK(spec.stats.spec.accepted < spec.stats.spec.drafted);
    CHECK(spec.stats.spec.accepted > spec.stats.spec.drafted / 2);
}

TEST_CASE("speculative: the int8 draft really disagrees, and rejections happen") {
    auto target = Model::load(kData + "/stories260K.gguf");
    GenerationParams p = greedy_params(190);
    p.speculative.draft_min = 4;
    p.speculative.draft_max = 4;
    p.speculative.p_min = 0;
    const Run spec = generate(*target, drafts().q80bin, {1, 403, 407, 261, 378}, p);
    CHECK(spec.stats.spec.accepted < spec.stats.spec.drafted);
    CHECK(spec.stats.spec.accepted > spec.stats.spec.drafted / 2);
}

TEST_CASE("speculative: a draft identical to the target is always accepted") {
    auto target = Model::load(kData + "/stories260K.gguf");
    GenerationParams p = greedy_params(150);
    p.speculative.draft_min = 5;
    p.speculative.draft_max = 5;
    p.speculative.p_min = 0;
    const Run plain = generate(*target, "", {1, 403, 407, 261, 378}, greedy_params(150));
    const Run spec = generate(*target, kData + "/stories260K.gguf", {1, 403, 407, 261, 378}, p);
    CHECK(spec.tokens == plain.tokens);
    CHECK(spec.stats.spec.drafted > 100);
    CHECK(spec.stats.spec.accepted == spec.stats.spec.drafted);
}

TEST_CASE("speculative: a draft restricted to part of the vocabulary keeps the output and never proposes other ids") {
    // The target itself as the draft: with every logit it would always be accepted; restricted to ids below 200 and
    // those of the context, it must miss exactly where the target picks an id it cannot see, and the output stays
    // the target's.
    auto target = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    const Run plain = generate(*target, "", prompt, greedy_params(150));
    GenerationParams p = greedy_params(150);
    p.speculative.draft_min = 5;
    p.speculative.draft_max = 5;
    p.speculative.p_min = 0;
    p.speculative.draft_vocab = 200;
    const Run spec = generate(*target, kData + "/stories260K.gguf", prompt, p);
    CHECK(spec.tokens == plain.tokens);
    CHECK(spec.stats.spec.drafted > 50);
    // A generated id >= 200 that is new to the context cannot have been proposed: count the rounds that must miss.
    std::vector<int> context = prompt;
    int unseeable = 0;
    for (int id : plain.tokens) {
        if (id >= 200 && std::find(context.begin(), context.end(), id) == context.end()) ++unseeable;
        context.push_back(id);
    }
    CHECK(unseeable > 0);  // the test would show nothing otherwise
    CHECK(spec.stats.spec.accepted < spec.stats.spec.drafted);
    p.speculative.draft_vocab = 0;
    const Run unrestricted = generate(*target, kData + "/stories260K.gguf", prompt, p);
    CHECK(unrestricted.tokens == plain.tokens);
    CHECK(unrestricted.stats.spec.accepted == unrestricted.stats.spec.drafted);
}

namespace {
// Delegates to a CPU backend and logs its calls: "w" for wait_for_repacking, the token count of each forward.
class LoggingBackend : public Backend {
public:
    LoggingBackend(CpuBackend& inner, std::vector<std::string>& log) : inner_(inner), log_(log) {}
    std::string name() const override { return inner_.name(); }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override { return inner_.new_cache(n_ctx); }
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
        log_.push_back(std::to_string(tokens.size()));
        inner_.forward(tokens, cache, n_logits, logits);
    }
    bool restrict_logits(int n_first, std::span<const int> extra) override {
        return inner_.restrict_logits(n_first, extra);
    }
    void wait_for_repacking() const override {
        log_.push_back("w");
        inner_.wait_for_repacking();
    }

private:
    CpuBackend& inner_;
    std::vector<std::string>& log_;
};
}  // namespace

TEST_CASE("speculative: the first drafting round waits for repacked weights, plain decoding never does") {
    // Verification and the draft's catch-up are compute-bound, where the CPU backend's repacked copies pay; decode
    // is not, and the background copies make no progress while it keeps the cores busy (generator.cpp).
    auto target = Model::load(kData + "/stories260K.gguf");
    auto draft = Model::load(drafts().q8_0);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    for (bool drafting : {false, true}) {
        CpuBackend target_cpu(*target, 1, 64), draft_cpu(*draft, 1, 64);
        std::vector<std::string> target_log, draft_log;
        LoggingBackend target_backend(target_cpu, target_log), draft_backend(draft_cpu, draft_log);
        auto cache = target_backend.new_cache(128);
        auto draft_cache = draft_backend.new_cache(128);
        GenerationParams p = greedy_params(40);
        p.speculative.draft_min = drafting ? 2 : 0;
        p.speculative.draft_max = drafting ? 2 : 0;
        p.speculative.p_min = 0;
        Generator gen(*target, target_backend, *cache, {draft.get(), &draft_backend, draft_cache.get()});
        const GenerationStats stats = gen.generate(prompt, p, [](std::string_view) { return true; });
        INFO("drafting " << drafting);
        const auto waits = [](const std::vector<std::string>& log) { return std::count(log.begin(), log.end(), "w"); };
        if (!drafting) {
            CHECK(stats.spec.drafted == 0);
            CHECK(waits(target_log) == 0);
            CHECK(waits(draft_log) == 0);
            continue;
        }
        REQUIRE(stats.spec.drafted > 0);
        CHECK(waits(target_log) == 1);
        CHECK(waits(draft_log) == 1);
        // The target: the prompt's prefill, then plain steps, then the wait, before the first verification of
        // several tokens. The draft: the wait before anything at all.
        const auto wait_at = std::find(target_log.begin(), target_log.end(), "w");
        const auto first_verify = std::find_if(target_log.begin() + 1, target_log.end(),
                                               [](const std::string& e) { return e != "w" && e != "1"; });
        CHECK(wait_at < first_verify);
        CHECK(draft_log.front() == "w");
    }
}

TEST_CASE("speculative: after a rejection the KV cache equals a fresh prefill of the same tokens") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const ModelConfig& c = model->config;
    CpuBackend backend(*model, 2, 64);
    auto cache_a = backend.new_cache(64);
    auto cache_b = backend.new_cache(64);
    std::vector<float> logits(16 * 512);
    // A verification of 6 tokens of which 2 are accepted: keep 1 (cur) + 2, as the generator does.
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    backend.forward(prompt, *cache_a, 1, logits.data());
    const std::vector<int> verify = {432, 383, 286, 99, 98, 97};
    backend.forward(verify, *cache_a, 6, logits.data());
    cache_a->truncate(5 + 3);
    std::vector<int> accepted = prompt;
    accepted.insert(accepted.end(), verify.begin(), verify.begin() + 3);
    backend.forward(accepted, *cache_b, 1, logits.data());
    REQUIRE(cache_a->n_committed() == cache_b->n_committed());
    auto& a = static_cast<CpuKvCache&>(*cache_a);
    auto& b = static_cast<CpuKvCache&>(*cache_b);
    for (int l = 0; l < c.n_layers; ++l)
        for (int pos = 0; pos < a.n_committed(); ++pos) CHECK(a.same_position(b, l, pos));
    // And continuing from both gives the same logits.
    std::vector<float> la(512), lb(512);
    const int next = 300;
    backend.forward(std::span<const int>(&next, 1), *cache_a, 1, la.data());
    backend.forward(std::span<const int>(&next, 1), *cache_b, 1, lb.data());
    CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
}

TEST_CASE("speculative: prompt lookup proposes the continuation of the longest match of the context's end") {
    SpeculativeParams sp;
    LookupProposer lookup(sp);
    const std::vector<int> ctx = {5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 4, 5, 6, 7};
    // The end 5 6 7 occurs at 0 and 7 (as long, and no longer anywhere): the most recent, at 7, continues 3 4 5.
    LookupProposal p = lookup.propose(ctx, 3);
    CHECK(p.tokens == std::vector<int>{3, 4, 5});
    CHECK(p.match_len == 3);
    CHECK(p.source == 10);
    CHECK(lookup.propose(ctx, 10).tokens == std::vector<int>{3, 4, 5, 6, 7});
    CHECK(lookup.propose(std::vector<int>{1, 2, 3, 4}, 4).tokens.empty());
    CHECK(lookup.propose(std::vector<int>{1, 2, 3, 4}, 4).match_len == 0);
    CHECK(lookup.propose(ctx, 0).tokens.empty());

    // A longer match wins over a more recent shorter one: the end 1 2 3 4 occurs at 0 (continued by 9), its last
    // two tokens 3 4 more recently at 6 (continued by 8).
    const std::vector<int> longer = {1, 2, 3, 4, 9, 0, 3, 4, 8, 1, 2, 3, 4};
    p = lookup.propose(longer, 2);
    CHECK(p.match_len == 4);
    CHECK(p.tokens == std::vector<int>{9, 0});

    // Lengths are measured up to lookup_ngram_max, and matches below lookup_ngram_min are none.
    sp.lookup_ngram_max = 3;
    sp.lookup_ngram_min = 3;
    LookupProposer capped(sp);
    p = capped.propose(longer, 2);
    CHECK(p.match_len == 3);
    CHECK(p.tokens == std::vector<int>{9, 0});
    CHECK(capped.propose(std::vector<int>{7, 3, 4, 8, 2, 3, 4}, 2).tokens.empty());  // 3 4 matches, 2 3 4 does not
}

TEST_CASE("speculative: prompt lookup follows its source in order among equally long matches") {
    // A source whose "a b" is followed by c early and by d twice later (the rewrite prompt's "    lines" followed
    // by " = []" and by ".append("): the answer copies the source's first line, then reaches "a b".
    SpeculativeParams sp;
    LookupProposer lookup(sp);
    //                        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16
    std::vector<int> ctx = {40, 41, 20, 21, 22, 30, 31, 32, 20, 21, 23, 30, 31, 33, 30, 31, 33};
    // Without a cursor: the most recent "30 31" (at 14) continues 33.
    CHECK(lookup.propose(std::span<const int>(ctx.data(), 16), 1).tokens == std::vector<int>{33});
    // The answer copied 40 41 from the source (accepted: the cursor is at 2) and writes 30 31 itself.
    std::vector<int> answer = ctx;
    answer.insert(answer.end(), {40, 41});
    LookupProposal p = lookup.propose(answer, 1);
    CHECK(p.source == 2);  // the copy goes on where it was
    lookup.follow(p, 1);   // 20 accepted: the cursor moves to 3
    answer.insert(answer.end(), {20, 77, 30, 31});
    p = lookup.propose(answer, 2);
    CHECK(p.match_len == 2);
    CHECK(p.tokens == std::vector<int>{32, 20});  // the first "30 31" after the cursor, not the most recent
    // Nothing rejected moves the cursor; an accepted token past the last occurrence leaves only the most recent.
    lookup.follow(p, 0);
    CHECK(lookup.propose(answer, 1).tokens == std::vector<int>{32});
    LookupProposer late(sp);
    late.follow(LookupProposal{{1}, 2, 16}, 1);  // cursor at 17: after every occurrence
    CHECK(late.propose(answer, 1).tokens == std::vector<int>{33});
}

// Verification costs of the 1.5B on this project's 2-core CPU (tandem-bench --verify: 30, 32, 35, 50, 84, 137 ms for
// 1, 2, 3, 5, 9, 17 tokens), as a line: 30 ms plus 7 ms per further token.
static void record_verify_costs(DraftLengthController& c, double per_token = 0.007) {
    for (int i = 0; i < 5; ++i)
        for (int n = 1; n <= 17; ++n) c.record_verify(n, 0.030 + per_token * (n - 1));
}

TEST_CASE("speculative: prompt lookup's length follows the length of its match") {
    DraftLengthController c(0, 16);
    c.set_free_drafts(true);
    CHECK(c.choose_lookup(16, 16, 16) == 0);  // plain decoding is measured first
    record_verify_costs(c);
    // A long match is a copy under way: a long proposal (each further token, accepted with 0.93 if all before it
    // were, costs 7 ms; at 0.93 per token the best round is 8 tokens, ~6.9 tokens for 86 ms).
    const int k16 = c.choose_lookup(16, 16, 16);
    CHECK(k16 >= 8);
    CHECK(c.choose_lookup(16, 5, 16) == 5);  // no more than the source holds
    CHECK(c.choose_lookup(16, 16, 3) == 3);  // nor than the limit
    // A short match is often chance: a few tokens only; a single token (acceptance 0.23) is not worth 7 ms.
    const int k2 = c.choose_lookup(2, 16, 16);
    CHECK(k2 >= 1);
    CHECK(k2 <= 4);
    CHECK(c.choose_lookup(1, 16, 16) == 0);
    CHECK(c.choose_lookup(0, 0, 16) == 0);
    // Where verification costs as much per token as a plain step, no lookup pays.
    DraftLengthController costly(0, 16);
    costly.set_free_drafts(true);
    record_verify_costs(costly, 0.030);
    CHECK(costly.choose_lookup(16, 16, 16) == 0);
    // --draft-min 1 asks for a proposal whenever something matches, at any cost.
    DraftLengthController always(1, 16);
    always.set_free_drafts(true);
    CHECK(always.choose_lookup(1, 16, 16) == 1);
    record_verify_costs(always, 0.030);
    CHECK(always.choose_lookup(1, 16, 16) == 1);
    CHECK(always.choose_lookup(0, 0, 16) == 0);  // nothing to propose
}

TEST_CASE("speculative: verification costs never extrapolate below the prefill's cost per token") {
    // A cold one-shot run (traced): plain steps 42-70 ms while the weights were being repacked, then 46 ms for
    // 3 tokens. A line through those two points is flat or falling, and 17 tokens looked as cheap as one: a
    // 16-token lookup at a 5-token match was verified for nothing (148 ms).
    auto traced = [](double prefill_token_s) {
        DraftLengthController c(0, 16);
        c.set_free_drafts(true);
        c.set_cost_prior(0.0, prefill_token_s, 0.0, 1e9);
        for (int i = 0; i < 5; ++i) c.record_verify(1, 0.050);
        c.record_verify(3, 0.046);
        return c.choose_lookup(5, 16, 16);
    };
    const int k = traced(0.0085);  // the prompt's prefill: 8.5 ms per token, so 17 tokens cost at least 145 ms
    CHECK(k >= 1);
    CHECK(k <= 6);             // up to 6 tokens the flat line (48 ms) is above the floor; 17 tokens: 145 ms for ~5 more
    CHECK(traced(0.0) == 16);  // the case the floor is for: without it the flat line prices 17 tokens as one
}

TEST_CASE("speculative: prompt lookup learns how far its matches are accepted") {
    DraftLengthController c(0, 16);
    c.set_free_drafts(true);
    record_verify_costs(c);
    const double prior3 = c.lookup_acceptance(3);
    CHECK(c.choose_lookup(3, 16, 16) > 0);
    // Matches of 3 tokens whose continuations are always rejected (a paraphrase, not a copy).
    for (int i = 0; i < 20; ++i) c.record_lookup(3, 4, 0);
    CHECK(c.lookup_acceptance(3) < 0.3 * prior3);
    CHECK(c.choose_lookup(3, 16, 16) == 0);
    // A proposal accepted in full counts a success at each length it went through (3, 4, 5), a partial one a failure
    // where it stopped.
    const double before4 = c.lookup_acceptance(4), before6 = c.lookup_acceptance(6);
    c.record_lookup(3, 3, 3);
    CHECK(c.lookup_acceptance(4) > before4);
    CHECK(c.lookup_acceptance(6) == before6);  // the bonus token is the target's, not a lookup trial
    c.record_lookup(5, 4, 1);
    CHECK(c.lookup_acceptance(6) < before6);
}

TEST_CASE("speculative: beside a draft model, a weak lookup match leaves the round to the draft") {
    DraftLengthController c(0, 16);
    record_verify_costs(c);
    // A draft at ~83% acceptance whose step costs 3 ms: ~3.5 tokens for 70 ms beats a 2-token match's lookup (at
    // best ~1.8 tokens for 44 ms).
    for (int i = 0; i < 10; ++i) {
        c.record_round(8, 5, 8 * 0.003);
        c.record_throughput(8, 6, 8 * 0.003 + 0.030 + 0.007 * 8);
    }
    CHECK(c.choose(16) > 0);
    CHECK(c.choose_lookup(2, 16, 16) == 0);
    CHECK(c.choose_lookup(16, 16, 16) >= 8);  // a copy under way beats it: ~6.9 tokens for 86 ms, no draft steps
}

TEST_CASE("speculative: the controller falls back to plain decoding when verification is expensive") {
    DraftLengthController cheap(0, 8);
    DraftLengthController costly(0, 8);
    for (int i = 0; i < 50; ++i) {
        // Verification cost grows one step per token (compute-bound) vs stays flat (memory-bound).
        for (int n = 1; n <= 9; ++n) {
            cheap.record_verify(n, 0.010);
            costly.record_verify(n, 0.010 * n);
        }
        cheap.record_round(4, 3, 4 * 0.001);  // a draft 10x cheaper than a target step
        costly.record_round(4, 2, 4 * 0.006);
    }
    CHECK(cheap.choose(8) >= 3);
    CHECK(costly.choose(8) == 0);
    CHECK(cheap.choose(2) <= 2);
}

TEST_CASE("speculative: a draft that cannot pay even on the optimistic prior is never started") {
    // Target step 33 ms; a large prefill costs 30 ms per token (compute-bound: a model too large for the CPU); a
    // draft reading 40% of the target's bytes. Even at 90% acceptance, and with reading the weights and the
    // arithmetic fully overlapped, k drafted tokens cost k*13 + max(33, (k + 1) * 30) ms for at most 1.9..~8
    // tokens: never better than 1 token per 33 ms (k = 1: 73 ms for 1.9).
    DraftLengthController hopeless(0, 16);
    hopeless.set_cost_prior(0.40, 0.030, 0.0, 1e9);
    CHECK(hopeless.choose(16) == 0);  // first: one plain step to measure the target
    for (int i = 0; i < 4; ++i) {
        hopeless.record_verify(1, 0.033);
        CHECK(hopeless.choose(16) == 0);
    }
    hopeless.record_verify(1, 0.033);
    for (int i = 0; i < 200; ++i) CHECK(hopeless.choose(16) == 0);  // no probes either: the draft never ran

    // A memory-bound machine (a verified token nearly free) and a small draft: the draft is tried.
    DraftLengthController promising(0, 16);
    promising.set_cost_prior(0.10, 0.002, 0.0, 1e9);
    CHECK(promising.choose(16) == 0);
    for (int i = 0; i < 5; ++i) promising.record_verify(1, 0.033);
    CHECK(promising.choose(16) == 4);

    // A draft that would pay in the long run but cannot repay its reading of the prompt in the tokens wanted.
    DraftLengthController short_answer(0, 16);
    short_answer.set_cost_prior(0.10, 0.002, 2.0, 64);  // at best ~3x faster: 64 tokens save < 2 s of catch-up
    for (int i = 0; i < 5; ++i) short_answer.record_verify(1, 0.033);
    CHECK(short_answer.choose(16) == 0);
    DraftLengthController long_answer(0, 16);
    long_answer.set_cost_prior(0.10, 0.002, 2.0, 4096);
    for (int i = 0; i < 5; ++i) long_answer.record_verify(1, 0.033);
    CHECK(long_answer.choose(16) == 4);

    // A user's --draft-min forces drafting whatever the prior says.
    DraftLengthController forced(2, 16);
    forced.set_cost_prior(0.40, 0.030, 0.0, 1e9);
    for (int i = 0; i < 5; ++i) forced.record_verify(1, 0.033);
    CHECK(forced.choose(16) >= 2);
}

TEST_CASE("speculative: realised throughput overrules the cost model") {
    // The model's costs say drafting wins (cheap draft, flat verification, high acceptance) ...
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.010);
    for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.010);
    c.record_round(4, 4, 4 * 0.001);
    CHECK(c.choose(8) > 0);
    // ... but whole drafting rounds take 60 ms where the model predicts 14 (4 draft steps and a verification), a
    // token every 12 ms where plain rounds take 10 ms. Three such rounds are not evidence enough (an answer's first
    // rounds are its least predictable); a fourth is.
    c.record_throughput(0, 1, 0.010);
    for (int i = 0; i < 3; ++i) {
        c.record_throughput(4, 5, 0.060);
        CHECK(c.choose(8) > 0);
    }
    c.record_throughput(4, 5, 0.060);
    CHECK(c.choose(8) == 0);
    // When drafting rounds (probes, the rounds after them) cost less, the model decides again: the scale follows
    // them, and no number of costly rounds before outweighs cheap ones for ever.
    int rounds_to_recover = 0;
    while (c.choose(8) == 0 && rounds_to_recover < 20) {
        c.record_throughput(4, 5, 0.030);
        ++rounds_to_recover;
    }
    CHECK(c.choose(8) > 0);
    CHECK(rounds_to_recover <= 4);  // the median of the last 7 rounds turns once 4 of them are cheap
}

TEST_CASE("speculative: one bad first round does not stop drafting that then wins") {
    // The case seen with the 1.5B + 0.5B on a rewrite prompt: the first drafting round accepts 1 of 4 and, with the
    // machine busy, takes twice the model's cost; the rounds after it accept everything, at the model's cost.
    // Low acceptance lowers alpha; it must not also make every later round look costly.
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.030);
    for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.030 + 0.006 * (n - 1));
    c.record_throughput(0, 1, 0.030);
    c.record_round(4, 1, 4 * 0.010);
    c.record_throughput(4, 2, 2 * (4 * 0.010 + 0.054));
    int drafting = 0;
    for (int round = 0; round < 40; ++round) {
        const int k = c.choose(8);
        if (k == 0) continue;
        ++drafting;
        c.record_round(k, k, k * 0.010);
        c.record_throughput(k, k + 1, k * 0.010 + 0.030 + 0.006 * k);
    }
    CHECK(drafting >= 35);
}

TEST_CASE("speculative: a few slow rounds do not stop drafting that wins") {
    // As traced (TANDEM_SPEC_TRACE=1) with the 1.5B + 0.5B on this shared host: k = 2 rounds accepting everything
    // at ~50 ms for 3 tokens against 21 ms plain steps, now and then one whose draft stopped at p_min after 1 token
    // (2 draft forwards, 44 ms for 2 tokens), then three rounds the machine slowed. Running averages took those
    // into the draft step, the verification estimates and the calibration at once, and the controller decoded the
    // next 30 rounds plainly at 96% acceptance.
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.021);
    c.record_throughput(0, 1, 0.021);
    // k drafted tokens from `steps` draft forwards, all accepted.
    auto round = [&](int k, int steps, double draft_s, double verify_s, double round_s) {
        c.record_verify(k + 1, verify_s);
        c.record_round(k, k, draft_s, steps);
        c.record_throughput(k, k + 1, round_s, steps);
    };
    for (int i = 0; i < 12; ++i) {
        if (i % 4 == 3)
            round(1, 2, 0.0169, 0.0274, 0.0443);
        else
            round(2, 2, 0.0167, 0.0330, 0.0500);
    }
    REQUIRE(c.choose(8) > 0);
    round(2, 2, 0.0187, 0.0523, 0.0709);
    round(1, 1, 0.0152, 0.0432, 0.0585);
    round(2, 2, 0.0211, 0.0600, 0.0811);
    // Rounds as before the slow ones (verification 21 ms + 6 ms per drafted token, 8.4 ms draft steps), scaled
    // by `slow`.
    auto round_as_chosen = [&](double slow) {
        const int k = c.choose(8);
        if (k == 0) return false;
        round(k, k, slow * k * 0.0084, slow * (0.021 + 0.006 * k), slow * (0.022 + 0.0144 * k));
        return true;
    };
    for (int i = 0; i < 5; ++i) REQUIRE(round_as_chosen(1.0));
    // A lasting change still counts: with every drafting round at 3x its cost, plain decoding wins within 5.
    int drafting = 0;
    while (drafting < 5 && round_as_chosen(3.0)) ++drafting;
    CHECK(c.choose(8) == 0);
}

TEST_CASE("speculative: a draft stopped by p_min is not taken for a slow draft") {
    // Rounds of k = 4 whose draft stops after 1 token: 2 forwards of 10 ms each. The step is 10 ms, not 20.
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.030);
    for (int i = 0; i < 6; ++i) c.record_round(1, 1, 0.020, 2);
    CHECK(c.draft_step_seconds() == doctest::Approx(0.010));
}

TEST_CASE("speculative: a hard patch in the answer does not leave the rest plain") {
    // Drafting wins at high acceptance (k = 2: 61 ms for up to 3 tokens against 25 ms plain steps) and the draft
    // agreed all along, until eight rejections in a row. Plain decoding must resume drafting well before the
    // first probe (32 rounds) would, once the long-run acceptance says the patch is likely over.
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.025);
    c.record_throughput(0, 1, 0.025);
    for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.025 + 0.010 * (n - 1));
    for (int i = 0; i < 30; ++i) {
        c.record_round(2, 2, 2 * 0.008);
        c.record_throughput(2, 3, 2 * 0.008 + 0.045);
    }
    for (int i = 0; i < 8; ++i) {
        c.record_round(2, 0, 2 * 0.008);
        c.record_throughput(2, 1, 2 * 0.008 + 0.045);
    }
    REQUIRE(c.choose(8) == 0);
    int plain = 1;
    while (plain < 100 && c.choose(8) == 0) ++plain;
    CHECK(plain < 20);
    // A draft that was poor all along gets no such second chances: only the probes, ever rarer.
    DraftLengthController poor(0, 8);
    for (int i = 0; i < 5; ++i) poor.record_verify(1, 0.025);
    poor.record_throughput(0, 1, 0.025);
    for (int n = 2; n <= 9; ++n) poor.record_verify(n, 0.025 + 0.010 * (n - 1));
    for (int i = 0; i < 30; ++i) {
        poor.record_round(2, i % 3 == 0 ? 1 : 0, 2 * 0.008);
        poor.record_throughput(2, 1, 2 * 0.008 + 0.045);
    }
    int drafting = 0;
    for (int round = 0; round < 100; ++round) drafting += poor.choose(8) > 0;
    CHECK(drafting <= 2);
}

TEST_CASE("speculative: probes of a losing draft become rarer") {
    // A cheap draft with flat verification, losing only through its acceptance (a better one would win).
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.010);
    for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.010 + 0.001 * n);
    for (int i = 0; i < 10; ++i) c.record_round(4, 0, 4 * 0.003);
    std::vector<int> probe_rounds;
    for (int round = 0; round < 400; ++round)
        if (c.choose(8) > 0) probe_rounds.push_back(round);
    REQUIRE(probe_rounds.size() >= 3);
    CHECK(probe_rounds[1] - probe_rounds[0] > 32);  // 64 after the first probe
    CHECK(probe_rounds[2] - probe_rounds[1] > probe_rounds[1] - probe_rounds[0]);
}

TEST_CASE("speculative: a draft whose measured costs lose even at high acceptance is not probed again") {
    // Verification is compute-bound (each extra token costs 60% of a step) and a draft step costs 50% of one: at
    // 90% acceptance k drafted tokens cost 0.5k + 1 + 0.6k steps for at most (1 - 0.9^(k+1)) / 0.1 tokens.
    DraftLengthController c(0, 8);
    for (int i = 0; i < 5; ++i) c.record_verify(1, 0.010);
    for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.010 + 0.006 * (n - 1));
    c.record_round(4, 1, 4 * 0.005);
    for (int round = 0; round < 2000; ++round) REQUIRE(c.choose(8) == 0);
}

TEST_CASE("speculative: vocabulary check") {
    auto stories = GgufFile::open(kData + "/stories260K.gguf");
    auto llama = GgufFile::open(kData + "/ggml-vocab-llama-spm.gguf");
    auto t_stories = Tokenizer::from_gguf(*stories);
    auto t_llama = Tokenizer::from_gguf(*llama);
    SUBCASE("tok512 cannot draft for the Llama 2 32k vocabulary") {
        try {
            check_draft_vocabulary(*t_llama, *t_stories);
            FAIL("expected an error");
        } catch (const Error& e) {
            const std::string msg = e.what();
            INFO(msg);
            CHECK(msg.find("id 259") != std::string::npos);  // the byte pieces 3..258 agree; the first merge does not
            CHECK(msg.find("target") != std::string::npos);
        }
        CHECK_THROWS_AS(check_draft_vocabulary(*t_stories, *t_llama), Error);  // draft larger than target
    }
    SUBCASE("identical vocabularies pass without a note") {
        const VocabCheck vc = check_draft_vocabulary(*t_stories, *t_stories);
        CHECK_FALSE(vc.draft_is_prefix);
        CHECK(vc.note.empty());
    }
    SUBCASE("a draft vocabulary that is a strict prefix of the target's is accepted with a note") {
        // The target: stories260K's vocabulary with 8 extra tokens appended.
        GgufWriter w;
        std::vector<std::string> tokens;
        for (auto t : stories->get_string_array("tokenizer.ggml.tokens")) tokens.emplace_back(t);
        std::vector<float> scores = stories->get_f32_array("tokenizer.ggml.scores");
        std::vector<int32_t> types;
        for (int64_t t : stories->get_int_array("tokenizer.ggml.token_type")) types.push_back(static_cast<int32_t>(t));
        for (int i = 0; i < 8; ++i) {
            tokens.push_back(
                "\xe2\x96\x81"
                "extra" +
                std::to_string(i));
            scores.push_back(-1000.0f - i);
            types.push_back(1);
        }
        w.add_string("general.architecture", "llama");
        w.add_string("tokenizer.ggml.model", "llama");
        w.add_string_array("tokenizer.ggml.tokens", tokens);
        w.add_f32_array("tokenizer.ggml.scores", scores);
        w.add_i32_array("tokenizer.ggml.token_type", types);
        w.add_u32("tokenizer.ggml.unknown_token_id", 0);
        w.add_u32("tokenizer.ggml.bos_token_id", 1);
        w.add_u32("tokenizer.ggml.eos_token_id", 2);
        const std::string path = drafts().dir + "/prefix-target.gguf";
        w.write(path);
        auto bigger = GgufFile::open(path);
        auto t_bigger = Tokenizer::from_gguf(*bigger);
        const VocabCheck vc = check_draft_vocabulary(*t_bigger, *t_stories);
        CHECK(vc.draft_is_prefix);
        CHECK(vc.note.find("prefix") != std::string::npos);
    }
}

namespace {

// The exact distributions of the first three sampled tokens after `prompt` under `target` alone with sampler `sp`,
// enumerated over the (few) continuations the sampler keeps: the marginals of tokens 1, 2, 3 and the joints of
// (1, 2) and (2, 3), keyed id * 512 + id (a sampler whose noise repeats across positions can keep every marginal and
// still couple neighbouring tokens). Under `grammar` each row is masked with its state after the generated tokens
// before the sampler's transforms, as constrained generation does.
std::array<std::map<int, double>, 5> exact_first_tokens(const Model& target, const SamplerParams& sp,
                                                        const std::vector<int>& prompt,
                                                        const grammar::TokenConstraint* grammar = nullptr) {
    CpuBackend backend(target, 1, 64);
    Sampler exact_sampler(sp, 512);
    std::vector<float> logits(512), probs(512);
    auto dist = [&](const std::vector<int>& ctx) {
        auto cache = backend.new_cache(64);
        backend.forward(ctx, *cache, 1, logits.data());
        if (grammar) {
            grammar::TokenConstraint state = *grammar;
            state.reset();
            for (size_t i = prompt.size(); i < ctx.size(); ++i) state.accept(ctx[i]);
            state.mask(logits.data(), 512);
        }
        exact_sampler.distribution(logits.data(), ctx, probs.data());
        std::map<int, double> d;
        for (int t = 0; t < 512; ++t)
            if (probs[static_cast<size_t>(t)] > 0) d[t] = probs[static_cast<size_t>(t)];
        return d;
    };
    std::array<std::map<int, double>, 5> m;
    m[0] = dist(prompt);
    for (const auto& [t1, p1] : m[0]) {
        std::vector<int> c1 = prompt;
        c1.push_back(t1);
        for (const auto& [t2, p2] : dist(c1)) {
            m[1][t2] += p1 * p2;
            m[3][t1 * 512 + t2] += p1 * p2;
            std::vector<int> c2 = c1;
            c2.push_back(t2);
            for (const auto& [t3, p3] : dist(c2)) {
                m[2][t3] += p1 * p2 * p3;
                m[4][t2 * 512 + t3] += p1 * p2 * p3;
            }
        }
    }
    return m;
}

using FirstTokenCounts = std::array<std::map<int, int>, 5>;  // as exact_first_tokens' five, counted

void count_first_tokens(const std::vector<int>& tokens, FirstTokenCounts& counts) {
    for (size_t i = 0; i < 3 && i < tokens.size(); ++i) ++counts[i][tokens[i]];
    if (tokens.size() >= 3) {
        ++counts[3][tokens[0] * 512 + tokens[1]];
        ++counts[4][tokens[1] * 512 + tokens[2]];
    }
}

// The chi-square tests' samples: n_runs generations of 3 tokens after `prompt`, seeds 0..n_runs-1, speculative with
// two drafts a round from `draft` (a path; "" with lookup), sampled by `scheme`, under a fresh copy of `grammar`
// where given; the first tokens counted, and the drafted and accepted totals.
struct SampledRuns {
    FirstTokenCounts counts;
    int64_t drafted = 0, accepted = 0;
};
SampledRuns sample_first_tokens(const Model& target, const std::string& draft, const std::vector<int>& prompt,
                                const SamplerParams& sp, int n_runs, SpecSampling scheme, bool lookup,
                                int draft_vocab = 0, const grammar::TokenConstraint* grammar = nullptr) {
    SampledRuns runs;
    for (int seed = 0; seed < n_runs; ++seed) {
        GenerationParams p;
        p.n_predict = 3;
        p.sampler = sp;
        p.sampler.seed = static_cast<uint64_t>(seed);
        p.speculative.draft_min = 2;
        p.speculative.draft_max = 2;
        p.speculative.p_min = 0;
        p.speculative.lookup = lookup;
        p.speculative.draft_vocab = draft_vocab;
        p.speculative.sampling = scheme;
        std::optional<grammar::TokenConstraint> state;
        if (grammar) {
            state.emplace(*grammar);
            state->reset();
            p.constraint = &*state;
        }
        const Run r = generate(target, draft, prompt, p);
        count_first_tokens(r.tokens, runs.counts);
        runs.drafted += r.stats.spec.drafted;
        runs.accepted += r.stats.spec.accepted;
    }
    return runs;
}

// Whether every one of the five passes the chi-square test against the exact distributions (INFO says which not).
bool all_pass(const FirstTokenCounts& counts, const std::array<std::map<int, double>, 5>& exact, int n_runs) {
    static const char* kNames[] = {"token 1", "token 2", "token 3", "tokens (1, 2)", "tokens (2, 3)"};
    bool ok = true;
    for (size_t i = 0; i < 5; ++i) {
        const auto [stat, crit] = chi_square(counts[i], exact[i], n_runs);
        if (stat >= crit) {
            MESSAGE(std::string(kNames[i]) << ": chi-square " << stat << " >= critical " << crit);
            ok = false;
        }
    }
    return ok;
}

}  // namespace

TEST_CASE(
    "speculative: sampling at temperature > 0 is lossless, coupled and by rejection (exact chi-square on tokens 1-3)") {
    // Mutation-checked: noise keyed without the position (one Gumbel vector for every token), or a uniform squared
    // (biased noise), fails this test.
    const std::vector<int> prompt = {1};  // after BOS alone the story can start many ways: broad distributions
    SamplerParams sp;
    sp.temperature = 1.2f;
    sp.top_k = 30;
    sp.top_p = 0.98f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.1f;  // the penalty must be applied alike to p and q
    const int n_runs = 3000;

    struct Pair {
        const char* name;
        std::string target, draft;
    };
    // The story model with its overconfident draft; the context-blind model (neighbouring tokens from one broad
    // distribution) with its own.
    const std::vector<Pair> pairs = {{"stories260K", kData + "/stories260K.gguf", drafts().sharp},
                                     {"context-blind", drafts().blind, drafts().blind_sharp}};
    for (const Pair& pair : pairs) {
        CAPTURE(std::string(pair.name));
        auto target = Model::load(pair.target);
        const auto exact = exact_first_tokens(*target, sp, prompt);
        REQUIRE(exact[0].size() >= 10);
        REQUIRE(exact[1].size() >= 10);
        REQUIRE(exact[2].size() >= 10);
        for (SpecSampling scheme : {SpecSampling::Coupled, SpecSampling::Rejection}) {
            CAPTURE(std::string(spec_sampling_name(scheme)));
            const SampledRuns drafted = sample_first_tokens(*target, pair.draft, prompt, sp, n_runs, scheme, false);
            CHECK(all_pass(drafted.counts, exact, n_runs));
            INFO("overconfident draft: " << drafted.accepted << " of " << drafted.drafted
                                         << " drafted tokens accepted");
            CHECK(drafted.accepted > drafted.drafted / 10);  // the rule was exercised both ways
            CHECK(drafted.accepted < drafted.drafted);
            // A draft restricted to part of the vocabulary (q is then its distribution over the kept ids).
            CHECK(all_pass(sample_first_tokens(*target, pair.draft, prompt, sp, n_runs, scheme, false, 256).counts,
                           exact, n_runs));
            // Prompt lookup (one-hot proposals).
            CHECK(all_pass(sample_first_tokens(*target, "", prompt, sp, n_runs, scheme, true).counts, exact, n_runs));
        }

        // Negative controls: the test rejects tokens drawn from another distribution (the draft's, at a higher
        // temperature), and tokens of the target's own distributions sampled with one position's noise for all
        // three (on the context-blind pair, where that couples neighbours).
        auto draft_model = Model::load(pair.draft);
        FirstTokenCounts draft_only, reused;
        CpuBackend backend(*target, 1, 64);
        std::vector<float> logits(512);
        for (int seed = 0; seed < n_runs; ++seed) {
            GenerationParams p;
            p.n_predict = 3;
            p.sampler = sp;
            p.sampler.temperature = 1.5f;
            p.sampler.seed = static_cast<uint64_t>(seed);
            count_first_tokens(generate(*draft_model, "", prompt, p).tokens, draft_only);
            SamplerParams q = sp;
            q.seed = static_cast<uint64_t>(seed);
            Sampler sampler(q, 512);
            std::vector<int> ctx = prompt;
            for (int i = 0; i < 3; ++i) {
                auto cache = backend.new_cache(64);
                backend.forward(ctx, *cache, 1, logits.data());
                ctx.push_back(sampler.sample(logits.data(), ctx, 1));  // always position 1: the reuse
            }
            count_first_tokens(std::vector<int>(ctx.begin() + 1, ctx.end()), reused);
        }
        const auto [n2, nc2] = chi_square(draft_only[1], exact[1], n_runs);
        INFO("negative control, token 2: " << n2 << " (critical " << nc2 << ")");
        CHECK(n2 > nc2);
        if (std::string(pair.name) == "context-blind") CHECK_FALSE(all_pass(reused, exact, n_runs));
    }
}

TEST_CASE("speculative: a second generation on a non-empty cache (a chat turn) keeps the draft in step") {
    // Also after drafting ahead (SpeculativeParams::draft_ahead), which leaves the draft's cache holding what it
    // drafted past the answer.
    for (int ahead : {0, 5}) {
        CAPTURE(ahead);
        auto target = Model::load(kData + "/stories260K.gguf");
        auto draft_model = Model::load(kData + "/stories260K.gguf");
        CpuBackend backend(*target, 1, 64), draft_backend(*draft_model, 1, 64);
        auto cache = backend.new_cache(256), draft_cache = draft_backend.new_cache(256);
        Generator spec(*target, backend, *cache, {draft_model.get(), &draft_backend, draft_cache.get()});
        GenerationParams p = greedy_params(30);
        p.speculative.draft_min = 3;
        p.speculative.draft_max = 3;
        p.speculative.p_min = 0;
        p.speculative.draft_ahead = ahead;
        auto ignore = [](std::string_view) { return true; };
        const std::vector<int> turn1 = {1, 403, 407, 261, 378};
        const GenerationStats a = spec.generate(turn1, p, ignore);
        // The chat keeps the conversation in both caches (cut to what both hold, as the REPL does) and appends a
        // turn: the rest of the conversation plus new user tokens.
        std::vector<int> conversation = turn1;
        conversation.insert(conversation.end(), a.generated.begin(), a.generated.end());
        const int held = std::min(cache->n_committed(), draft_cache->n_committed());
        REQUIRE(held > static_cast<int>(turn1.size()));
        cache->truncate(held);
        draft_cache->truncate(held);
        std::vector<int> turn2(conversation.begin() + held, conversation.end());
        turn2.insert(turn2.end(), {291, 376, 400, 428});
        const GenerationStats b = spec.generate(turn2, p, ignore);
        CHECK(b.spec.drafted > 0);
        CHECK(b.spec.accepted == b.spec.drafted);  // an identical draft in step is always right
        CHECK((b.spec.ahead_used > 0) == (ahead > 0));

        // And the text equals plain decoding of the same whole sequence.
        std::vector<int> whole(conversation.begin(), conversation.begin() + held);
        whole.insert(whole.end(), turn2.begin(), turn2.end());
        const Run plain = generate(*target, "", whole, greedy_params(30));
        CHECK(plain.tokens == b.generated);

        // A draft that holds only part of the earlier turns (it did not draft then) reads the rest from `held` when
        // it first drafts, and is as right as before.
        cache->truncate(held);
        draft_cache->truncate(3);
        const std::span<const int> earlier(conversation.data(), static_cast<size_t>(held));
        const GenerationStats c = spec.generate(turn2, p, ignore, earlier);
        CHECK(c.spec.drafted > 0);
        CHECK(c.spec.accepted == c.spec.drafted);
        CHECK(c.generated == b.generated);
        // Without the earlier tokens that is an error, not a silently wrong draft.
        cache->truncate(held);
        draft_cache->truncate(3);
        CHECK_THROWS_AS(spec.generate(turn2, p, ignore), Error);
    }
}

namespace {

// The dense row's Gumbel-max: argmax over every id of log w + g, zero weights skipped, the lower id on a tie.
int dense_gumbel_max(const std::vector<float>& w, const PositionNoise& noise, int64_t position, NoiseUse use) {
    int best = -1;
    double best_score = 0;
    for (int id = 0; id < static_cast<int>(w.size()); ++id) {
        if (!(w[static_cast<size_t>(id)] > 0)) continue;
        const double s = std::log(static_cast<double>(w[static_cast<size_t>(id)])) +
                         noise.gumbel(position, use, static_cast<uint32_t>(id));
        if (best < 0 || s > best_score) best = id, best_score = s;
    }
    return best;
}

// Rejection sampling over dense rows (as the rule was written before the distributions became sparse), the reference
// for the sparse one: the same numbers of the same positions, so the same verdict.
Verdict dense_rejection(std::span<const int> drafted, const std::vector<std::vector<float>>& p_rows,
                        const std::vector<std::vector<float>>& q_rows, const PositionNoise& noise, int64_t pos) {
    Verdict v;
    for (size_t i = 0; i < drafted.size(); ++i) {
        const std::vector<float>& p = p_rows[i];
        const std::vector<float>& q = q_rows[i];
        const int x = drafted[i];
        const int64_t at = pos + static_cast<int64_t>(i);
        if (q[x] > 0 && noise.uniform(at, NoiseUse::Acceptance) < std::min(1.0, static_cast<double>(p[x]) / q[x])) {
            ++v.n_accepted;
            continue;
        }
        std::vector<float> r(p.size());
        bool any = false;
        for (size_t t = 0; t < p.size(); ++t) {
            r[t] = std::max(0.0f, p[t] - q[t]);
            any = any || r[t] > 0;
        }
        v.next_token = dense_gumbel_max(any ? r : p, noise, at, NoiseUse::Residual);
        return v;
    }
    v.next_token =
        dense_gumbel_max(p_rows[drafted.size()], noise, pos + static_cast<int64_t>(drafted.size()), NoiseUse::Token);
    return v;
}

}  // namespace

TEST_CASE("speculative: verify_proposal over sparse distributions gives the dense rules' verdicts") {
    std::mt19937 rng(41);
    const int n = 60;
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    // A distribution on a random support (sometimes the whole vocabulary, sometimes one id), normalised.
    auto random_dist = [&](std::vector<float>& dense, SparseDistribution& sparse) {
        dense.assign(n, 0.0f);
        const int support = rng() % 4 == 0 ? n : 1 + static_cast<int>(rng() % 12);
        float sum = 0;
        for (int j = 0; j < support; ++j) {
            const int id = support == n ? j : static_cast<int>(rng() % n);
            dense[id] = unit(rng) + 1e-3f;
        }
        for (float x : dense) sum += x;
        sparse.ids.clear();
        sparse.probs.clear();
        for (int id = 0; id < n; ++id) {
            dense[id] /= sum;
            if (dense[id] > 0) sparse.ids.push_back(id), sparse.probs.push_back(dense[id]);
        }
    };
    int rejections = 0, all_accepted = 0, coupled_accepted = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        const int k = 1 + static_cast<int>(rng() % 5);
        std::vector<std::vector<float>> p_rows(k + 1), q_rows(k);
        std::vector<SparseDistribution> p_sparse(k + 1), q_sparse(k);
        for (int i = 0; i <= k; ++i) random_dist(p_rows[i], p_sparse[i]);
        const PositionNoise noise(rng());
        const int64_t pos = rng() % 1000;
        std::vector<int> drafted, coupled_drafts;
        for (int i = 0; i < k; ++i) {
            if (trial % 3 == 0) {  // often the target itself: long acceptances
                q_rows[i] = p_rows[i];
                q_sparse[i] = p_sparse[i];
            } else {
                random_dist(q_rows[i], q_sparse[i]);
            }
            // A token of q's support (or, now and then, one q gives no mass: always rejected).
            const SparseDistribution& q = q_sparse[i];
            drafted.push_back(rng() % 10 == 0 ? static_cast<int>(rng() % n) : q.ids[rng() % q.ids.size()]);
            // The coupled draft: q's Gumbel-max with the target's noise for its position.
            coupled_drafts.push_back(gumbel_max(q, noise, pos + i, NoiseUse::Token));
        }
        CAPTURE(trial);
        const Verdict want = dense_rejection(drafted, p_rows, q_rows, noise, pos);
        const Verdict got = verify_proposal(drafted, p_sparse, q_sparse, false, SpecSampling::Rejection, noise, pos);
        REQUIRE(got.n_accepted == want.n_accepted);
        REQUIRE(got.next_token == want.next_token);
        rejections += want.n_accepted < k;
        all_accepted += want.n_accepted == k;

        // Coupled: the accepted drafts and the next token are exactly the tokens plain decoding samples at those
        // positions (the dense rows' Gumbel-max), up to and including the first the draft got wrong.
        const Verdict c = verify_proposal(coupled_drafts, p_sparse, q_sparse, false, SpecSampling::Coupled, noise, pos);
        int plain_accepted = 0;
        int plain_next = -1;
        for (int i = 0; i <= k; ++i) {
            const int t = dense_gumbel_max(p_rows[static_cast<size_t>(i)], noise, pos + i, NoiseUse::Token);
            if (i < k && t == coupled_drafts[static_cast<size_t>(i)]) {
                ++plain_accepted;
                continue;
            }
            plain_next = t;
            break;
        }
        REQUIRE(c.n_accepted == plain_accepted);
        REQUIRE(c.next_token == plain_next);
        coupled_accepted += c.n_accepted;
    }
    CHECK(rejections > 500);
    CHECK(all_accepted > 100);
    CHECK(coupled_accepted > 500);

    // Greedy: accepted while the token is the one-hot's id; else that id.
    SparseDistribution one, two, three;
    one.assign_one(4), two.assign_one(9), three.assign_one(2);
    const PositionNoise noise(1);
    const std::vector<SparseDistribution> target = {one, two, three};
    Verdict g = verify_proposal(std::vector<int>{4, 9}, target, {}, true, SpecSampling::Coupled, noise, 0);
    CHECK(g.n_accepted == 2);
    CHECK(g.next_token == 2);
    g = verify_proposal(std::vector<int>{4, 5}, target, {}, true, SpecSampling::Rejection, noise, 0);
    CHECK(g.n_accepted == 1);
    CHECK(g.next_token == 9);
}

TEST_CASE(
    "speculative: a synthetic next-token pair picks the rule's successors and its draft is accepted where they agree") {
    // tandem-bench --make-synthetic NAME --next-token A (synthetic_model.h): the pair a lent GPU runs to measure
    // speculative decoding at the real pair's shapes with a known acceptance rate. Target: the tiny shape in Q8_0
    // and, for the k-quants' per-sub-block offsets, Q4_K, following the cycle; draft: a smaller shape in Q4_0 that
    // agrees on 75% of the tokens. Each model's argmax after a token must be the rule's successor, on every row.
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-next-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const SyntheticShape tiny = *synthetic_preset("tiny");
    const SyntheticShape small{"tiny-draft", 128, 384, 2, 4, 2, tiny.n_vocab, tiny.context_length, false};
    const SyntheticNextToken target_rule{1.0, 2}, draft_rule{0.75, 2};
    write_synthetic_model(dir + "/target.gguf", tiny, GgmlType::Q8_0, 5, target_rule);
    write_synthetic_model(dir + "/target-q4_k.gguf", tiny, GgmlType::Q4_K, 6, target_rule);
    write_synthetic_model(dir + "/draft.gguf", small, GgmlType::Q4_0, 7, draft_rule);
    const std::vector<int> succ = synthetic_successors(tiny.n_vocab, target_rule);
    const std::vector<int> draft_succ = synthetic_successors(tiny.n_vocab, draft_rule);

    // The rule: one cycle through ids 3..n_vocab-1 (the vocabulary is under cycle_ids), nothing leads to 0-2;
    // the draft agrees on ~75% of the ids and otherwise skips one step.
    int t = succ[0], steps = 0;
    do {
        REQUIRE(t >= 3);
        t = succ[static_cast<size_t>(t)];
        ++steps;
    } while (t != succ[0] && steps <= tiny.n_vocab);
    CHECK(steps == tiny.n_vocab - 3);
    int agree = 0;
    for (int id = 0; id < tiny.n_vocab; ++id) {
        const int next = succ[static_cast<size_t>(id)], d = draft_succ[static_cast<size_t>(id)];
        agree += d == next;
        if (d != next) CHECK(d == succ[static_cast<size_t>(next)]);
    }
    CHECK(std::abs(static_cast<double>(agree) / tiny.n_vocab - 0.75) < 0.05);

    std::vector<int> probe;
    for (int id = 0; id < 64; ++id) probe.push_back(id * 16 + 1);  // every part of the vocabulary, specials too
    for (const auto& [file, rule] : {std::pair{"target.gguf", &succ}, std::pair{"target-q4_k.gguf", &succ},
                                     std::pair{"draft.gguf", &draft_succ}}) {
        const std::string name = file;
        CAPTURE(name);
        auto model = Model::load(dir + "/" + name);
        CpuBackend backend(*model, 1, 64);
        auto cache = backend.new_cache(128);
        std::vector<float> logits(probe.size() * static_cast<size_t>(tiny.n_vocab));
        backend.forward(probe, *cache, static_cast<int>(probe.size()), logits.data());
        for (size_t i = 0; i < probe.size(); ++i) {
            const float* row = logits.data() + i * static_cast<size_t>(tiny.n_vocab);
            CAPTURE(probe[i]);
            CHECK(std::max_element(row, row + tiny.n_vocab) - row == (*rule)[static_cast<size_t>(probe[i])]);
        }
    }

    // Greedy generation follows the cycle, and speculative decoding gives the same tokens, accepting some drafts
    // and rejecting others.
    auto target = Model::load(dir + "/target.gguf");
    const std::vector<int> prompt = {1, 100, 200};
    const Run plain = generate(*target, "", prompt, greedy_params(120));
    REQUIRE(plain.tokens.size() == 120);
    int last = prompt.back();
    for (int id : plain.tokens) {
        CHECK(id == succ[static_cast<size_t>(last)]);
        last = id;
    }
    GenerationParams p = greedy_params(120);
    p.speculative.draft_min = 1;  // draft every round
    const Run spec = generate(*target, dir + "/draft.gguf", prompt, p);
    CHECK(spec.tokens == plain.tokens);
    REQUIRE(spec.stats.speculative);
    CHECK(spec.stats.spec.accepted > 0);
    CHECK(spec.stats.spec.accepted < spec.stats.spec.drafted);

    // What the rule cannot do: a tied output (the embedding is derived from the output matrix), an agreement
    // outside [0, 1], a cycle of fewer than two ids.
    SyntheticShape tied = tiny;
    tied.tied_output = true;
    CHECK_THROWS_AS(write_synthetic_model(dir + "/tied.gguf", tied, GgmlType::Q8_0, 1, target_rule), Error);
    CHECK_THROWS_AS(synthetic_successors(tiny.n_vocab, {1.5, 1}), Error);
    CHECK_THROWS_AS(synthetic_successors(tiny.n_vocab, {1.0, 1, 4}), Error);
    std::filesystem::remove_all(dir);
}

TEST_CASE(
    "speculative: a synthetic draft replaying a recorded pattern agrees where it says, about as sure as it says") {
    // tandem-bench --make-synthetic NAME --next-token-pattern FILE: the j-th id of the target's cycle takes step j mod
    // size of the recording (tandem-bench --record-agreement: a real pair's greedy agreement and the draft's top
    // probability along the target's output). Checked along the cycle: the rule's successors, then the written
    // model's argmax and top probability at each of those ids (one forward: a next-token model's logits depend on the
    // last token alone), and speculative decoding against plain decoding.
    const std::string dir = std::filesystem::temp_directory_path() / ("tandem-pattern-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const SyntheticShape tiny = *synthetic_preset("tiny");
    const SyntheticShape small{"tiny-draft", 128, 384, 2, 4, 2, tiny.n_vocab, tiny.context_length, false};
    {
        std::ofstream f(dir + "/pattern.txt");
        f << "# a comment\n1:0.990 1:0.950 0:0.350 1:0.500\n1:0.999 0:0.900 1:0.350 1:1.000 1:0.800 0:0.500\n";
    }
    SyntheticNextToken rule;
    rule.pattern = read_agreement_pattern(dir + "/pattern.txt");
    REQUIRE(rule.pattern.size() == 10);
    CHECK(format_agreement_steps({rule.pattern.begin(), rule.pattern.begin() + 3}) == "1:0.990 1:0.950 0:0.350");
    const size_t L = rule.pattern.size();
    const std::vector<int> succ = synthetic_successors(tiny.n_vocab, SyntheticNextToken{1.0, 2});
    const std::vector<int> draft_succ = synthetic_successors(tiny.n_vocab, rule);
    std::vector<int> cycle = {succ[0]};  // id 0 leads to the cycle's first id
    while (cycle.size() < 4 * L) cycle.push_back(succ[static_cast<size_t>(cycle.back())]);
    for (size_t j = 0; j + 2 < cycle.size(); ++j) {
        CAPTURE(j);
        CHECK(draft_succ[static_cast<size_t>(cycle[j])] == (rule.pattern[j % L].agrees ? cycle[j + 1] : cycle[j + 2]));
    }

    write_synthetic_model(dir + "/target.gguf", tiny, GgmlType::Q8_0, 5, SyntheticNextToken{1.0, 2});
    write_synthetic_model(dir + "/draft.gguf", small, GgmlType::Q4_0, 7, rule);
    auto draft = Model::load(dir + "/draft.gguf");
    const int V = tiny.n_vocab, n = static_cast<int>(3 * L);
    CpuBackend backend(*draft, 1, 64);
    auto cache = backend.new_cache(128);
    std::vector<float> logits(static_cast<size_t>(n) * V);
    backend.forward(std::vector<int>(cycle.begin(), cycle.begin() + n), *cache, n, logits.data());
    for (int j = 0; j < n; ++j) {
        const float* row = logits.data() + static_cast<size_t>(j) * V;
        const int pick = static_cast<int>(std::max_element(row, row + V) - row);
        double sum = 0;
        for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i]) - row[pick]);
        const float p = static_cast<float>(1.0 / sum),
                    want = replayed_confidence(rule.pattern[static_cast<size_t>(j) % L]);
        CAPTURE(j);
        CAPTURE(p);
        CAPTURE(want);
        CHECK(pick == draft_succ[static_cast<size_t>(cycle[static_cast<size_t>(j)])]);
        if (want >= 0.99f)
            CHECK(p > 0.9f);  // as sure as the plain rule makes a draft of this width
        else
            CHECK(std::abs(p - want) < 0.1f);
    }

    // Greedy speculative decoding gives the target's tokens, accepting along the recording.
    auto target = Model::load(dir + "/target.gguf");
    const std::vector<int> prompt = {1, 100, 200};
    const Run plain = generate(*target, "", prompt, greedy_params(100));
    GenerationParams p = greedy_params(100);
    p.speculative.draft_min = 1;
    const Run spec = generate(*target, dir + "/draft.gguf", prompt, p);
    CHECK(spec.tokens == plain.tokens);
    CHECK(spec.stats.spec.accepted > 0);
    CHECK(spec.stats.spec.accepted < spec.stats.spec.drafted);

    // Malformed patterns: a step that is not A:P, a probability past 1, no steps.
    for (const char* bad : {"1:0.5 2:0.5\n", "1:1.5\n", "# only a comment\n", "1-0.5\n"}) {
        CAPTURE(std::string(bad));
        std::ofstream(dir + "/bad.txt") << bad;
        CHECK_THROWS_AS(read_agreement_pattern(dir + "/bad.txt"), Error);
    }
    CHECK_THROWS_AS(read_agreement_pattern(dir + "/missing.txt"), Error);
    std::filesystem::remove_all(dir);
}

namespace {

// A grammar over stories260K's vocabulary (SentencePiece, byte pieces), EOS ending it.
grammar::TokenConstraint story_constraint(const Model& model, const std::string& gbnf) {
    return grammar::TokenConstraint(grammar::parse_gbnf(gbnf), model.tokenizer->token_bytes_table(model.config.n_vocab),
                                    {model.tokenizer->eos()});
}

// generate() under a fresh copy of `grammar`.
Run generate_constrained(const Model& target, const std::string& draft, const std::vector<int>& prompt,
                         GenerationParams p, const grammar::TokenConstraint& grammar) {
    grammar::TokenConstraint state = grammar;
    state.reset();
    p.constraint = &state;
    return generate(target, draft, prompt, p);
}

// Grammars that cut into what the story model says: no letter e anywhere; sentences of lower-case words, each
// ending in ". " (the model's capitals and commas are out).
const char* const kStoryGrammars[] = {
    "root ::= [^e]*",
    "root ::= sentence+\nsentence ::= [a-z]+ (\" \" [a-z]+)* \". \"",
};

}  // namespace

TEST_CASE(
    "speculative: under a grammar, drafted and looked-up output is constrained plain decoding's, greedy and coupled") {
    // Mutation-checked: verification that does not mask its rows (the target's unmasked pick leaves the grammar),
    // or masks every row with the state before the drafts, fails this test.
    auto target = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    const int n = 80;
    int64_t drafted = 0, accepted = 0;
    for (const char* gbnf : kStoryGrammars) {
        CAPTURE(std::string(gbnf));
        const grammar::TokenConstraint grammar = story_constraint(*target, gbnf);
        for (const float temp : {0.0f, 0.8f}) {
            CAPTURE(temp);
            GenerationParams base = greedy_params(n);
            base.sampler.temperature = temp;
            base.sampler.seed = 7;
            const Run plain = generate_constrained(*target, "", prompt, base, grammar);
            grammar::GrammarMatcher matcher = grammar::GrammarMatcher::from_gbnf(gbnf);
            CHECK(matcher.advance(plain.text));                                 // the grammar is followed ...
            CHECK(plain.tokens != generate(*target, "", prompt, base).tokens);  // ... and changes the answer
            const auto same = [&](const std::string& draft, GenerationParams p, const char* what) {
                const Run spec = generate_constrained(*target, draft, prompt, p, grammar);
                INFO(what << ", draft " << draft);
                CHECK(spec.tokens == plain.tokens);
                CHECK(spec.text == plain.text);
                CHECK(spec.stats.spec.drafted > 0);
                drafted += spec.stats.spec.drafted;
                accepted += spec.stats.spec.accepted;
            };
            for (const std::string& draft : {drafts().q8_0, drafts().q4_0, drafts().sharp}) {
                for (bool lookup : {false, true}) {
                    GenerationParams p = base;
                    p.speculative.lookup = lookup;
                    p.speculative.draft_min = 1;  // always draft, so verification really runs
                    same(draft, p, lookup ? "draft and lookup" : "draft");
                }
            }
            GenerationParams p = base;
            p.speculative.lookup = true;
            p.speculative.draft_min = 1;
            same("", p, "lookup alone");
            // Drafting ahead (forced on the CPU), its carried tokens proposed under the grammar.
            p = base;
            p.speculative.draft_min = 2;
            p.speculative.draft_ahead = 4;
            same(drafts().q8_0, p, "drafting ahead");
            // The target as its own draft, restricted to ids below 200 and the context's: the grammar may leave it
            // nothing to propose.
            p = base;
            p.speculative.draft_min = 5;
            p.speculative.draft_max = 5;
            p.speculative.p_min = 0;
            p.speculative.draft_vocab = 200;
            same(kData + "/stories260K.gguf", p, "restricted vocabulary");
        }
    }
    INFO(accepted << " of " << drafted << " drafted tokens accepted");
    CHECK(accepted > drafted / 10);  // acceptance and rejection both exercised
    CHECK(accepted < drafted);
}

TEST_CASE("speculative: under a grammar, sampling stays lossless against the masked distributions (exact chi-square)") {
    // The masked target's exact distributions of tokens 1-3 after BOS, against tokens from drafted and looked-up
    // generation under the grammar, coupled and by rejection. Rejection is where masking matters beyond greedy:
    // p and q must both be the masked ones for min(1, p/q) and the residual to give the masked p.
    auto target = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> prompt = {1};
    SamplerParams sp;
    sp.temperature = 1.2f;
    sp.top_k = 30;
    sp.top_p = 0.98f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.1f;
    const int n_runs = 3000;
    const grammar::TokenConstraint grammar = story_constraint(*target, kStoryGrammars[0]);
    const auto exact = exact_first_tokens(*target, sp, prompt, &grammar);
    REQUIRE(exact[0].size() >= 10);
    REQUIRE(exact[1].size() >= 10);
    REQUIRE(exact[2].size() >= 10);
    // The grammar took mass away: the unmasked first token's distribution keeps ids the masked one lacks.
    const auto unmasked = exact_first_tokens(*target, sp, prompt);
    CHECK(std::any_of(unmasked[0].begin(), unmasked[0].end(),
                      [&](const auto& kv) { return kv.second > 0.01 && !exact[0].count(kv.first); }));
    for (SpecSampling scheme : {SpecSampling::Coupled, SpecSampling::Rejection}) {
        CAPTURE(std::string(spec_sampling_name(scheme)));
        for (const bool lookup : {false, true}) {
            CAPTURE(lookup);
            const SampledRuns runs = sample_first_tokens(*target, lookup ? "" : drafts().sharp, prompt, sp, n_runs,
                                                         scheme, lookup, 0, &grammar);
            CHECK(all_pass(runs.counts, exact, n_runs));
            if (!lookup) {
                INFO(runs.accepted << " of " << runs.drafted << " drafted tokens accepted");
                CHECK(runs.accepted > runs.drafted / 10);
                CHECK(runs.accepted < runs.drafted);
            }
        }
    }
    // Negative control: unconstrained tokens fail against the masked distributions.
    FirstTokenCounts free_counts;
    for (int seed = 0; seed < n_runs; ++seed) {
        GenerationParams p;
        p.n_predict = 3;
        p.sampler = sp;
        p.sampler.seed = static_cast<uint64_t>(seed);
        count_first_tokens(generate(*target, "", prompt, p).tokens, free_counts);
    }
    CHECK_FALSE(all_pass(free_counts, exact, n_runs));
}
