// CudaBackend: embedding → n_layers × (RMSNorm, Q/K/V matvec (+bias), RoPE fused with the KV-cache write (fp16 or
// Q8_0), split-K causal GQA attention, output projection, residual add fused into the next RMSNorm, gate/up matvec,
// SwiGLU, down matvec, residual add fused into the next RMSNorm) → output matvec → logits (or their argmax ids)
// copied to the host.
// Long calls take the prefill path: the same sequence per chunk with the GEMM for the matvecs and tiled flash
// attention for split-K; the output matvec still runs 16 rows at a time, for the requested logits only.
//
// forward_batch runs several sequences' tokens as the steps of one call: each matrix over all the step's rows, RoPE,
// the cache writes and attention per sequence (one launch each, against its own cache and position), the wanted
// rows' logits through one output projection.
//
// Short calls replay one CUDA graph per step shape (see cuda_backend.h for why the position lives in device memory
// and attention's grid is bucketed); long calls, batched steps of several sequences and --cuda-route graphs=0 launch
// kernel by kernel. Both run the same enqueue functions, so the graph holds exactly the launches a direct step makes.
//
// Memory: three device allocations made once — weights (one buffer, tensors at 256-byte aligned offsets), chunk
// scratch (one buffer) and the attention workspace (grows with the largest cache) — plus one per KV cache. The
// sizes come from the same layout functions the memory plan uses, so the plan is what gets allocated.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "error.h"
#include "kernels.h"
#include "model/model.h"

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
        for (const WeightView* v : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.wo,
                                    &L.post_attn_norm, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down, &L.post_ffn_norm})
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
// chunk's worth of rows would be 256 x n_vocab floats, mostly never asked for). step_in is the start position and
// the tokens; ids and sampling the greedy picks of kStepTokens rows and their kernels' workspace; extra_ids the
// extra logit ids of restrict_logits (at most n_vocab); xq a step's input quantized for the 8-bit matvec route
// (Q8_1 or Q8_K rows of the widest input); xq_ffn SwiGLU's output quantized for ffn_down (gate/up reads xq while
// its last blocks write it) and swiglu_counters their count of finished rows; xq_norm the residual RMSNorm's
// output quantized for the matvec after it (not xq: attn_output and ffn_down read that while their last block
// writes it); split_counters the decode attention's, one per (step token, head); rope_trig a step's RoPE cosines and sines and rope_counters the Q/K/V
// launch's count of finished blocks per head (matvec_qkv_rope); norm_counter matvec_add_rms_norm's count of
// finished blocks; pick_counters the one-launch argmax's per row.
// x16 and w_tile (fp16) exist only on the cuBLAS route.
struct ScratchLayout {
    size_t x, xb, q, k, v, att, proj, gate, up, logits, inv_freq, step_in, ids, top_probs, sampling, extra_ids,
        cand_logits, cand_ids, cand_extra_ids, cand_extra_logits, xq, xq_ffn, xq_norm, swiglu_counters, split_counters,
        rope_trig, rope_counters, norm_counter, pick_counters, x16, w_tile;
    size_t total() const {
        size_t t = 0;
        for (size_t words : {x,
                             xb,
                             q,
                             k,
                             v,
                             att,
                             proj,
                             gate,
                             up,
                             logits,
                             inv_freq,
                             step_in,
                             ids,
                             top_probs,
                             sampling,
                             extra_ids,
                             cand_logits,
                             cand_ids,
                             cand_extra_ids,
                             cand_extra_logits,
                             xq,
                             xq_ffn,
                             xq_norm,
                             swiglu_counters,
                             split_counters,
                             rope_trig,
                             rope_counters,
                             norm_counter,
                             pick_counters,
                             x16,
                             w_tile})
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

// Bytes of a quantized activation row of `cols` for any type of the 8-bit route: 36 bytes per 32 (Q8_1) or 292 per
// 256 (Q8_K), whichever is more, over whole blocks.
size_t q8_row_bytes_bound(size_t cols) { return std::max((cols + 31) / 32 * 36, (cols + 255) / 256 * 292); }

ScratchLayout scratch_layout(const Model& m, const CudaPrefillOptions& o, bool blas, bool int8_gemm) {
    const ModelConfig& c = m.config;
    const size_t B = static_cast<size_t>(std::max(CudaBackend::kStepTokens, o.chunk_tokens));
    const size_t S = CudaBackend::kStepTokens;
    const size_t widest =
        std::max({static_cast<size_t>(c.dim), static_cast<size_t>(c.q_dim()), static_cast<size_t>(c.hidden_dim)});
    return {B * c.dim,
            B * c.dim,
            B * c.q_dim(),
            B * c.kv_dim(),
            B * c.kv_dim(),
            B * c.q_dim(),
            B * c.dim,
            B * c.hidden_dim,
            B * c.hidden_dim,
            S * c.n_vocab,
            c.rope_inv_freq.size() * static_cast<size_t>(c.rope_dim / 2),
            1 + B,
            S,
            S,
            (cuda::sampling_workspace_bytes(static_cast<int>(S), c.n_vocab) + 3) / 4,
            static_cast<size_t>(c.n_vocab),
            S * cuda::kTopKMax,
            S * cuda::kTopKMax,
            static_cast<size_t>(cuda::kTopKMax),
            S * cuda::kTopKMax,
            ((int8_gemm ? B : S) * q8_row_bytes_bound(widest) + 3) / 4,
            (S * q8_row_bytes_bound(static_cast<size_t>(c.hidden_dim)) + 3) / 4,
            (S * q8_row_bytes_bound(static_cast<size_t>(c.dim)) + 3) / 4,
            cuda::matvec_swiglu_counters(c.hidden_dim),
            S * c.n_heads,
            S * c.rope_dim,
            static_cast<size_t>(c.n_heads + 2 * c.n_kv_heads),
            1,
            cuda::argmax_counters(static_cast<int>(S)),
            blas ? (B * widest + 1) / 2 : 0,
            blas ? (blas_tile_halves(m.weights) + 1) / 2 : 0};
}

// Every layer's sliding window (0: none) and its ring's shape: the margin is the longest step (a prefill chunk, or a
// short call of up to matvec_max_call tokens) and the rollback margin (kv_rings.h), the alignment the attention
// kernels' splits and tiles need.
CudaKvWindows kv_windows(const ModelConfig& c, const CudaPrefillOptions& prefill, const CudaOptions& options) {
    CudaKvWindows w;
    for (const LayerAttention& l : c.layers) w.windows.push_back(l.window);
    w.margin =
        std::max({prefill.chunk_tokens, prefill.matvec_max_call, CudaBackend::kStepTokens}) + KvRings::kRollbackMargin;
    w.align = cuda::attention_ring_multiple(options.attention_split);
    return w;
}

size_t workspace_bytes(const ModelConfig& c, int n_ctx, int split) {
    const int n = CudaBackend::kStepTokens;
    // The worst step: the last n positions of the cache. (A graph's attention grid is rounded up, but never past
    // the splits of the whole cache, which this is.)
    return 4 * cuda::attention_workspace_floats(n, std::max(0, n_ctx - n), c.n_heads, c.head_dim, split);
}

void check_fits(const std::string& what, size_t need, const std::string& detail) {
    const cuda::DeviceMemory mem = cuda::device_memory();
    if (need > mem.free_bytes)
        throw Error(what + " needs " + gib(need) + " of device memory" + detail + " but the GPU (" +
                    cuda::device_name() + ") has " + gib(mem.free_bytes) + " free of " + gib(mem.total_bytes) +
                    " (a smaller --ctx or a smaller quantization may fit)");
}

// The persistent decode step's shape for this model (kernels.h decode_step).
cuda::DecodeStepShape step_shape(const ModelConfig& c, cuda::KvType kv_type) {
    return {c.n_layers, c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim, kv_type};
}

// The persistent step's counters: attention's per head, then RoPE's per Q, K and V head.
size_t persistent_step_counters(const ModelConfig& c) { return static_cast<size_t>(2 * c.n_heads + 2 * c.n_kv_heads); }

// Device bytes of the persistent step's layer table, attention workspace and counters.
size_t persistent_step_bytes(const ModelConfig& c, const cuda::DecodeStepPlan& plan) {
    return align_up(static_cast<size_t>(c.n_layers) * sizeof(cuda::DecodeStepLayer)) +
           align_up(plan.workspace_floats * 4 + persistent_step_counters(c) * sizeof(unsigned));
}

}  // namespace

std::optional<cuda::DecodeStepPlan> CudaBackend::persistent_step_plan(const Model& model, const CudaOptions& options) {
    if (!options.persistent_step) return std::nullopt;
    const ModelConfig& c = model.config;
    if (!c.is_plain_block()) return std::nullopt;  // the launch computes the plain llama/qwen2 block only
    if (!cuda::decode_step_supports(step_shape(c, options.kv_type))) return std::nullopt;
    // Rows staged through shared memory, by the first staged kernel that takes every matrix's type, unless
    // --cuda-route matvec=direct asks otherwise, none does, or every matrix is of a float type (walked directly
    // in any kernel: the direct one, without the stage, is the same sums).
    std::vector<GgmlType> types;
    for (const LayerWeights& L : model.weights.layers) {
        for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.w_gate, &L.w_up})
            if (!cuda::decode_step_supports(v->type, c.dim)) return std::nullopt;
        if (!cuda::decode_step_supports(L.wo.type, c.q_dim()) ||
            !cuda::decode_step_supports(L.w_down.type, c.hidden_dim))
            return std::nullopt;
        for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            types.push_back(v->type);
    }
    // With 8-bit activations where every block type's route reads them (--cuda-route int8=1, or a model of Q4_0 rows
    // only, its measured route), as the launches the step replaces would, where an 8-bit kernel takes every type
    // (Q5_K_M's rows and the real draft's Q5_0 / Q8_0 / Q4_K / Q6_K take fp32 rows: those 8-bit kernels spilled).
    const auto block_type_is_int8 = [&](GgmlType t) {
        return ggml_is_float_type(t) || (options.matvec_route(t).int8 && cuda::matvec_q8_supports(t));
    };
    cuda::DecodeStepRows rows = cuda::DecodeStepRows::Direct;
    if (options.matvec_loads != cuda::MatvecLoads::Direct &&
        !std::all_of(types.begin(), types.end(), ggml_is_float_type)) {
        const bool int8 = std::all_of(types.begin(), types.end(), block_type_is_int8);
        for (const cuda::DecodeStepRows staged : {cuda::DecodeStepRows::Int8Q4_0, cuda::DecodeStepRows::Int8Q4K,
                                                  cuda::DecodeStepRows::StagedQ4K, cuda::DecodeStepRows::StagedQ5K}) {
            if (cuda::decode_step_int8(staged) && !int8) continue;  // (then an fp32 kernel, as without 8-bit)
            if (std::all_of(types.begin(), types.end(),
                            [&](GgmlType t) { return cuda::decode_step_stages(staged, t); })) {
                rows = staged;
                break;
            }
        }
    }
    return cuda::decode_step_plan(step_shape(c, options.kv_type), options.persistent_step_blocks, rows);
}

