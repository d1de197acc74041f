// Drafting ahead (SpeculativeParams::draft_ahead): the draft drafts on while the target verifies, and a round that
// went as the draft guessed hands its next drafts to the next round. Checked on stories260K with the draft steps
// forced (the CPU backend computes in the call, so "auto" never drafts ahead there): greedy output equal to plain
// decoding, the draft's cache holding exactly the accepted tokens, an identical draft opening its rounds with what
// it drafted ahead, sampling still lossless (chi-square on the first token a carried draft can decide), and the
// controller's model of it. (A chat turn after drafting ahead: test_speculative.cpp's chat-turn case; the CUDA
// backend's deferred outputs, on which it runs for real: test_cuda_draft_ahead.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "backend_doubles.h"
#include "cpu/cpu_backend.h"
#include "generate/generator.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "spec_test_models.h"
#include "test_paths.h"

using namespace tandem;
using test::chi_square;
using test::drafts;

namespace {

const std::string kData = TANDEM_TEST_DATA;
const std::vector<int> kPrompt = {1, 403, 407, 261, 378};

GenerationParams params(int n, int k_min, int k_max, float p_min, int ahead) {
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0;
    p.speculative.draft_min = k_min;
    p.speculative.draft_max = k_max;
    p.speculative.p_min = p_min;
    p.speculative.draft_ahead = ahead;
    return p;
}

GenerationStats run(const Model& target, const Model* draft, const std::vector<int>& prompt, const GenerationParams& p,
                    int n_ctx = 256) {
    CpuBackend backend(target, 1, 64);
    auto cache = backend.new_cache(n_ctx);
    test::CpuDraft d(draft, n_ctx);
    Generator gen(target, backend, *cache, d.draft);
    return gen.generate(prompt, p, [](std::string_view) { return true; });
}

}  // namespace

TEST_CASE("draft ahead: greedy output equals plain decoding whatever the draft, k, p_min and the steps ahead") {
    auto target = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> plain = run(*target, nullptr, kPrompt, params(60, 0, 16, 0.6f, 0)).generated;
    REQUIRE(plain.size() == 60);
    struct Shape {
        int k_min, k_max;
        float p_min;
    };
    int64_t used = 0;
    for (const std::string& path : {kData + "/stories260K.gguf", drafts().q8_0, drafts().q4_0, drafts().sharp}) {
        auto draft = Model::load(path);
        for (const Shape s : {Shape{1, 1, 0.0f}, Shape{3, 3, 0.0f}, Shape{1, 8, 0.6f}, Shape{2, 16, 0.9f}})
            for (int ahead : {1, 2, 4, 17})
                for (bool lookup : {false, true}) {
                    GenerationParams p = params(60, s.k_min, s.k_max, s.p_min, ahead);
                    p.speculative.lookup = lookup;
                    const GenerationStats st = run(*target, draft.get(), kPrompt, p);
                    CAPTURE(path);
                    CAPTURE(s.k_max);
                    CAPTURE(s.p_min);
                    CAPTURE(ahead);
                    CAPTURE(lookup);
                    CHECK(st.generated == plain);
                    CHECK(st.spec.ahead_steps > 0);
                    used += st.spec.ahead_used;
                }
    }
    CHECK(used > 0);
}

TEST_CASE("draft ahead: an identical draft opens every round with the tokens it drafted ahead") {
    // Every proposal is accepted and every guess right, so after the first round the draft never drafts on its
    // own: each round's 3 proposals were drafted while the round before was verified.
    auto target = Model::load(kData + "/stories260K.gguf");
    const GenerationStats st = run(*target, target.get(), kPrompt, params(100, 3, 3, 0.0f, 4));
    CHECK(st.generated == run(*target, nullptr, kPrompt, params(100, 0, 3, 0.0f, 0)).generated);
    CHECK(st.spec.accepted == st.spec.drafted);
    CHECK(st.spec.plain_steps == 0);
    // 100 tokens: the first from the prefill, then rounds of 4 (the last shorter, the tokens wanted running out).
    CHECK(st.spec.rounds == 25);
    CHECK(st.spec.drafted == 3 * 24 + 2);
    CHECK(st.spec.ahead_used == st.spec.drafted - 3);  // all but the first round's
    // Without drafting ahead the same rounds, each drafted on its own.
    const GenerationStats off = run(*target, target.get(), kPrompt, params(100, 3, 3, 0.0f, 0));
    CHECK(off.generated == st.generated);
    CHECK(off.spec.rounds == st.spec.rounds);
    CHECK(off.spec.ahead_steps == 0);
    CHECK(off.spec.ahead_used == 0);
}

