// Backend::forward_batch, the step of continuous batching: several sequences' tokens in one call, each against its own
// KV cache, must give every position the logits it gets when its sequence runs alone. On the CPU bitwise, for every
// architecture fixture (sliding windows, QK-norm, biases, soft-caps...) and every KV type, through the schedules a
// batch makes: sequences that join late, prefill chunks beside decode steps, a slice cut between two internal steps,
// a finished sequence's cache emptied and refilled by a new one. On the (emulated) CUDA backend, against its own
// single-sequence calls of the same sizes.
#include <cstring>
#include <doctest/doctest.h>
#include <functional>
#include <memory>
#include <vector>

#include "common/architecture_fixtures.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "model/model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kArch = std::string(TANDEM_TEST_DATA) + "/arch";

// A sequence of the schedule: its tokens, and the step at which it joins.
struct Sequence {
    std::vector<int> tokens;
    int joins = 0;
};

// Sequences of different lengths over the fixture's vocabulary; the last one joins only after the first has finished
// and takes over its cache (a slot refilled).
std::vector<Sequence> make_sequences(int n_vocab) {
    const int lengths[] = {37, 5, 60, 23, 41};
    const int joins[] = {0, 0, 2, 5, 0};
    std::vector<Sequence> seqs;
    for (int s = 0; s < 5; ++s) {
        Sequence q;
        for (int i = 0; i < lengths[s]; ++i) q.tokens.push_back(3 + (i * 7919 + s * 104729) % (n_vocab - 3));
        q.joins = joins[s];
        seqs.push_back(q);
    }
    return seqs;
}

// How many tokens sequence s feeds at a step: prefill chunks of 7 for the first 14 tokens (logits of every token, so
// that each position is compared), one token a step after that (decode).
int step_size(size_t done, size_t total) {
    const size_t n = done < 14 ? 7 : 1;
    return static_cast<int>(std::min(n, total - done));
}

// The logits of every position of every sequence, run as a batch: each step gathers the active sequences' next
// slices into one forward_batch call. Sequence 4 runs in sequence 0's cache once sequence 0 is done (the cache is
// emptied first). calls[s] records the sizes of s's slices, so that the single-sequence runs can repeat them.
std::vector<std::vector<float>> run_batched(Backend& backend, const std::vector<Sequence>& seqs, int n_vocab, int n_ctx,
                                            std::vector<std::vector<int>>& calls) {
    const size_t V = static_cast<size_t>(n_vocab);
    std::vector<std::unique_ptr<KvCache>> caches;
    for (int s = 0; s < 4; ++s) caches.push_back(backend.new_cache(n_ctx));
    std::vector<std::vector<float>> logits(seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) logits[s].resize(seqs[s].tokens.size() * V);
    calls.assign(seqs.size(), {});
    std::vector<size_t> done(seqs.size(), 0);
    bool seq4_started = false;
    for (int step = 0;; ++step) {
        std::vector<SequenceSlice> slices;
        std::vector<size_t> owners;
        for (size_t s = 0; s < seqs.size(); ++s) {
            if (step < seqs[s].joins || done[s] == seqs[s].tokens.size()) continue;
            KvCache* cache = caches[s == 4 ? 0 : s].get();
            if (s == 4) {
                if (done[0] < seqs[0].tokens.size()) continue;  // waits for sequence 0's slot
                if (!seq4_started) cache->truncate(0);
                seq4_started = true;
            }
            const int n = step_size(done[s], seqs[s].tokens.size());
            slices.push_back({std::span<const int>(seqs[s].tokens).subspan(done[s], static_cast<size_t>(n)), cache, n,
                              logits[s].data() + done[s] * V});
            owners.push_back(s);
            calls[s].push_back(n);
        }
        if (slices.empty()) break;
        backend.forward_batch(slices);
        for (size_t i = 0; i < owners.size(); ++i) done[owners[i]] += slices[i].tokens.size();
    }
    return logits;
}

// Each sequence alone in a fresh cache, in calls of the given sizes.
std::vector<float> run_alone(Backend& backend, const Sequence& seq, const std::vector<int>& calls, int n_vocab,
                             int n_ctx) {
    const size_t V = static_cast<size_t>(n_vocab);
    auto cache = backend.new_cache(n_ctx);
    std::vector<float> logits(seq.tokens.size() * V);
    size_t at = 0;
    for (int n : calls) {
        backend.forward(std::span<const int>(seq.tokens).subspan(at, static_cast<size_t>(n)), *cache, n,
                        logits.data() + at * V);
        at += static_cast<size_t>(n);
    }
    REQUIRE(at == seq.tokens.size());
    return logits;
}