std::string CudaBackend::describe_persistent_step(const Model& model, const CudaOptions& options) {
    if (!options.persistent_step) return "kernel by kernel";
    const auto plan = persistent_step_plan(model, options);
    if (!plan) return "kernel by kernel (the model's shapes or types do not fit the persistent launch)";
    return std::string("in one persistent launch of ") + std::to_string(plan->blocks) + " blocks (rows " +
           cuda::decode_step_rows_name(plan->rows) + ")";
}

std::optional<cuda::KvType> parse_kv_type(const std::string& name) {
    if (name == "f16") return cuda::KvType::F16;
    if (name == "q8_0") return cuda::KvType::Q8_0;
    return std::nullopt;
}

const char* kv_type_name(cuda::KvType type) { return type == cuda::KvType::Q8_0 ? "q8_0" : "f16"; }

std::string CudaMemoryPlan::describe() const {
    return gib(total()) + " (weights " + mib(weights) + ", KV cache " + mib(kv_cache) + " " + kv_type_name(kv_type) +
           ", scratch " + mib(scratch) + " for " + std::to_string(prefill_chunk) + "-token prefill chunks, " +
           (int8_gemm ? "int8 tensor-core GEMM, else " : "") + (blas ? "cuBLAS fp16 GEMM" : "SIMT GEMM") + ")";
}

namespace {

// The options as the device can honour them: before sm_80 the int8 GEMM's instructions do not exist, so such a
// device keeps the fp16 route (the plan's describe(), printed by -v, says which).
CudaOptions on_this_device(CudaOptions o) {
    o.int8_gemm = o.int8_gemm && cuda::device_has_int8_mma();
    return o;
}

}  // namespace

bool CudaBackend::use_blas(const CudaOptions& options) { return !options.simt_gemm && cuda::blas_available(); }

namespace {
// The rings of a cache of `capacity` positions (every layer's window, 0 past `windows`).
KvRings cuda_rings(int n_layers, int capacity, const CudaKvWindows& w) {
    std::vector<int> all(w.windows);
    all.resize(static_cast<size_t>(n_layers), 0);
    return KvRings(all, w.margin, capacity, false, w.align);
}
}  // namespace

size_t CudaKvCache::bytes_needed(int n_layers, int capacity, int kv_dim, cuda::KvType type,
                                 const CudaKvWindows& windows) {
    const KvRings rings = cuda_rings(n_layers, capacity, windows);
    size_t rows = 0;
    for (int l = 0; l < n_layers; ++l) rows += static_cast<size_t>(rings.ring(l) > 0 ? rings.ring(l) : capacity);
    return 2 * cuda::kv_row_bytes(type, kv_dim) * rows;
}

CudaKvCache::CudaKvCache(int n_layers, int capacity, int kv_dim, cuda::KvType type, const CudaKvWindows& windows)
    : KvCache(capacity),
      type_(type),
      row_bytes_(cuda::kv_row_bytes(type, kv_dim)),
      rings_(cuda_rings(n_layers, capacity, windows)),
      k_(bytes_needed(n_layers, capacity, kv_dim, type, windows) / 2),
      v_(bytes_needed(n_layers, capacity, kv_dim, type, windows) / 2) {
    size_t offset = 0;
    for (int l = 0; l < n_layers; ++l) {
        layer_offset_.push_back(offset);
        offset += static_cast<size_t>(rings_.ring(l) > 0 ? rings_.ring(l) : capacity) * row_bytes_;
    }
}

KvCache::RowFormat CudaKvCache::row_format() const {
    return {type_ == cuda::KvType::Q8_0 ? "q8_0" : "f16", static_cast<int>(layer_offset_.size()), row_bytes_};
}

void CudaKvCache::copy_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values, bool to_host) const {
    const int ring = rings_.ring(layer);
    for (int done = 0; done < n;) {
        const int pos = first + done, row = ring > 0 ? pos % ring : pos;
        const int run = ring > 0 ? std::min(n - done, ring - row) : n - done;
        const size_t at = static_cast<size_t>(row) * row_bytes_, bytes = static_cast<size_t>(run) * row_bytes_;
        uint8_t* k = static_cast<uint8_t*>(key(layer)) + at;
        uint8_t* v = static_cast<uint8_t*>(value(layer)) + at;
        uint8_t* hk = keys + static_cast<size_t>(done) * row_bytes_;
        uint8_t* hv = values + static_cast<size_t>(done) * row_bytes_;
        if (to_host) {
            cuda::copy_to_host(hk, k, bytes, nullptr);
            cuda::copy_to_host(hv, v, bytes, nullptr);
        } else {
            cuda::copy_to_device(k, hk, bytes, nullptr);
            cuda::copy_to_device(v, hv, bytes, nullptr);
        }
        done += run;
    }
    cuda::stream_synchronize(nullptr);
}

void CudaKvCache::read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const {
    assert(first >= held_from(layer) && first + n <= n_committed());
    copy_rows(layer, first, n, keys, values, true);
}

