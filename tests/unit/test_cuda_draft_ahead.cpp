// Drafting ahead on the CUDA backend (SpeculativeParams::draft_ahead; the generator's side is test_draft_ahead.cpp):
// its deferred outputs (pinned staging, delivered by collect_outputs), target and draft both on the device with
// the target's outputs deferred, and a draft failing mid-verification. Built into tandem_tests (emulated) and
// tandem_cuda_device_tests (a real GPU, where the two streams really overlap).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "device.h"
#include "error.h"
#include "generate/generator.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "model/model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;
const std::vector<int> kPrompt = {1, 403, 407, 261, 378};

GenerationParams greedy_ahead(int n, int k, int ahead) {
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0;
    p.speculative.draft_min = p.speculative.draft_max = k;
    p.speculative.p_min = 0;
    p.speculative.draft_ahead = ahead;
    return p;
}

}  // namespace

TEST_CASE("cuda backend: deferred outputs arrive at collect_outputs, the same bytes as immediate ones") {
    // A GPU queues the work and copies the outputs back into pinned staging; the emulation runs the kernels in the
    // call but stages the outputs the same way. Several calls queue before one collect, and a call with whole rows
    // of logits outgrows the first staging buffer.
    auto model = Model::load(kData + "/stories260K.gguf");
    const int n_vocab = model->config.n_vocab;
    const float kNaN = std::numeric_limits<float>::quiet_NaN();
    CudaBackend gpu(*model, 64);
    CHECK(gpu.computes_in_background() == !cuda::device_is_emulated());  // emulated: the work is done in the call
    auto now = gpu.new_cache(64), later = gpu.new_cache(64);
    std::vector<float> scratch(static_cast<size_t>(6) * n_vocab);
    std::vector<float> rows_now(scratch.size()), rows_later(scratch.size(), kNaN);
    gpu.forward(kPrompt, *now, 5, rows_now.data());
    gpu.defer_outputs();
    gpu.forward(kPrompt, *later, 5, rows_later.data());
    if (cuda::device_is_emulated()) CHECK(gpu.outputs_ready());  // a GPU may still be at it
    CHECK(std::isnan(rows_later[0]));  // not written before the collect
    gpu.collect_outputs();
    CHECK(std::memcmp(rows_now.data(), rows_later.data(), static_cast<size_t>(5) * n_vocab * sizeof(float)) == 0);

    const std::vector<int> verify = {432, 383, 286, 99};
    std::vector<int> ids_now(4), ids_later(4, -7), conf_ids_now(1), conf_ids_later(1, -7);
    std::vector<float> top_now(1), top_later(1, kNaN);
    const int k = 5;
    const std::vector<int> extra = {3, 17};
    std::vector<float> cand_now(4 * k), cand_later(4 * k, kNaN), extra_now(4 * 2), extra_later(4 * 2, kNaN);
    std::vector<int> cand_ids_now(4 * k), cand_ids_later(4 * k, -7);
    // 40 rows of logits: 80 KiB, past the first staging buffer of 64 KiB, queued behind the calls before it.
    std::vector<int> long_call(40);
    for (int i = 0; i < 40; ++i) long_call[static_cast<size_t>(i)] = (i * 37 + 11) % n_vocab;
    std::vector<float> big_now(static_cast<size_t>(40) * n_vocab), big_later(big_now.size(), kNaN);
    auto calls = [&](KvCache& cache, int* ids, int* conf_ids, float* top, float* cand, int* cand_ids, float* ex,
                     float* big) {
        const int committed = cache.n_committed();
        gpu.forward_argmax(verify, cache, 4, ids, scratch);
        cache.truncate(committed);
        gpu.forward_argmax_confidence(std::span<const int>(verify.data(), 1), cache, 1, conf_ids, top, scratch);
        cache.truncate(committed);
        gpu.forward_candidates(verify, cache, 4, k, extra, cand, cand_ids, ex, scratch);
        cache.truncate(committed);
        gpu.forward(long_call, cache, 40, big);
    };
    calls(*now, ids_now.data(), conf_ids_now.data(), top_now.data(), cand_now.data(), cand_ids_now.data(),
          extra_now.data(), big_now.data());
    gpu.defer_outputs();
    calls(*later, ids_later.data(), conf_ids_later.data(), top_later.data(), cand_later.data(), cand_ids_later.data(),
          extra_later.data(), big_later.data());
    gpu.collect_outputs();
    CHECK(ids_later == ids_now);
    CHECK(conf_ids_later == conf_ids_now);
    CHECK(std::memcmp(top_later.data(), top_now.data(), sizeof(float)) == 0);
    CHECK(std::memcmp(cand_later.data(), cand_now.data(), cand_now.size() * sizeof(float)) == 0);
    CHECK(cand_ids_later == cand_ids_now);
    CHECK(std::memcmp(extra_later.data(), extra_now.data(), extra_now.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(big_later.data(), big_now.data(), big_now.size() * sizeof(float)) == 0);
    // Collecting with nothing deferred changes nothing; a later call writes in the call again.
    gpu.collect_outputs();
    std::vector<int> again(1, -7);
    gpu.forward_argmax(std::span<const int>(verify.data(), 1), *later, 1, again.data(), scratch);
    CHECK(again[0] >= 0);
}

TEST_CASE("cuda backend: target and draft on the device, drafting ahead keeps the greedy output") {
    // The generator's configuration on a GPU (both models on the device, the target's outputs deferred while the
    // draft's steps run on their own stream), forced, so that the emulation (which computes in the call) takes the
    // same path. The target is its own draft, so every guess is right.
    // With the target's stream at the device's greatest priority (CudaOptions::high_priority, the CLI's default) and
    // without.
    auto model = Model::load(kData + "/stories260K.gguf");
    auto generate = [&](bool speculative, int ahead, bool priority) {
        CudaOptions target_options;
        target_options.high_priority = priority;
        CudaBackend target(*model, 64, {}, target_options), draft(*model, 64);
        CHECK(target.stream_high_priority() == priority);  // every GPU since sm_35 has priorities
        CHECK_FALSE(draft.stream_high_priority());
        auto cache = target.new_cache(64), draft_cache = draft.new_cache(64);
        GenerationParams p = greedy_ahead(14, 3, ahead);
        Generator gen(*model, target, *cache,
                      speculative ? DraftModel{model.get(), &draft, draft_cache.get()} : DraftModel{});
        return gen.generate(kPrompt, p, [](std::string_view) { return true; });
    };
    const GenerationStats plain = generate(false, 0, false);
    for (const bool priority : {true, false}) {
        CAPTURE(priority);
        const GenerationStats ahead = generate(true, 4, priority);
        CHECK(ahead.generated == plain.generated);
        CHECK(ahead.spec.accepted == ahead.spec.drafted);
        CHECK(ahead.spec.ahead_used == ahead.spec.drafted - 3);
    }
}

TEST_CASE("cuda backend: under a grammar, drafting (ahead) on the device keeps constrained plain decoding's output") {
    // Target and draft on the device as above, the rows masked on the host: every verification row and draft row,
    // deferred or not, is masked with its own state. Greedy and coupled sampling, drafting ahead forced and not.
    auto model = Model::load(kData + "/stories260K.gguf");
    const grammar::TokenConstraint grammar(grammar::parse_gbnf("root ::= [^e]*"),
                                           model->tokenizer->token_bytes_table(model->config.n_vocab),
                                           {model->tokenizer->eos()});
    auto generate = [&](bool speculative, int ahead, float temp) {
        CudaBackend target(*model, 64), draft(*model, 64);
        auto cache = target.new_cache(64), draft_cache = draft.new_cache(64);
        GenerationParams p = greedy_ahead(30, 3, ahead);
        p.sampler.temperature = temp;
        p.sampler.seed = 5;
        grammar::TokenConstraint state = grammar;
        p.constraint = &state;
        Generator gen(*model, target, *cache,
                      speculative ? DraftModel{model.get(), &draft, draft_cache.get()} : DraftModel{});
        std::string text;
        GenerationStats st = gen.generate(kPrompt, p, [&](std::string_view t) {
            text += t;
            return true;
        });
        CHECK(text.find('e') == std::string::npos);
        return st;
    };
    for (const float temp : {0.0f, 0.8f}) {
        CAPTURE(temp);
        const GenerationStats plain = generate(false, 0, temp);
        for (const int ahead : {0, 4}) {
            CAPTURE(ahead);
            const GenerationStats spec = generate(true, ahead, temp);
            CHECK(spec.generated == plain.generated);
            CHECK(spec.spec.drafted > 0);
            CHECK(spec.spec.accepted == spec.spec.drafted);  // the target is its own draft, masked alike
        }
    }
}

TEST_CASE("cuda backend: a draft that fails while the target verifies leaves the target writing its outputs again") {
    // The target's verification is deferred when the draft throws: the error reaches the caller, and the target's
    // next call (a REPL's next turn) writes its outputs in the call, not into a staging nobody collects.
    auto model = Model::load(kData + "/stories260K.gguf");
    class FailingDraft : public Backend {
    public:
        FailingDraft(const Model& m, int fail_at) : inner_(m, 1, 64), fail_at_(fail_at) {}
        std::string name() const override { return "failing"; }
        std::unique_ptr<KvCache> new_cache(int n_ctx) override { return inner_.new_cache(n_ctx); }
        void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override {
            if (++calls_ == fail_at_) throw Error("the draft failed");
            inner_.forward(tokens, cache, n_logits, logits);
        }

    private:
        CpuBackend inner_;
        int calls_ = 0, fail_at_;
    };
    CudaBackend target(*model, 64);
    // The draft's calls: the catch-up forward of the prompt's cur, 2 more drafts (k = 3), then the ahead steps.
    FailingDraft draft(*model, 4);
    auto cache = target.new_cache(64), draft_cache = draft.new_cache(64);
    Generator gen(*model, target, *cache, {model.get(), &draft, draft_cache.get()});
    CHECK_THROWS_WITH_AS(gen.generate(kPrompt, greedy_ahead(20, 3, 4), [](std::string_view) { return true; }),
                         "the draft failed", Error);
    CHECK(target.outputs_ready());
    std::vector<int> id(1, -7);
    std::vector<float> scratch(static_cast<size_t>(model->config.n_vocab));
    cache->truncate(0);
    target.forward_argmax(std::span<const int>(kPrompt.data(), 1), *cache, 1, id.data(), scratch);
    CHECK(id[0] >= 0);
}