void check_batch_matches_alone(const std::function<std::unique_ptr<Backend>(const Model&)>& make_backend,
                               const std::vector<int>& alone_call_sizes, const std::vector<std::string>& names) {
    for (const std::string& name : names) {
        CAPTURE(name);
        const auto model = Model::load(kArch + "/" + name + ".gguf");
        const int n_vocab = model->config.n_vocab, n_ctx = 128;
        const std::vector<Sequence> seqs = make_sequences(n_vocab);
        auto backend = make_backend(*model);
        std::vector<std::vector<int>> calls;
        const auto batched = run_batched(*backend, seqs, n_vocab, n_ctx, calls);
        for (size_t s = 0; s < seqs.size(); ++s) {
            CAPTURE(s);
            const std::vector<int> sizes =
                alone_call_sizes.empty() ? calls[s] : std::vector<int>(seqs[s].tokens.size(), alone_call_sizes[0]);
            const auto alone = run_alone(*backend, seqs[s], sizes, n_vocab, n_ctx);
            CHECK(std::memcmp(alone.data(), batched[s].data(), alone.size() * sizeof(float)) == 0);
        }
    }
}

}  // namespace

TEST_CASE("batched forward: on the CPU every position's logits are bitwise those of its sequence alone") {
    // Alone one token at a time: the CPU's logits do not depend on how a sequence is chunked either. A max_batch of
    // 16 cuts the batch's larger steps (up to 4 × 7 tokens) into two internal steps, a slice across both.
    for (const CpuKvType kv : {CpuKvType::F32, CpuKvType::F16, CpuKvType::Q8_0}) {
        CAPTURE(static_cast<int>(kv));
        check_batch_matches_alone(
            [kv](const Model& m) { return std::make_unique<CpuBackend>(m, 2, 16, CpuBackendOptions{.kv_type = kv}); },
            {1}, architecture_fixture_names());
    }
}

TEST_CASE("batched forward: the CPU backend's batch of many decode steps matches each sequence decoding alone") {
    // Eight sequences decoding together after prefills of different lengths: one token each per step, positions
    // far apart in the same step.
    const auto model = Model::load(kArch + "/qwen3.gguf");
    const int n_vocab = model->config.n_vocab, n_ctx = 96;
    CpuBackend backend(*model, 2, 64, {.kv_type = CpuKvType::F16});
    const size_t V = static_cast<size_t>(n_vocab);
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<std::vector<int>> prompts;
    for (int s = 0; s < 8; ++s) {
        caches.push_back(backend.new_cache(n_ctx));
        std::vector<int> p;
        for (int i = 0; i < 3 + 9 * s; ++i) p.push_back(3 + (i * 31 + s * 977) % (n_vocab - 3));
        prompts.push_back(p);
        backend.forward(p, *caches.back(), 0, nullptr);
    }
    std::vector<float> batched(8 * V), alone(V);
    std::vector<int> next(8);
    for (int s = 0; s < 8; ++s) next[static_cast<size_t>(s)] = 5 + s;
    for (int step = 0; step < 6; ++step) {
        std::vector<SequenceSlice> slices;
        for (int s = 0; s < 8; ++s)
            slices.push_back({std::span<const int>(&next[static_cast<size_t>(s)], 1),
                              caches[static_cast<size_t>(s)].get(), 1, batched.data() + static_cast<size_t>(s) * V});
        backend.forward_batch(slices);
        for (int s = 0; s < 8; ++s) {
            CAPTURE(step);
            CAPTURE(s);
            // The same sequence alone: a fresh cache fed its prompt and the tokens so far one by one.
            auto own = backend.new_cache(n_ctx);
            std::vector<int> seq = prompts[static_cast<size_t>(s)];
            backend.forward(seq, *own, 0, nullptr);
            for (int t = 0; t < step; ++t) {
                const int tok = 5 + s + 11 * t;
                backend.forward(std::span<const int>(&tok, 1), *own, 0, nullptr);
            }
            backend.forward(std::span<const int>(&next[static_cast<size_t>(s)], 1), *own, 1, alone.data());
            CHECK(std::memcmp(alone.data(), batched.data() + static_cast<size_t>(s) * V, V * sizeof(float)) == 0);
        }
        for (int s = 0; s < 8; ++s) next[static_cast<size_t>(s)] = 5 + s + 11 * (step + 1);
    }
}

TEST_CASE("batched forward: the emulated CUDA backend gives each sequence its single-sequence logits") {
    // Against the same backend's forward calls of the same sizes (short calls: its bitwise-invariant matvec path).
    // Two fixtures (the emulation is slow): qwen3's QK-norm and gemma3's sliding windows (window 5, rings).
    check_batch_matches_alone([](const Model& m) { return std::make_unique<CudaBackend>(m, 128); }, {},
                              {"qwen3", "gemma3"});
}
