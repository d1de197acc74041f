// How a run is built from its options (session.h): model and draft resolution, backends, caches, the chat template.
#include "app/session.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string_view>
#include <thread>

#include "app/model_registry.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "text/vocab_check.h"
#ifdef TANDEM_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace tandem {

namespace {

const char* flag_of(BackendRole role) { return role == BackendRole::Target ? "--backend" : "--draft-backend"; }

#ifdef TANDEM_HAS_CUDA
CudaOptions cuda_options(const BackendSettings& settings, BackendRole role) {
    CudaOptions options = settings.cuda.options(role == BackendRole::Draft);
    // The one storage the CUDA backend lacks, f32, leaves its default (make_backend notes it under -v).
    options.kv_type = parse_kv_type(settings.kv_type).value_or(cuda::KvType::F16);
    return options;
}

CudaPrefillOptions cuda_prefill(const BackendSettings& settings) {
    CudaPrefillOptions prefill;
    prefill.chunk_tokens = settings.chunk;
    return prefill;
}

std::unique_ptr<Backend> make_cuda_backend(const Model& model, int n_ctx, const BackendSettings& settings,
                                           BackendRole role) {
    const CudaOptions options = cuda_options(settings, role);
    const char* which = flag_of(role);
    const char* program = settings.program.c_str();
    if (settings.verbose) {
        if (settings.kv_type == "f32")
            std::fprintf(stderr, "%s: note: --kv-type f32 applies to the CPU backend; %s cuda keeps an f16 KV cache\n",
                         program, which);
        const CudaMemoryPlan plan = CudaBackend::plan(model, n_ctx, cuda_prefill(settings), options);
        std::fprintf(stderr, "%s: CUDA memory plan: %s\n", program, plan.describe().c_str());
        std::fprintf(stderr, "%s: CUDA graphs for decode / verification steps: %s\n", program,
                     options.graphs ? "on" : "off (--cuda-route graphs=0)");
        // The routes in use (the measured defaults unless tandem-bench --cuda-route forces another), so that a
        // benchmark log says what ran.
        std::fprintf(stderr,
                     "%s: CUDA kernels (%s): matvecs with %s, overlapping launches %s (sm_90+), prefill GEMM %s, "
                     "stream priority %s, one-token steps %s\n",
                     program, which, describe_matvec_routes(options).c_str(), options.overlap_launches ? "on" : "off",
                     options.int8_gemm ? "int8 tensor cores"
                     : plan.blas       ? "cuBLAS fp16"
                                       : "SIMT",
                     options.high_priority ? "high" : "default",
                     CudaBackend::describe_persistent_step(model, options).c_str());
    }
    return std::make_unique<CudaBackend>(model, n_ctx, cuda_prefill(settings), options);
}
#endif

}  // namespace

BackendSettings backend_settings(const std::string& program, int threads, int chunk, const std::string& kv_type,
                                 bool long_lived, bool verbose) {
    const Environment& env = environment();
    BackendSettings s;
    s.threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    s.chunk = std::max(1, chunk);
    s.kv_type = kv_type;
    s.repack_cache_dir = env.repack_cache_dir;
    s.long_lived = long_lived;
    s.verbose = verbose;
    s.program = program;
    return s;
}