void CudaKvCache::write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) {
    assert(n_committed() == 0 && first >= 0 && first + n <= capacity() && (ring(layer) == 0 || n <= ring(layer)));
    copy_rows(layer, first, n, const_cast<uint8_t*>(keys), const_cast<uint8_t*>(values), false);
}

std::string CudaBackend::kv_signature() const {
    // The routes that are "the same bits" as their alternatives (graphs, fusions, loads) are left out.
    return "cuda " + cuda::device_name() + "; prefill chunk " + std::to_string(prefill_.chunk_tokens) +
           ", calls over " + std::to_string(prefill_.matvec_max_call) + (options_.int8_gemm ? " int8 GEMM," : "") +
           (blas_ ? " cuBLAS" : " SIMT GEMM") + "; matvecs " + describe_matvec_routes(options_) +
           (options_.persistent_step ? "; persistent step" : "");
}

CudaMemoryPlan CudaBackend::plan(const Model& model, int n_ctx, CudaPrefillOptions prefill, CudaOptions options) {
    const ModelConfig& c = model.config;
    CudaMemoryPlan p;
    p.blas = use_blas(options);
    p.int8_gemm = on_this_device(options).int8_gemm;
    p.prefill_chunk = prefill.chunk_tokens;
    p.weights = weight_layout(model.weights, nullptr);
    p.kv_type = options.kv_type;
    p.kv_cache = n_ctx > 0 ? CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim(), options.kv_type,
                                                       kv_windows(c, prefill, options))
                           : 0;
    p.scratch = scratch_layout(model, prefill, p.blas, p.int8_gemm).total() +
                (n_ctx > 0 ? workspace_bytes(c, n_ctx, options.attention_split) : 0);
    if (const auto step = persistent_step_plan(model, options)) p.scratch += persistent_step_bytes(c, *step);
    return p;
}

void CudaBackend::check_pair_fits(const CudaMemoryPlan& target, const CudaMemoryPlan& draft) {
    check_fits("the model with its draft", target.total() + draft.total(),
               " (model " + target.describe() + "; draft " + draft.describe() + ")");
}

CudaBackend::CudaBackend(const Model& model, int n_ctx, CudaPrefillOptions prefill, CudaOptions options)
    : model_(model), prefill_(prefill), options_(on_this_device(options)) {
    if (prefill.chunk_tokens < 1 || prefill.matvec_max_call < 0)
        throw Error("the CUDA backend needs a prefill chunk of at least one token");
    if (options.attention_split < 1) throw Error("the CUDA backend needs attention splits of at least one position");
    if (!cuda::kv_type_supports(options.kv_type, model.config.kv_dim()))
        throw Error(std::string("--kv-type ") + kv_type_name(options.kv_type) +
                    " needs the model's key/value width (n_kv_heads x head_dim = " +
                    std::to_string(model.config.kv_dim()) + ") to be a multiple of 32");
    const ModelConfig& c = model.config;
    const Weights& w = model.weights;
    // The block variations (ModelConfig) run kernel by kernel; what the kernels cannot take is refused here.
    if (c.post_norms && c.hidden_dim < c.dim)
        throw Error("the CUDA backend's post-norms need feed_forward_length >= embedding_length: use --backend cpu");
    if (c.qk_norm && c.head_dim > 256)
        throw Error("the CUDA backend's QK-norm takes heads of at most 256 (this model's: " +
                    std::to_string(c.head_dim) + "): use --backend cpu");
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

    const CudaMemoryPlan p = plan(model, n_ctx, prefill, options);
    check_fits("the model", p.total(), " " + p.describe().substr(p.describe().find('(')));

    stream_ = cuda::stream_create(options.overlap_launches, options.high_priority);
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
            layers_.push_back({vec(L.attn_norm), vec(L.ffn_norm), vec(L.bq), vec(L.bk), vec(L.bv), vec(L.q_norm),
                               vec(L.k_norm), vec(L.post_attn_norm), vec(L.post_ffn_norm), matrix(L.wq), matrix(L.wk),
                               matrix(L.wv), matrix(L.wo), matrix(L.w_gate), matrix(L.w_up), matrix(L.w_down)});

        // Scratch: one buffer cut into the pieces of scratch_layout.
        const ScratchLayout s = scratch_layout(model, prefill, p.blas, p.int8_gemm);
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
        step_in_ = reinterpret_cast<int*>(take(s.step_in));
        tokens_ = step_in_ + 1;
        step_host_.resize(s.step_in);
        ids_ = reinterpret_cast<int*>(take(s.ids));
        top_probs_ = take(s.top_probs);
        sampling_ws_ = take(s.sampling);
        logit_extra_ids_ = reinterpret_cast<int*>(take(s.extra_ids));
        logit_first_ = c.n_vocab;
        cand_logits_ = take(s.cand_logits);
        cand_ids_ = reinterpret_cast<int*>(take(s.cand_ids));
        cand_extra_ids_ = reinterpret_cast<int*>(take(s.cand_extra_ids));
        cand_extra_logits_ = take(s.cand_extra_logits);
        xq_ = reinterpret_cast<uint8_t*>(take(s.xq));
        xq_ffn_ = reinterpret_cast<uint8_t*>(take(s.xq_ffn));
        xq_norm_ = reinterpret_cast<uint8_t*>(take(s.xq_norm));
        swiglu_counters_ = reinterpret_cast<unsigned*>(take(s.swiglu_counters));
        cuda::device_memset(swiglu_counters_, 0, s.swiglu_counters * 4, stream_);  // matvec_swiglu leaves them at zero
        split_counters_ = reinterpret_cast<unsigned*>(take(s.split_counters));
        cuda::device_memset(split_counters_, 0, s.split_counters * 4, stream_);  // attention leaves them at zero
        rope_trig_ = take(s.rope_trig);
        rope_counters_ = reinterpret_cast<unsigned*>(take(s.rope_counters));
        cuda::device_memset(rope_counters_, 0, s.rope_counters * 4, stream_);  // matvec_qkv_rope leaves them at zero
        norm_counter_ = reinterpret_cast<unsigned*>(take(s.norm_counter));
        cuda::device_memset(norm_counter_, 0, s.norm_counter * 4, stream_);  // matvec_add_rms_norm leaves it at zero
        pick_counters_ = reinterpret_cast<unsigned*>(take(s.pick_counters));
        cuda::device_memset(pick_counters_, 0, s.pick_counters * 4, stream_);  // the argmax leaves them at zero
        x16_ = reinterpret_cast<uint16_t*>(take(s.x16));
        w_tile_ = reinterpret_cast<uint16_t*>(take(s.w_tile));
        w_tile_halves_ = 2 * s.w_tile;
        // The model's RoPE tables (ModelConfig::rope_inv_freq, the CPU backend's), one after another.
        std::vector<float> inv_freq;
        for (const std::vector<float>& table : c.rope_inv_freq)
            inv_freq.insert(inv_freq.end(), table.begin(), table.end());
        cuda::copy_to_device(inv_freq_, inv_freq.data(), inv_freq.size() * 4, stream_);
        if (const auto step = persistent_step_plan(model, options)) {
            step_plan_ = *step;
            step_layers_buf_ = cuda::DeviceBuffer(static_cast<size_t>(c.n_layers) * sizeof(cuda::DecodeStepLayer));
            // The attention workspace, then the counters (zero: each launch leaves them so).
            step_ws_buf_ = cuda::DeviceBuffer(step_plan_.workspace_floats * 4 + persistent_step_counters(c) * 4);
            cuda::device_memset(step_ws_buf_.as<float>() + step_plan_.workspace_floats, 0,
                                persistent_step_counters(c) * 4, stream_);
        }
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
    workspace_buf_ = cuda::DeviceBuffer(workspace_bytes(model_.config, n_ctx, options_.attention_split));
    workspace_ctx_ = n_ctx;
}

std::unique_ptr<KvCache> CudaBackend::new_cache(int n_ctx) {
    const ModelConfig& c = model_.config;
    const CudaKvWindows windows = kv_windows(c, prefill_, options_);
    const size_t kv = CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim(), options_.kv_type, windows);
    const size_t ws = n_ctx > workspace_ctx_ ? workspace_bytes(c, n_ctx, options_.attention_split) : 0;
    check_fits("a KV cache of " + std::to_string(n_ctx) + " positions", kv + ws,
               " (KV cache " + mib(kv) + ", attention workspace " + mib(ws) + ")");
    ensure_workspace(n_ctx);
    return std::make_unique<CudaKvCache>(c.n_layers, n_ctx, c.kv_dim(), options_.kv_type, windows);
}

