// tandem's command line: flags → options, then a one-shot generation streamed to stdout. No logic of its own
// beyond wiring: loading is Model, compute is the Backend, the loop is Generator.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

#include "chat_prompt.h"
#include "cpu/cpu_backend.h"
#include "cpu/repack_cache.h"
#include "error.h"
#include "generator.h"
#include "model.h"
#include "model_registry.h"
#include "repl.h"
#include "stream_write.h"
#include "vocab_check.h"
#ifdef TANDEM_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

struct Options {
    std::string model_path;
    std::string prompt;
    std::string prompt_file;
    std::string tokenizer_path;
    std::string backend = "auto";
    std::string draft_path;
    bool no_draft = false;
    bool list_models = false;
    bool raw = false;
    std::string system_prompt;
    std::string chat_template;
    std::string draft_backend = "auto";
    std::string draft_requant = "q4_0";
    std::string kv_type = "f16";
    int n_predict = -1;
    int n_ctx = 0;
    int chunk = 256;
    int threads = 0;
    bool echo = false;
    bool stats = false;
    bool verbose = false;
    bool seed_given = false;
    bool chat = false;  // --chat, or a terminal on stdin with no prompt
    tandem::GenerationParams gen;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw tandem::Error(path + ": cannot open the prompt file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string read_stdin() {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
}

// The context to allocate: the user's --ctx, else the model's, capped so the KV cache takes at most a quarter
// of physical memory.
int choose_context(const Options& opt, const tandem::ModelConfig& c) {
    if (opt.n_ctx > 0) return opt.n_ctx;
    const size_t phys = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t per_pos = tandem::CpuKvCache::bytes_needed(
        c.n_layers, 1, c.kv_dim(), tandem::parse_cpu_kv_type(opt.kv_type).value_or(tandem::CpuKvType::F16));
    const size_t fit = std::max<size_t>(256, phys / 4 / per_pos);
    return static_cast<int>(std::min<size_t>(static_cast<size_t>(c.context_length), fit));
}

// Resolves --backend / --draft-backend ("auto", "cpu", "cuda") to the backend that will run: "cuda" when asked
// for and usable (an error naming the CUDA error otherwise), "auto" picks CUDA when this build has it and a device
// answers, else the CPU.
std::string resolve_backend(const std::string& requested, const char* flag, bool verbose) {
#ifdef TANDEM_HAS_CUDA
    if (requested == "cpu") return "cpu";
    std::string why;
    const int n = tandem::cuda::device_count(&why);
    if (n > 0) {
        if (verbose && requested == "auto")
            std::fprintf(stderr, "tandem: %s auto: CUDA on %s\n", flag, tandem::cuda::device_name().c_str());
        return "cuda";
    }
    if (requested == "cuda") throw tandem::Error(std::string(flag) + " cuda: no usable CUDA device: " + why);
    if (verbose) std::fprintf(stderr, "tandem: %s auto: no usable CUDA device (%s): using the CPU\n", flag, why.c_str());
    return "cpu";
#else
    if (requested == "cuda")
        throw tandem::Error(std::string(flag) +
                            " cuda: this tandem was built without CUDA (nvcc not found, or -DTANDEM_CUDA=OFF)");
    if (verbose && requested == "auto")
        std::fprintf(stderr, "tandem: %s auto: built without CUDA: using the CPU\n", flag);
    return "cpu";
#endif
}

#ifdef TANDEM_HAS_CUDA
tandem::CudaOptions cuda_options(const Options& opt) {
    tandem::CudaOptions options;
    // The one storage the CUDA backend lacks, f32, leaves its default (make_backend notes it under -v).
    options.kv_type = tandem::parse_kv_type(opt.kv_type).value_or(tandem::cuda::KvType::F16);
    return options;
}
#endif

// The repacked-weights cache's directory: ${XDG_CACHE_HOME:-~/.cache}/tandem/repacked unless TANDEM_REPACK_CACHE
// moves it or turns it off ("").
std::string repack_cache_directory() { return tandem::cpu::repack_cache_dir(tandem::cache_root() + "/repacked"); }

// `which` is "--backend" or "--draft-backend", for the notes.
// `requantize_to`: the CPU backend's copies requantized (a draft's, --draft-requant).
// `huge_pages`: its copies on huge pages (a draft's, or the chat REPL's: see CpuBackendOptions).
// `head_rows`: only the output's first rows copied (a draft's, under --draft-vocab: see CpuBackendOptions).
std::unique_ptr<tandem::Backend> make_backend(const std::string& kind, const tandem::Model& model, int threads,
                                              int chunk, int n_ctx, const Options& opt, const char* which,
                                              bool huge_pages,
                                              std::optional<tandem::GgmlType> requantize_to = std::nullopt,
                                              int64_t head_rows = 0) {
#ifdef TANDEM_HAS_CUDA
    if (kind == "cuda") {
        const bool verbose = opt.verbose;
        tandem::CudaOptions options = cuda_options(opt);
        // The target's stream goes first where a draft on the same device drafts ahead while it verifies.
        const bool target = std::string_view(which) == "--backend";
        options.high_priority = target && tandem::cuda_stream_priority_from_env();
        options.persistent_step = tandem::cuda_persistent_step_from_env(!target);
        if (verbose && opt.kv_type == "f32")
            std::fprintf(stderr,
                         "tandem: note: --kv-type f32 applies to the CPU backend; %s cuda keeps an f16 KV cache\n",
                         which);
        if (verbose) {
            const tandem::CudaMemoryPlan plan = tandem::CudaBackend::plan(model, n_ctx, {}, options);
            std::fprintf(stderr, "tandem: CUDA memory plan: %s\n", plan.describe().c_str());
            std::fprintf(stderr, "tandem: CUDA graphs for decode / verification steps: %s\n",
                         tandem::cuda_graphs_from_env() ? "on (TANDEM_CUDA_GRAPHS=0 turns them off)"
                                                        : "off (TANDEM_CUDA_GRAPHS=0)");
            // The routes in use (measured defaults unless a TANDEM_CUDA_* switch forces another), so that a
            // benchmark log says what ran.
            std::fprintf(stderr,
                         "tandem: CUDA kernels (%s): matvecs with %s (TANDEM_CUDA_INT8, TANDEM_CUDA_MATVEC), "
                         "overlapping launches %s (TANDEM_CUDA_PDL; sm_90+), prefill GEMM %s (TANDEM_CUDA_GEMM), "
                         "stream priority %s (TANDEM_CUDA_STREAM_PRIORITY), one-token steps %s "
                         "(TANDEM_CUDA_PERSISTENT_STEP)\n",
                         which, tandem::describe_matvec_routes(options).c_str(),
                         options.overlap_launches ? "on" : "off",
                         options.int8_gemm ? "int8 tensor cores" : plan.blas ? "cuBLAS fp16" : "SIMT",
                         options.high_priority ? "high" : "default",
                         tandem::CudaBackend::describe_persistent_step(model, options).c_str());
        }
        return std::make_unique<tandem::CudaBackend>(model, n_ctx, tandem::CudaPrefillOptions{}, options);
    }
#else
    (void)kind, (void)n_ctx;
#endif
    const std::optional<tandem::CpuKvType> kv = tandem::parse_cpu_kv_type(opt.kv_type);  // CLI11 admitted only these
    auto cpu = std::make_unique<tandem::CpuBackend>(
        model, threads, std::max(1, chunk),
        tandem::CpuBackendOptions{
            .requantize_to = requantize_to,
            .huge_pages = huge_pages,
            // Every CLI run keeps its copies in the repacked-weights cache (CpuBackendOptions::repack_cache_dir).
            .repack_cache_dir = repack_cache_directory(),
            .head_rows = head_rows,
            .kv_type = *kv});
    if (opt.verbose && cpu->repacked_bytes() > 0)
        std::fprintf(stderr, "tandem: %s cpu: %.1f MB of repacked weight copies in %s\n", which,
                     cpu->repacked_bytes() / 1e6, cpu->describe_repacking().c_str());
    return cpu;
}

int run(const Options& opt) {
    // No prompt and a terminal on stdin opens the chat REPL; --chat runs the same loop over a pipe.
    const bool chat = opt.chat || (opt.prompt.empty() && opt.prompt_file.empty() && isatty(STDIN_FILENO));
    std::string prompt;
    if (!opt.prompt.empty()) {
        prompt = opt.prompt;
    } else if (!opt.prompt_file.empty()) {
        prompt = read_file(opt.prompt_file);
    } else if (!chat) {
        prompt = read_stdin();
    }
    const std::string backend_kind = resolve_backend(opt.backend, "--backend", opt.verbose);

    // No -m: the default model from the cache, with the default draft when it is installed too.
    std::string model_path = opt.model_path;
    std::string draft_path = opt.draft_path;
    if (model_path.empty()) {
        const auto target = tandem::installed_path(tandem::default_target());
        if (!target)
            throw tandem::Error("no model given (-m FILE) and the default model " + tandem::default_target() +
                                " is not installed in " + tandem::models_dir() + ": run scripts/fetch-models");
        model_path = *target;
        const auto draft = tandem::installed_path(tandem::default_draft());
        if (draft_path.empty() && !opt.no_draft && draft) {
            draft_path = *draft;
            std::fprintf(stderr, "tandem: %s with draft %s (--no-draft to turn drafting off)\n",
                         tandem::default_target().c_str(), tandem::default_draft().c_str());
        }
    } else if (auto known = tandem::installed_path(model_path)) {
        model_path = *known;  // a model name from --list-models
    }
    if (opt.no_draft) draft_path.clear();

    auto model = tandem::Model::load(model_path, opt.tokenizer_path);
    const tandem::ModelConfig& c = model->config;
    const int n_ctx = choose_context(opt, c);
    const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (opt.verbose)
        std::fprintf(stderr, "tandem: %s (%s): %d layers, dim %d, %d heads (%d kv), vocab %d, ctx %d, %d threads\n",
                     model_path.c_str(), c.name.c_str(), c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.n_vocab,
                     n_ctx, threads);

    // Instruct models (a chat template in the file, or --chat-template) get the prompt as one user turn; base
    // models and --raw get the text as it is.
    std::vector<int> stop_tokens;
    std::vector<int> tokens;
    const std::string template_source = model->file->get_string_or("tokenizer.chat_template", "");
    std::optional<tandem::ChatTemplate> tmpl;
    if (!opt.raw) {
        if (!opt.chat_template.empty()) {
            tmpl = tandem::ChatTemplate::by_name(opt.chat_template);
        } else if (!template_source.empty()) {
            std::string warning;
            tmpl = tandem::ChatTemplate::detect(template_source, &warning);
            if (!warning.empty()) std::fprintf(stderr, "tandem: warning: %s\n", warning.c_str());
        }
    }
    if (chat) {
        // The REPL renders and tokenizes each turn itself.
    } else if (tmpl && !tmpl->is_raw()) {
        std::vector<tandem::ChatMessage> messages;
        if (!opt.system_prompt.empty()) messages.push_back({"system", opt.system_prompt});
        messages.push_back({"user", prompt});
        tokens = tandem::tokenize_chat(*model->tokenizer, *tmpl, messages, /*add_generation_prompt=*/true);
        for (const std::string& marker : tmpl->end_of_turn()) {
            const int id = model->tokenizer->token_id(marker);
            if (id >= 0) stop_tokens.push_back(id);
        }
        if (opt.verbose) std::fprintf(stderr, "tandem: chat template %s\n", tmpl->name().c_str());
    } else {
        tokens = model->tokenizer->encode(prompt, model->tokenizer->add_bos());
    }
    if (static_cast<int>(tokens.size()) > n_ctx)
        throw tandem::Error("the prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                            std::to_string(n_ctx) + " (raise --ctx, at most the model's " +
                            std::to_string(c.context_length) + ")");

    // The draft model is loaded and its vocabulary checked before either backend is made, and a pair on one GPU
    // is planned as a whole: what cannot run is refused before the target's weights are uploaded.
    std::unique_ptr<tandem::Model> draft_model;
    std::string draft_kind;
    if (!draft_path.empty()) {
        draft_kind = resolve_backend(opt.draft_backend, "--draft-backend", opt.verbose);
        draft_model = tandem::Model::load(draft_path);
        const tandem::VocabCheck vc = [&] {
            try {
                return tandem::check_draft_vocabulary(*model->tokenizer, *draft_model->tokenizer);
            } catch (const tandem::Error& e) {
                throw tandem::Error("draft " + draft_path + " cannot draft for " + model_path + ": " + e.what());
            }
        }();
        if (!vc.note.empty()) std::fprintf(stderr, "tandem: note: %s\n", vc.note.c_str());
    }
#ifdef TANDEM_HAS_CUDA
    if (draft_model && backend_kind == "cuda" && draft_kind == "cuda")
        tandem::CudaBackend::check_pair_fits(tandem::CudaBackend::plan(*model, n_ctx, {}, cuda_options(opt)),
                                             tandem::CudaBackend::plan(*draft_model, n_ctx, {}, cuda_options(opt)));
#endif

    std::unique_ptr<tandem::Backend> backend_ptr =
        make_backend(backend_kind, *model, threads, opt.chunk, n_ctx, opt, "--backend", /*huge_pages=*/chat);
    tandem::Backend& backend = *backend_ptr;
    auto cache = backend.new_cache(n_ctx);

    // The draft's own backend (--draft-backend), cache and thread pool.
    std::unique_ptr<tandem::Backend> draft_backend;
    std::unique_ptr<tandem::KvCache> draft_cache;
    tandem::DraftModel draft;
    if (draft_model) {
        const std::optional<tandem::GgmlType> requant = tandem::parse_requant(opt.draft_requant);
        if (opt.verbose && requant && draft_kind == "cuda")
            std::fprintf(stderr, "tandem: note: --draft-requant applies to a draft on the CPU backend\n");
        // The draft scores ids below --draft-vocab (and the context's): the rest of its output is never copied
        // (the backend copies every row when the value is 0 or covers the whole vocabulary).
        draft_backend = make_backend(draft_kind, *draft_model, threads, opt.chunk, n_ctx, opt, "--draft-backend",
                                     /*huge_pages=*/true, requant, opt.gen.speculative.draft_vocab);
        draft_cache = draft_backend->new_cache(n_ctx);
        draft = {draft_model.get(), draft_backend.get(), draft_cache.get()};
        if (opt.verbose)
            std::fprintf(stderr, "tandem: draft %s: %d layers, dim %d\n", draft_path.c_str(),
                         draft_model->config.n_layers, draft_model->config.dim);
    }
    tandem::Generator generator(*model, backend, *cache, draft);

    if (chat) {
        tandem::ReplConfig rc;
        rc.chat_template = tmpl;
        rc.system = opt.system_prompt;
        rc.params = opt.gen;
        rc.params.n_predict = opt.n_predict;
        rc.params.chunk = opt.chunk;
        rc.interactive = isatty(STDIN_FILENO);
        rc.model_name = c.name.empty() ? model_path : c.name;
        return tandem::run_repl(*model, generator, *cache, draft, rc);
    }

    if (opt.echo && !tandem::write_stdout(prompt)) return 0;
    tandem::GenerationParams params = opt.gen;
    params.n_predict = opt.n_predict;
    params.chunk = opt.chunk;
    params.stop_tokens = stop_tokens;
    const tandem::GenerationStats st = generator.generate(tokens, params, tandem::write_stdout);
    if (st.stop == tandem::StopReason::OutputClosed) return 0;  // the reader went away: end quietly
    if (st.stop == tandem::StopReason::ContextFull)
        std::fprintf(stderr, "\ntandem: stopped: the context of %d tokens is full\n", n_ctx);

    if (opt.stats) {
        // Tokens per second as the user sees them; bandwidth from the target forwards actually run (fewer than
        // the tokens when speculation accepts drafts).
        const double decode_tps = st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0;
        const double gbps = st.decode_s > 0 ? st.n_decode_forwards / st.decode_s *
                                                  static_cast<double>(model->weights.bytes_per_token()) / 1e9
                                            : 0.0;
        std::fprintf(stderr,
                     "\n--- stats ---\n"
                     "prompt tokens:      %d\n"
                     "prefill:            %.3f s, %.1f tokens/s\n"
                     "time to first token: %.3f s\n"
                     "generated tokens:   %d (stop: %s)\n"
                     "decode:             %.3f s, %.1f tokens/s\n"
                     "weight bandwidth:   %.2f GB/s (%.1f MB of weights per token)\n",
                     st.n_prompt, st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0, st.ttft_s,
                     st.n_generated, tandem::stop_reason_name(st.stop), st.decode_s, decode_tps, gbps,
                     static_cast<double>(model->weights.bytes_per_token()) / 1e6);
        if (st.speculative) std::fputs(st.spec.summary(st.decode_s, st.n_generated).c_str(), stderr);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);  // a closed stdout shows up as a failed write, which ends generation quietly
    Options opt;
    CLI::App app{"tandem: local LLM inference from a GGUF file (streams generated text to stdout)"};
    app.add_option("-m,--model", opt.model_path,
                   "GGUF model file or installed model name (default: " + tandem::default_target() + ")");
    app.add_flag("--no-draft", opt.no_draft, "do not use a draft model (not even the default one)");
    app.add_flag("--list-models", opt.list_models, "list the installed models and exit");
    app.add_flag("--raw", opt.raw, "feed the prompt as it is, without the model's chat template");
    app.add_option("--system", opt.system_prompt, "system prompt (instruct models)");
    app.add_option("--chat-template", opt.chat_template, "chat template family instead of the model's")
        ->check(CLI::IsMember(tandem::ChatTemplate::names()));
    app.add_option("-p,--prompt", opt.prompt, "prompt text");
    app.add_flag("--chat", opt.chat,
                 "chat: one user turn per line of stdin, one answer per line on stdout (a terminal on stdin with "
                 "no prompt opens the interactive chat)");
    app.add_option("-f,--file", opt.prompt_file, "read the prompt from a file")->check(CLI::ExistingFile);
    app.add_option("-n,--n-predict", opt.n_predict, "new tokens to generate, per answer in a chat (-1: until EOS or a full context)")
        ->check(CLI::Range(-1, 1 << 30));
    app.add_option("--temp", opt.gen.sampler.temperature, "temperature (0 = greedy)")
        ->capture_default_str()->check(CLI::Range(0.0, 100.0));
    app.add_option("--top-k", opt.gen.sampler.top_k, "keep the k most likely tokens (0 = off)")
        ->capture_default_str()->check(CLI::NonNegativeNumber);
    app.add_option("--top-p", opt.gen.sampler.top_p, "nucleus sampling threshold (1 = off)")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-p", opt.gen.sampler.min_p, "drop tokens below min-p × the top probability (0 = off)")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--repeat-penalty", opt.gen.sampler.repeat_penalty, "penalty for recent tokens (1 = off)")
        ->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--repeat-last-n", opt.gen.sampler.repeat_last_n, "how many recent tokens the penalty sees")
        ->capture_default_str()->check(CLI::NonNegativeNumber);
    auto* seed_opt = app.add_option("--seed", opt.gen.sampler.seed, "random seed (default: random)");
    app.add_option("--stop", opt.gen.stops, "stop before this string (repeatable)")->take_all();
    app.add_flag("--echo", opt.echo, "print the prompt before the generated text");
    app.add_flag("--stats", opt.stats, "print timing and throughput statistics to stderr");
    app.add_option("-t,--threads", opt.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
    app.add_option("-c,--ctx", opt.n_ctx, "context size in tokens (default: the model's, capped to memory)")
        ->check(CLI::Range(1, 1 << 24));
    app.add_option("--chunk", opt.chunk, "prompt tokens per prefill step")->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    app.add_option("--tokenizer", opt.tokenizer_path, "sentencepiece .model overriding the GGUF vocabulary")
        ->check(CLI::ExistingFile);
    app.add_option("--backend", opt.backend, "compute backend: auto (CUDA when built with it and a GPU answers), cpu, cuda")->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--kv-type", opt.kv_type,
                   "KV-cache storage: f16, f32 (CPU: the reference precision, twice the memory), or q8_0 (ggml Q8_0 "
                   "blocks, about half of f16's memory; the key/value width must be a multiple of 32)")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "f16", "q8_0"}));
    app.add_option("--draft", opt.draft_path, "draft model (same vocabulary) for speculative decoding")
        ->check(CLI::ExistingFile);
    app.add_option("--draft-backend", opt.draft_backend, "backend of the draft model: auto, cpu, cuda")
        ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--draft-requant", opt.draft_requant,
                   "a draft on the CPU reads its weights requantized to this type where that makes them smaller "
                   "(q4_0: the 0.5B draft's Q5_0/Q8_0/Q6_K matrices, 279 MB of copies instead of 393 MB), or none; the output "
                   "is the target's either way")
        ->capture_default_str()->check(CLI::IsMember({"q4_0", "none"}));
    app.add_option("--draft-max", opt.gen.speculative.draft_max, "most tokens drafted per round")
        ->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--draft-min", opt.gen.speculative.draft_min,
                   "fewest tokens drafted per round (0 lets tandem fall back to plain decoding when drafting loses)")
        ->capture_default_str()->check(CLI::Range(0, 64));
    app.add_option("--draft-p-min", opt.gen.speculative.p_min,
                   "stop drafting when the draft's top probability falls below this")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--draft-vocab", opt.gen.speculative.draft_vocab,
                   "the draft computes logits only for ids below this (a BPE vocabulary's frequent ones) and those in "
                   "the context (0: every id); the output is the target's either way")
        ->capture_default_str()->check(CLI::NonNegativeNumber);
    app.add_option("--draft-ahead", opt.gen.speculative.draft_ahead,
                   "draft steps taken while the target verifies, guessing that it accepts every draft: -1 while a GPU "
                   "target works, 0 never, n up to n every round; the output is the target's either way")
        ->capture_default_str()->check(CLI::Range(-1, 65));
    app.add_flag("--lookup", opt.gen.speculative.lookup,
                 "prompt-lookup drafting: propose what followed the longest earlier match of the context's last tokens");
    app.add_flag("-v,--verbose", opt.verbose, "log model details to stderr");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    if (opt.list_models) {
        std::fputs(tandem::list_installed_table().c_str(), stdout);
        // Where the disk space of the runs' repacked copies goes (cpu/repack_cache.h).
        const std::string cache_dir = repack_cache_directory();
        if (const tandem::cpu::RepackCacheUsage u = tandem::cpu::repack_cache_usage(cache_dir); u.files > 0)
            std::printf("repacked-weights cache: %zu file%s, %.1f GB in %s (TANDEM_REPACK_CACHE=0 turns it off; "
                        "safe to delete)\n", u.files, u.files == 1 ? "" : "s", u.bytes / 1e9, cache_dir.c_str());
        return 0;
    }
    opt.seed_given = seed_opt->count() > 0;
    if (!opt.seed_given) opt.gen.sampler.seed = std::random_device{}();
    if (opt.gen.speculative.draft_min > opt.gen.speculative.draft_max) {
        std::fprintf(stderr, "tandem: --draft-min must not exceed --draft-max\n");
        return 2;
    }
    if (opt.chat && (!opt.prompt.empty() || !opt.prompt_file.empty())) {
        std::fprintf(stderr, "tandem: --chat reads its turns from stdin: give no -p or -f\n");
        return 2;
    }
    if (!opt.prompt.empty() && !opt.prompt_file.empty()) {
        std::fprintf(stderr, "tandem: give either -p or -f, not both\n");
        return 2;
    }
    try {
        tandem::Sampler::validate(opt.gen.sampler);
        return run(opt);
    } catch (const tandem::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "tandem: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "tandem: error: out of memory\n");
        return 1;
    }
}
