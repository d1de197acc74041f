// CudaBackend: embedding → n_layers × (RMSNorm, Q/K/V matvec (+bias), RoPE fused with the fp16 KV-cache write,
// split-K causal GQA attention, output projection, residual add fused into the next RMSNorm, gate/up matvec,
// SwiGLU, down matvec, residual add fused into the next RMSNorm) → output matvec → logits copied to the host.
//
// Memory: three device allocations made once — weights (one buffer, tensors at 256-byte aligned offsets), step
// scratch (one buffer) and the attention workspace (grows with the largest cache) — plus one per KV cache. The
// sizes come from the same layout functions the memory plan uses, so the plan is what gets allocated.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "error.h"
#include "kernels.h"
#include "model.h"

namespace tandem {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string gib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
    return buf;
}
std::string mib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

// Every tensor the forward pass reads, in upload order. A tied output is the same host pointer as the embedding
// and is uploaded once.
template <class F>
void for_each_tensor(const Weights& w, F&& f) {
    f(w.token_embd);
    f(w.output_norm);
    f(w.output);
    for (const LayerWeights& L : w.layers)
        for (const WeightView* v : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.wo, &L.ffn_norm,
                                    &L.w_gate, &L.w_up, &L.w_down})
            f(*v);
}

// Device offset of every distinct tensor, and the total.
size_t weight_layout(const Weights& w, std::unordered_map<const void*, size_t>* offsets) {
    size_t total = 0;
    std::unordered_map<const void*, size_t> local;
    auto& map = offsets ? *offsets : local;
    for_each_tensor(w, [&](const WeightView& v) {
        if (!v.data || map.count(v.data)) return;
        map[v.data] = total;
        total += align_up(v.n_bytes());
    });
    return total;
}

// The step scratch: sizes (in floats / ints) of its pieces, in order.
struct ScratchLayout {
    size_t x, xb, q, k, v, att, proj, gate, up, logits, inv_freq, tokens;
    size_t total() const {
        size_t t = 0;
        for (size_t floats : {x, xb, q, k, v, att, proj, gate, up, logits, inv_freq, tokens}) t += align_up(floats * 4);
        return t;
    }
};

ScratchLayout scratch_layout(const ModelConfig& c) {
    const size_t B = CudaBackend::kStepTokens;
    return {B * c.dim,        B * c.dim,        B * c.q_dim(),   B * c.kv_dim(),
            B * c.kv_dim(),   B * c.q_dim(),    B * c.dim,       B * c.hidden_dim,
            B * c.hidden_dim, B * c.n_vocab,    static_cast<size_t>(c.rope_dim / 2), B};
}

size_t workspace_bytes(const ModelConfig& c, int n_ctx) {
    const int n = CudaBackend::kStepTokens;
    // The worst step: the last n positions of the cache.
    return 4 * cuda::attention_workspace_floats(n, std::max(0, n_ctx - n), c.n_heads, c.head_dim,
                                                CudaBackend::kAttentionSplit);
}

void check_fits(const std::string& what, size_t need, const std::string& detail) {
    const cuda::DeviceMemory mem = cuda::device_memory();
    if (need > mem.free_bytes)
        throw Error(what + " needs " + gib(need) + " of device memory" + detail + " but the GPU (" +
                    cuda::device_name() + ") has " + gib(mem.free_bytes) + " free of " + gib(mem.total_bytes) +
                    " (a smaller --ctx or a smaller quantization may fit)");
}

}  // namespace

std::string CudaMemoryPlan::describe() const {
    return gib(total()) + " (weights " + mib(weights) + ", KV cache " + mib(kv_cache) + ", scratch " + mib(scratch) +
           ")";
}

CudaKvCache::CudaKvCache(int n_layers, int capacity, int kv_dim)
    : KvCache(capacity),
      kv_dim_(kv_dim),
      k_(bytes_needed(n_layers, capacity, kv_dim) / 2),
      v_(bytes_needed(n_layers, capacity, kv_dim) / 2) {}

CudaMemoryPlan CudaBackend::plan(const Model& model, int n_ctx) {
    const ModelConfig& c = model.config;
    CudaMemoryPlan p;
    p.weights = weight_layout(model.weights, nullptr);
    p.kv_cache = n_ctx > 0 ? CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim()) : 0;
    p.scratch = scratch_layout(c).total() + (n_ctx > 0 ? workspace_bytes(c, n_ctx) : 0);
    return p;
}