CudaBackend::CallOutput CudaBackend::CallOutput::advanced(size_t rows, int n_vocab) const {
    CallOutput o = *this;
    if (logits) o.logits += rows * static_cast<size_t>(n_vocab);
    if (ids) o.ids += rows;
    if (top_probs) o.top_probs += rows;
    if (top_logits) o.top_logits += rows * static_cast<size_t>(k);
    if (top_ids) o.top_ids += rows * static_cast<size_t>(k);
    if (extra_logits) o.extra_logits += rows * static_cast<size_t>(n_extra);
    return o;
}

void CudaBackend::forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) {
    CallOutput out;
    out.logits = logits;
    run_call(tokens, cache, n_logits, out);
}

void CudaBackend::forward_argmax(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids, std::span<float>) {
    CallOutput out;
    out.ids = ids;
    run_call(tokens, cache, n_rows, out);
}

void CudaBackend::forward_argmax_confidence(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                                            float* top_probs, std::span<float>) {
    CallOutput out;
    out.ids = ids;
    out.top_probs = top_probs;
    run_call(tokens, cache, n_rows, out);
}

void CudaBackend::forward_candidates(std::span<const int> tokens, KvCache& cache, int n_rows, int k,
                                     std::span<const int> extra, float* top_logits, int* top_ids, float* extra_logits,
                                     std::span<float>) {
    const int n_vocab = model_.config.n_vocab;
    if (k < 1 || k > std::min(cuda::kTopKMax, n_vocab))
        throw Error("candidates: k = " + std::to_string(k) + " is outside 1.." +
                    std::to_string(std::min(cuda::kTopKMax, n_vocab)));
    if (extra.size() > static_cast<size_t>(cuda::kTopKMax))
        throw Error("candidates: more than " + std::to_string(cuda::kTopKMax) + " extra ids");
    CallOutput out;
    out.k = k;
    out.n_extra = static_cast<int>(extra.size());
    out.top_logits = top_logits, out.top_ids = top_ids, out.extra_logits = extra_logits;
    // Pageable host memory: staged before the copy returns, like the step's tokens.
    if (!extra.empty()) cuda::copy_to_device(cand_extra_ids_, extra.data(), extra.size() * sizeof(int), stream_);
    run_call(tokens, cache, n_rows, out);
}

void CudaBackend::run_call(std::span<const int> tokens, KvCache& cache_base, int n_logits, const CallOutput& out) {
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
        const size_t done = static_cast<size_t>(std::max(0, begin - first_logit_token));  // rows of earlier steps
        forward_step(tokens.subspan(begin, n), cache, step_logits, out.advanced(done, n_vocab), prefill);
    }
    if (!deferring_) cuda::stream_synchronize(stream_);
}

void CudaBackend::copy_output(void* dst, const void* src, size_t bytes) {
    if (!deferring_) {
        cuda::copy_to_host(dst, src, bytes, stream_);
        return;
    }
    const size_t end = staged_.empty() ? 0 : staged_.back().offset + staged_.back().bytes;
    size_t offset = (end + 15) & ~size_t{15};
    if (offset + bytes > staging_.size()) {
        // The staged copies queued so far land in the old buffer: let them finish before it goes. Sized for
        // greedy picks and candidates at first; a call that wants whole rows of logits grows it once.
        if (!staged_.empty()) {
            cuda::stream_synchronize(stream_);
            deliver_staged();
        }
        staging_ = cuda::PinnedBuffer(std::max({bytes, 2 * staging_.size(), size_t{64} << 10}));
        offset = 0;
    }
    cuda::copy_to_host(staging_.as<uint8_t>() + offset, src, bytes, stream_);
    staged_.push_back({dst, offset, bytes});
}

void CudaBackend::deliver_staged() {
    for (const StagedOutput& o : staged_) std::memcpy(o.dst, staging_.as<uint8_t>() + o.offset, o.bytes);
    staged_.clear();
}

void CudaBackend::collect_outputs() {
    if (!deferring_) return;
    deferring_ = false;
    try {
        cuda::stream_synchronize(stream_);
    } catch (...) {
        staged_.clear();  // what the faulted work would have written is not delivered
        throw;
    }
    deliver_staged();
}

bool CudaBackend::uses_int8_gemm(GgmlType type) const { return options_.int8_gemm && cuda::gemm_q8_supports(type); }

void CudaBackend::gemm_input(const float* x, int n, int cols, std::initializer_list<GgmlType> readers) {
    bool to_int8 = false, to_f16 = false;
    for (GgmlType type : readers) (uses_int8_gemm(type) ? to_int8 : to_f16) = true;
    if (blas_ && to_f16) cuda::convert_f16(x, static_cast<size_t>(n) * cols, x16_, stream_);
    if (to_int8) {
        // Q8_1 blocks, what gemm_q8 reads for every type it takes (GgmlType::Q8_0 names that format). xq_ holds
        // the chunk's rows now, so the decode path's record of what it holds is dropped.
        cuda::quantize_activations(GgmlType::Q8_0, x, cols, n, xq_, stream_);
        xq_format_ = cuda::Q8Format::None;
    }
}

cuda::MatvecTarget CudaBackend::target(const DeviceMatrix& W, float* y, const float* bias) {
    return {W.data, W.row_bytes, W.rows, y, bias};
}

const void* CudaBackend::quantized(GgmlType type, const float* x, int n, int cols) {
    if (!options_.matvec_route(type).int8 || !cuda::matvec_q8_supports(type) || n > kStepTokens) return nullptr;
    if (xq_format_ == cuda::q8_activation_format(type) && cols == xq_cols_ && x >= xq_of_ &&
        x < xq_of_ + static_cast<ptrdiff_t>(kStepTokens) * cols) {
        const ptrdiff_t offset = x - xq_of_;
        if (offset % cols == 0 && offset / cols + n <= kStepTokens)  // whole rows the producer already quantized
            return xq_at_ + static_cast<size_t>(offset / cols) * cuda::q8_activation_row_bytes(type, cols);
    }
    cuda::quantize_activations(type, x, cols, n, xq_, stream_);
    xq_format_ = cuda::Q8Format::None;
    return xq_;
}

bool CudaBackend::fuses_quant(GgmlType next, int n, bool prefill) const {
    return !prefill && options_.fused_matvecs && options_.matvec_route(next).int8 && cuda::matvec_q8_supports(next) &&
           n <= kStepTokens;
}

CudaBackend::FusedQuant CudaBackend::fused_quant(const float* out, int cols, GgmlType next, int n, bool prefill,
                                                 uint8_t* into) {
    xq_format_ = cuda::Q8Format::None;  // the producer rewrites `out` either way
    if (!fuses_quant(next, n, prefill)) return {};
    xq_of_ = out;
    xq_cols_ = cols;
    xq_format_ = cuda::q8_activation_format(next);
    xq_at_ = into ? into : xq_;
    return {next, xq_at_};
}

bool CudaBackend::fuses_qkv(const DeviceLayer& L, bool prefill) const {
    // One type, or V of the other type of a pair with kernels (a Q4_K_M layer's Q6_K beside Q4_K) on the same route:
    // one launch reads one form of x.
    if (prefill || !options_.fused_matvecs || L.wq.type != L.wk.type) return false;
    return L.wv.type == L.wq.type || (options_.qkv_type_pairs && cuda::matvec_types_fuse(L.wq.type, L.wv.type) &&
                                      options_.matvec_route(L.wq.type) == options_.matvec_route(L.wv.type));
}

bool CudaBackend::fuses_rope(const DeviceLayer& L, const cuda::RopeKvArgs& rope, int n, bool prefill) const {
    // The launch's epilogue rotates with one table and no QK-norm before it: the plain block's RoPE.
    return model_.config.is_plain_block() && fuses_qkv(L, prefill) && options_.qkv_rope && n <= kStepTokens &&
           cuda::matvec_rope_in_launch(L.wq.type, loads(L.wq.type), rope);
}

