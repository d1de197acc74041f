// The seed promise (README: "the same seed gives the same output"): sampled output is byte-identical, for several
// seeds and prompts, across plain decoding, a draft at every fixed length 1..16 and the adaptive controller, prompt
// lookup, drafting ahead, prefill chunks of 1 and 256, 1 and 2 threads, candidates and whole rows, and the emulated
// CUDA backend; on stories260K with drafts that agree to different degrees and on synthetic qwen2-shaped models
// with random weights (broad distributions). Rejection sampling keeps a seed's output where the draft lengths are
// fixed, and only there. Exactness in distribution is test_speculative.cpp's chi-square test.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/synthetic_model.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "generate/generator.h"
#include "model/model.h"
#include "spec_test_models.h"
#include "test_paths.h"

using namespace tandem;
using test::drafts;

namespace {

const std::string kData = TANDEM_TEST_DATA;

enum class Kind { Cpu, Cuda };

// What the runs drafted and accepted, summed: the equalities below must not hold merely because nothing was drafted.
struct Tally {
    int64_t drafted = 0, accepted = 0;
};
Tally tally;

// Generates from `prompt` with `target` (and `draft`, if given) on the backend `kind` with `threads` CPU threads;
// returns the generated ids.
std::vector<int> generate(const Model& target, const Model* draft, const std::vector<int>& prompt,
                          const GenerationParams& params, Kind kind = Kind::Cpu, int threads = 1) {
    auto make = [&](const Model& m) -> std::unique_ptr<Backend> {
        if (kind == Kind::Cuda) return std::make_unique<CudaBackend>(m, 256);
        return std::make_unique<CpuBackend>(m, threads, 256);
    };
    std::unique_ptr<Backend> backend = make(target), draft_backend;
    auto cache = backend->new_cache(256);
    std::unique_ptr<KvCache> draft_cache;
    DraftModel d;
    if (draft) {
        draft_backend = make(*draft);
        draft_cache = draft_backend->new_cache(256);
        d = {draft, draft_backend.get(), draft_cache.get()};
    }
    Generator gen(target, *backend, *cache, d);
    const GenerationStats st = gen.generate(prompt, params, [](std::string_view) { return true; });
    tally.drafted += st.spec.drafted;
    tally.accepted += st.spec.accepted;
    return st.generated;
}

GenerationParams sampled(uint64_t seed, int n, float temperature = 0.9f) {
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = temperature;
    p.sampler.seed = seed;
    p.sampler.repeat_penalty = 1.1f;  // a penalty that sees the drafts, as verification must apply it
    return p;
}

GenerationParams fixed_length(GenerationParams p, int k) {
    p.speculative.draft_min = p.speculative.draft_max = k;
    p.speculative.p_min = 0;
    return p;
}

// A synthetic qwen2-shaped model (random weights, 320 ids), written once per test run.
const Model& synthetic(const std::string& name, GgmlType type, uint64_t seed) {
    static std::vector<std::pair<std::string, std::unique_ptr<Model>>> loaded;
    for (auto& [n, m] : loaded)
        if (n == name) return *m;
    const std::string path = drafts().dir + "/synthetic-" + name + ".gguf";
    write_synthetic_model(path, {name, 64, 128, 2, 4, 2, 320, 256, false, "qwen2"}, type, seed);
    loaded.emplace_back(name, Model::load(path));
    return *loaded.back().second;
}

}  // namespace

TEST_CASE("seeded sampling: a seed gives plain decoding's text with any draft, draft length, lookup and chunking") {
    auto target = Model::load(kData + "/stories260K.gguf");
    auto q8 = Model::load(drafts().q8_0);     // agrees almost everywhere
    auto sharp = Model::load(drafts().sharp);  // overconfident: many rejections
    const std::vector<std::vector<int>> prompts = {{1}, {1, 403, 407, 261, 378}};
    int64_t differing_seeds = 0;
    tally = {};
    for (const std::vector<int>& prompt : prompts)
        for (uint64_t seed : {1ull, 7ull, 4242ull}) {
            CAPTURE(prompt.size());
            CAPTURE(seed);
            const GenerationParams base = sampled(seed, 40);
            const std::vector<int> want = generate(*target, nullptr, prompt, base);
            REQUIRE(want.size() == 40);
            differing_seeds += want != generate(*target, nullptr, prompt, sampled(seed + 1, 40));
            for (const Model* draft : {q8.get(), sharp.get()}) {
                for (int k = 1; k <= 16; ++k) {
                    CAPTURE(k);
                    CHECK(generate(*target, draft, prompt, fixed_length(base, k)) == want);
                }
                CHECK(generate(*target, draft, prompt, base) == want);  // the adaptive controller, p_min 0.6
                GenerationParams ahead = fixed_length(base, 4);
                ahead.speculative.draft_ahead = 3;
                CHECK(generate(*target, draft, prompt, ahead) == want);
                GenerationParams restricted = base;
                restricted.speculative.draft_vocab = 200;
                CHECK(generate(*target, draft, prompt, restricted) == want);
            }
            GenerationParams lookup = base;
            lookup.speculative.lookup = true;
            CHECK(generate(*target, nullptr, prompt, lookup) == want);
            lookup.speculative.draft_min = 2;  // lookup forced to propose whenever it matches
            CHECK(generate(*target, nullptr, prompt, lookup) == want);
            CHECK(generate(*target, q8.get(), prompt, lookup) == want);
            for (int chunk : {1, 256}) {
                GenerationParams c = base;
                c.chunk = chunk;
                CHECK(generate(*target, nullptr, prompt, c) == want);
                CHECK(generate(*target, sharp.get(), prompt, fixed_length(c, 3)) == want);
            }
            GenerationParams whole = fixed_length(base, 5);
            whole.whole_rows = true;
            CHECK(generate(*target, q8.get(), prompt, whole) == want);
        }
    CHECK(differing_seeds == 6);  // the seeds matter: the equalities above are not of one fixed text
    INFO(tally.accepted << " of " << tally.drafted << " drafted tokens accepted");
    CHECK(tally.drafted > 5000);
    CHECK(tally.accepted < tally.drafted * 9 / 10);  // many rejections: the corrections were the plain tokens too
    CHECK(tally.accepted > tally.drafted / 4);
}

