// ContinuousBatcher against the Generator: on stories260K, every job of a batch (greedy, seeded sampling with
// penalties, stop strings, a token budget, a grammar, prompts of different lengths) generates exactly the text and
// tokens its own plain Generator run gives, whatever the number of slots and the step budget (down to budgets smaller
// than the number of sequences, which leave prompts waiting while others decode). Slots are refilled as jobs end,
// records come back in finishing order, and a consumer that goes away ends only its own sequence.
#include <doctest/doctest.h>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "generate/continuous_batcher.h"
#include "generate/generator.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "model/model.h"
#include "test_paths.h"
#include "text/tokenizer.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

struct Case {
    std::string prompt;
    GenerationParams params;
    std::optional<grammar::Grammar> grammar;
};

std::vector<Case> make_cases() {
    std::vector<Case> cases;
    const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Tom went to the park and saw a big",
                             "One day", "Sam had a red ball. He"};
    for (int i = 0; i < 10; ++i) {
        Case c;
        c.prompt = prompts[i % 5];
        c.params.n_predict = 20 + 7 * (i % 4);
        if (i % 3 != 0) {  // seeded sampling, one with a repeat penalty (it reads the history)
            c.params.sampler.temperature = 0.9f;
            c.params.sampler.seed = 100 + static_cast<uint64_t>(i);
            c.params.sampler.top_k = i % 2 ? 40 : 0;
            if (i == 4) c.params.sampler.repeat_penalty = 1.3f;
        } else {
            c.params.sampler.temperature = 0.0f;
        }
        if (i == 5) c.params.stops = {"."};
        if (i == 7) c.grammar = grammar::parse_gbnf("root ::= \" \" [a-z]+ (\" \" [a-z]+)* \".\"");
        cases.push_back(c);
    }
    return cases;
}

grammar::TokenConstraint constraint_for(const Model& model, const grammar::Grammar& g) {
    std::vector<std::string> bytes;
    for (int id = 0; id < model.config.n_vocab; ++id) bytes.push_back(model.tokenizer->token_bytes(id));
    return grammar::TokenConstraint(g, bytes, {model.tokenizer->eos()});
}

struct Result {
    std::string text;
    GenerationStats stats;
};

Result alone(const Model& model, const Case& c) {
    CpuBackend backend(model, 1, 64);
    auto cache = backend.new_cache(256);
    GenerationParams params = c.params;
    std::optional<grammar::TokenConstraint> constraint;
    if (c.grammar) constraint.emplace(constraint_for(model, *c.grammar));
    params.constraint = constraint ? &*constraint : nullptr;
    Generator gen(model, backend, *cache);
    Result r;
    r.stats = gen.generate(model.tokenizer->encode(c.prompt, true), params, [&](std::string_view piece) {
        r.text += piece;
        return true;
    });
    return r;
}

// Runs the cases through a batcher; results by case index, and the order they finished in.
std::map<size_t, Result> batched(const Model& model, const std::vector<Case>& cases, const BatcherOptions& options,
                                 std::vector<size_t>* order = nullptr, BatcherStats* stats = nullptr) {
    CpuBackend backend(model, 2, 64);
    ContinuousBatcher batcher(model, backend, options);
    std::map<size_t, Result> results;
    std::map<size_t, std::optional<grammar::TokenConstraint>> constraints;
    size_t next = 0;
    const BatcherStats st = batcher.run(
        [&]() -> std::optional<BatchJob> {
            if (next == cases.size()) return std::nullopt;
            const Case& c = cases[next];
            BatchJob job;
            job.tag = next;
            job.prompt = model.tokenizer->encode(c.prompt, true);
            job.params = c.params;
            auto& constraint = constraints[next];
            if (c.grammar) constraint.emplace(constraint_for(model, *c.grammar));
            job.params.constraint = constraint ? &*constraint : nullptr;
            std::string* text = &results[next].text;
            job.emit = [text](std::string_view piece) {
                *text += piece;
                return true;
            };
            ++next;
            return job;
        },
        [&](BatchJob& job, GenerationStats& s) {
            results[job.tag].stats = s;
            if (order) order->push_back(job.tag);
        });
    if (stats) *stats = st;
    return results;
}

}  // namespace