TEST_CASE("draft ahead: the draft's cache holds the accepted tokens, bit for bit a prefill of them") {
    // Drafts that agree to different degrees (the int8 export parts from the model after ~110 tokens; q4_0 now and
    // then), so that rounds end in rejections, in a full acceptance with a wrong guess and with a right one; k
    // chosen by the controller or fixed, drafting stopped by p_min or not. After the generation, the positions both
    // caches hold are the context's tokens in the draft's cache too. (A wrong token there would not change the
    // output, only the acceptance: the output checks cannot see it.)
    auto target = Model::load(kData + "/stories260K.gguf");
    struct Shape {
        int k_min, k_max;
        float p_min;
        int ahead;
    };
    for (const std::string& path : {drafts().q80bin, drafts().q4_0}) {
        CAPTURE(path);
        auto draft_model = Model::load(path);
        for (const Shape s : {Shape{2, 4, 0.0f, 3}, Shape{1, 4, 0.6f, 5}, Shape{1, 8, 0.9f, 9}})
            for (int n : {37, 180}) {
                CAPTURE(s.k_max);
                CAPTURE(s.p_min);
                CAPTURE(n);
                CpuBackend backend(*target, 1, 64), draft_backend(*draft_model, 1, 64);
                auto cache = backend.new_cache(256), draft_cache = draft_backend.new_cache(256);
                Generator gen(*target, backend, *cache, {draft_model.get(), &draft_backend, draft_cache.get()});
                const GenerationStats st = gen.generate(kPrompt, params(n, s.k_min, s.k_max, s.p_min, s.ahead),
                                                        [](std::string_view) { return true; });
                REQUIRE(st.spec.ahead_steps > 0);
                std::vector<int> context = kPrompt;
                context.insert(context.end(), st.generated.begin(), st.generated.end());
                const int held = std::min(cache->n_committed(), draft_cache->n_committed());
                REQUIRE(held > static_cast<int>(kPrompt.size()) + n / 2);
                REQUIRE(held <= static_cast<int>(context.size()));
                auto fresh = draft_backend.new_cache(256);
                std::vector<float> logits(static_cast<size_t>(draft_model->config.n_vocab));
                draft_backend.forward(std::span<const int>(context.data(), static_cast<size_t>(held)), *fresh, 1,
                                      logits.data());
                auto& a = static_cast<CpuKvCache&>(*draft_cache);
                auto& b = static_cast<CpuKvCache&>(*fresh);
                const ModelConfig& c = draft_model->config;
                int differing = 0;
                for (int l = 0; l < c.n_layers; ++l)
                    for (int pos = 0; pos < held; ++pos) differing += !a.same_position(b, l, pos);
                CHECK(differing == 0);
            }
    }
}

