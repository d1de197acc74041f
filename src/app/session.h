// Everything a run is built from, in one place for the CLI (one-shot and chat), tandem-bench and tandem-perplexity,
// so that a benchmark measures exactly what the CLI runs: the model and draft resolved from names and defaults, the
// draft's vocabulary checked, the chat template, the backends (CPU or CUDA; KV type, repacked-weights cache, huge
// pages, CUDA routes) and their caches, and a pair on one GPU planned as a whole.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/cuda_routes.h"
#include "app/environment.h"
#include "app/prompt_reuse.h"
#include "backend.h"
#include "generate/generator.h"
#include "gguf/ggml_types.h"
#include "model/model.h"
#include "text/chat_template.h"

namespace tandem {

// What every backend of a process is built with.
struct BackendSettings {
    int threads = 1;              // CPU threads
    int chunk = 256;              // prompt tokens per prefill step (the CPU's batch, the CUDA prefill chunk)
    std::string kv_type = "f16";  // --kv-type: f16, f32 (CPU only; a CUDA backend keeps f16) or q8_0
    // The repacked-weights cache's directory ("" = copies in memory; environment().repack_cache_dir).
    std::string repack_cache_dir;
    // A process that reads the target's weights long enough to repay faulting in huge pages (the chat REPL, the
    // benchmarks; a draft's are always read often enough): CpuBackendOptions::huge_pages.
    bool long_lived = false;
    CudaSwitches cuda;               // the CUDA routes (tandem-bench --cuda-route; the defaults elsewhere)
    bool verbose = false;            // -v: describe each backend on stderr as it is made
    std::string program = "tandem";  // the prefix of those lines
};

enum class BackendRole { Target, Draft };

// The settings a program gets from its flags: threads (0 = all cores), the environment's repacked-weights cache.
BackendSettings backend_settings(const std::string& program, int threads, int chunk, const std::string& kv_type,
                                 bool long_lived, bool verbose);

// Resolves a --backend choice ("auto", "cpu", "cuda") to the backend that will run: "cuda" when asked for and
// usable (an error naming the CUDA error otherwise); "auto" picks CUDA when this build has it and a device answers,
// else the CPU. `flag` names the option in messages.
std::string resolve_backend(const std::string& requested, const char* flag, bool verbose);

// A backend of `kind` ("cpu" or "cuda", resolved) for `model` with room for `n_ctx` tokens. A draft's CPU copies may
// be requantized (`requantize_to`) and hold only the output's first `head_rows` rows (CpuBackendOptions). With
// settings.verbose, stderr lines say how it is configured (the same lines for the CLI and the tools).
std::unique_ptr<Backend> make_backend(const std::string& kind, const Model& model, int n_ctx,
                                      const BackendSettings& settings, BackendRole role,
                                      std::optional<GgmlType> requantize_to = std::nullopt, int64_t head_rows = 0);

// A model file path for `name_or_path`: an existing file, or the name of an installed model (--list-models).
std::string resolve_model_path(const std::string& name_or_path);

// Loads `path` as a draft for `target`, checking that it shares the vocabulary (a note on stderr where the check
// has one).
std::unique_ptr<Model> load_draft(const Model& target, const std::string& target_path, const std::string& path);

// Refuses a target and draft that would not fit together on one GPU before either is uploaded (no-op without CUDA,
// or when either runs on the CPU).
void check_pair_fits(const std::string& kind, const Model& target, const std::string& draft_kind, const Model& draft,
                     int n_ctx, const BackendSettings& settings);

// The CLI's choices that make a Session.
struct SessionOptions {
    std::string model;  // path or installed name; "" = the default target
    std::string draft;  // path; "" = the default draft, where the default target is used
    bool no_draft = false;
    std::string tokenizer;               // a sentencepiece .model overriding the GGUF's vocabulary
    std::string backend = "auto";        // --backend
    std::string draft_backend = "auto";  // --draft-backend
    std::optional<GgmlType> draft_requant = GgmlType::Q4_0;
    int draft_vocab = 0;        // --draft-vocab: the draft's output rows kept (0: all)
    int n_ctx = 0;              // 0: the model's, capped so the KV cache takes at most 1/4 of memory
    bool raw = false;           // no chat template
    std::string chat_template;  // a template family by name instead of the file's
    // --think on|off: the template's thinking switch (ChatTemplate::set_thinking); unset keeps the template's
    // default (on). A template without a switch ignores it, with a note on stderr.
    std::optional<bool> think;
    BackendSettings backends;
    // The on-disk prompt cache (--prompt-cache; prompt_reuse.h): dir "" (the default here, for the tools) is off.
    prompt_cache::Options prompt_cache;
};

// A loaded model (and draft) with their backends and KV caches, ready for a Generator. Built in two steps so that
// what cannot run is refused before any weight is copied or uploaded: the constructor loads the models, checks the
// draft against the target (and a pair's room on one GPU) and chooses the template and context; open_backends()
// then makes the backends and caches (a caller checks its prompt in between).
class Session {
public:
    explicit Session(const SessionOptions& options);
    // Makes the backends and their caches (once; later calls do nothing).
    void open_backends();

    const Model& model() const { return *model_; }
    const std::string& model_path() const { return model_path_; }
    // The chat template for the prompt: nullopt for --raw or a model without one.
    const std::optional<ChatTemplate>& chat_template() const { return template_; }
    int n_ctx() const { return n_ctx_; }
    const SessionOptions& options() const { return options_; }
    bool verbose() const { return options_.backends.verbose; }

    // After open_backends():
    Backend& backend() { return *backend_; }
    KvCache& cache() { return *cache_; }
    // The draft's model, backend and cache (all null without a draft).
    DraftModel draft() { return {draft_model_.get(), draft_backend_.get(), draft_cache_.get()}; }
    // The prompt cache over both caches (off unless SessionOptions::prompt_cache.dir is set).
    PromptReuser& prompts() { return *prompts_; }

private:
    SessionOptions options_;
    std::string model_path_, draft_path_;
    std::string kind_, draft_kind_;  // the resolved --backend and --draft-backend
    std::unique_ptr<Model> model_;
    std::unique_ptr<Model> draft_model_;
    std::optional<ChatTemplate> template_;
    int n_ctx_ = 0;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<KvCache> cache_;
    std::unique_ptr<Backend> draft_backend_;
    std::unique_ptr<KvCache> draft_cache_;
    std::unique_ptr<PromptReuser> prompts_;
};

}  // namespace tandem
