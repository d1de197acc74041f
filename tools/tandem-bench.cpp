// tandem-bench: llama-bench-style throughput figures. Prefill tokens/s for a P-token prompt (pp512) and decode
// tokens/s for N tokens (tg128), each the median of R runs after a warm-up, with the weight bandwidth achieved in
// decode. It can also write synthetic llama models of a given shape and type (random weights) so that speed is
// measurable on sizes no real file here has.
//   tandem-bench -m MODEL.gguf [-p 512] [-n 128] [-r 5] [-t THREADS] [--chunk 256] [-d DEPTH]
//   tandem-bench --make-synthetic 1b --type q4_0 -o /tmp/1b-q4_0.gguf [--next-token 1|0.9]
//   tandem-bench -m TARGET.gguf --draft DRAFT.gguf [--lookup] [--prompts FILE] [-n 128]   (speculative vs plain)
//   tandem-bench -m MODEL.gguf --serve [-p 512] [-n 128] [-t THREADS]   (one run per "pp"/"tg" line on stdin)
//   tandem-bench -m TARGET.gguf --draft DRAFT.gguf|--lookup --prompts FILE --serve   (one generation per
//       "plain I"/"spec I" line on stdin)
//   tandem-bench --bandwidth [-t THREADS] [-r 5]                     (memory read bandwidth, GB/s)
// Backends are built as the CLI builds them (app/session.h); --backend cuda (builds with nvcc) runs target and draft
// on the GPU, where --cuda-route NAME=VALUE forces a route other than the measured default (app/cuda_routes.h).
// --json prints JSON lines instead of Markdown tables (scripts/compare-llamacpp reads them).
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "app/environment.h"
#include "app/session.h"
#include "common/bench_util.h"
#include "common/synthetic_model.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "json/json_value.h"
#include "model/model.h"
#include "text/chat_prompt.h"

namespace {

// The presets of --make-synthetic (synthetic_model.h synthetic_preset), for its help and its error.
constexpr const char* kSyntheticPresets = "tiny, 1b, 7b, qwen1.5b, qwen0.5b";

using Clock = std::chrono::steady_clock;

using tandem::bench::median;
using tandem::json_quote;  // the prompts and names may hold quotes, backslashes and control characters

// Deterministic "random" prompt tokens, avoiding the first 3 (unk/bos/eos) ids.
std::vector<int> bench_tokens(int n, int n_vocab) {
    std::vector<int> t(static_cast<size_t>(n));
    uint64_t s = 12345;
    for (int& x : t) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = 3 + static_cast<int>((s >> 33) % static_cast<uint64_t>(n_vocab - 3));
    }
    return t;
}

// A --prompts line with --unescape: \n is a newline, \t a tab, \\ a backslash; any other backslash stays.
std::string unescape_prompt(const std::string& line) {
    std::string out;
    for (size_t i = 0; i < line.size(); ++i) {
        const char next = i + 1 < line.size() ? line[i + 1] : '\0';
        if (line[i] == '\\' && (next == 'n' || next == 't' || next == '\\')) {
            out += next == 'n' ? '\n' : next == 't' ? '\t' : '\\';
            ++i;
        } else {
            out += line[i];
        }
    }
    return out;
}

// ---- memory read bandwidth ----------------------------------------------------------------------------------
// Each thread sums its own contiguous slice of one large buffer (streaming loads, four independent
// accumulators); the figure is buffer bytes / wall time of the slowest thread, the median of `reps` passes after
// one warm-up pass. It is the ceiling a decode step can approach: decode reads every weight once per token.

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                       _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; ++i) s += p[i];
    return s;
}
#endif