TEST_CASE("seeded sampling: threads and the emulated CUDA backend give the same text for a seed") {
    auto target = Model::load(kData + "/stories260K.gguf");
    auto q4 = Model::load(drafts().q4_0);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    for (uint64_t seed : {3ull, 99ull}) {
        CAPTURE(seed);
        const GenerationParams base = sampled(seed, 32);
        const std::vector<int> want = generate(*target, nullptr, prompt, base);
        CHECK(generate(*target, nullptr, prompt, base, Kind::Cpu, 2) == want);
        CHECK(generate(*target, q4.get(), prompt, fixed_length(base, 4), Kind::Cpu, 2) == want);
    }
    // The emulated device (slow: one seed, fewer tokens): the same kernels a GPU runs, whose logits stay within
    // rounding of the CPU backend's (test_cuda_backend); Gumbel-max picks differently only where two perturbed
    // scores come that close.
    const GenerationParams base = sampled(3, 20);
    const std::vector<int> want = generate(*target, nullptr, prompt, base);
    const std::vector<int> on_device = generate(*target, nullptr, prompt, base, Kind::Cuda);
    CHECK(on_device == want);
    tally = {};
    CHECK(generate(*target, q4.get(), prompt, fixed_length(base, 3), Kind::Cuda) == on_device);
    CHECK(generate(*target, q4.get(), prompt, base, Kind::Cuda) == on_device);
    CHECK(tally.drafted > 10);
}

TEST_CASE("seeded sampling: synthetic models with broad distributions keep the seed's text under drafting") {
    // Random weights: distributions far flatter than a trained model's, and a draft (the target requantized to
    // q4_0) that disagrees often, so many positions are sampled from wide kept sets and many drafts are rejected.
    const Model& target = synthetic("target", GgmlType::Q8_0, 5);
    const Model& draft = synthetic("draft", GgmlType::Q4_0, 5);
    const Model& other = synthetic("other", GgmlType::Q8_0, 6);  // another model entirely: almost no agreement
    const std::vector<int> prompt = {1, 10, 20, 30};
    tally = {};
    for (uint64_t seed : {11ull, 12ull}) {
        for (float temperature : {0.3f, 1.0f, 1.5f}) {
            CAPTURE(seed);
            CAPTURE(temperature);
            GenerationParams base = sampled(seed, 48, temperature);
            base.sampler.top_k = 0;  // the whole vocabulary kept (top-p and min-p still cut)
            const std::vector<int> want = generate(target, nullptr, prompt, base);
            for (int k : {1, 2, 5, 8, 16}) {
                CAPTURE(k);
                CHECK(generate(target, &draft, prompt, fixed_length(base, k)) == want);
                CHECK(generate(target, &other, prompt, fixed_length(base, k)) == want);
            }
            CHECK(generate(target, &draft, prompt, base) == want);
            GenerationParams chunked = fixed_length(base, 3);
            chunked.chunk = 1;
            CHECK(generate(target, &draft, prompt, chunked) == want);
        }
    }
    INFO(tally.accepted << " of " << tally.drafted << " drafted tokens accepted");
    CHECK(tally.drafted > 1000);
    CHECK(tally.accepted > tally.drafted / 10);  // the requantized draft agrees often,
    CHECK(tally.accepted < tally.drafted / 2);   // and the other model hardly ever
}

TEST_CASE("seeded sampling: rejection sampling reproduces a seed at fixed draft lengths, and differs from plain") {
    auto target = Model::load(kData + "/stories260K.gguf");
    auto sharp = Model::load(drafts().sharp);
    const std::vector<int> prompt = {1};
    int differs_from_plain = 0, differs_by_length = 0;
    for (uint64_t seed : {1ull, 2ull, 3ull, 4ull}) {
        GenerationParams p = sampled(seed, 40);
        p.speculative.sampling = SpecSampling::Rejection;
        const std::vector<int> plain = generate(*target, nullptr, prompt, p);
        const std::vector<int> k3 = generate(*target, sharp.get(), prompt, fixed_length(p, 3));
        CHECK(generate(*target, sharp.get(), prompt, fixed_length(p, 3)) == k3);       // the same schedule: the same
        CHECK(generate(*target, sharp.get(), prompt, fixed_length(p, 3), Kind::Cpu, 2) == k3);  // text, any threads
        differs_from_plain += k3 != plain;
        differs_by_length += generate(*target, sharp.get(), prompt, fixed_length(p, 5)) != k3;
    }
    // What the README says of it: the text depends on where rounds begin, so on the draft lengths.
    CHECK(differs_from_plain > 0);
    CHECK(differs_by_length > 0);
}