TEST_CASE("continuous batcher: every job's output is its own Generator run's, whatever the slots and budget") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    const std::vector<Case> cases = make_cases();
    std::vector<Result> expected;
    for (const Case& c : cases) expected.push_back(alone(*model, c));
    for (const BatcherOptions options : {BatcherOptions{.n_parallel = 1, .n_ctx = 256, .step_tokens = 64},
                                         BatcherOptions{.n_parallel = 3, .n_ctx = 256, .step_tokens = 5},
                                         BatcherOptions{.n_parallel = 4, .n_ctx = 256, .step_tokens = 2},
                                         BatcherOptions{.n_parallel = 16, .n_ctx = 256, .step_tokens = 256}}) {
        CAPTURE(options.n_parallel);
        CAPTURE(options.step_tokens);
        std::vector<size_t> order;
        BatcherStats st;
        const auto got = batched(*model, cases, options, &order, &st);
        REQUIRE(got.size() == cases.size());
        CHECK(order.size() == cases.size());
        CHECK(st.peak_in_flight == std::min<int>(options.n_parallel, static_cast<int>(cases.size())));
        for (size_t i = 0; i < cases.size(); ++i) {
            CAPTURE(i);
            const Result& r = got.at(i);
            CHECK(r.text == expected[i].text);
            CHECK(r.stats.generated == expected[i].stats.generated);
            CHECK(r.stats.stop == expected[i].stats.stop);
            CHECK(r.stats.n_prompt == expected[i].stats.n_prompt);
        }
        // The step budget bounds every step: prompt tokens beyond it wait for later steps.
        long total = 0;
        for (size_t i = 0; i < cases.size(); ++i)
            total += expected[i].stats.n_prompt + static_cast<long>(expected[i].stats.generated.size());
        CHECK(st.tokens_forwarded <= total);
        CHECK(st.steps * static_cast<long>(std::max(options.step_tokens, options.n_parallel)) >= st.tokens_forwarded);
    }
}

TEST_CASE("continuous batcher: the jobs' texts are nontrivial and differ, so the comparison above can fail") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    const std::vector<Case> cases = make_cases();
    const Result a = alone(*model, cases[1]), b = alone(*model, cases[2]);
    CHECK(a.text.size() > 20);
    CHECK(a.text != b.text);
    CHECK(alone(*model, cases[5]).stats.stop == StopReason::StopString);
}

TEST_CASE("continuous batcher: a consumer that goes away ends its own sequence only") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend(*model, 2, 64);
    ContinuousBatcher batcher(*model, backend, {.n_parallel = 2, .n_ctx = 256, .step_tokens = 64});
    int next = 0;
    std::map<size_t, GenerationStats> done;
    batcher.run(
        [&]() -> std::optional<BatchJob> {
            if (next == 2) return std::nullopt;
            BatchJob job;
            job.tag = static_cast<size_t>(next);
            job.prompt = model->tokenizer->encode("Once upon a time", true);
            job.params.n_predict = 30;
            job.params.sampler.temperature = 0.0f;
            const bool closes = next == 0;
            job.emit = [closes](std::string_view) { return !closes; };
            ++next;
            return job;
        },
        [&](BatchJob& job, GenerationStats& s) { done[job.tag] = s; });
    CHECK(done.at(0).stop == StopReason::OutputClosed);
    CHECK(done.at(1).stop == StopReason::Length);
    CHECK(done.at(1).n_generated == 30);
}

TEST_CASE("continuous batcher: a prompt longer than a slot's context is an error") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend(*model, 1, 64);
    ContinuousBatcher batcher(*model, backend, {.n_parallel = 2, .n_ctx = 4, .step_tokens = 64});
    bool given = false;
    CHECK_THROWS_AS(batcher.run(
                        [&]() -> std::optional<BatchJob> {
                            if (given) return std::nullopt;
                            given = true;
                            BatchJob job;
                            job.prompt = model->tokenizer->encode("Once upon a time there was", true);
                            job.emit = [](std::string_view) { return true; };
                            return job;
                        },
                        [](BatchJob&, GenerationStats&) {}),
                    Error);
}