void CudaBackend::project_add_norm(const DeviceMatrix& W, const float* in, int n, const float* post_norm,
                                   const float* norm_weight, GgmlType next, bool prefill) {
    const ModelConfig& c = model_.config;
    if (post_norm) {  // the projection normed before the residual add (gemma): three launches
        // The normed rows go to up_, free here (its FFN products are consumed, or not made yet) and at least as
        // wide (the constructor checks hidden_dim >= dim for such a model).
        matmul(W, in, n, proj_, prefill);
        cuda::rms_norm(proj_, post_norm, up_, n, c.dim, c.rms_eps, stream_);
        const FusedQuant nq = fused_quant(xb_, c.dim, next, n, prefill);
        cuda::add_rms_norm(x_, up_, norm_weight, xb_, n, c.dim, c.rms_eps, stream_, nq.type, nq.xq);
        return;
    }
    if (prefill) {
        matmul(W, in, n, proj_, prefill);
        const FusedQuant nq = fused_quant(xb_, c.dim, next, n, prefill);
        cuda::add_rms_norm(x_, proj_, norm_weight, xb_, n, c.dim, c.rms_eps, stream_, nq.type, nq.xq);
        return;
    }
    // The matvec's input first (the record of what xq_ holds), then the norm's output, into a buffer of its own:
    // the launch reads xq_ (the kernels take it as __restrict__, so the compiler may assume nothing in the launch
    // writes it), while with the counter its last block writes the norm's quantized row. Without the counter the
    // call launches add_rms_norm after the matvec.
    const void* xq = quantized(W.type, in, n, W.cols);
    const FusedQuant nq = fused_quant(xb_, c.dim, next, n, prefill, xq_norm_);
    cuda::matvec_add_rms_norm(W.type, W.data, W.row_bytes, W.rows, W.cols, in, n, proj_, stream_, loads(W.type), xq,
                              {x_, norm_weight, xb_, c.rms_eps, nq.type, nq.xq},
                              options_.fused_matvecs && options_.matvec_norm ? norm_counter_ : nullptr);
}

void CudaBackend::matmul(const DeviceMatrix& W, const float* x, int n, float* y, bool prefill) {
    if (!prefill)
        cuda::matvec(W.type, W.data, W.row_bytes, W.rows, W.cols, x, n, y, stream_, 0, loads(W.type),
                     quantized(W.type, x, n, W.cols));
    else if (uses_int8_gemm(W.type))
        cuda::gemm_q8(W.type, W.data, W.row_bytes, W.rows, W.cols, xq_, n, y, stream_);  // xq_: gemm_input's
    else if (!blas_)
        cuda::gemm(W.type, W.data, W.row_bytes, W.rows, W.cols, x, n, y, stream_);
    else
        cuda::gemm_via_f16(blas_.get(), W.type, W.data, W.row_bytes, W.rows, W.cols, x, x16_, n, y, w_tile_,
                           w_tile_halves_, stream_);
}

void CudaBackend::forward_step(std::span<const int> tokens, CudaKvCache& cache, int n_logits, const CallOutput& out,
                               bool prefill) {
    const Picks picks = picks_of(out);
    const ModelConfig& c = model_.config;
    const int n = static_cast<int>(tokens.size());
    const int start_pos = cache.n_committed();
    for (int tok : tokens)
        if (tok < 0 || tok >= c.n_vocab) throw Error("token id " + std::to_string(tok) + " is out of range");

    // The position and the tokens, in one copy: device memory that a replayed graph reads. step_host_ is pageable
    // host memory: the copy is staged before cudaMemcpyAsync returns, so the next step may overwrite it.
    step_host_[0] = start_pos;
    std::copy(tokens.begin(), tokens.end(), step_host_.begin() + 1);
    cuda::copy_to_device(step_in_, step_host_.data(), static_cast<size_t>(n + 1) * sizeof(int), stream_);
    if (persistent_step(n, prefill)) upload_step_layers(cache);
    cache.rings().check_reach(start_pos);

    if (prefill) {
        const StepSegment all{0, n, &cache, {start_pos, nullptr, start_pos}};
        enqueue_layers({&all, 1}, n, true);
        ++graph_stats_.direct_steps;
    } else if (options_.graphs) {
        replay_step(cache, n, start_pos, n_logits, picks);
    } else {
        const StepSegment all{0, n, &cache, {start_pos, nullptr, start_pos}};
        enqueue_layers({&all, 1}, n, false);
        if (n_logits > 0) enqueue_output(xb_ + static_cast<size_t>(n - n_logits) * c.dim, n_logits, picks);
        ++graph_stats_.direct_steps;
    }
    cache.commit_appended(n);
    cache.rings().note_written(start_pos + n);

    // The outputs: a short step's (<= kStepTokens rows) were computed above, inside the graph; a prefill chunk's
    // run kStepTokens rows at a time through matvec (logits_ holds that many). Queued on the stream like the
    // kernels: the next group's matvec cannot overwrite logits_ (or ids_) before the copy has read it, and
    // run_call() synchronizes before the caller looks at the outputs (with deferred outputs, collect_outputs()
    // does). Greedy picks copy one int per row;
    // candidates are selected from logits_ outside the graph (their k and extra count vary from call to call)
    // and copy k + k + n_extra numbers per row.
    for (int g = 0; g < n_logits; g += kStepTokens) {
        const int rows = std::min(kStepTokens, n_logits - g);
        const CallOutput o = out.advanced(static_cast<size_t>(g), c.n_vocab);
        if (prefill) enqueue_output(xb_ + static_cast<size_t>(n - n_logits + g) * c.dim, rows, picks);
        if (picks != Picks::None) {
            copy_output(o.ids, ids_, static_cast<size_t>(rows) * sizeof(int));
            if (picks == Picks::ArgmaxConfidence)
                copy_output(o.top_probs, top_probs_, static_cast<size_t>(rows) * sizeof(float));
        } else if (o.k > 0) {
            const size_t top = static_cast<size_t>(rows) * static_cast<size_t>(o.k);
            cuda::top_k(logits_, rows, c.n_vocab, o.k, cand_logits_, cand_ids_, sampling_ws_, stream_);
            copy_output(o.top_logits, cand_logits_, top * sizeof(float));
            copy_output(o.top_ids, cand_ids_, top * sizeof(int));
            if (o.n_extra > 0) {
                cuda::gather_columns(logits_, rows, c.n_vocab, cand_extra_ids_, o.n_extra, cand_extra_logits_, stream_);
                copy_output(o.extra_logits, cand_extra_logits_,
                            static_cast<size_t>(rows) * static_cast<size_t>(o.n_extra) * sizeof(float));
            }
        } else {
            copy_output(o.logits, logits_, static_cast<size_t>(rows) * c.n_vocab * sizeof(float));
        }
    }
}

void CudaBackend::forward_batch(std::span<const SequenceSlice> slices) {
    // One sequence is forward's call, with its graphs and persistent step.
    if (slices.size() == 1) {
        forward(slices[0].tokens, *slices[0].cache, slices[0].n_logits, slices[0].logits);
        return;
    }
    size_t n_total = 0;
    for (const SequenceSlice& s : slices) {
        assert(s.cache && s.n_logits >= 0 && static_cast<size_t>(s.n_logits) <= s.tokens.size());
        assert(s.cache->n_committed() + static_cast<int>(s.tokens.size()) <= s.cache->capacity());
        assert(s.cache->capacity() <= workspace_ctx_);
        n_total += s.tokens.size();
    }
    // The path is chosen for the whole call, as run_call chooses it for one sequence's: matvec steps while the call
    // has at most matvec_max_call tokens (each slice then gets its own calls' bits), prefill chunks through the GEMM
    // beyond (within tolerance). The steps are what the scratch holds; a slice that does not fit in what is left of
    // one continues in the next, its logits rows produced by the steps that hold its last n_logits tokens.
    const bool prefill = n_total > static_cast<size_t>(prefill_.matvec_max_call);
    const int step = prefill ? prefill_.chunk_tokens : kStepTokens;
    std::vector<StepSegment> segments;
    for_each_step(
        slices, step, static_cast<size_t>(model_.config.n_vocab), batch_tokens_, batch_parts_,
        [&](std::span<const int> tokens, std::span<const StepPart> parts) {
            segments.clear();
            for (const StepPart& p : parts) {
                StepSegment seg;
                seg.first = p.first;
                seg.n = p.n;
                seg.cache = static_cast<CudaKvCache*>(p.slice->cache);
                seg.n_logits = p.n_logits;
                seg.logits = p.logits;
                segments.push_back(seg);
            }
            if (segments.size() == 1) {  // a step of one sequence: forward's step (its graph on the short path)
                CallOutput out;
                out.logits = segments[0].logits;
                forward_step(tokens, *segments[0].cache, segments[0].n_logits, out, prefill);
            } else {
                batch_step(tokens, segments, prefill);
            }
        });
    if (!deferring_) cuda::stream_synchronize(stream_);
}