CudaBackend::CudaBackend(const Model& model, int n_ctx) : model_(model) {
    const ModelConfig& c = model.config;
    const Weights& w = model.weights;
    // What the kernels can take, checked before anything is allocated.
    auto require_matvec = [](const WeightView& v, const std::string& name) {
        if (!cuda::matvec_supports(v.type))
            throw Error("the CUDA backend cannot multiply " + std::string(ggml_type_name(v.type)) + " weights (" +
                        name + ")");
    };
    if (!cuda::embedding_supports(w.token_embd.type))
        throw Error("the CUDA backend cannot gather a " + std::string(ggml_type_name(w.token_embd.type)) +
                    " token embedding");
    require_matvec(w.output, "output");
    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& L = w.layers[l];
        const std::string p = "blk." + std::to_string(l) + ".";
        require_matvec(L.wq, p + "attn_q");
        require_matvec(L.wk, p + "attn_k");
        require_matvec(L.wv, p + "attn_v");
        require_matvec(L.wo, p + "attn_output");
        require_matvec(L.w_gate, p + "ffn_gate");
        require_matvec(L.w_up, p + "ffn_up");
        require_matvec(L.w_down, p + "ffn_down");
    }
    // The output rows of a step start at xb + i * dim, and matvec wants 16-byte aligned activations.
    if (c.dim % 4 != 0) throw Error("the CUDA backend needs an embedding length divisible by 4");

    const CudaMemoryPlan p = plan(model, n_ctx);
    check_fits("the model", p.total(), " " + p.describe().substr(p.describe().find('(')));

    stream_ = cuda::stream_create();
    try {
        // Weights: one buffer, each distinct tensor at its offset, uploaded once as the GGUF holds it.
        std::unordered_map<const void*, size_t> offsets;
        weight_buf_ = cuda::DeviceBuffer(weight_layout(w, &offsets));
        std::unordered_map<const void*, bool> uploaded;
        for_each_tensor(w, [&](const WeightView& v) {
            if (!v.data || uploaded[v.data]) return;
            uploaded[v.data] = true;
            cuda::copy_to_device(weight_buf_.as<uint8_t>() + offsets.at(v.data), v.data, v.n_bytes(), stream_);
        });
        auto dev = [&](const WeightView& v) -> const uint8_t* {
            return v.data ? weight_buf_.as<uint8_t>() + offsets.at(v.data) : nullptr;
        };
        auto matrix = [&](const WeightView& v) {
            return DeviceMatrix{dev(v), v.type, v.row_bytes(), static_cast<int>(v.rows), static_cast<int>(v.cols)};
        };
        auto vec = [&](const WeightView& v) { return reinterpret_cast<const float*>(dev(v)); };
        token_embd_ = matrix(w.token_embd);
        output_ = matrix(w.output);
        output_norm_ = vec(w.output_norm);
        for (const LayerWeights& L : w.layers)
            layers_.push_back({vec(L.attn_norm), vec(L.ffn_norm), vec(L.bq), vec(L.bk), vec(L.bv), matrix(L.wq),
                               matrix(L.wk), matrix(L.wv), matrix(L.wo), matrix(L.w_gate), matrix(L.w_up),
                               matrix(L.w_down)});

        // Scratch: one buffer cut into the pieces of scratch_layout.
        const ScratchLayout s = scratch_layout(c);
        scratch_buf_ = cuda::DeviceBuffer(s.total());
        uint8_t* cursor = scratch_buf_.as<uint8_t>();
        auto take = [&](size_t floats) {
            float* ptr = reinterpret_cast<float*>(cursor);
            cursor += align_up(floats * 4);
            return ptr;
        };
        x_ = take(s.x), xb_ = take(s.xb), q_ = take(s.q), k_ = take(s.k), v_ = take(s.v), att_ = take(s.att);
        proj_ = take(s.proj), gate_ = take(s.gate), up_ = take(s.up), logits_ = take(s.logits);
        inv_freq_ = take(s.inv_freq);
        tokens_ = reinterpret_cast<int*>(take(s.tokens));
        // The CPU backend's frequencies: theta^(-2i/rope_dim) computed in double, rounded to float.
        std::vector<float> inv_freq;
        for (int i = 0; i < c.rope_dim / 2; ++i)
            inv_freq.push_back(
                static_cast<float>(std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim)));
        cuda::copy_to_device(inv_freq_, inv_freq.data(), inv_freq.size() * 4, stream_);
        if (n_ctx > 0) ensure_workspace(n_ctx);
        cuda::stream_synchronize(stream_);  // the uploads read host memory that must stay put until they finish
    } catch (...) {
        cuda::stream_destroy(stream_);
        throw;
    }
}

CudaBackend::~CudaBackend() {
    try {
        cuda::stream_synchronize(stream_);
    } catch (...) {
        // A fault was already reported by the forward that caused it; freeing comes next either way.
    }
    cuda::stream_destroy(stream_);
}

void CudaBackend::ensure_workspace(int n_ctx) {
    if (n_ctx <= workspace_ctx_) return;
    cuda::stream_synchronize(stream_);  // the old workspace may still be in use by queued kernels
    workspace_buf_ = cuda::DeviceBuffer(workspace_bytes(model_.config, n_ctx));
    workspace_ctx_ = n_ctx;
}

