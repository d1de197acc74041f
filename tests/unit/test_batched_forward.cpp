// Backend::forward_batch, the step of continuous batching: several sequences' tokens in one call, each against its own
// KV cache, must give every position the logits it gets when its sequence runs alone. On the CPU bitwise, for every
// architecture fixture (sliding windows, QK-norm, biases, soft-caps...) and every KV type, through the schedules a
// batch makes: sequences that join late, prefill chunks beside decode steps, a slice cut between two internal steps,
// a finished sequence's cache emptied and refilled by a new one. On the (emulated) CUDA backend, against its own
// single-sequence calls of the same sizes: bitwise on its matvec path (steps of at most matvec_max_call tokens, the
// 8-bit route and its fused epilogues, either KV type, more sequences than a step holds), within tolerance where a
// step takes the prefill GEMM; and each matrix launched once per step, not once per sequence.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/architecture_fixtures.h"
#include "convert/quantize_model.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "emu/cuda_emu.h"
#include "gguf/gguf.h"
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
// that each position is compared, unless a test asks for the last one's only, as a prompt's prefill does), one token
// a step after that (decode).
int step_size(size_t done, size_t total) {
    const size_t n = done < 14 ? 7 : 1;
    return static_cast<int>(std::min(n, total - done));
}

// The logits a call of n tokens asks for: every token's, or (a prompt's prefill) the last one's.
int logits_wanted(int n, bool all_logits) { return all_logits ? n : std::min(n, 1); }

// The logits of every position of every sequence, run as a batch: each step gathers the active sequences' next
// slices into one forward_batch call. Sequence 4 runs in sequence 0's cache once sequence 0 is done (the cache is
// emptied first). calls[s] records the sizes of s's slices, so that the single-sequence runs can repeat them.
std::vector<std::vector<float>> run_batched(Backend& backend, const std::vector<Sequence>& seqs, int n_vocab, int n_ctx,
                                            std::vector<std::vector<int>>& calls, bool all_logits = true) {
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
            const int n = step_size(done[s], seqs[s].tokens.size()), wanted = logits_wanted(n, all_logits);
            slices.push_back({std::span<const int>(seqs[s].tokens).subspan(done[s], static_cast<size_t>(n)), cache,
                              wanted, logits[s].data() + (done[s] + static_cast<size_t>(n - wanted)) * V});
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
                             int n_ctx, bool all_logits = true) {
    const size_t V = static_cast<size_t>(n_vocab);
    auto cache = backend.new_cache(n_ctx);
    std::vector<float> logits(seq.tokens.size() * V);
    size_t at = 0;
    for (int n : calls) {
        const int wanted = logits_wanted(n, all_logits);
        backend.forward(std::span<const int>(seq.tokens).subspan(at, static_cast<size_t>(n)), *cache, wanted,
                        logits.data() + (at + static_cast<size_t>(n - wanted)) * V);
        at += static_cast<size_t>(n);
    }
    REQUIRE(at == seq.tokens.size());
    return logits;
}

using MakeBackend = std::function<std::unique_ptr<Backend>(const Model&)>;

// How a batched run is held to the single-sequence runs (check_model_batch_matches_alone).
struct BatchCheck {
    std::vector<int> alone_call_sizes;  // empty: the batch's own slice sizes; {n}: calls of n tokens
    bool all_logits = true;             // false: chunks of several tokens ask for their last token's logits only
    double tolerance = 0.0;             // 0: bitwise; else the largest |batched - alone| / the row's logit range
    std::function<void(Backend&)> after_batch;  // checks on the backend after the batched run
};

// The largest |a - b| of a row over the row's logit range, over every row that either wrote (rows neither wrote
// stay zero in both).
double worst_relative(const std::vector<float>& a, const std::vector<float>& b, size_t n_vocab) {
    double worst = 0.0;
    for (size_t r = 0; r * n_vocab < a.size(); ++r) {
        const float* x = a.data() + r * n_vocab;
        const float* y = b.data() + r * n_vocab;
        const auto [lo, hi] = std::minmax_element(y, y + n_vocab);
        const double range = std::max(1e-30, static_cast<double>(*hi) - *lo);
        for (size_t i = 0; i < n_vocab; ++i)
            worst = std::max(worst, std::fabs(static_cast<double>(x[i]) - y[i]) / range);
    }
    return worst;
}