std::string resolve_backend(const std::string& requested, const char* flag, bool verbose) {
#ifdef TANDEM_HAS_CUDA
    if (requested == "cpu") return "cpu";
    std::string why;
    const int n = cuda::device_count(&why);
    if (n > 0) {
        if (verbose && requested == "auto")
            std::fprintf(stderr, "tandem: %s auto: CUDA on %s\n", flag, cuda::device_name().c_str());
        return "cuda";
    }
    if (requested == "cuda") throw Error(std::string(flag) + " cuda: no usable CUDA device: " + why);
    if (verbose)
        std::fprintf(stderr, "tandem: %s auto: no usable CUDA device (%s): using the CPU\n", flag, why.c_str());
    return "cpu";
#else
    if (requested == "cuda")
        throw Error(std::string(flag) +
                    " cuda: this tandem was built without CUDA (nvcc not found, or -DTANDEM_CUDA=OFF)");
    if (verbose && requested == "auto")
        std::fprintf(stderr, "tandem: %s auto: built without CUDA: using the CPU\n", flag);
    return "cpu";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& kind, const Model& model, int n_ctx,
                                      const BackendSettings& settings, BackendRole role,
                                      std::optional<GgmlType> requantize_to, int64_t head_rows) {
    if (kind == "cuda") {
#ifdef TANDEM_HAS_CUDA
        return make_cuda_backend(model, n_ctx, settings, role);
#else
        throw Error(std::string(flag_of(role)) + " cuda: this build has no CUDA backend (nvcc was not found)");
#endif
    }
    auto cpu =
        std::make_unique<CpuBackend>(model, settings.threads, settings.chunk,
                                     CpuBackendOptions{.requantize_to = requantize_to,
                                                       .huge_pages = role == BackendRole::Draft || settings.long_lived,
                                                       .repack_cache_dir = settings.repack_cache_dir,
                                                       .head_rows = head_rows,
                                                       .kv_type = require_cpu_kv_type(settings.kv_type)});
    if (settings.verbose && cpu->repacked_bytes() > 0)
        std::fprintf(stderr, "%s: %s cpu: %.1f MB of repacked weight copies in %s\n", settings.program.c_str(),
                     flag_of(role), cpu->repacked_bytes() / 1e6, cpu->describe_repacking().c_str());
    return cpu;
}

std::string resolve_model_path(const std::string& name_or_path) {
    if (std::ifstream(name_or_path).good()) return name_or_path;
    if (find_known_model(name_or_path)) {
        if (auto p = installed_path(name_or_path)) return *p;
        throw Error("model " + name_or_path + " is not installed in " + environment().models_dir +
                    " (run scripts/fetch-models " + name_or_path + ")");
    }
    throw Error(name_or_path + ": no such model file");
}

std::unique_ptr<Model> load_draft(const Model& target, const std::string& target_path, const std::string& path) {
    auto draft = Model::load(path);
    const VocabCheck vc = [&] {
        try {
            return check_draft_vocabulary(*target.tokenizer, *draft->tokenizer);
        } catch (const Error& e) {
            throw Error("draft " + path + " cannot draft for " + target_path + ": " + e.what());
        }
    }();
    if (!vc.note.empty()) std::fprintf(stderr, "tandem: note: %s\n", vc.note.c_str());
    return draft;
}

void check_pair_fits(const std::string& kind, const Model& target, const std::string& draft_kind, const Model& draft,
                     int n_ctx, const BackendSettings& settings) {
#ifdef TANDEM_HAS_CUDA
    if (kind == "cuda" && draft_kind == "cuda")
        CudaBackend::check_pair_fits(
            CudaBackend::plan(target, n_ctx, cuda_prefill(settings), cuda_options(settings, BackendRole::Target)),
            CudaBackend::plan(draft, n_ctx, cuda_prefill(settings), cuda_options(settings, BackendRole::Draft)));
#else
    (void)kind, (void)target, (void)draft_kind, (void)draft, (void)n_ctx, (void)settings;
#endif
}

namespace {

// The context to allocate: the user's --ctx, else the model's, capped so the KV cache takes at most a quarter of
// physical memory.
int choose_context(int requested, const ModelConfig& c, const std::string& kv_type) {
    if (requested > 0) return requested;
    const size_t phys = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t per_pos =
        CpuKvCache::bytes_needed(c.n_layers, 1, c.kv_dim(), parse_cpu_kv_type(kv_type).value_or(CpuKvType::F16));
    const size_t fit = std::max<size_t>(256, phys / 4 / per_pos);
    return static_cast<int>(std::min<size_t>(static_cast<size_t>(c.context_length), fit));
}

// Instruct models (a chat template in the file, or --chat-template) get the prompt as one user turn; base models
// and --raw get the text as it is.
std::optional<ChatTemplate> choose_template(const SessionOptions& o, const Model& model) {
    if (o.raw) return std::nullopt;
    if (!o.chat_template.empty()) return ChatTemplate::by_name(o.chat_template);
    const std::string source = model.file->get_string_or("tokenizer.chat_template", "");
    if (source.empty()) return std::nullopt;
    std::string warning;
    std::optional<ChatTemplate> t = ChatTemplate::detect(source, &warning);
    if (!warning.empty()) std::fprintf(stderr, "tandem: warning: %s\n", warning.c_str());
    return t;
}

}  // namespace