void CudaBackend::batch_step(std::span<const int> tokens, std::span<StepSegment> segments, bool prefill) {
    const ModelConfig& c = model_.config;
    const int n = static_cast<int>(tokens.size());
    for (int tok : tokens)
        if (tok < 0 || tok >= c.n_vocab) throw Error("token id " + std::to_string(tok) + " is out of range");
    for (size_t i = 0; i < segments.size(); ++i)
        for (size_t j = 0; j < i; ++j) assert(segments[i].cache != segments[j].cache);  // one segment per cache

    // The tokens in one copy, as forward_step uploads them; the positions go to the kernels by value (the step is
    // not captured), so the start position's slot is not read.
    step_host_[0] = 0;
    std::copy(tokens.begin(), tokens.end(), step_host_.begin() + 1);
    cuda::copy_to_device(step_in_, step_host_.data(), static_cast<size_t>(n + 1) * sizeof(int), stream_);
    for (StepSegment& s : segments) {
        const int start = s.cache->n_committed();
        s.pos = {start, nullptr, start};
        s.cache->rings().check_reach(start);
    }
    enqueue_layers(segments, n, prefill);
    ++graph_stats_.batched_steps;
    for (const StepSegment& s : segments) {
        s.cache->commit_appended(s.n);
        s.cache->rings().note_written(s.pos.start + s.n);
    }

    // The rows whose logits are wanted (each segment's last n_logits), in one block for the output projection:
    // the step's own rows where they follow one another (a step of decode tokens: every row), else gathered into
    // proj_ (free after the last layer's add), one copy per segment.
    const size_t dim = static_cast<size_t>(c.dim), n_vocab = static_cast<size_t>(c.n_vocab);
    int n_out = 0, first_row = 0, next_row = -1;
    bool contiguous = true;
    for (const StepSegment& s : segments) {
        if (s.n_logits == 0) continue;
        const int row = s.first + s.n - s.n_logits;
        if (n_out == 0) first_row = row;
        if (next_row >= 0 && row != next_row) contiguous = false;
        next_row = s.first + s.n;
        n_out += s.n_logits;
    }
    if (n_out == 0) return;
    const float* rows = xb_ + static_cast<size_t>(first_row) * dim;
    if (!contiguous) {
        size_t at = 0;
        for (const StepSegment& s : segments) {
            if (s.n_logits == 0) continue;
            cuda::copy_on_device(proj_ + at * dim, xb_ + static_cast<size_t>(s.first + s.n - s.n_logits) * dim,
                                 static_cast<size_t>(s.n_logits) * dim * sizeof(float), stream_);
            at += static_cast<size_t>(s.n_logits);
        }
        rows = proj_;
    }
    // kStepTokens rows at a time (what logits_ holds), each row's logits copied to its segment's destination.
    for (int g = 0; g < n_out; g += kStepTokens) {
        const int group = std::min(kStepTokens, n_out - g);
        enqueue_output(rows + static_cast<size_t>(g) * dim, group, Picks::None);
        int at = 0;  // the gathered row of the segment's first wanted one
        for (const StepSegment& s : segments) {
            if (s.n_logits == 0) continue;
            const int lo = std::max(at, g), hi = std::min(at + s.n_logits, g + group);
            if (lo < hi)
                copy_output(s.logits + static_cast<size_t>(lo - at) * n_vocab,
                            logits_ + static_cast<size_t>(lo - g) * n_vocab,
                            static_cast<size_t>(hi - lo) * n_vocab * sizeof(float));
            at += s.n_logits;
        }
    }
}