void check_model_batch_matches_alone(const Model& model, const MakeBackend& make_backend, const BatchCheck& check) {
    const int n_vocab = model.config.n_vocab, n_ctx = 128;
    const std::vector<Sequence> seqs = make_sequences(n_vocab);
    auto backend = make_backend(model);
    std::vector<std::vector<int>> calls;
    const auto batched = run_batched(*backend, seqs, n_vocab, n_ctx, calls, check.all_logits);
    if (check.after_batch) check.after_batch(*backend);
    double worst_of_all = 0.0;
    for (size_t s = 0; s < seqs.size(); ++s) {
        CAPTURE(s);
        const std::vector<int> sizes = check.alone_call_sizes.empty()
                                           ? calls[s]
                                           : std::vector<int>(seqs[s].tokens.size(), check.alone_call_sizes[0]);
        const auto alone = run_alone(*backend, seqs[s], sizes, n_vocab, n_ctx, check.all_logits);
        if (check.tolerance == 0.0) {
            CHECK(std::memcmp(alone.data(), batched[s].data(), alone.size() * sizeof(float)) == 0);
        } else {
            const double worst = worst_relative(batched[s], alone, static_cast<size_t>(n_vocab));
            MESSAGE("sequence ", s, ": batched within ", worst, " of the logit range of alone");
            CHECK(worst <= check.tolerance);
            worst_of_all = std::max(worst_of_all, worst);
        }
    }
    if (check.tolerance > 0.0) CHECK(worst_of_all > 0.0);  // the GEMM's sums ran (the matvec path's are bitwise)
}

void check_batch_matches_alone(const MakeBackend& make_backend, const std::vector<int>& alone_call_sizes,
                               const std::vector<std::string>& names, BatchCheck check = {}) {
    check.alone_call_sizes = alone_call_sizes;
    for (const std::string& name : names) {
        CAPTURE(name);
        const auto model = Model::load(kArch + "/" + name + ".gguf");
        check_model_batch_matches_alone(*model, make_backend, check);
    }
}

// An architecture fixture requantized to `type` (its F32 matrices, embedding and output included): Q4_0 takes the
// CUDA backend's 8-bit matvec route (its measured default) and with it the fused epilogues that quantize.
std::unique_ptr<Model> requantized_fixture(const std::string& name, GgmlType type) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("tandem-batched-" + std::to_string(getpid()) + "-" + name + ".gguf"))
            .string();
    requantize_gguf(*GgufFile::open(kArch + "/" + name + ".gguf"), type).write(path);
    auto model = Model::load(path);  // mapped: the mapping outlives the name
    std::filesystem::remove(path);
    return model;
}

// The steps of several sequences a CUDA backend ran kernel by kernel (CudaGraphStats::batched_steps).
int batched_steps(Backend& backend) { return dynamic_cast<CudaBackend&>(backend).graph_stats().batched_steps; }

// The names of the kernels launched while `fn` runs (the emulation's launch log).
std::vector<std::string> launches_of(const std::function<void()>& fn) {
    std::vector<std::string> names;
    emu::LaunchOptions o = emu::launch_options();
    o.launched = &names;
    emu::ScopedLaunchOptions scoped(o);
    fn();
    return names;
}

size_t count_prefixed(const std::vector<std::string>& names, const std::string& prefix) {
    return static_cast<size_t>(
        std::count_if(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; }));
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
    // Two fixtures (the emulation is slow): qwen3's QK-norm and gemma3's sliding windows (window 5, rings). The
    // schedule's steps of several sequences run as batched steps, not as one forward per sequence.
    BatchCheck check;
    check.after_batch = [](Backend& b) { CHECK(batched_steps(b) >= 20); };
    check_batch_matches_alone([](const Model& m) { return std::make_unique<CudaBackend>(m, 128); }, {},
                              {"qwen3", "gemma3"}, check);
}