Session::Session(const SessionOptions& o) : options_(o) {
    const BackendSettings& settings = o.backends;
    const bool verbose = settings.verbose;
    kind_ = resolve_backend(o.backend, "--backend", verbose);

    // No -m: the default model from the cache, with the default draft when it is installed too.
    model_path_ = o.model;
    draft_path_ = o.draft;
    if (model_path_.empty()) {
        const auto target = installed_path(default_target());
        if (!target)
            throw Error("no model given (-m FILE) and the default model " + default_target() + " is not installed in " +
                        environment().models_dir + ": run scripts/fetch-models");
        model_path_ = *target;
        const auto draft = installed_path(default_draft());
        if (draft_path_.empty() && !o.no_draft && draft) {
            draft_path_ = *draft;
            std::fprintf(stderr, "tandem: %s with draft %s (--no-draft to turn drafting off)\n",
                         default_target().c_str(), default_draft().c_str());
        }
    } else if (auto known = installed_path(model_path_)) {
        model_path_ = *known;  // a model name from --list-models
    }
    if (o.no_draft) draft_path_.clear();

    model_ = Model::load(model_path_, o.tokenizer);
    const ModelConfig& c = model_->config;
    n_ctx_ = choose_context(o.n_ctx, c, settings.kv_type);
    if (verbose)
        std::fprintf(stderr, "tandem: %s (%s): %d layers, dim %d, %d heads (%d kv), vocab %d, ctx %d, %d threads\n",
                     model_path_.c_str(), c.name.c_str(), c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.n_vocab, n_ctx_,
                     settings.threads);
    if (verbose) std::fprintf(stderr, "tandem: %s\n", c.describe_block().c_str());
    template_ = choose_template(o, *model_);
    if (o.think) {
        // Accepted whatever the model, so that a script can pass --think off to any of them: a model without a
        // thinking switch does not think, which off asks for anyway, and on cannot make it think.
        if (template_ && template_->supports_thinking())
            template_->set_thinking(*o.think);
        else
            std::fprintf(
                stderr, "tandem: note: --think %s is ignored: %s has no thinking switch\n", *o.think ? "on" : "off",
                template_ ? ("the chat template " + template_->name()).c_str() : "a run without a chat template");
    }

    // The draft model is loaded and its vocabulary checked before either backend is made, and a pair on one GPU is
    // planned as a whole: what cannot run is refused before the target's weights are uploaded.
    if (!draft_path_.empty()) {
        draft_kind_ = resolve_backend(o.draft_backend, "--draft-backend", verbose);
        draft_model_ = load_draft(*model_, model_path_, draft_path_);
        check_pair_fits(kind_, *model_, draft_kind_, *draft_model_, n_ctx_, settings);
    }
}

void Session::open_backends() {
    if (backend_) return;
    const SessionOptions& o = options_;
    const BackendSettings& settings = o.backends;
    backend_ = make_backend(kind_, *model_, n_ctx_, settings, BackendRole::Target);
    cache_ = backend_->new_cache(n_ctx_);
    if (draft_model_) {
        if (settings.verbose && o.draft_requant && draft_kind_ == "cuda")
            std::fprintf(stderr, "tandem: note: --draft-requant applies to a draft on the CPU backend\n");
        // The draft scores ids below --draft-vocab (and the context's): the rest of its output is never copied (the
        // backend copies every row when the value is 0 or covers the whole vocabulary).
        draft_backend_ = make_backend(draft_kind_, *draft_model_, n_ctx_, settings, BackendRole::Draft, o.draft_requant,
                                      o.draft_vocab);
        draft_cache_ = draft_backend_->new_cache(n_ctx_);
        if (settings.verbose)
            std::fprintf(stderr, "tandem: draft %s: %d layers, dim %d\n", draft_path_.c_str(),
                         draft_model_->config.n_layers, draft_model_->config.dim);
    }
    prompts_ = std::make_unique<PromptReuser>(o.prompt_cache, model_path_, *backend_, *cache_, draft_path_, draft());
}

}  // namespace tandem