void CudaBackend::enqueue_layers(std::span<const StepSegment> segments, int n, bool prefill) {
    const ModelConfig& c = model_.config;
    const int dim = c.dim;
    // One sequence: RoPE may go into the Q/K/V launch and a one-token step into the persistent launch, both made for
    // one cache and one position. Several (forward_batch) take a rope_kv_write and an attention launch each.
    const bool one = segments.size() == 1;
    cuda::embedding(token_embd_.type, token_embd_.data, token_embd_.row_bytes, c.n_vocab, dim, tokens_, n, x_, stream_);
    if (c.embedding_scale != 1.0f) cuda::scale(x_, static_cast<int64_t>(n) * dim, c.embedding_scale, stream_);
    if (one && persistent_step(n, prefill)) return enqueue_persistent_step(*segments[0].cache);
    const FusedQuant nq = fused_quant(xb_, dim, layers_[0].wq.type, n, prefill);
    cuda::rms_norm(x_, layers_[0].attn_norm, xb_, n, dim, c.rms_eps, stream_, nq.type, nq.xq);

    const cuda::RopeMode mode =
        c.rope_style == RopeStyle::Neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs;
    const auto rope_args = [&](int l, const StepSegment& s) {
        // The layer's RoPE table (ModelConfig::rope_inv_freq, uploaded one after another; chosen by the cache's
        // capacity), or none: rope_dim 0 leaves Q and K as they are and only writes the cache. The segment's rows of
        // Q, K and V.
        const CudaKvCache& cache = *s.cache;
        const int table = c.rope_table(l, cache.capacity());
        const float* inv_freq = inv_freq_ + static_cast<size_t>(std::max(table, 0)) * (c.rope_dim / 2);
        const size_t row = static_cast<size_t>(s.first);
        cuda::RopeKvArgs rope{q_ + row * c.q_dim(),
                              k_ + row * c.kv_dim(),
                              v_ + row * c.kv_dim(),
                              cache.key(l),
                              cache.value(l),
                              inv_freq,
                              s.n,
                              s.pos.start,
                              c.n_heads,
                              c.n_kv_heads,
                              c.head_dim,
                              table >= 0 ? c.rope_dim : 0,
                              mode,
                              cache.type()};
        rope.ring = cache.ring(l);
        rope.device_start_pos = s.pos.device;
        rope.trig = rope_trig_;  // read only by the Q/K/V launches that apply RoPE, after rope_trig_table below
        return rope;
    };
    // The step's RoPE angles, once, for the Q/K/V launches that apply RoPE themselves.
    bool tabled = false;
    for (int l = 0; one && l < c.n_layers && !tabled; ++l)
        tabled = fuses_rope(layers_[l], rope_args(l, segments[0]), n, prefill);
    if (tabled) cuda::rope_trig_table(rope_args(0, segments[0]), rope_trig_, stream_);
    for (int l = 0; l < c.n_layers; ++l) {
        const DeviceLayer& L = layers_[l];
        const cuda::RopeKvArgs rope = rope_args(l, segments[0]);  // the Q/K/V launch's RoPE: one segment only
        const bool rope_in_qkv = one && fuses_rope(L, rope, n, prefill);
        if (prefill) gemm_input(xb_, n, dim, {L.wq.type, L.wk.type, L.wv.type});
        const bool b = c.qkv_bias;
        const cuda::MatvecTarget qkv[] = {target(L.wq, q_, b ? L.bq : nullptr), target(L.wk, k_, b ? L.bk : nullptr),
                                          target(L.wv, v_, b ? L.bv : nullptr)};
        if (fuses_qkv(L, prefill)) {
            // One launch for Q, K and V with the biases added in it (bitwise the separate launches), and RoPE with
            // the cache write in its last blocks (bitwise rope_kv_write after it).
            const cuda::MatvecTypes types{L.wq.type, L.wv.type};
            const void* xq = quantized(L.wq.type, xb_, n, dim);
            if (rope_in_qkv)
                cuda::matvec_qkv_rope(types, qkv, dim, xb_, n, stream_, loads(L.wq.type), xq, rope, rope_counters_);
            else
                cuda::matvec_multi(types, qkv, 3, dim, xb_, n, stream_, loads(L.wq.type), xq);
        } else if (!prefill && options_.fused_matvecs) {
            // Types no one launch takes together: a launch per run of one type (Q and K, then V), the biases added in
            // them (bitwise add_bias after).
            const DeviceMatrix* mats[] = {&L.wq, &L.wk, &L.wv};
            for (int first = 0, end = 0; first < 3; first = end) {
                const GgmlType type = mats[first]->type;
                for (end = first + 1; end < 3 && mats[end]->type == type; ++end) {
                }
                cuda::matvec_multi(type, qkv + first, end - first, dim, xb_, n, stream_, loads(type),
                                   quantized(type, xb_, n, dim));
            }
        } else {
            matmul(L.wq, xb_, n, q_, prefill);
            matmul(L.wk, xb_, n, k_, prefill);
            matmul(L.wv, xb_, n, v_, prefill);
            if (c.qkv_bias) {
                cuda::add_bias(q_, L.bq, n, c.q_dim(), stream_);
                cuda::add_bias(k_, L.bk, n, c.kv_dim(), stream_);
                cuda::add_bias(v_, L.bv, n, c.kv_dim(), stream_);
            }
        }
        if (c.qk_norm) {  // every Q and K head normed on its own, before RoPE
            cuda::rms_norm_in_place(q_, L.q_norm, n * c.n_heads, c.head_dim, c.rms_eps, stream_);
            cuda::rms_norm_in_place(k_, L.k_norm, n * c.n_kv_heads, c.head_dim, c.rms_eps, stream_);
        }
        if (c.rope_amplitude != 1.0f && rope.rope_dim > 0) {  // LongRoPE's attn_factor, on the dims RoPE rotates
            cuda::scale_leading(q_, n * c.n_heads, c.head_dim, c.rope_dim, c.rope_amplitude, stream_);
            cuda::scale_leading(k_, n * c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_amplitude, stream_);
        }
        if (!rope_in_qkv)
            for (const StepSegment& s : segments) cuda::rope_kv_write(rope_args(l, s), stream_);
        // The combine also quantizes the output for attn_output's 8-bit route (no quantize launch), each segment's
        // rows where a launch over all the step's rows would put them.
        FusedQuant aq;
        if (cuda::attention_quantizes_for(L.wo.type, c.head_dim))
            aq = fused_quant(att_, c.q_dim(), L.wo.type, n, prefill);
        // Attention per segment, against its own cache: the launches of one step share the workspace and the split
        // counters, each launch leaving the counters zero for the next (stream order).
        for (const StepSegment& s : segments) {
            const CudaKvCache& cache = *s.cache;
            const size_t row = static_cast<size_t>(s.first);
            cuda::AttentionArgs att{q_ + row * c.q_dim(),
                                    cache.key(l),
                                    cache.value(l),
                                    att_ + row * c.q_dim(),
                                    workspace_buf_.as<float>(),
                                    s.n,
                                    s.pos.device ? s.pos.grid_bound : s.pos.start,
                                    c.n_heads,
                                    c.n_kv_heads,
                                    c.head_dim,
                                    options_.attention_split,
                                    cache.type()};
            att.scale = c.attention_scale;
            att.window = c.layers[static_cast<size_t>(l)].window;
            if (c.attention_softcap > 0.0f) {
                att.softcap = c.attention_softcap;
                att.inv_softcap = 1.0f / c.attention_softcap;
            }
            att.ring = cache.ring(l);
            att.device_start_pos = s.pos.device;
            att.split_counters = split_counters_;  // the split kernel combines: one launch, not two
            if (aq.xq) {
                att.q8_for = aq.type;
                att.q8_out = static_cast<uint8_t*>(aq.xq) + row * cuda::q8_activation_row_bytes(aq.type, c.q_dim());
            }
            if (prefill)
                cuda::attention_prefill(att, stream_);
            else
                cuda::attention(att, stream_);
        }
        if (prefill) gemm_input(att_, n, c.q_dim(), {L.wo.type});
        project_add_norm(L.wo, att_, n, L.post_attn_norm, L.ffn_norm, L.w_gate.type, prefill);
        if (prefill) gemm_input(xb_, n, dim, {L.w_gate.type, L.w_up.type});
        const bool gelu = c.activation == FfnActivation::GeluTanh;
        const bool fused_gate_up = !gelu && !prefill && options_.fused_matvecs && L.w_gate.type == L.w_up.type;
        if (fused_gate_up) {
            // SwiGLU in the gate/up launch (bitwise the launches below) and, for ffn_down's 8-bit route, its output
            // quantized into xq_ffn_ (the launch reads xq_): by the launch's last blocks on the staged and persistent
            // 8-bit routes with gate_up_quantizes (given the counters), else by a quantize launch.
            const void* xq = quantized(L.w_gate.type, xb_, n, dim);
            const FusedQuant sq = fused_quant(gate_, c.hidden_dim, L.w_down.type, n, prefill, xq_ffn_);
            cuda::matvec_swiglu(L.w_gate.type, L.w_gate.data, L.w_up.data, L.w_gate.row_bytes, c.hidden_dim, dim, xb_,
                                n, gate_, stream_, loads(L.w_gate.type), xq,
                                {sq.type, sq.xq, options_.gate_up_quantizes ? swiglu_counters_ : nullptr});
        } else {
            // SwiGLU on its own, which can also quantize its output for ffn_down's 8-bit route.
            matmul(L.w_gate, xb_, n, gate_, prefill);
            matmul(L.w_up, xb_, n, up_, prefill);
            if (gelu) {  // GeGLU: its own launch; ffn_down quantizes its input itself
                xq_format_ = cuda::Q8Format::None;
                cuda::geglu(gate_, up_, gate_, static_cast<int64_t>(n) * c.hidden_dim, stream_);
            } else {
                const FusedQuant sq = fused_quant(gate_, c.hidden_dim, L.w_down.type, n, prefill);
                cuda::swiglu(gate_, up_, gate_, static_cast<int64_t>(n) * c.hidden_dim, stream_, sq.type, sq.xq);
            }
        }
        if (prefill) gemm_input(gate_, n, c.hidden_dim, {L.w_down.type});
        // The residual add, fused with the norm that comes next: the next layer's, or the output norm.
        const bool last = l + 1 == c.n_layers;
        project_add_norm(L.w_down, gate_, n, L.post_ffn_norm, last ? output_norm_ : layers_[l + 1].attn_norm,
                         last ? output_.type : layers_[l + 1].wq.type, prefill);
    }
}

void CudaBackend::upload_step_layers(const CudaKvCache& cache) {
    // The layer table names the cache's rows: uploaded again (in stream order, before the launch that reads it) when
    // they differ from the table's (another cache, or one at the same address with another capacity, whose layers
    // start elsewhere); outside any capture (a captured copy must come from pinned memory). A replayed graph reads
    // the table through its pointer, so it always sees the current cache's. The weights never change.
    const ModelConfig& c = model_.config;
    std::vector<const void*> rows;
    for (int l = 0; l < c.n_layers; ++l) rows.insert(rows.end(), {cache.key(l), cache.value(l)});
    if (rows == step_layers_rows_) return;
    std::vector<cuda::DecodeStepLayer> table;
    const auto m = [](const DeviceMatrix& M) { return cuda::DecodeMatrix{M.data, M.row_bytes, M.type}; };
    for (int l = 0; l < c.n_layers; ++l) {
        const DeviceLayer& L = layers_[l];
        table.push_back({m(L.wq), m(L.wk), m(L.wv), m(L.wo), m(L.w_gate), m(L.w_up), m(L.w_down), L.attn_norm,
                         L.ffn_norm, L.bq, L.bk, L.bv, cache.key(l), cache.value(l)});
    }
    cuda::copy_to_device(step_layers_buf_.as<cuda::DecodeStepLayer>(), table.data(),
                         table.size() * sizeof(cuda::DecodeStepLayer), stream_);
    step_layers_rows_ = std::move(rows);
}

