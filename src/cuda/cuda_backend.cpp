// CudaBackend: embedding → n_layers × (RMSNorm, Q/K/V matvec (+bias), RoPE fused with the fp16 KV-cache write,
// split-K causal GQA attention, output projection, residual add fused into the next RMSNorm, gate/up matvec,
// SwiGLU, down matvec, residual add fused into the next RMSNorm) → output matvec → logits copied to the host.
// Long calls take the prefill path: the same sequence per chunk with the GEMM for the matvecs and tiled flash
// attention for split-K; the output matvec still runs 16 rows at a time, for the requested logits only.
//
// Memory: three device allocations made once — weights (one buffer, tensors at 256-byte aligned offsets), chunk
// scratch (one buffer) and the attention workspace (grows with the largest cache) — plus one per KV cache. The
// sizes come from the same layout functions the memory plan uses, so the plan is what gets allocated.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

// The chunk scratch: sizes (in 4-byte words) of its pieces, in order. Activations hold one prefill chunk (or one
// step when that is longer); logits only kStepTokens rows, the output projection running 16 rows at a time (a
// chunk's worth of rows would be 256 x n_vocab floats, mostly never asked for). x16 and w_tile (fp16) exist only on
// the cuBLAS route.
struct ScratchLayout {
    size_t x, xb, q, k, v, att, proj, gate, up, logits, inv_freq, tokens, x16, w_tile;
    size_t total() const {
        size_t t = 0;
        for (size_t words : {x, xb, q, k, v, att, proj, gate, up, logits, inv_freq, tokens, x16, w_tile})
            t += align_up(words * 4);
        return t;
    }
};

// Halves of the fp16 weight tile: the largest layer matrix the cuBLAS route dequantizes, capped (whole rows fit:
// the cap is far above any row length).
size_t blas_tile_halves(const Weights& w) {
    size_t most = 0;
    for (const LayerWeights& L : w.layers)
        for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            if (v->type != GgmlType::F32 && v->type != GgmlType::F16)
                most = std::max(most, static_cast<size_t>(v->rows) * static_cast<size_t>(v->cols));
    return std::min(most, CudaBackend::kBlasTileHalves);
}

ScratchLayout scratch_layout(const Model& m, const CudaPrefillOptions& o, bool blas) {
    const ModelConfig& c = m.config;
    const size_t B = static_cast<size_t>(std::max(CudaBackend::kStepTokens, o.chunk_tokens));
    const size_t S = CudaBackend::kStepTokens;
    const size_t widest = std::max({static_cast<size_t>(c.dim), static_cast<size_t>(c.q_dim()),
                                    static_cast<size_t>(c.hidden_dim)});
    return {B * c.dim,        B * c.dim,        B * c.q_dim(),   B * c.kv_dim(),
            B * c.kv_dim(),   B * c.q_dim(),    B * c.dim,       B * c.hidden_dim,
            B * c.hidden_dim, S * c.n_vocab,    static_cast<size_t>(c.rope_dim / 2), B,
            blas ? (B * widest + 1) / 2 : 0,    blas ? (blas_tile_halves(m.weights) + 1) / 2 : 0};
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
           " for " + std::to_string(prefill_chunk) + "-token prefill chunks, " +
           (blas ? "cuBLAS fp16 GEMM" : "SIMT GEMM") + ")";
}

bool CudaBackend::use_blas() {
    if (!cuda::blas_available()) return false;
    const char* env = std::getenv("TANDEM_CUDA_GEMM");
    return !(env && std::string(env) == "simt");
}

CudaKvCache::CudaKvCache(int n_layers, int capacity, int kv_dim)
    : KvCache(capacity),
      kv_dim_(kv_dim),
      k_(bytes_needed(n_layers, capacity, kv_dim) / 2),
      v_(bytes_needed(n_layers, capacity, kv_dim) / 2) {}

CudaMemoryPlan CudaBackend::plan(const Model& model, int n_ctx, CudaPrefillOptions prefill) {
    const ModelConfig& c = model.config;
    CudaMemoryPlan p;
    p.blas = use_blas();
    p.prefill_chunk = prefill.chunk_tokens;
    p.weights = weight_layout(model.weights, nullptr);
    p.kv_cache = n_ctx > 0 ? CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim()) : 0;
    p.scratch = scratch_layout(model, prefill, p.blas).total() + (n_ctx > 0 ? workspace_bytes(c, n_ctx) : 0);
    return p;
}