TEST_CASE("draft ahead: sampling at temperature > 0 stays lossless (exact chi-square on the 4th token)") {
    // One draft a round (k = 1): the first round verifies token 2 and adds token 3; when it accepts the draft and
    // token 3 is the draft's guess, token 4 is proposed from what was drafted ahead, with the distribution it was
    // drawn from. Token 4's exact marginal under the target alone, by enumerating the sampler's continuations.
    // (Rejection sampling is lossless for any proposal distribution used consistently, so what this guards is
    // that carried proposals really go through it with their own distribution: the draft's cache test above
    // guards what they were conditioned on.)
    auto target = Model::load(kData + "/stories260K.gguf");
    const std::vector<int> prompt = {1};
    SamplerParams sp;
    sp.temperature = 2.0f;  // broad: at 1.2 the 4th token of a story is nearly decided
    sp.top_k = 12;
    sp.top_p = 0.95f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.1f;
    CpuBackend backend(*target, 1, 64);
    Sampler exact(sp, 512);
    std::vector<float> logits(512), probs(512);
    auto cache = backend.new_cache(16);
    // Depth-first over the continuations, one cached forward per token: marginal[d] is token d + 1's.
    std::array<std::map<int, double>, 4> marginal;
    std::vector<int> ctx = prompt;
    auto walk = [&](auto&& self, double p_ctx, int depth) -> void {
        backend.forward(std::span<const int>(&ctx.back(), 1), *cache, 1, logits.data());
        exact.distribution(logits.data(), ctx, probs.data());
        std::vector<std::pair<int, double>> next;
        for (int t = 0; t < 512; ++t)
            if (probs[static_cast<size_t>(t)] > 0) next.push_back({t, probs[static_cast<size_t>(t)]});
        const int pos = cache->n_committed();
        for (const auto& [t, p] : next) {
            marginal[static_cast<size_t>(depth)][t] += p_ctx * p;
            if (depth + 1 < 4) {
                ctx.push_back(t);
                self(self, p_ctx * p, depth + 1);
                ctx.pop_back();
                cache->truncate(pos);
            }
        }
    };
    walk(walk, 1.0, 0);
    REQUIRE(marginal[3].size() >= 20);

    auto draft = Model::load(drafts().sharp);
    const int n_runs = 3000;
    std::map<int, int> fourth;
    int64_t used = 0, drafted = 0, accepted = 0;
    for (int seed = 0; seed < n_runs; ++seed) {
        GenerationParams p;
        p.n_predict = 5;  // the last token is never drafted: 5 lets the carried draft decide the 4th
        p.sampler = sp;
        p.sampler.seed = static_cast<uint64_t>(seed);
        p.speculative.draft_min = p.speculative.draft_max = 1;
        p.speculative.p_min = 0;
        p.speculative.draft_ahead = 2;
        const GenerationStats st = run(*target, draft.get(), prompt, p, 16);
        REQUIRE(st.generated.size() >= 4);
        ++fourth[st.generated[3]];
        used += st.spec.ahead_used;
        drafted += st.spec.drafted;
        accepted += st.spec.accepted;
    }
    INFO("drafted " << drafted << ", accepted " << accepted << ", from ahead " << used);
    CHECK(used > n_runs / 20);  // the carried path really decided many 4th tokens
    const auto [s, c] = chi_square(fourth, marginal[3], n_runs);
    INFO("chi-square token 4: " << s << " (critical " << c << ")");
    CHECK(s < c);
    // The same statistic rejects tokens drawn from the draft alone.
    std::map<int, int> draft_only;
    for (int seed = 0; seed < n_runs; ++seed) {
        GenerationParams p;
        p.n_predict = 4;
        p.sampler = sp;
        p.sampler.seed = static_cast<uint64_t>(seed);
        const GenerationStats st = run(*draft, nullptr, prompt, p, 16);
        REQUIRE(st.generated.size() == 4);
        ++draft_only[st.generated[3]];
    }
    const auto [n4, nc4] = chi_square(draft_only, marginal[3], n_runs);
    INFO("negative control, token 4: " << n4 << " (critical " << nc4 << ")");
    CHECK(n4 > nc4);
}

TEST_CASE("draft ahead: the controller counts on it, where drafting then pays and without it would not") {
    // A GPU-like pair (the default pair's shapes on an H200): a target step of 2.2 ms, each further verified token
    // 22% of it more, a draft step half a target step, 2 of every 3 drafts accepted. Without drafting ahead a
    // round of one draft expects 1.67 tokens for 1.1 + 2.68 ms (0.44 a ms, plain decoding 0.45); drafting ahead,
    // the next round's draft is carried 44% of the time, and the same round costs 0.61 + 2.68 ms (0.51 a ms).
    auto controller = [](bool ahead) {
        DraftLengthController c(0, 8);
        c.set_draft_ahead(ahead);
        for (int i = 0; i < 5; ++i) c.record_verify(1, 0.0022);
        for (int n = 2; n <= 9; ++n) c.record_verify(n, 0.0022 * (1.0 + 0.22 * (n - 1)));
        for (int i = 0; i < 30; ++i) c.record_round(3, 2, 3 * 0.0011, 3);
        return c;
    };
    DraftLengthController without = controller(false), with = controller(true);
    REQUIRE(std::abs(with.acceptance() - 2.0 / 3.0) < 0.02);
    CHECK(without.choose(8) == 0);
    CHECK(with.choose(8) >= 1);
}
