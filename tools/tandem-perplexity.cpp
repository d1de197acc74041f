// tandem-perplexity: the perplexity of a model over a text file, computed the way llama.cpp's
// `llama-perplexity -c CTX -b BATCH` does (see src/generate/perplexity.h), so the figures compare with llama.cpp's.
// Progress and per-window values on stderr; the final estimate on stdout.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "app/environment.h"
#include "app/session.h"
#include "error.h"
#include "generate/perplexity.h"
#include "model/model.h"

namespace {

bool g_progress_line = false;  // a "[k]ppl," line is open on stderr: an error message starts on a new line

struct Options {
    std::string model;
    std::string text_file;
    int n_ctx = 512;
    int n_chunks = -1;
    int threads = 0;
    int batch = 512;
    std::string kv_type = "f16";  // llama-perplexity's default cache, and tandem's
};

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw tandem::Error(path + ": cannot open the text file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    // llama.cpp's -f drops one trailing newline; doing the same keeps the token sequence identical.
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
}

int run(const Options& opt) {
    const std::string path = tandem::resolve_model_path(opt.model);
    auto model = tandem::Model::load(path);
    const tandem::Tokenizer& tok = *model->tokenizer;
    const tandem::ModelConfig& c = model->config;
    if (opt.n_ctx > c.context_length)
        throw tandem::Error("--ctx " + std::to_string(opt.n_ctx) + " exceeds the model's context length " +
                            std::to_string(c.context_length));

    // As llama.cpp: the whole text is tokenized once, with BOS in front only when the vocabulary asks for it, and
    // each window's first token then becomes BOS as well.
    const bool add_bos = tok.add_bos() && tok.bos() >= 0;
    const std::vector<int> tokens = tok.encode(read_text(opt.text_file), add_bos);

    tandem::PerplexityParams params;
    params.n_ctx = opt.n_ctx;
    params.n_chunks = opt.n_chunks;
    params.batch = std::min(opt.batch, opt.n_ctx);
    params.bos = add_bos ? tok.bos() : -1;
    const int n_windows = tandem::perplexity_windows(static_cast<int>(tokens.size()), params);

    // The CLI's CPU backend (app/session.h), waited for: a long throughput run, every window should use the copies.
    const tandem::BackendSettings settings = tandem::backend_settings("tandem-perplexity", opt.threads, params.batch,
                                                                      opt.kv_type, /*long_lived=*/true, false);
    const int threads = settings.threads;
    auto backend_ptr = tandem::make_backend("cpu", *model, params.n_ctx, settings, tandem::BackendRole::Target);
    tandem::Backend& backend = *backend_ptr;
    backend.wait_for_repacking();
    auto cache = backend.new_cache(params.n_ctx);
    std::fprintf(stderr,
                 "tandem-perplexity: %s: %zu tokens, %d windows of %d (scoring the last %d of each), batch %d, "
                 "%d threads, BOS %s, %s KV cache\n",
                 path.c_str(), tokens.size(), n_windows, params.n_ctx, params.n_ctx - params.n_ctx / 2 - 1,
                 params.batch, threads, add_bos ? "yes" : "no", opt.kv_type.c_str());

    const tandem::PerplexityResult r =
        tandem::perplexity(backend, *cache, c.n_vocab, tokens, params, [](int k, double ppl) {
            std::fprintf(stderr, "[%d]%.4f,", k, ppl);
            g_progress_line = true;
            std::fflush(stderr);
        });
    const double evaluated = static_cast<double>(r.n_windows) * params.n_ctx;
    std::fprintf(stderr, "\ntandem-perplexity: %d windows, %ld scored tokens, %.2f s, %.1f tokens/s\n", r.n_windows,
                 r.stats.count, r.seconds, r.seconds > 0 ? evaluated / r.seconds : 0.0);
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl(), r.error());
    if (std::fflush(stdout) != 0) return 1;
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    CLI::App app{"Perplexity of a GGUF model over a text file, computed as llama.cpp's llama-perplexity does"};
    app.add_option("-m,--model", opt.model, "GGUF model file, or the name of an installed model")->required();
    app.add_option("-f,--file", opt.text_file, "text file to score")->required()->check(CLI::ExistingFile);
    app.add_option("-c,--ctx", opt.n_ctx, "tokens per window (the first half is context, the second is scored)")
        ->capture_default_str()->check(CLI::Range(4, 1 << 20));
    app.add_option("--chunks", opt.n_chunks, "windows to evaluate at most (-1: all)")->capture_default_str()
        ->check(CLI::Range(-1, 1 << 30));
    app.add_option("-t,--threads", opt.threads, "CPU threads (default: all cores)")->check(CLI::Range(1, 1024));
    app.add_option("-b,--batch", opt.batch, "tokens per forward call")->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    app.add_option("--kv-type", opt.kv_type, "KV-cache storage: f16 (llama-perplexity's default), f32, q8_0")
        ->capture_default_str()->check(CLI::IsMember({"f32", "f16", "q8_0"}));
    CLI11_PARSE(app, argc, argv);
    try {
        for (const std::string& note : tandem::environment().retired)  // read once, before anything runs
            std::fprintf(stderr, "tandem-perplexity: warning: %s\n", note.c_str());
        return run(opt);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%standem-perplexity: %s\n", g_progress_line ? "\n" : "", e.what());
        return 1;
    }
}