std::unique_ptr<KvCache> CudaBackend::new_cache(int n_ctx) {
    const ModelConfig& c = model_.config;
    const size_t kv = CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim());
    const size_t ws = n_ctx > workspace_ctx_ ? workspace_bytes(c, n_ctx) : 0;
    check_fits("a KV cache of " + std::to_string(n_ctx) + " positions", kv + ws,
               " (KV cache " + mib(kv) + ", attention workspace " + mib(ws) + ")");
    ensure_workspace(n_ctx);
    return std::make_unique<CudaKvCache>(c.n_layers, n_ctx, c.kv_dim());
}

void CudaBackend::forward(std::span<const int> tokens, KvCache& cache_base, int n_logits, float* logits) {
    auto& cache = static_cast<CudaKvCache&>(cache_base);
    assert(n_logits >= 0 && static_cast<size_t>(n_logits) <= tokens.size());
    assert(cache.n_committed() + static_cast<int>(tokens.size()) <= cache.capacity());
    assert(cache.capacity() <= workspace_ctx_);
    const int n_vocab = model_.config.n_vocab;
    const int n_total = static_cast<int>(tokens.size());
    for (int begin = 0; begin < n_total; begin += kStepTokens) {
        const int n = std::min(kStepTokens, n_total - begin);
        const int first_logit_token = n_total - n_logits;
        const int step_logits = std::max(0, begin + n - std::max(begin, first_logit_token));
        float* out = logits ? logits + static_cast<size_t>(std::max(0, begin - first_logit_token)) * n_vocab
                            : nullptr;
        forward_step(tokens.subspan(begin, n), cache, step_logits, out);
    }
    cuda::stream_synchronize(stream_);
}

void CudaBackend::matvec(const DeviceMatrix& W, const float* x, int n, float* y) {
    cuda::matvec(W.type, W.data, W.row_bytes, W.rows, W.cols, x, n, y, stream_);
}

void CudaBackend::forward_step(std::span<const int> tokens, CudaKvCache& cache, int n_logits, float* logits) {
    const ModelConfig& c = model_.config;
    const int n = static_cast<int>(tokens.size());
    const int start_pos = cache.n_committed();
    const int dim = c.dim;
    for (int tok : tokens)
        if (tok < 0 || tok >= c.n_vocab) throw Error("token id " + std::to_string(tok) + " is out of range");

    // `tokens` is pageable host memory: the copy is staged before cudaMemcpyAsync returns.
    cuda::copy_to_device(tokens_, tokens.data(), static_cast<size_t>(n) * sizeof(int), stream_);
    cuda::embedding(token_embd_.type, token_embd_.data, token_embd_.row_bytes, c.n_vocab, dim, tokens_, n, x_,
                    stream_);
    cuda::rms_norm(x_, layers_[0].attn_norm, xb_, n, dim, c.rms_eps, stream_);

    const cuda::RopeMode mode =
        c.rope_style == RopeStyle::Neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs;
    for (int l = 0; l < c.n_layers; ++l) {
        const DeviceLayer& L = layers_[l];
        matvec(L.wq, xb_, n, q_);
        matvec(L.wk, xb_, n, k_);
        matvec(L.wv, xb_, n, v_);
        if (c.qkv_bias) {
            cuda::add_bias(q_, L.bq, n, c.q_dim(), stream_);
            cuda::add_bias(k_, L.bk, n, c.kv_dim(), stream_);
            cuda::add_bias(v_, L.bv, n, c.kv_dim(), stream_);
        }
        cuda::rope_kv_write({q_, k_, v_, cache.key(l), cache.value(l), inv_freq_, n, start_pos, c.n_heads,
                             c.n_kv_heads, c.head_dim, c.rope_dim, mode},
                            stream_);
        cuda::attention({q_, cache.key(l), cache.value(l), att_, workspace_buf_.as<float>(), n, start_pos, c.n_heads,
                         c.n_kv_heads, c.head_dim, kAttentionSplit},
                        stream_);
        matvec(L.wo, att_, n, proj_);
        cuda::add_rms_norm(x_, proj_, L.ffn_norm, xb_, n, dim, c.rms_eps, stream_);
        matvec(L.w_gate, xb_, n, gate_);
        matvec(L.w_up, xb_, n, up_);
        cuda::swiglu(gate_, up_, gate_, static_cast<int64_t>(n) * c.hidden_dim, stream_);
        matvec(L.w_down, gate_, n, proj_);
        // The residual add, fused with the norm that comes next: the next layer's, or the output norm.
        const float* next_norm = l + 1 < c.n_layers ? layers_[l + 1].attn_norm : output_norm_;
        cuda::add_rms_norm(x_, proj_, next_norm, xb_, n, dim, c.rms_eps, stream_);
    }
    cache.commit_appended(n);

    if (n_logits > 0) {
        matvec(output_, xb_ + static_cast<size_t>(n - n_logits) * dim, n_logits, logits_);
        // Queued on the stream like the kernels: a later step's output matvec cannot overwrite logits_ before the
        // copy has read it, and forward() synchronizes before the caller looks at `logits`.
        cuda::copy_to_host(logits, logits_, static_cast<size_t>(n_logits) * c.n_vocab * sizeof(float), stream_);
    }
}

}  // namespace tandem