TEST_CASE("continuous batcher: prompts that share a start run it once, and generate what they generate alone") {
    // A long shared start (a few-shot block) and different endings; one prompt repeats another whole. Budgets small
    // enough that later prompts wait for the first one's prefill and then copy it.
    const auto model = Model::load(kData + "/stories260K.gguf");
    const std::string shared =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, "
        "she saw a big, red ball in the park.";
    std::vector<Case> cases;
    const char* endings[] = {" She", " Her mom said", " The ball", " Lily", " She", " Then a dog came and"};
    for (int i = 0; i < 6; ++i) {
        Case c;
        c.prompt = shared + endings[i];
        c.params.n_predict = 12 + 3 * i;
        c.params.sampler.temperature = i % 2 ? 0.8f : 0.0f;
        c.params.sampler.seed = 7 + static_cast<uint64_t>(i);
        cases.push_back(c);
    }
    std::vector<Result> expected;
    long prompt_tokens = 0;
    for (const Case& c : cases) {
        expected.push_back(alone(*model, c));
        prompt_tokens += expected.back().stats.n_prompt;
    }
    const long shared_tokens = static_cast<long>(model->tokenizer->encode(shared, true).size());
    REQUIRE(shared_tokens > 40);
    for (const BatcherOptions options : {BatcherOptions{.n_parallel = 3, .n_ctx = 256, .step_tokens = 8},
                                         BatcherOptions{.n_parallel = 6, .n_ctx = 256, .step_tokens = 256},
                                         BatcherOptions{.n_parallel = 2, .n_ctx = 256, .step_tokens = 64}}) {
        CAPTURE(options.n_parallel);
        CAPTURE(options.step_tokens);
        BatcherStats st;
        const auto got = batched(*model, cases, options, nullptr, &st);
        long decode_forwards = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            CAPTURE(i);
            CHECK(got.at(i).text == expected[i].text);
            CHECK(got.at(i).stats.generated == expected[i].stats.generated);
            decode_forwards += got.at(i).stats.n_decode_forwards;
        }
        // Every prompt after the first starts from the shared part (most of it: tokenization at the seam may differ).
        MESSAGE("reused " << st.prefix_tokens_reused << " of " << prompt_tokens << " prompt tokens");
        CHECK(st.prefix_tokens_reused >= 5 * (shared_tokens - 2));
        CHECK(st.tokens_forwarded == prompt_tokens - st.prefix_tokens_reused + decode_forwards);
    }
}

TEST_CASE("continuous batcher: CPU caches copy a prefix bit for bit, and refuse what they cannot copy") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend(*model, 1, 64, {.kv_type = CpuKvType::F16});
    auto a = backend.new_cache(64), b = backend.new_cache(64);
    const std::vector<int> tokens = model->tokenizer->encode("Once upon a time there was a dog", true);
    backend.forward(tokens, *a, 0, nullptr);
    backend.forward(std::span<const int>(tokens).first(2), *b, 0, nullptr);
    CHECK_FALSE(b->copy_prefix(*a, a->n_committed() + 1));  // more than it holds
    CHECK(b->n_committed() == 2);
    REQUIRE(b->copy_prefix(*a, 5));
    CHECK(b->n_committed() == 5);
    const auto& ca = static_cast<const CpuKvCache&>(*a);
    const auto& cb = static_cast<const CpuKvCache&>(*b);
    for (int l = 0; l < model->config.n_layers; ++l)
        for (int p = 0; p < 5; ++p) CHECK(cb.same_position(ca, l, p));
    CpuBackend other(*model, 1, 64, {.kv_type = CpuKvType::F32});
    auto c = other.new_cache(64);
    CHECK_FALSE(c->copy_prefix(*a, 3));  // another storage type
    CHECK(c->n_committed() == 0);
}