CudaBackend::CudaBackend(const Model& model, int n_ctx, CudaPrefillOptions prefill)
    : model_(model), prefill_(prefill) {
    if (prefill.chunk_tokens < 1 || prefill.matvec_max_call < 0)
        throw Error("the CUDA backend needs a prefill chunk of at least one token");
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

    const CudaMemoryPlan p = plan(model, n_ctx, prefill);
    check_fits("the model", p.total(), " " + p.describe().substr(p.describe().find('(')));

    stream_ = cuda::stream_create();
    try {
        if (p.blas) blas_.reset(cuda::blas_create(stream_));
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
        const ScratchLayout s = scratch_layout(model, prefill, p.blas);
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
        x16_ = reinterpret_cast<uint16_t*>(take(s.x16));
        w_tile_ = reinterpret_cast<uint16_t*>(take(s.w_tile));
        w_tile_halves_ = 2 * s.w_tile;
        // The CPU backend's frequencies: theta^(-2i/rope_dim) computed in double, rounded to float.
        std::vector<float> inv_freq;
        for (int i = 0; i < c.rope_dim / 2; ++i)
            inv_freq.push_back(
                static_cast<float>(std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim)));
        cuda::copy_to_device(inv_freq_, inv_freq.data(), inv_freq.size() * 4, stream_);
        if (n_ctx > 0) ensure_workspace(n_ctx);
        cuda::stream_synchronize(stream_);  // the uploads read host memory that must stay put until they finish
    } catch (...) {
        blas_.reset();
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
    blas_.reset();  // bound to stream_: goes first
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
    // The path is chosen for the whole call, so a call's positions all come out of the same kernels.
    const bool prefill = n_total > prefill_.matvec_max_call;
    const int step = prefill ? prefill_.chunk_tokens : kStepTokens;
    for (int begin = 0; begin < n_total; begin += step) {
        const int n = std::min(step, n_total - begin);
        const int first_logit_token = n_total - n_logits;
        const int step_logits = std::max(0, begin + n - std::max(begin, first_logit_token));
        float* out = logits ? logits + static_cast<size_t>(std::max(0, begin - first_logit_token)) * n_vocab
                            : nullptr;
        forward_step(tokens.subspan(begin, n), cache, step_logits, out, prefill);
    }
    cuda::stream_synchronize(stream_);
}

void CudaBackend::gemm_input(const float* x, int n, int cols) {
    if (blas_) cuda::convert_f16(x, static_cast<size_t>(n) * cols, x16_, stream_);
}

void CudaBackend::matmul(const DeviceMatrix& W, const float* x, int n, float* y, bool prefill) {
    if (!prefill)
        cuda::matvec(W.type, W.data, W.row_bytes, W.rows, W.cols, x, n, y, stream_);
    else if (!blas_)
        cuda::gemm(W.type, W.data, W.row_bytes, W.rows, W.cols, x, n, y, stream_);
    else
        cuda::gemm_via_f16(blas_.get(), W.type, W.data, W.row_bytes, W.rows, W.cols, x, x16_, n, y, w_tile_,
                           w_tile_halves_, stream_);
}

void CudaBackend::forward_step(std::span<const int> tokens, CudaKvCache& cache, int n_logits, float* logits,
                               bool prefill) {
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
        if (prefill) gemm_input(xb_, n, dim);
        matmul(L.wq, xb_, n, q_, prefill);
        matmul(L.wk, xb_, n, k_, prefill);
        matmul(L.wv, xb_, n, v_, prefill);
        if (c.qkv_bias) {
            cuda::add_bias(q_, L.bq, n, c.q_dim(), stream_);
            cuda::add_bias(k_, L.bk, n, c.kv_dim(), stream_);
            cuda::add_bias(v_, L.bv, n, c.kv_dim(), stream_);
        }
        cuda::rope_kv_write({q_, k_, v_, cache.key(l), cache.value(l), inv_freq_, n, start_pos, c.n_heads,
                             c.n_kv_heads, c.head_dim, c.rope_dim, mode},
                            stream_);
        const cuda::AttentionArgs att{q_, cache.key(l), cache.value(l), att_, workspace_buf_.as<float>(), n, start_pos,
                                      c.n_heads, c.n_kv_heads, c.head_dim, kAttentionSplit};
        if (prefill)
            cuda::attention_prefill(att, stream_);
        else
            cuda::attention(att, stream_);
        if (prefill) gemm_input(att_, n, c.q_dim());
        matmul(L.wo, att_, n, proj_, prefill);
        cuda::add_rms_norm(x_, proj_, L.ffn_norm, xb_, n, dim, c.rms_eps, stream_);
        if (prefill) gemm_input(xb_, n, dim);
        matmul(L.w_gate, xb_, n, gate_, prefill);
        matmul(L.w_up, xb_, n, up_, prefill);
        cuda::swiglu(gate_, up_, gate_, static_cast<int64_t>(n) * c.hidden_dim, stream_);
        if (prefill) gemm_input(gate_, n, c.hidden_dim);
        matmul(L.w_down, gate_, n, proj_, prefill);
        // The residual add, fused with the norm that comes next: the next layer's, or the output norm.
        const float* next_norm = l + 1 < c.n_layers ? layers_[l + 1].attn_norm : output_norm_;
        cuda::add_rms_norm(x_, proj_, next_norm, xb_, n, dim, c.rms_eps, stream_);
    }
    cache.commit_appended(n);

    // The output projection for the requested rows only, kStepTokens at a time through matvec whatever the path:
    // logits_ holds that many rows. Queued on the stream like the kernels: the next group's matvec cannot overwrite
    // logits_ before the copy has read it, and forward() synchronizes before the caller looks at `logits`.
    for (int g = 0; g < n_logits; g += kStepTokens) {
        const int rows = std::min(kStepTokens, n_logits - g);
        cuda::matvec(output_.type, output_.data, output_.row_bytes, output_.rows, output_.cols,
                     xb_ + static_cast<size_t>(n - n_logits + g) * dim, rows, logits_, stream_);
        cuda::copy_to_host(logits + static_cast<size_t>(g) * c.n_vocab, logits_,
                           static_cast<size_t>(rows) * c.n_vocab * sizeof(float), stream_);
    }
}

}  // namespace tandem