uint64_t sum_scalar(const uint64_t* p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    for (; i < n; ++i) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

int bandwidth_bench(int threads, int reps, size_t mib, bool json) {
    const size_t n = mib * (1u << 20) / sizeof(uint64_t);
    auto* raw = static_cast<uint64_t*>(std::aligned_alloc(64, n * sizeof(uint64_t)));
    if (!raw) throw tandem::Error("cannot allocate " + std::to_string(mib) + " MiB for the bandwidth test");
    std::unique_ptr<uint64_t, decltype(&std::free)> buf(raw, &std::free);
    for (size_t i = 0; i < n; ++i) raw[i] = i;  // touch every page: no page faults inside the timing
    bool avx2 = false;
#if defined(__x86_64__) || defined(__i386__)
    avx2 = __builtin_cpu_supports("avx2");
#endif
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    auto pass = [&] {
        std::vector<std::thread> pool;
        const size_t per = (n / static_cast<size_t>(threads)) & ~size_t{15};
        const auto t0 = Clock::now();
        for (int t = 0; t < threads; ++t) {
            const size_t begin = per * static_cast<size_t>(t);
            const size_t len = t + 1 == threads ? n - begin : per;
            pool.emplace_back([&, t, begin, len] {
#if defined(__x86_64__) || defined(__i386__)
                if (avx2) {
                    sums[static_cast<size_t>(t)] += sum_avx2(raw + begin, len);
                    return;
                }
#endif
                sums[static_cast<size_t>(t)] += sum_scalar(raw + begin, len);
            });
        }
        for (auto& th : pool) th.join();
        return static_cast<double>(n * sizeof(uint64_t)) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
    };
    pass();  // warm-up
    std::vector<double> runs;
    for (int r = 0; r < reps; ++r) runs.push_back(pass());
    const double gbps = median(runs);
    uint64_t check = 0;
    for (uint64_t s : sums) check += s;  // keeps the sums alive
    if (json)
        std::printf("{\"test\":\"bandwidth\",\"gb_per_s\":%.3f,\"threads\":%d,\"mib\":%zu,\"reps\":%d,"
                    "\"avx2\":%s,\"checksum\":%llu}\n",
                    gbps, threads, mib, reps, avx2 ? "true" : "false", static_cast<unsigned long long>(check % 1000));
    else
        std::printf("memory read bandwidth: %.2f GB/s (%d threads, %zu MiB buffer, median of %d)\n", gbps, threads,
                    mib, reps);
    return 0;
}

// The backend a measurement runs on: the CLI's (app/session.h make_backend: the same options, repacked-weights
// cache and switches), waited for until it serves from its final layout, as timings are of the steady state.
// `head_rows`: only the output's first rows copied, as a draft's (see CpuBackendOptions); `draft`: a draft's
// backend (its stream keeps the default priority, the persistent step follows TANDEM_CUDA_PERSISTENT_STEP's role).
std::unique_ptr<tandem::Backend> make_bench_backend(const std::string& kind, const tandem::Model& model, int n_ctx,
                                                    const tandem::BackendSettings& settings,
                                                    std::optional<tandem::GgmlType> requantize_to = std::nullopt,
                                                    int64_t head_rows = 0, bool draft = false) {
    auto backend = tandem::make_backend(kind, model, n_ctx, settings,
                                        draft ? tandem::BackendRole::Draft : tandem::BackendRole::Target,
                                        requantize_to, head_rows);
    backend->wait_for_repacking();
    return backend;
}

// --record-agreement: for each prompt the target's greedy output (plain decoding, n_gen tokens), and at each of its
// positions whether the draft's greedy pick after the same prefix is the target's token, with the draft's top
// probability there (its softmax over the whole vocabulary, the file's own weights): for greedy speculative decoding
// this is all that decides what a round accepts. One line of steps per prompt (synthetic_model.h's pattern format),
// which --make-synthetic ... --next-token-pattern replays at any shape.
int record_agreement(const tandem::Model& model, const std::string& draft_path,
                     const std::vector<std::string>& prompts, int n_gen, const tandem::BackendSettings& settings,
                     const std::string& backend_kind, const std::string& out_path) {
    auto draft_model = tandem::load_draft(model, model.file->path(), draft_path);
    const int chunk = settings.chunk;
    std::string text = "# tandem-bench --record-agreement: target " + model.config.name + ", draft " +
                       draft_model->config.name + ", greedy, " + std::to_string(n_gen) + " tokens a prompt, " +
                       backend_kind + " backend; a line a prompt, steps A:P (A: the draft's pick is the target's "
                       "token, P: its top probability)\n";
    long agreed = 0, steps = 0;
    for (const std::string& prompt_text : prompts) {
        const std::vector<int> prompt = model.tokenizer->encode(prompt_text, model.tokenizer->add_bos());
        const int n_ctx = static_cast<int>(prompt.size()) + n_gen + 1;
        auto backend = make_bench_backend(backend_kind, model, n_ctx, settings);
        auto cache = backend->new_cache(n_ctx);
        tandem::GenerationParams params;
        params.n_predict = n_gen;
        params.chunk = chunk;
        params.sampler.temperature = 0.0f;
        tandem::Generator gen(model, *backend, *cache, tandem::DraftModel{});
        const std::vector<int> out = gen.generate(prompt, params, [](std::string_view) { return true; }).generated;
        if (out.empty()) throw tandem::Error("--record-agreement: the target generated nothing after a prompt");
        // The draft teacher-forced along prompt + output: the logits before each output token.
        auto draft_backend = make_bench_backend(backend_kind, *draft_model, n_ctx, settings);
        auto draft_cache = draft_backend->new_cache(n_ctx);
        std::vector<int> forced = prompt;
        forced.insert(forced.end(), out.begin(), out.end() - 1);
        const int n_vocab = draft_model->config.n_vocab, n = static_cast<int>(out.size());
        std::vector<float> logits(static_cast<size_t>(n) * n_vocab);
        draft_backend->forward(forced, *draft_cache, n, logits.data());
        std::vector<tandem::AgreementStep> line;
        for (int i = 0; i < n; ++i) {
            const float* row = logits.data() + static_cast<size_t>(i) * n_vocab;
            const int pick = static_cast<int>(std::max_element(row, row + n_vocab) - row);
            double sum = 0;
            for (int j = 0; j < n_vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - row[pick]);
            line.push_back({pick == out[static_cast<size_t>(i)], static_cast<float>(1.0 / sum)});
            agreed += line.back().agrees;
        }
        steps += n;
        text += tandem::format_agreement_steps(line) + "\n";
    }
    std::ofstream f(out_path);
    if (!(f << text) || !(f.flush())) throw tandem::Error(out_path + ": cannot write the agreement pattern");
    std::fprintf(stderr, "recorded %ld steps, %ld agreeing (%.1f%%), into %s\n", steps, agreed,
                 100.0 * static_cast<double>(agreed) / static_cast<double>(steps), out_path.c_str());
    return 0;
}

// How the speculative benchmark samples: greedy at temperature 0, else the CLI's sampler defaults at `temperature`,
// repetition r (from 1) with seed `seed` + r - 1, so that medians and acceptance span several samples, and the
// verification scheme `scheme`.
struct BenchSampling {
    float temperature = 0.0f;
    uint64_t seed = 1234;
    tandem::SpecSampling scheme = tandem::SpecSampling::Coupled;
};

// Generation of n tokens per prompt, plain and speculative, interleaved `reps` times; medians side by side, the
// acceptance over all repetitions. Where the output must be plain decoding's (greedy, coupled sampling), a
// speculative run that differs from the plain run of its seed is an error. With `serve`, after loading it answers
// one generation per stdin line instead: "plain I [SEED]" or "spec I [SEED]" (prompt I, from 0), one JSON line
// each, so that a caller can interleave the runs with another engine's.
int speculative_bench(const tandem::Model& model, const std::string& draft_path,
                      std::optional<tandem::GgmlType> draft_requant, bool lookup, int draft_vocab,
                      const std::vector<std::string>& prompts, bool chat, int n_gen, int reps,
                      const tandem::BackendSettings& settings, bool json, bool serve, const std::string& backend_kind,
                      const BenchSampling& sampling, bool whole_rows, int draft_ahead, bool trace) {
    const int chunk = settings.chunk;
    std::optional<tandem::ChatTemplate> tmpl;
    if (chat) {
        const std::string source = model.file->get_string_or("tokenizer.chat_template", "");
        if (source.empty()) throw tandem::Error("--chat: the model has no chat template");
        tmpl = tandem::ChatTemplate::detect(source);
    }
    std::vector<std::vector<int>> encoded;
    int n_ctx_max = 0;
    for (const std::string& text : prompts) {
        // --chat: one user turn, as tandem sends a prompt to an instruct model (without its end-of-turn stop).
        encoded.push_back(tmpl ? tandem::tokenize_chat(*model.tokenizer, *tmpl, {{"user", text}}, true)
                               : model.tokenizer->encode(text, model.tokenizer->add_bos()));
        n_ctx_max = std::max(n_ctx_max, static_cast<int>(encoded.back().size()) + n_gen + 70);
    }
    std::unique_ptr<tandem::Model> draft_model;
    std::unique_ptr<tandem::Backend> draft_backend;
    if (!draft_path.empty()) {
        draft_model = tandem::load_draft(model, model.file->path(), draft_path);
        // One GPU holds both: refused as a pair before either is uploaded (as the CLI).
        tandem::check_pair_fits(backend_kind, model, backend_kind, *draft_model, n_ctx_max, settings);
        draft_backend = make_bench_backend(backend_kind, *draft_model, n_ctx_max, settings, draft_requant, draft_vocab,
                                           /*draft=*/true);
    }
    std::unique_ptr<tandem::Backend> backend_ptr =
        make_bench_backend(backend_kind, model, n_ctx_max, settings);
    tandem::Backend& backend = *backend_ptr;

    auto run = [&](const std::vector<int>& prompt, bool speculative, uint64_t seed) {
        const int n_ctx = static_cast<int>(prompt.size()) + n_gen + 70;
        auto cache = backend.new_cache(n_ctx);
        std::unique_ptr<tandem::KvCache> draft_cache;
        tandem::DraftModel draft;
        if (speculative && draft_model) {
            draft_cache = draft_backend->new_cache(n_ctx);
            draft = {draft_model.get(), draft_backend.get(), draft_cache.get()};
        }
        tandem::GenerationParams params;
        params.n_predict = n_gen;
        params.chunk = chunk;
        params.sampler.temperature = sampling.temperature;  // > 0: the CLI's sampler defaults (top-k 40, ...)
        params.sampler.seed = seed;
        params.speculative.sampling = sampling.scheme;
        params.whole_rows = whole_rows;
        params.speculative.lookup = speculative && lookup;
        params.speculative.draft_vocab = draft_vocab;
        params.speculative.draft_ahead = draft_ahead;
        params.speculative.trace = trace;
        tandem::Generator gen(model, backend, *cache, speculative ? draft : tandem::DraftModel{});
        return gen.generate(prompt, params, [](std::string_view) { return true; });
    };

    if (serve) {
        std::string sizes;
        for (const auto& p : encoded) sizes += (sizes.empty() ? "" : ",") + std::to_string(p.size());
        std::printf("{\"ready\":true,\"n_prompts\":%zu,\"n_prompt_tokens\":[%s],\"draft\":%s,\"lookup\":%s}\n",
                    encoded.size(), sizes.c_str(), draft_model ? "true" : "false", lookup ? "true" : "false");
        std::fflush(stdout);
        for (std::string line; std::getline(std::cin, line);) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line == "quit") break;
            char mode[16] = {0};
            int index = -1;
            unsigned long long seed = sampling.seed;
            const int fields = std::sscanf(line.c_str(), "%15s %d %llu", mode, &index, &seed);
            if (fields < 2 || index < 0 || index >= static_cast<int>(encoded.size()) ||
                (std::strcmp(mode, "plain") != 0 && std::strcmp(mode, "spec") != 0)) {
                std::printf("{\"error\":%s}\n",
                            json_quote("bad request '" + line + "' (plain I [SEED] | spec I [SEED])").c_str());
                std::fflush(stdout);
                continue;
            }
            const bool speculative = std::strcmp(mode, "spec") == 0;
            const tandem::GenerationStats st = run(encoded[static_cast<size_t>(index)], speculative, seed);
            std::printf("{\"test\":\"%s\",\"prompt\":%d,\"n_generated\":%d,\"seconds\":%.6f,\"tokens_per_s\":%.4f,"
                        "\"drafted\":%lld,\"accepted\":%lld,\"rounds\":%d,\"plain_steps\":%d}\n",
                        mode, index, st.n_generated, st.decode_s, st.n_generated / st.decode_s,
                        static_cast<long long>(st.spec.drafted), static_cast<long long>(st.spec.accepted),
                        static_cast<int>(st.spec.rounds), static_cast<int>(st.spec.plain_steps));
            std::fflush(stdout);
        }
        return 0;
    }

    if (!json) {
        std::printf("| prompt | plain tokens/s | speculative tokens/s | speedup | acceptance | mean accepted | "
                    "drafted ahead |\n");
        std::printf("|---|---|---|---|---|---|---|\n");
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        const std::string& text = prompts[i];
        const std::vector<int>& prompt = encoded[i];
        std::vector<double> plain, spec;
        int64_t drafted = 0, accepted = 0, ahead_used = 0;
        int drafting_rounds = 0, n_plain = 0, n_spec = 0;
        const bool must_match = sampling.temperature == 0.0f || sampling.scheme == tandem::SpecSampling::Coupled;
        for (int r = 0; r <= reps; ++r) {  // run 0 is a warm-up
            const uint64_t seed = sampling.seed + static_cast<uint64_t>(std::max(0, r - 1));
            std::vector<int> plain_tokens;
            for (bool speculative : {false, true}) {
                const tandem::GenerationStats st = run(prompt, speculative, seed);
                if (!speculative) plain_tokens = st.generated;
                if (speculative && must_match && st.generated != plain_tokens)
                    throw tandem::Error("prompt " + std::to_string(i + 1) + ", seed " + std::to_string(seed) +
                                        ": the speculative output differs from plain decoding's");
                const double tps = st.n_generated / st.decode_s;
                if (r == 0) continue;
                (speculative ? spec : plain).push_back(tps);
                (speculative ? n_spec : n_plain) = st.n_generated;
                if (speculative) {
                    drafted += st.spec.drafted;
                    accepted += st.spec.accepted;
                    ahead_used += st.spec.ahead_used;
                    drafting_rounds += st.spec.rounds - st.spec.plain_steps;
                }
            }
        }
        const double acceptance = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
        const double mean_accepted = drafting_rounds ? static_cast<double>(accepted) / drafting_rounds : 0.0;
        const double from_ahead = drafted ? static_cast<double>(ahead_used) / static_cast<double>(drafted) : 0.0;
        const double p = median(plain), s = median(spec);
        if (json) {
            std::printf("{\"test\":\"speculative\",\"prompt\":%s,\"n_prompt\":%zu,\"n_generated_plain\":%d,"
                        "\"n_generated_speculative\":%d,\"plain_tokens_per_s\":%.4f,\"speculative_tokens_per_s\":%.4f,"
                        "\"acceptance\":%.4f,\"mean_accepted\":%.4f,\"drafted_ahead\":%.4f,\"reps\":%d,\"draft\":%s,"
                        "\"lookup\":%s,\"temperature\":%g,\"spec_sampling\":\"%s\",\"seed\":%llu}\n",
                        json_quote(text).c_str(), prompt.size(), n_plain, n_spec, p, s, acceptance, mean_accepted,
                        from_ahead, reps, draft_model ? "true" : "false", lookup ? "true" : "false",
                        sampling.temperature, tandem::spec_sampling_name(sampling.scheme),
                        static_cast<unsigned long long>(sampling.seed));
            std::fflush(stdout);
            continue;
        }
        std::printf("| %s | %.2f | %.2f | %.2fx | %.1f%% | %.2f | %.0f%% |\n", text.substr(0, 40).c_str(), p, s, s / p,
                    100 * acceptance, mean_accepted, 100 * from_ahead);
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace

// What a verification of k drafted tokens costs the target: a forward of n = k + 1 tokens after a prompt, with
// logits for every position, rolled back afterwards (as a rejected draft is). The sizes take turns within each
// repetition, so that a drifting machine shifts them alike; the ratio to one token is what the draft-length
// controller weighs against acceptance.
int verify_bench(tandem::Backend& backend, tandem::KvCache& cache, const std::vector<int>& tokens, int n_prompt,
                 int chunk, const std::vector<int>& sizes, int reps, int n_vocab, bool json) {
    const int n_max = *std::max_element(sizes.begin(), sizes.end());
    if (n_prompt + n_max > cache.capacity() || static_cast<int>(tokens.size()) < n_prompt + n_max)
        throw tandem::Error("--verify: -p plus the largest size must fit the context");
    std::vector<float> logits(static_cast<size_t>(n_max) * n_vocab);
    for (int b = 0; b < n_prompt; b += chunk) {
        const int n = std::min(chunk, n_prompt - b);
        backend.forward(std::span<const int>(tokens.data() + b, n), cache, 0, logits.data());
    }
    auto run = [&](int n) {
        const auto t0 = Clock::now();
        backend.forward(std::span<const int>(tokens.data() + n_prompt, n), cache, n, logits.data());
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        cache.truncate(n_prompt);
        return s;
    };
    for (int n : sizes) run(n);  // warm-up
    std::vector<std::vector<double>> times(sizes.size());
    for (int r = 0; r < reps * 8; ++r)
        for (size_t i = 0; i < sizes.size(); ++i) times[i].push_back(run(sizes[i]));
    double base = -1;
    for (size_t i = 0; i < sizes.size(); ++i)
        if (sizes[i] == 1) base = median(times[i]);
    if (!json) {
        std::printf("| tokens | ms (median of %d) | x one token | ms per token |\n|---|---|---|---|\n", reps * 8);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        const double ms = 1e3 * median(times[i]);
        if (json)
            std::printf("{\"test\":\"verify\",\"n\":%d,\"after\":%d,\"ms\":%.4f}\n", sizes[i], n_prompt, ms);
        else
            std::printf("| %d | %.2f | %s | %.2f |\n", sizes[i], ms,
                        base > 0 ? (std::to_string(ms / (1e3 * base)).substr(0, 4) + "x").c_str() : "",
                        ms / sizes[i]);
    }
    return 0;
}

int main(int argc, char** argv) {
    std::string model_path, synth_name, synth_type = "q4_0", synth_out;
    int n_prompt = 512, n_gen = 128, reps = 5, threads = 0, chunk = 256, depth = 0;
    CLI::App app{"tandem-bench: prefill (pp) and decode (tg) throughput, llama-bench style"};
    app.add_option("-m,--model", model_path, "GGUF model to measure");
    app.add_option("-p,--n-prompt", n_prompt, "prompt tokens for the prefill test (0 = skip)")->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("-n,--n-gen", n_gen, "tokens for the decode test (0 = skip)")->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("-r,--repetitions", reps, "runs per test (median reported)")->capture_default_str()
        ->check(CLI::Range(1, 1000));
    app.add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
    app.add_option("--chunk", chunk, "prefill chunk size")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("-d,--depth", depth,
                   "pp/tg: tokens already in the KV cache before each run (llama-bench's -d), prefilled once and "
                   "kept; the runs' tokens attend to them")
        ->capture_default_str()->check(CLI::Range(0, 1 << 20));
    app.add_option("--make-synthetic", synth_name, std::string("write a synthetic model: ") + kSyntheticPresets);
    app.add_option("--type", synth_type,
                   "weight type of the synthetic model (any type the CPU backend reads; k-quants get random codes), "
                   "or q4_k_m: llama.cpp's Q4_K_M mixture of Q4_K and Q6_K (Q5_0 and Q8_0 in rows that are not "
                   "whole super-blocks), as the default models have it, or q5_k_m: its Q5_K_M (Q5_K, Q6_K; Q5_1, "
                   "Q8_0)")
        ->capture_default_str();
    app.add_option("-o,--output", synth_out, "where to write the synthetic model");
    double next_token = -1.0;
    app.add_option("--next-token", next_token,
                   "the synthetic model's greedy next token follows the last token alone, along one cycle over the "
                   "vocabulary from this fraction of tokens (1 for a target, e.g. 0.9 for a draft beside it: a pair "
                   "with that acceptance rate and the shapes' step costs; synthetic_model.h)")
        ->check(CLI::Range(0.0, 1.0));
    std::string pattern_path, record_path;
    app.add_option("--next-token-pattern", pattern_path,
                   "the synthetic model is a next-token draft replaying this recorded agreement pattern (written by "
                   "--record-agreement; synthetic_model.h) beside a --next-token 1 target, instead of --next-token's "
                   "fraction");
    std::string draft_path, prompts_path;
    bool lookup = false, json = false, serve = false, bandwidth = false, unescape = false;
    size_t bandwidth_mib = 1024;
    app.add_option("--draft", draft_path, "speculative mode: draft model to compare against plain decoding");
    app.add_flag("--lookup", lookup, "speculative mode with prompt-lookup drafting");
    int logits_vocab = 0;
    app.add_option("--logits-vocab", logits_vocab,
                   "pp/tg: logits for the first N ids only, as a speculative draft computes them (0: all)")
        ->check(CLI::NonNegativeNumber);
    int draft_vocab = tandem::SpeculativeParams{}.draft_vocab;
    app.add_option("--draft-vocab", draft_vocab,
                   "speculative mode: the draft computes logits for ids below this and those of the context only (0: all)")
        ->capture_default_str()->check(CLI::NonNegativeNumber);
    std::string requant_name = "none";
    app.add_option("--requant", requant_name,
                   "pp/tg: the weights' copies requantized to this type where smaller, as a draft's are (--draft-requant)")
        ->capture_default_str()->check(CLI::IsMember({"q4_0", "none"}));
    std::string draft_requant = "q4_0";
    app.add_option("--draft-requant", draft_requant,
                   "speculative mode: the draft's weights requantized to this type where smaller (as tandem's flag), or none")
        ->capture_default_str()->check(CLI::IsMember({"q4_0", "none"}));
    app.add_option("--record-agreement", record_path,
                   "with --draft: write, for each prompt, where the draft's greedy pick is the target's along the "
                   "target's greedy output (-n tokens) and the draft's top probability there, for --next-token-pattern");
    app.add_option("--prompts", prompts_path, "speculative mode: prompts, one per line (default: three built in)");
    bool chat = false;
    app.add_flag("--chat", chat,
                 "speculative mode: each prompt is a user turn in the model's chat template, as tandem sends it");
    app.add_flag("--unescape", unescape, "the --prompts lines use the escapes \\n, \\t and \\\\ (multi-line prompts)");
    app.add_flag("--json", json, "print JSON lines instead of Markdown tables");
    app.add_flag("--serve", serve,
                 "load the model, warm up once, then run one test per stdin line (\"pp\" or \"tg\"; with --draft/--lookup: "
                 "\"plain I\" or \"spec I\", a generation from prompt I, no warm-up), one JSON line each");
    app.add_flag("--bandwidth", bandwidth, "measure the memory read bandwidth with -t threads (median of -r passes)");
    app.add_option("--bandwidth-mib", bandwidth_mib, "buffer size of --bandwidth")->capture_default_str()
        ->check(CLI::Range(size_t{16}, size_t{1} << 20));
    std::string backend_kind = "cpu", kv_type = "f16";
    app.add_option("--backend", backend_kind, "cpu, or cuda (the GPU; builds with nvcc)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--kv-type", kv_type, "KV-cache storage: f16, f32 (CPU), q8_0")
        ->capture_default_str()->check(CLI::IsMember({"f32", "f16", "q8_0"}));
    BenchSampling sampling;
    app.add_option("--temp", sampling.temperature,
                   "speculative mode: sampling temperature (0: greedy; else the CLI's sampler defaults)")
        ->capture_default_str()->check(CLI::Range(0.0, 100.0));
    app.add_option("--seed", sampling.seed, "speculative mode: the seed of the first repetition (then +1 each)")
        ->capture_default_str();
    std::string spec_sampling = "coupled";
    app.add_option("--spec-sampling", spec_sampling,
                   "speculative mode at --temp > 0: coupled (the output is plain decoding's for the seed) or rejection")
        ->capture_default_str()->check(CLI::IsMember({"coupled", "rejection"}));
    bool whole_rows = false;
    app.add_flag("--whole-rows", whole_rows,
                 "speculative mode: every row of logits comes back whole (no candidates, no device confidence): the "
                 "same tokens, to measure what those save on a GPU");
    int draft_ahead = tandem::SpeculativeParams{}.draft_ahead;
    app.add_option("--draft-ahead", draft_ahead,
                   "speculative mode: draft steps while the target verifies (-1: while a GPU target works, 0: never, "
                   "n: up to n a round)")
        ->capture_default_str()->check(CLI::Range(-1, 65));
    std::vector<std::string> cuda_routes;
    app.add_option("--cuda-route", cuda_routes,
                   "--backend cuda: force a route other than the measured default, NAME=VALUE (repeatable):\n" +
                       tandem::cuda_route_help())
        ->take_all();
    bool spec_trace = false;
    app.add_flag("--spec-trace", spec_trace,
                 "speculative mode: one stderr line per round (draft length, drafted, accepted, timings)");
    bool verbose = false;
    app.add_flag("-v,--verbose", verbose, "describe each backend on stderr as it is made (the lines of tandem -v)");
    std::vector<int> verify_sizes;
    app.add_option("--verify", verify_sizes,
                   "speculative verification cost: after a prefill of -p tokens, forwards of each of these token "
                   "counts with logits for all (then rolled back), interleaved, -r x 8 runs each; ms and the ratio to "
                   "one token")
        ->delimiter(',')->check(CLI::Range(1, 64));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        // Read once, before anything runs. A retired route variable is an error here: the run would measure the
        // default route under the name the caller meant to force.
        for (const std::string& note : tandem::environment().retired) {
            if (note.rfind("TANDEM_CUDA_", 0) == 0) throw tandem::Error(note);
            std::fprintf(stderr, "tandem-bench: warning: %s\n", note.c_str());
        }
        if (!synth_name.empty()) {
            auto shape = tandem::synthetic_preset(synth_name);
            if (!shape)
                throw tandem::Error("unknown synthetic preset '" + synth_name + "' (" + kSyntheticPresets + ")");
            auto type = tandem::synthetic_types_from_name(synth_type);
            if (!type) throw tandem::Error("unknown type '" + synth_type + "'");
            if (synth_out.empty()) throw tandem::Error("--make-synthetic needs -o FILE");
            std::fprintf(stderr, "writing %s: %.2fB parameters, %s%s\n", synth_out.c_str(), shape->n_params() / 1e9,
                         synth_type.c_str(), next_token >= 0 ? ", next-token rule"
                                             : pattern_path.empty() ? ""
                                                                    : ", next-token rule replaying a pattern");
            std::optional<tandem::SyntheticNextToken> rule;
            if (next_token >= 0) rule = tandem::SyntheticNextToken{next_token, 2};
            if (!pattern_path.empty()) {
                if (next_token >= 0) throw tandem::Error("give --next-token or --next-token-pattern, not both");
                rule = tandem::SyntheticNextToken{};
                rule->pattern = tandem::read_agreement_pattern(pattern_path);
            }
            tandem::write_synthetic_model(synth_out, *shape, *type, 1, rule);
            if (model_path.empty()) return 0;
        }
        if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        if (bandwidth) return bandwidth_bench(threads, reps, bandwidth_mib, json);
        if (model_path.empty()) throw tandem::Error("give -m MODEL.gguf (or --make-synthetic NAME -o FILE)");

        tandem::BackendSettings settings =
            tandem::backend_settings("tandem-bench", threads, chunk, kv_type, /*long_lived=*/true, verbose);
        settings.cuda = tandem::parse_cuda_routes(cuda_routes);
        auto model = tandem::Model::load(model_path);
        // Speculative mode builds its own backends (the target's and the draft's): before the pp/tg one, which it
        // would only repack for nothing.
        if (!record_path.empty() && draft_path.empty()) throw tandem::Error("--record-agreement needs --draft");
        sampling.scheme =
            spec_sampling == "rejection" ? tandem::SpecSampling::Rejection : tandem::SpecSampling::Coupled;
        if (verify_sizes.empty() && (!draft_path.empty() || lookup)) {
            std::vector<std::string> prompts = {"Once upon a time", "Lily and Tom went to the park",
                                                "The little dog was sad because"};
            if (!prompts_path.empty()) {
                std::ifstream in(prompts_path);
                if (!in) throw tandem::Error(prompts_path + ": cannot open");
                prompts.clear();
                for (std::string line; std::getline(in, line);)
                    if (!line.empty()) prompts.push_back(unescape ? unescape_prompt(line) : line);
            }
            if (!record_path.empty())
                return record_agreement(*model, draft_path, prompts, n_gen, settings, backend_kind, record_path);
            return speculative_bench(*model, draft_path, tandem::parse_requant(draft_requant), lookup, draft_vocab, prompts, chat,
                                     n_gen, reps, settings, json, serve, backend_kind, sampling, whole_rows,
                                     draft_ahead, spec_trace);
        }
        const tandem::ModelConfig& c = model->config;
        const double bytes_per_token = static_cast<double>(model->weights.bytes_per_token());
        const int n_ctx = depth + n_prompt + std::max(n_gen, 64) + 1;
        std::unique_ptr<tandem::Backend> backend_ptr =
            make_bench_backend(backend_kind, *model, n_ctx, settings, tandem::parse_requant(requant_name), logits_vocab);
        tandem::Backend& backend = *backend_ptr;
        if (logits_vocab > 0 && !backend.restrict_logits(logits_vocab, {}))
            throw tandem::Error("--logits-vocab: the " + backend.name() + " backend computes every logit");
        auto cache = backend.new_cache(n_ctx);
        std::vector<float> logits(static_cast<size_t>(c.n_vocab));
        // The first `depth` tokens are the context every run starts from; a run's own tokens follow them.
        const std::vector<int> tokens = bench_tokens(depth + std::max(n_prompt, n_gen) + 64, c.n_vocab);  // + --verify's
        const std::span<const int> prompt = std::span<const int>(tokens).subspan(static_cast<size_t>(depth));
        if (depth > 0) {
            if (!verify_sizes.empty()) throw tandem::Error("--verify has its own context (-p tokens); drop --depth");
            const auto t0 = Clock::now();
            for (int b = 0; b < depth; b += chunk)
                backend.forward(std::span<const int>(tokens.data() + b, std::min(chunk, depth - b)), *cache, 0,
                                logits.data());
            std::fprintf(stderr, "tandem-bench: %d tokens of context prefilled in %.1f s\n", depth,
                         std::chrono::duration<double>(Clock::now() - t0).count());
        }

        auto run_pp = [&] {
            cache->truncate(depth);
            const auto t0 = Clock::now();
            for (int b = 0; b < n_prompt; b += chunk) {
                const int n = std::min(chunk, n_prompt - b);
                backend.forward(prompt.subspan(static_cast<size_t>(b), static_cast<size_t>(n)), *cache,
                                b + n == n_prompt ? 1 : 0, logits.data());
            }
            return n_prompt / std::chrono::duration<double>(Clock::now() - t0).count();
        };
        auto run_tg = [&] {
            cache->truncate(depth);
            const auto t0 = Clock::now();
            for (int i = 0; i < n_gen; ++i)
                backend.forward(prompt.subspan(static_cast<size_t>(i), 1), *cache, 1, logits.data());
            return n_gen / std::chrono::duration<double>(Clock::now() - t0).count();
        };

        if (!verify_sizes.empty()) return verify_bench(backend, *cache, tokens, n_prompt, chunk, verify_sizes, reps,
                                                      c.n_vocab, json);
        if (serve) {
            // The caller (scripts/compare-llamacpp) interleaves these runs with another engine's; the model load
            // and the warm-up stay out of every timing.
            if (n_prompt > 0) run_pp();
            if (n_gen > 0) run_tg();
            std::printf("{\"ready\":true,\"model\":%s,\"threads\":%d,\"n_prompt\":%d,\"n_gen\":%d,\"chunk\":%d,"
                        "\"depth\":%d,\"bytes_per_token\":%.0f,\"file_size\":%llu,\"n_vocab\":%d}\n",
                        json_quote(c.name).c_str(), threads, n_prompt, n_gen, chunk, depth, bytes_per_token,
                        static_cast<unsigned long long>(model->file->file_size()), c.n_vocab);
            std::fflush(stdout);
            for (std::string line; std::getline(std::cin, line);) {
                if (!line.empty() && line.back() == '\r') line.pop_back();
                if (line == "quit") break;
                const bool pp = line == "pp";
                if ((!pp && line != "tg") || (pp ? n_prompt : n_gen) <= 0) {
                    std::printf("{\"error\":%s}\n", json_quote("unknown or disabled test '" + line + "'").c_str());
                } else {
                    const double tps = pp ? run_pp() : run_tg();
                    const int n = pp ? n_prompt : n_gen;
                    std::printf("{\"test\":\"%s\",\"n\":%d,\"tokens_per_s\":%.4f,\"seconds\":%.6f}\n",
                                pp ? "pp" : "tg", n, tps, n / tps);
                }
                std::fflush(stdout);
            }
            return 0;
        }
        uint64_t n_params = 0;
        for (const auto& t : model->file->tensors()) n_params += t.n_elements();
        if (!json) {
            std::printf("| model | size | params | backend | test | tokens/s (median of %d) | weight GB/s |\n", reps);
            std::printf("|---|---|---|---|---|---|---|\n");
        }
        const double size_gib = static_cast<double>(model->file->file_size()) / (1024.0 * 1024 * 1024);
        auto print = [&](const char* test, int n, std::vector<double> runs, bool decode) {
            const double tps = median(std::move(runs));
            if (json) {
                std::printf("{\"test\":\"%s\",\"n\":%d,\"depth\":%d,\"tokens_per_s\":%.4f,\"reps\":%d,"
                            "\"threads\":%d,\"bytes_per_token\":%.0f}\n",
                            test, n, depth, tps, reps, threads, bytes_per_token);
                std::fflush(stdout);
                return;
            }
            const std::string gbps = decode ? std::to_string(tps * bytes_per_token / 1e9).substr(0, 5) : "";
            const std::string where = backend.name() == "cpu" ? "cpu, " + std::to_string(threads) + " threads" : backend.name();
            const std::string at = depth > 0 ? " @ d" + std::to_string(depth) : "";  // llama-bench's label
            std::printf("| %s | %.1f MiB | %.3fB | %s | %s%d%s | %.2f | %s |\n", c.name.c_str(), size_gib * 1024,
                        static_cast<double>(n_params) / 1e9, where.c_str(), test, n, at.c_str(), tps, gbps.c_str());
            std::fflush(stdout);
        };
        if (n_prompt > 0) {
            run_pp();  // warm-up: page in the weights
            std::vector<double> runs;
            for (int r = 0; r < reps; ++r) runs.push_back(run_pp());
            print("pp", n_prompt, runs, false);
        }
        if (n_gen > 0) {
            run_tg();
            std::vector<double> runs;
            for (int r = 0; r < reps; ++r) runs.push_back(run_tg());
            print("tg", n_gen, runs, true);
        }
        return 0;
    } catch (const tandem::Error& e) {
        std::fprintf(stderr, "tandem-bench: error: %s\n", e.what());
        return 1;
    }
}