void CudaBackend::enqueue_persistent_step(CudaKvCache& cache) {
    const ModelConfig& c = model_.config;
    const cuda::RopeMode mode =
        c.rope_style == RopeStyle::Neox ? cuda::RopeMode::NeoxHalves : cuda::RopeMode::AdjacentPairs;
    // The step's RoPE angles, which the kernel's RoPE phase reads (it computes no cosines itself).
    cuda::RopeKvArgs rope{q_, k_,        v_,           cache.key(0), cache.value(0), inv_freq_, 1,
                          0,  c.n_heads, c.n_kv_heads, c.head_dim,   c.rope_dim,     mode,      cache.type()};
    rope.device_start_pos = step_in_;
    cuda::rope_trig_table(rope, rope_trig_, stream_);
    unsigned* counters = reinterpret_cast<unsigned*>(step_ws_buf_.as<float>() + step_plan_.workspace_floats);
    const cuda::DecodeStepArgs a{step_layers_buf_.as<cuda::DecodeStepLayer>(),
                                 c.n_layers,
                                 c.dim,
                                 c.hidden_dim,
                                 c.n_heads,
                                 c.n_kv_heads,
                                 c.head_dim,
                                 c.rope_dim,
                                 mode,
                                 c.rms_eps,
                                 inv_freq_,
                                 rope_trig_,
                                 output_norm_,
                                 step_in_,
                                 x_,
                                 xb_,
                                 q_,
                                 k_,
                                 v_,
                                 att_,
                                 gate_,
                                 step_ws_buf_.as<float>(),
                                 counters,
                                 counters + c.n_heads};
    cuda::decode_step(a, step_plan_, stream_);
    xq_format_ = cuda::Q8Format::None;  // the launch rewrote xb_ and quantized nothing: the head quantizes its input
    ++graph_stats_.persistent_steps;
}

bool CudaBackend::restrict_logits(int n_first, std::span<const int> extra) {
    const int n_vocab = model_.config.n_vocab;
    const int first = std::clamp(n_first, 0, n_vocab);
    std::vector<int> ids;
    for (int id : extra)
        if (id >= first && id < n_vocab) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    // A graph reads the ids through a pointer; the first count and the number of ids matvec_rows launches for are
    // launch arguments, and a change of them means capturing again. A draft's context brings new ids every few
    // tokens, so the launch is for a capacity, the count rounded up to a power of two (at least 16), and the slots
    // past the count compute rows that are written anyway: ids below n_first (already computed by the first
    // matvec, now again with the same bits), else the last id repeated (the same bits to the same place). So the
    // graphs are captured again only as the count passes each power of two, at the cost of at most twice the
    // extra rows.
    const int n_extra = static_cast<int>(ids.size());
    int capacity = 0;
    if (n_extra > 0) {
        capacity = 16;
        while (capacity < n_extra) capacity *= 2;
        capacity = std::min(capacity, n_vocab - first);  // >= n_extra: the ids are distinct and >= first
        for (int pad = 0; static_cast<int>(ids.size()) < capacity; ++pad) ids.push_back(pad < first ? pad : ids[0]);
    }
    // The ids go to the device in stream order, so a step queued earlier still reads the old ones. Like the step
    // inputs, the copy from pageable memory is staged before it returns: `ids` may go.
    if (!ids.empty()) cuda::copy_to_device(logit_extra_ids_, ids.data(), ids.size() * sizeof(int), stream_);
    if (first != logit_first_ || capacity != n_extra_logits_) ++restriction_version_;
    logit_first_ = first;
    n_extra_logits_ = capacity;
    return true;
}

void CudaBackend::enqueue_output(const float* x, int rows, Picks picks) {
    const int n_vocab = model_.config.n_vocab;
    const DeviceMatrix& W = output_;
    const void* xq = quantized(W.type, x, rows, W.cols);  // one quantization for every matvec below
    if (logit_first_ >= n_vocab) {
        cuda::matvec(W.type, W.data, W.row_bytes, W.rows, W.cols, x, rows, logits_, stream_, 0, loads(W.type), xq);
    } else {
        if (logit_first_ > 0)
            cuda::matvec(W.type, W.data, W.row_bytes, logit_first_, W.cols, x, rows, logits_, stream_, n_vocab,
                         loads(W.type), xq);
        cuda::fill_columns(logits_, rows, n_vocab, logit_first_, n_vocab, -INFINITY, stream_);
        if (n_extra_logits_ > 0)
            cuda::matvec_rows(W.type, W.data, W.row_bytes, W.cols, logit_extra_ids_, n_extra_logits_, x, rows, logits_,
                              n_vocab, stream_, loads(W.type), xq);
    }
    if (model_.config.logit_softcap > 0.0f)
        cuda::soft_cap(logits_, rows, static_cast<size_t>(n_vocab), n_vocab, model_.config.logit_softcap, stream_);
    unsigned* counters = options_.one_launch_picks ? pick_counters_ : nullptr;  // one launch, not two or three
    if (picks == Picks::Argmax) cuda::argmax(logits_, rows, n_vocab, ids_, sampling_ws_, stream_, counters);
    if (picks == Picks::ArgmaxConfidence)
        cuda::argmax_top_probability(logits_, rows, n_vocab, ids_, top_probs_, sampling_ws_, stream_, counters);
}

int CudaBackend::graph_splits(int n_keys, int capacity) const {
    const int split = options_.attention_split;
    const int needed = (n_keys + split - 1) / split, most = (capacity + split - 1) / split;
    int splits = 1;
    while (splits < needed) splits *= 2;
    return std::min(splits, most);  // needed <= most: n_keys never exceeds the capacity
}

void CudaBackend::replay_step(CudaKvCache& cache, int n, int start_pos, int n_logits, Picks picks) {
    // What the captured launches hold by value besides shapes fixed by the key: the cache and workspace addresses
    // and attention's grid. When one differs the step is captured again; end_capture then updates the graph in place
    // (the same kernels in the same order), which is far cheaper than a new instantiation.
    const int splits = graph_splits(start_pos + n, cache.capacity());
    StepGraph& g = graphs_[{n, n_logits, picks}];
    const void *k = cache.key(0), *v = cache.value(0);
    const float* ws = workspace_buf_.as<float>();
    if (!g.graph || g.k_cache != k || g.v_cache != v || g.capacity != cache.capacity() || g.workspace != ws ||
        g.splits != splits || g.restriction != restriction_version_) {
        // The grid bound: the largest start position whose keys still fit in `splits` splits (>= start_pos).
        const int bound = splits * options_.attention_split - n;
        assert(bound >= start_pos);
        cuda::begin_capture(stream_);
        try {
            const StepSegment all{0, n, &cache, {start_pos, step_in_, bound}};
            enqueue_layers({&all, 1}, n, false);
            if (n_logits > 0)
                enqueue_output(xb_ + static_cast<size_t>(n - n_logits) * model_.config.dim, n_logits, picks);
        } catch (...) {
            try {
                (void)cuda::end_capture(stream_);  // leaves the stream usable; the launch's error is the one to report
            } catch (const cuda::DeviceError&) {
            }
            throw;
        }
        const bool updated = cuda::end_capture(stream_, g.graph);
        ++graph_stats_.captures;
        ++(updated ? graph_stats_.updates : graph_stats_.instantiations);
        g.k_cache = k, g.v_cache = v, g.capacity = cache.capacity(), g.workspace = ws, g.splits = splits;
        g.restriction = restriction_version_;
    }
    g.graph.launch(stream_);
    // The graph rewrote xb_ and xq_ in the stream; what xq_ holds after it is not tracked here.
    xq_format_ = cuda::Q8Format::None;
    ++graph_stats_.replays;
    graph_stats_.nodes = g.graph.node_count();
}

}  // namespace tandem