TEST_CASE("batched forward: the CUDA backend's 8-bit route, fused epilogues and Q8_0 cache keep each sequence's bits") {
    // llama3 requantized to Q4_0 is a plain block on Q4_0's 8-bit staged route: alone, a one-token step fuses RoPE
    // into the Q/K/V launch, the residual norm into attn_output's and ffn_down's, attention quantizes its output
    // and gate/up quantizes SwiGLU's; a batched step takes rope_kv_write and attention per sequence, each writing
    // its rows of the quantized output. The prefill chunks ask for their last token's logits only, so the rows an
    // output projection reads are not one run of the step (gathered). Then qwen3 on a Q8_0 cache (its quantizing
    // rope_kv_write and attention kernels per sequence).
    const auto llama = requantized_fixture("llama3", GgmlType::Q4_0);
    BatchCheck check;
    check.all_logits = false;
    check.after_batch = [](Backend& b) { CHECK(batched_steps(b) >= 20); };
    {
        CAPTURE("llama3 q4_0, f16 cache");
        check_model_batch_matches_alone(
            *llama, [](const Model& m) { return std::make_unique<CudaBackend>(m, 128); }, check);
    }
    {
        CAPTURE("qwen3 f32, q8_0 cache");
        const auto qwen = Model::load(kArch + "/qwen3.gguf");
        check_model_batch_matches_alone(
            *qwen,
            [](const Model& m) {
                return std::make_unique<CudaBackend>(m, 128, CudaPrefillOptions{},
                                                     CudaOptions{.kv_type = cuda::KvType::Q8_0});
            },
            check);
    }
}

TEST_CASE("batched forward: CUDA steps longer than matvec_max_call take the GEMM, within tolerance of each sequence") {
    // matvec_max_call 8 and prefill chunks of 8: the schedule's first steps (up to 4 sequences × 7 tokens) run as
    // prefill chunks through the GEMM and flash attention, cut between chunks; the later decode steps (3 tokens)
    // through matvec. Each sequence alone runs calls of 7 and 1 tokens: the matvec path, so the GEMM's steps agree
    // within tolerance, not bitwise.
    BatchCheck check;
    check.tolerance = 1e-4;
    check.after_batch = [](Backend& b) { CHECK(batched_steps(b) >= 3); };
    check_batch_matches_alone(
        [](const Model& m) {
            return std::make_unique<CudaBackend>(m, 128, CudaPrefillOptions{8, 8});
        },
        {}, {"qwen3"}, check);
}

TEST_CASE("batched forward: the CUDA backend reads each matrix once per step, for more sequences than a step holds") {
    // 20 sequences at different positions decode together: 20 tokens are two steps (16 + 4, kStepTokens), each
    // sequence bitwise its own one-token calls. A step of 5 launches every matvec as often as one sequence's
    // one-token step does (the weights read once for the five), attention once per sequence; the default loop (one
    // forward per slice) would launch five times the matvecs. 20 tokens: two steps, the 16-token one's matvecs in
    // two launches of 8 tokens each (the kernels' limit), so three times one sequence's.
    const auto model = requantized_fixture("llama3", GgmlType::Q4_0);
    const int n_vocab = model->config.n_vocab, n_ctx = 64, n_seqs = 20;
    const size_t V = static_cast<size_t>(n_vocab);
    CudaBackend backend(*model, n_ctx);
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<std::vector<int>> history;  // each sequence's tokens so far
    for (int s = 0; s < n_seqs; ++s) {
        caches.push_back(backend.new_cache(n_ctx));
        std::vector<int> prompt;
        for (int i = 0; i < 1 + (s * 7) % 23; ++i) prompt.push_back(3 + (i * 31 + s * 977) % (n_vocab - 3));
        backend.forward(prompt, *caches.back(), 0, nullptr);
        history.push_back(prompt);
    }
    std::vector<float> batched(static_cast<size_t>(n_seqs) * V);
    std::vector<int> next(static_cast<size_t>(n_seqs));
    const auto decode = [&](int count) {
        std::vector<SequenceSlice> slices;
        for (int s = 0; s < count; ++s) {
            next[static_cast<size_t>(s)] =
                5 + (s * 13 + static_cast<int>(history[static_cast<size_t>(s)].size())) % 200;
            history[static_cast<size_t>(s)].push_back(next[static_cast<size_t>(s)]);
            slices.push_back({std::span<const int>(&next[static_cast<size_t>(s)], 1),
                              caches[static_cast<size_t>(s)].get(), 1, batched.data() + static_cast<size_t>(s) * V});
        }
        return launches_of([&] { backend.forward_batch(slices); });
    };
    const auto one = decode(1);
    const size_t one_matvecs = count_prefixed(one, "matvec");
    REQUIRE(one_matvecs >= static_cast<size_t>(4 * model->config.n_layers + 1));
    const int steps_before = backend.graph_stats().batched_steps;
    const auto five = decode(5);
    CHECK(count_prefixed(five, "matvec") == one_matvecs);
    CHECK(count_prefixed(five, "attention_split") == static_cast<size_t>(5 * model->config.n_layers));
    CHECK(backend.graph_stats().batched_steps == steps_before + 1);
    const auto all = decode(n_seqs);
    CHECK(count_prefixed(all, "matvec") == 3 * one_matvecs);
    CHECK(backend.graph_stats().batched_steps == steps_before + 3);
    // Each sequence's last logits against its whole history run alone, prompt first, then one token a call.
    for (int s = 0; s < n_seqs; ++s) {
        CAPTURE(s);
        const std::vector<int>& h = history[static_cast<size_t>(s)];
        const size_t prompt = 1 + static_cast<size_t>((s * 7) % 23);
        auto own = backend.new_cache(n_ctx);
        backend.forward(std::span<const int>(h).first(prompt), *own, 0, nullptr);
        std::vector<float> alone(V);
        for (size_t i = prompt; i < h.size(); ++i)
            backend.forward(std::span<const int>(h).subspan(i, 1), *own, 1, alone.data());
        CHECK(std::memcmp(alone.data(), batched.data() + static_cast<size_t>(s) * V, V * sizeof(float)) == 0);
    }
}

