// tandem-bench: llama-bench-style throughput figures. Prefill tokens/s for a P-token prompt (pp512) and decode
// tokens/s for N tokens (tg128), each the median of R runs after a warm-up, with the weight bandwidth achieved in
// decode. It can also write synthetic llama models of a given shape and type (random weights) so that speed is
// measurable on sizes no real file here has.
//   tandem-bench -m MODEL.gguf [-p 512] [-n 128] [-r 5] [-t THREADS] [--chunk 256]
//   tandem-bench --make-synthetic 1b --type q4_0 -o /tmp/1b-q4_0.gguf
//   tandem-bench -m TARGET.gguf --draft DRAFT.gguf [--lookup] [--prompts FILE] [-n 128]   (speculative vs plain)
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "cpu/cpu_backend.h"
#include "error.h"
#include "generator.h"
#include "vocab_check.h"
#include "model.h"
#include "synthetic_model.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

// Greedy generation of n tokens per prompt, plain and speculative, interleaved `reps` times; medians side by side.
int speculative_bench(const tandem::Model& model, const std::string& draft_path, bool lookup,
                      const std::vector<std::string>& prompts, int n_gen, int reps, int threads, int chunk) {
    std::unique_ptr<tandem::Model> draft_model;
    std::unique_ptr<tandem::CpuBackend> draft_backend;
    if (!draft_path.empty()) {
        draft_model = tandem::Model::load(draft_path);
        tandem::check_draft_vocabulary(*model.tokenizer, *draft_model->tokenizer);
        draft_backend = std::make_unique<tandem::CpuBackend>(*draft_model, threads, chunk);
    }
    tandem::CpuBackend backend(model, threads, chunk);
    std::printf("| prompt | plain tokens/s | speculative tokens/s | speedup | acceptance | mean accepted |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const std::string& text : prompts) {
        const std::vector<int> prompt = model.tokenizer->encode(text, model.tokenizer->add_bos());
        const int n_ctx = static_cast<int>(prompt.size()) + n_gen + 70;
        std::vector<double> plain, spec;
        double acceptance = 0, mean_accepted = 0;
        for (int r = 0; r <= reps; ++r) {  // run 0 is a warm-up
            for (bool speculative : {false, true}) {
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
                params.sampler.temperature = 0;
                params.speculative.lookup = speculative && lookup;
                tandem::Generator gen(model, backend, *cache, speculative ? draft : tandem::DraftModel{});
                const tandem::GenerationStats st = gen.generate(prompt, params, [](std::string_view) { return true; });
                const double tps = st.n_generated / st.decode_s;
                if (r == 0) continue;
                (speculative ? spec : plain).push_back(tps);
                if (speculative && st.spec.drafted > 0) {
                    acceptance = static_cast<double>(st.spec.accepted) / static_cast<double>(st.spec.drafted);
                    const int drafting_rounds = st.spec.rounds - st.spec.plain_steps;
                    mean_accepted = drafting_rounds ? static_cast<double>(st.spec.accepted) / drafting_rounds : 0;
                }
            }
        }
        const double p = median(plain), s = median(spec);
        std::printf("| %s | %.2f | %.2f | %.2fx | %.1f%% | %.2f |\n", text.substr(0, 40).c_str(), p, s, s / p,
                    100 * acceptance, mean_accepted);
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model_path, synth_name, synth_type = "q4_0", synth_out;
    int n_prompt = 512, n_gen = 128, reps = 5, threads = 0, chunk = 256;
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
    app.add_option("--make-synthetic", synth_name, "write a synthetic model: tiny, 1b or 7b");
    app.add_option("--type", synth_type, "weight type of the synthetic model (f32, f16, q8_0, q4_0)")
        ->capture_default_str();
    app.add_option("-o,--output", synth_out, "where to write the synthetic model");
    std::string draft_path, prompts_path;
    bool lookup = false;
    app.add_option("--draft", draft_path, "speculative mode: draft model to compare against plain decoding");
    app.add_flag("--lookup", lookup, "speculative mode with prompt-lookup drafting");
    app.add_option("--prompts", prompts_path, "speculative mode: prompts, one per line (default: three built in)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        if (!synth_name.empty()) {
            auto shape = tandem::synthetic_preset(synth_name);
            if (!shape) throw tandem::Error("unknown synthetic preset '" + synth_name + "' (tiny, 1b, 7b)");
            auto type = tandem::ggml_type_from_name(synth_type);
            if (!type) throw tandem::Error("unknown type '" + synth_type + "'");
            if (synth_out.empty()) throw tandem::Error("--make-synthetic needs -o FILE");
            std::fprintf(stderr, "writing %s: %.2fB parameters, %s\n", synth_out.c_str(), shape->n_params() / 1e9,
                         synth_type.c_str());
            tandem::write_synthetic_model(synth_out, *shape, *type);
            if (model_path.empty()) return 0;
        }
        if (model_path.empty()) throw tandem::Error("give -m MODEL.gguf (or --make-synthetic NAME -o FILE)");
        if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

        auto model = tandem::Model::load(model_path);
        const tandem::ModelConfig& c = model->config;
        const double bytes_per_token = static_cast<double>(model->weights.bytes_per_token());
        tandem::CpuBackend backend(*model, threads, chunk);
        auto cache = backend.new_cache(n_prompt + n_gen + 1);
        std::vector<float> logits(static_cast<size_t>(c.n_vocab));
        const std::vector<int> prompt = bench_tokens(std::max(n_prompt, n_gen), c.n_vocab);

        auto run_pp = [&] {
            cache->truncate(0);
            const auto t0 = Clock::now();
            for (int b = 0; b < n_prompt; b += chunk) {
                const int n = std::min(chunk, n_prompt - b);
                backend.forward(std::span<const int>(prompt.data() + b, n), *cache, b + n == n_prompt ? 1 : 0,
                                logits.data());
            }
            return n_prompt / std::chrono::duration<double>(Clock::now() - t0).count();
        };
        auto run_tg = [&] {
            cache->truncate(0);
            const auto t0 = Clock::now();
            for (int i = 0; i < n_gen; ++i) backend.forward(std::span<const int>(&prompt[i], 1), *cache, 1, logits.data());
            return n_gen / std::chrono::duration<double>(Clock::now() - t0).count();
        };

        if (!draft_path.empty() || lookup) {
            std::vector<std::string> prompts = {"Once upon a time", "Lily and Tom went to the park",
                                                "The little dog was sad because"};
            if (!prompts_path.empty()) {
                std::ifstream in(prompts_path);
                if (!in) throw tandem::Error(prompts_path + ": cannot open");
                prompts.clear();
                for (std::string line; std::getline(in, line);)
                    if (!line.empty()) prompts.push_back(line);
            }
            return speculative_bench(*model, draft_path, lookup, prompts, n_gen, reps, threads, chunk);
        }
        uint64_t n_params = 0;
        for (const auto& t : model->file->tensors()) n_params += t.n_elements();
        std::printf("| model | size | params | threads | test | tokens/s (median of %d) | weight GB/s |\n", reps);
        std::printf("|---|---|---|---|---|---|---|\n");
        const double size_gib = static_cast<double>(model->file->file_size()) / (1024.0 * 1024 * 1024);
        auto print = [&](const char* test, int n, std::vector<double> runs, bool decode) {
            const double tps = median(std::move(runs));
            const std::string gbps = decode ? std::to_string(tps * bytes_per_token / 1e9).substr(0, 5) : "";
            std::printf("| %s | %.1f MiB | %.3fB | %d | %s%d | %.2f | %s |\n", c.name.c_str(), size_gib * 1024,
                        static_cast<double>(n_params) / 1e9, threads, test, n, tps, gbps.c_str());
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