namespace {

// A cache that copied the first n positions of another continues as the other does after a cut back to n: the
// same logits, bit for bit. `make` builds the backend; `long_run` tokens are run in the source first.
void check_copy_prefix(Backend& backend, const Model& model, int long_run, int n, bool expect_copy) {
    const size_t V = static_cast<size_t>(model.config.n_vocab);
    std::vector<int> tokens;
    for (int i = 0; i < long_run + 8; ++i) tokens.push_back(3 + (i * 7919) % (model.config.n_vocab - 3));
    auto source = backend.new_cache(512), copy = backend.new_cache(512);
    for (int at = 0; at < long_run; at += 8)
        backend.forward(std::span<const int>(tokens).subspan(static_cast<size_t>(at), 8), *source, 0, nullptr);
    REQUIRE(copy->copy_prefix(*source, n) == expect_copy);
    if (!expect_copy) {
        CHECK(copy->n_committed() == 0);
        return;
    }
    CHECK(copy->n_committed() == n);
    auto fresh = backend.new_cache(512);  // the same positions computed from scratch
    for (int at = 0; at < n; at += 8) {
        const int step = std::min(8, n - at);
        backend.forward(std::span<const int>(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(step)),
                        *fresh, 0, nullptr);
    }
    std::vector<float> a(8 * V), b(8 * V);
    const auto next = std::span<const int>(tokens).subspan(static_cast<size_t>(n), 8);
    backend.forward(next, *copy, 8, a.data());
    backend.forward(next, *fresh, 8, b.data());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("batched forward: a KV cache copies another's prefix, sliding-window rings included, CPU and CUDA") {
    // gemma3's fixture has a window of 5: its rings hold window + margin positions, so a source that ran far past
    // the copy point no longer holds what a step there reads, and the copy is refused.
    for (const std::string name : {"qwen3", "gemma3"}) {
        CAPTURE(name);
        const auto model = Model::load(kArch + "/" + name + ".gguf");
        for (const CpuKvType kv : {CpuKvType::F16, CpuKvType::Q8_0}) {
            CpuBackend cpu(*model, 2, 16, {.kv_type = kv});
            check_copy_prefix(cpu, *model, 48, 37, true);
            if (name == "gemma3") check_copy_prefix(cpu, *model, 400, 37, false);
        }
        CudaBackend cuda(*model, 512);
        check_copy_prefix(cuda, *model, 48, 37, true);
    }
}
