// CpuBackend: embedding → n_layers × (RMSNorm, Q/K/V, RoPE, cached causal GQA attention, output projection,
// residual, RMSNorm, SwiGLU FFN, residual) → final RMSNorm → logits for the requested rows.
//
// Batch invariance: every per-token quantity is computed by code whose floating-point operation sequence does not
// depend on how many tokens share the step (matmul guarantees it for the projections; norms, RoPE and attention
// are per token). That is what makes chunk sizes and speculative verification unable to change the output.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_ATTENTION_SIMD 1
#include <immintrin.h>
#endif

#include "cpu/fp16.h"
#include "cpu/matmul.h"
#include "cpu/quant.h"
#include "cpu/unaligned.h"
#include "cpu/vec_math.h"
#include "error.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace tandem {

// Up to this many query heads of one KV group are attended together: they share every key and value load (and its
// widening from fp16 or Q8_0), which is what the attention loops spend their time on. Whole groups of 6-7 heads
// (8, with one key and one eight-value group at a time to stay in registers) were slower: the 1.5B's prefill of a
// 2,557-token prompt ran at 90 tokens/s against 136 with tiles of at most 4.
namespace {
constexpr int kMaxQueryTile = 4;
}  // namespace

CpuKvCache::CpuKvCache(int n_layers, int capacity, int kv_dim, CpuKvType type, int n_kv_heads,
                       const std::vector<int>& windows, int ring_margin)
    : KvCache(capacity),
      kv_dim_(check_kv_width(kv_dim, type)),
      type_(type),
      slabs_(n_kv_heads > 1 && kv_dim % n_kv_heads == 0 && (type != CpuKvType::Q8_0 || (kv_dim / n_kv_heads) % 32 == 0)
                 ? n_kv_heads
                 : 1) {
    std::vector<int> all_windows(windows);
    all_windows.resize(static_cast<size_t>(n_layers), 0);
    rings_ = KvRings(all_windows, ring_margin, capacity, true);
    for (int l = 0; l < n_layers; ++l) {
        const int ring = rings_.ring(l);
        layer_slots_.push_back(ring > 0 ? static_cast<size_t>(ring + rings_.window(l)) : static_cast<size_t>(capacity));
        layer_first_.push_back(total_slots_ * static_cast<size_t>(slabs_));
        total_slots_ += layer_slots_.back();
    }
    const size_t bytes = total_slots_ * row_bytes(kv_dim, type);
    k_.reset(new uint8_t[bytes]);
    v_.reset(new uint8_t[bytes]);
}

int CpuKvCache::check_kv_width(int kv_dim, CpuKvType type) {
    if (type == CpuKvType::Q8_0 && kv_dim % 32 != 0)
        throw Error("a q8_0 KV cache needs the model's key/value width to be a multiple of 32 (this model's is " +
                    std::to_string(kv_dim) + "): use --kv-type f16");
    return kv_dim;
}

void CpuKvCache::store_row(uint8_t* dst, const float* src) const {
    const int width = slab_width();
    if (type_ == CpuKvType::F32) {
        std::memcpy(dst, src, slab_row_bytes());
    } else if (type_ == CpuKvType::Q8_0) {  // ggml's Q8_0 rounding, the blocks the CUDA backend's q8_0 cache holds
        cpu::quantize_row(GgmlType::Q8_0, src, dst, width);
    } else {
        auto* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int j = 0; j < width; ++j) d16[j] = fp32_to_fp16(src[j]);
    }
}

void CpuKvCache::store(int layer, int pos, const float* key, const float* value) {
    const int width = slab_width(), at = slot(layer, pos), ring = rings_.ring(layer);
    // A ring's first `window` slots are mirrored after it (see the header's comment).
    const int mirror = ring > 0 && at < rings_.window(layer) ? at + ring : -1;
    for (int s = 0; s < slabs_; ++s) {
        const float* ks = key + static_cast<size_t>(s) * width;
        const float* vs = value + static_cast<size_t>(s) * width;
        store_row(k_.get() + offset(layer, s, at), ks);
        store_row(v_.get() + offset(layer, s, at), vs);
        if (mirror >= 0) {
            std::memcpy(k_.get() + offset(layer, s, mirror), k_.get() + offset(layer, s, at), slab_row_bytes());
            std::memcpy(v_.get() + offset(layer, s, mirror), v_.get() + offset(layer, s, at), slab_row_bytes());
        }
    }
}

std::vector<uint8_t> CpuKvCache::position_bytes(int layer, int pos, bool key) const {
    std::vector<uint8_t> row(row_bytes());
    for (int s = 0; s < slabs_; ++s)
        std::memcpy(row.data() + static_cast<size_t>(s) * slab_row_bytes(),
                    (key ? k_ : v_).get() + offset(layer, s, slot(layer, pos)), slab_row_bytes());
    return row;
}

bool CpuKvCache::copy_prefix(const KvCache& from_base, int n) {
    const auto* from = dynamic_cast<const CpuKvCache*>(&from_base);
    if (!from || from == this || n <= 0 || n > from->n_committed() || n > capacity()) return false;
    if (from->kv_dim_ != kv_dim_ || from->type_ != type_ || from->slabs_ != slabs_ ||
        from->layer_slots_.size() != layer_slots_.size())
        return false;
    for (size_t l = 0; l < layer_slots_.size(); ++l)  // rings: the rows a step needs, through the default
        if (rings_.ring(static_cast<int>(l)) > 0 || from->rings_.ring(static_cast<int>(l)) > 0)
            return KvCache::copy_prefix(from_base, n);
    const size_t bytes = static_cast<size_t>(n) * slab_row_bytes();
    for (size_t l = 0; l < layer_slots_.size(); ++l)
        for (int s = 0; s < slabs_; ++s) {
            const int layer = static_cast<int>(l);
            std::memcpy(k_.get() + offset(layer, s, 0), from->k_.get() + from->offset(layer, s, 0), bytes);
            std::memcpy(v_.get() + offset(layer, s, 0), from->v_.get() + from->offset(layer, s, 0), bytes);
        }
    truncate(0);
    commit_appended(n);
    return true;
}

bool CpuKvCache::same_position(const CpuKvCache& other, int layer, int pos) const {
    if (other.kv_dim_ != kv_dim_ || other.type_ != type_ || other.slabs_ != slabs_) return false;
    const int at = slot(layer, pos), other_at = other.slot(layer, pos);
    for (int s = 0; s < slabs_; ++s)
        if (std::memcmp(k_.get() + offset(layer, s, at), other.k_.get() + other.offset(layer, s, other_at),
                        slab_row_bytes()) != 0 ||
            std::memcmp(v_.get() + offset(layer, s, at), other.v_.get() + other.offset(layer, s, other_at),
                        slab_row_bytes()) != 0)
            return false;
    return true;
}

KvCache::RowFormat CpuKvCache::row_format() const {
    const char* name = type_ == CpuKvType::F32 ? "f32" : type_ == CpuKvType::F16 ? "f16" : "q8_0";
    return {name, static_cast<int>(layer_slots_.size()), row_bytes()};
}

void CpuKvCache::read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const {
    assert(first >= held_from(layer) && first + n <= n_committed());
    const size_t slab_bytes = slab_row_bytes(), row = row_bytes();
    for (int i = 0; i < n; ++i) {
        const int at = slot(layer, first + i);
        for (int s = 0; s < slabs_; ++s) {
            const size_t o = offset(layer, s, at),
                         d = static_cast<size_t>(i) * row + static_cast<size_t>(s) * slab_bytes;
            std::memcpy(keys + d, k_.get() + o, slab_bytes);
            std::memcpy(values + d, v_.get() + o, slab_bytes);
        }
    }
}

void CpuKvCache::write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) {
    const int ring = rings_.ring(layer);
    assert(n_committed() == 0 && first >= 0 && first + n <= capacity() && (ring == 0 || n <= ring));
    const size_t slab_bytes = slab_row_bytes(), row = row_bytes();
    for (int i = 0; i < n; ++i) {
        const int at = slot(layer, first + i);
        // A ring's first `window` slots are mirrored after it, as store() keeps them.
        const int mirror = ring > 0 && at < rings_.window(layer) ? at + ring : -1;
        for (int s = 0; s < slabs_; ++s) {
            const size_t d = static_cast<size_t>(i) * row + static_cast<size_t>(s) * slab_bytes;
            for (const int to : {at, mirror}) {
                if (to < 0) continue;
                std::memcpy(k_.get() + offset(layer, s, to), keys + d, slab_bytes);
                std::memcpy(v_.get() + offset(layer, s, to), values + d, slab_bytes);
            }
        }
    }
}

std::optional<CpuKvType> parse_cpu_kv_type(const std::string& name) {
    if (name == "f32") return CpuKvType::F32;
    if (name == "f16") return CpuKvType::F16;
    if (name == "q8_0") return CpuKvType::Q8_0;
    return std::nullopt;
}

CpuKvType require_cpu_kv_type(const std::string& name) {
    const std::optional<CpuKvType> type = parse_cpu_kv_type(name);
    if (!type) throw Error("unknown --kv-type '" + name + "' (f32, f16, q8_0)");
    return *type;
}

std::optional<GgmlType> parse_requant(const std::string& name) {
    if (name == "none") return std::nullopt;
    const std::optional<GgmlType> type = ggml_type_from_name(name);
    if (!type) throw Error("unknown requantization type '" + name + "' (q4_0, none)");
    return type;
}

CpuBackend::CpuBackend(const Model& model, int n_threads, int max_batch, const CpuBackendOptions& options)
    : model_(model),
      pool_(std::max(1, n_threads)),
      max_batch_(std::max(1, max_batch)),
      activations_(options.activations),
      kv_type_(options.kv_type) {
    const ModelConfig& c = model.config;
    logit_first_ = c.n_vocab;
    const size_t B = static_cast<size_t>(max_batch_);
    x_.resize(B * c.dim);
    xb_.resize(B * c.dim);
    q_.resize(B * c.q_dim());
    k_.resize(B * c.kv_dim());
    v_.resize(B * c.kv_dim());
    att_out_.resize(B * c.q_dim());
    proj_.resize(B * c.dim);
    gate_.resize(B * c.hidden_dim);
    up_.resize(B * c.hidden_dim);
    rope_cs_.resize(static_cast<size_t>(pool_.size()) * c.rope_dim);
    if (options.repack && activations_ == cpu::Activations::Int8)
        repack_weights(options.requantize_to, options.huge_pages, options.head_rows, options.repack_cache_dir);
    // What changes the bits of the keys and values (Backend::kv_signature): the instruction set, the repacking
    // (but for requantized copies), threads and chunking do not.
    kv_signature_ = "cpu";
    if (activations_ == cpu::Activations::Float) kv_signature_ += " float-activations";
    if (options.requantize_to && repacked_bytes() > 0)
        kv_signature_ += std::string(" requantized-") + ggml_type_name(*options.requantize_to);
}

// Every projection and the output matrix, where the CPU has a row-lane kernel for the type (cpu/repack.h), repacked
// on a background thread at idle priority; each matrix's file pages are released once its copy is in use. (A tied
// output is the token embedding too: the rows the embedding lookup reads come back from the page cache.)
void CpuBackend::repack_weights(std::optional<GgmlType> requantize_to, bool huge_pages, int64_t head_rows,
                                const std::string& cache_dir) {
    const Weights& w = model_.weights;
    std::vector<const WeightView*> views;
    for (const LayerWeights& L : w.layers)
        for (const WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) views.push_back(v);
    // Rows are stored one after another, so the first head_rows rows are a view of the same data, fewer rows: its
    // copy is found under the same address, and only its pages are released.
    output_copied_ = w.output;
    if (head_rows > 0 && head_rows < w.output.rows) output_copied_.rows = head_rows;
    views.push_back(&output_copied_);
    const GgufFile* file = model_.file.get();
    cpu::RepackCacheSpec cache;
    if (file && !cache_dir.empty()) cache = {cache_dir, file->path(), file->mapping()};
    repacked_ = std::make_unique<cpu::RepackedWeights>(
        views,
        [file](const WeightView& v) {
            if (file) file->release_pages(v.data, v.n_bytes());
        },
        requantize_to, huge_pages, cache);
}

size_t CpuBackend::repacked_bytes() const { return repacked_ ? repacked_->bytes() : 0; }

std::string CpuBackend::describe_repacking() const { return repacked_ ? repacked_->describe() : "none"; }

void CpuBackend::wait_for_repacking() const {
    if (repacked_) repacked_->wait();
}

void CpuBackend::matmul(const WeightView& W, const float* x, int n, float* y) {
    const cpu::RepackedMatrix* R = repacked_ ? repacked_->find(W.data) : nullptr;
    if (R && R->rows() == W.rows)  // (a copy of the output's first rows only serves restricted_logits)
        cpu::matmul(*R, x, n, y, pool_);
    else
        cpu::matmul(W.type, W.data, W.cols, W.rows, x, n, y, pool_, activations_);
}

std::unique_ptr<KvCache> CpuBackend::new_cache(int n_ctx) {
    const ModelConfig& c = model_.config;
    if (n_ctx > scores_stride_) {
        scores_stride_ = n_ctx;
        scores_.assign(static_cast<size_t>(pool_.size()) * kMaxQueryTile * n_ctx, 0.0f);
    }
    // Windowed layers keep rings: a margin of one step's tokens plus the deepest rollback speculative decoding makes
    // (KvRings::kRollbackMargin).
    std::vector<int> windows;
    for (const LayerAttention& l : c.layers) windows.push_back(l.window);
    return std::make_unique<CpuKvCache>(c.n_layers, n_ctx, c.kv_dim(), kv_type_, c.n_kv_heads, windows,
                                        max_batch_ + KvRings::kRollbackMargin);
}

namespace {
// A forward call of at least this many tokens waits for the background repacking. With the 1.5B on this project's
// 2-core machine, prefill ran at 150 tokens/s repacked and 112 in the file's layout, and repacking all of it takes
// about 0.5 s: waiting pays from about 0.5 / (1/112 - 1/150) = 220 tokens on. Shorter calls (a short prompt,
// decode, verification) go ahead at once, so start-up never waits for the copies. Copies from a cache file only need
// their checksums checked (~0.1 s for the 1.5B's, on two threads less): every call of several tokens waits.
constexpr int kRepackWaitTokens = 256;
constexpr int kCachedRepackWaitTokens = 2;
}  // namespace

void CpuBackend::forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) {
    const SequenceSlice slice{tokens, &cache, n_logits, logits};
    forward_batch(std::span<const SequenceSlice>(&slice, 1));
}

void CpuBackend::forward_batch(std::span<const SequenceSlice> slices) {
    size_t n_total = 0;
    bool prefill = !slices.empty();
    for (const SequenceSlice& s : slices) {
        assert(s.cache && s.n_logits >= 0 && static_cast<size_t>(s.n_logits) <= s.tokens.size());
        assert(s.cache->n_committed() + static_cast<int>(s.tokens.size()) <= s.cache->capacity());
        assert(s.cache->capacity() <= scores_stride_);
        n_total += s.tokens.size();
        // A prompt's prefill (several tokens, logits for at most the last) pauses the repacking; decode and
        // verification (logits for every token) do not, nor a step that decodes any sequence.
        prefill = prefill && s.tokens.size() > 1 && s.n_logits <= 1;
    }
    // Matrices not repacked yet are read in the file's layout (the same bits); only a call long enough for the
    // copies to pay for waiting waits for them (see kRepackWaitTokens).
    if (repacked_ &&
        n_total >= static_cast<size_t>(repacked_->from_cache() ? kCachedRepackWaitTokens : kRepackWaitTokens))
        repacked_->wait();
    struct ForwardBracket {
        cpu::RepackedWeights* r;
        bool prefill;
        ForwardBracket(cpu::RepackedWeights* w, bool p) : r(w), prefill(p) {
            if (r) r->begin_forward(prefill);
        }
        ~ForwardBracket() {
            if (r) r->end_forward(prefill);
        }
    } bracket(repacked_.get(), prefill);
    std::vector<StepSegment> segments;
    for_each_step(
        slices, max_batch_, static_cast<size_t>(model_.config.n_vocab), step_tokens_, step_parts_,
        [&](std::span<const int> tokens, std::span<const StepPart> parts) {
            segments.clear();
            for (const StepPart& p : parts)
                segments.push_back({p.first, p.n, static_cast<CpuKvCache*>(p.slice->cache), 0, p.n_logits, p.logits});
            forward_step(tokens, segments);
        });
}

namespace {

// RMSNorm in llama2.c's operation order (mean of squares, + eps, 1/sqrt, then weight * (scale * x)); out may be x.
void rms_norm(float* out, const float* x, const float* weight, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    ss /= static_cast<float>(n);
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int i = 0; i < n; ++i) out[i] = weight[i] * (ss * x[i]);
}

// Adds `bias` (width floats) to each of the n rows of `rows`.
void add_bias(float* rows, const float* bias, int n, int width) {
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < width; ++j) rows[static_cast<size_t>(i) * width + j] += bias[j];
}

// cos / sin of pos * inv_freq[i] for the rope_dim / 2 pairs: computed once per token and shared by every head of q
// and k (the same values each head would compute for itself);
// `amplitude` multiplies both (ggml's mscale: the rotated dims come out scaled by it; 1 leaves the values exact).
void rope_angles(int pos, const float* inv_freq, int n_pairs, float amplitude, float* cos_out, float* sin_out) {
    for (int i = 0; i < n_pairs; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq[i];
        cos_out[i] = std::cos(angle) * amplitude;
        sin_out[i] = std::sin(angle) * amplitude;
    }
}

// Rotates the first rope_dim dims of each head by the angles of rope_angles.
void rope(float* vec, int n_heads, int head_dim, int rope_dim, RopeStyle style, const float* cos_a,
          const float* sin_a) {
    for (int h = 0; h < n_heads; ++h) {
        float* v = vec + h * head_dim;
        for (int i = 0; i < rope_dim / 2; ++i) {
            const float c = cos_a[i], s = sin_a[i];
            const int a = style == RopeStyle::AdjacentPairs ? 2 * i : i;
            const int b = style == RopeStyle::AdjacentPairs ? 2 * i + 1 : i + rope_dim / 2;
            const float v0 = v[a], v1 = v[b];
            v[a] = v0 * c - v1 * s;
            v[b] = v0 * s + v1 * c;
        }
    }
}

// Readers of one layer's cached keys or values: element d of position t as fp32, and (d % 8 == 0, within one row)
// eight of them. fp16 is widened exactly; a Q8_0 element is its code times the block's scale, as dequantize_row
// computes it. The same arithmetic then follows for every storage, so a cache computes what an fp32 cache holding
// its rounded values would.
struct F32Rows {
    const float* base;
    size_t stride;  // floats from one position to the next
    float element(int t, int d) const { return base[t * stride + d]; }
    const void* address(int t, int d) const { return base + t * stride + d; }
    F32Rows from(int first) const { return {base + first * stride, stride}; }  // position first becomes 0
#ifdef TANDEM_ATTENTION_SIMD
    __m256 load8(int t, int d) const { return _mm256_loadu_ps(base + t * stride + d); }
#endif
};
struct F16Rows {
    const uint16_t* base;
    size_t stride;
    float element(int t, int d) const { return fp16_to_fp32(base[t * stride + d]); }
    const void* address(int t, int d) const { return base + t * stride + d; }
    F16Rows from(int first) const { return {base + first * stride, stride}; }
#ifdef TANDEM_ATTENTION_SIMD
    __m256 load8(int t, int d) const {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + t * stride + d)));
    }
#endif
};
struct Q8_0Rows {  // rows of kv_dim / 32 blocks: an fp16 scale, then 32 int8 codes (34 bytes)
    const uint8_t* base;
    size_t row_bytes;
    const uint8_t* block(int t, int d) const { return base + t * row_bytes + static_cast<size_t>(d / 32) * 34; }
    const void* address(int t, int d) const { return block(t, d) + 2 + d % 32; }
    Q8_0Rows from(int first) const { return {base + first * row_bytes, row_bytes}; }
    float element(int t, int d) const {
        const uint8_t* blk = block(t, d);
        return static_cast<float>(static_cast<int8_t>(blk[2 + d % 32])) * fp16_to_fp32(cpu::load_u16(blk));
    }
#ifdef TANDEM_ATTENTION_SIMD
    __m256 load8(int t, int d) const {
        const uint8_t* blk = block(t, d);
        const __m256 codes = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + d % 32))));
        return _mm256_mul_ps(codes, _mm256_set1_ps(fp16_to_fp32(cpu::load_u16(blk))));
    }
#endif
};

#ifdef TANDEM_ATTENTION_SIMD
inline float hsum8(__m256 v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Positions ahead of the one being read whose head slice is prefetched. With whole rows (before the cache was
// head-major) a head's slice was a short run every row, which the hardware prefetchers left waiting on memory (a
// decode step at 2,557 positions spent a quarter of its time in attention). A head's own run of positions they
// follow; the software prefetch still gained a few percent there (SmolLM2 decode after 2,048 tokens: 163-178
// tokens/s with it, 157-164 without), and it serves the Q8_0 caches that keep whole rows.
constexpr int kPrefetchAhead = 8;

// The lines of row t's elements off..off+n-1 (t a position in the cache).
template <typename Rows>
inline void prefetch_head(const Rows& rows, int t, int off, int n) {
    const char* first = static_cast<const char*>(rows.address(t, off));
    const char* last = static_cast<const char*>(rows.address(t, off + n - 1));
    for (const char* p = first; p <= last; p += 64) _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(last, _MM_HINT_T0);
}

// Scores of Q queries against keys t..t+K-1: each key's eight-value groups are loaded once and meet all Q queries.
template <int Q, int K, typename Rows>
inline void score_keys(const float* const* q, const Rows& keys, int off, int hd, int t, float scale,
                       float* const* att) {
    __m256 acc[K][Q];
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k)
#pragma GCC unroll 4
        for (int j = 0; j < Q; ++j) acc[k][j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        __m256 key[K];
#pragma GCC unroll 4
        for (int k = 0; k < K; ++k) key[k] = keys.load8(t + k, off + d);
#pragma GCC unroll 4
        for (int j = 0; j < Q; ++j) {
            const __m256 qv = _mm256_loadu_ps(q[j] + d);
#pragma GCC unroll 4
            for (int k = 0; k < K; ++k) acc[k][j] = _mm256_fmadd_ps(qv, key[k], acc[k][j]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k)
#pragma GCC unroll 4
        for (int j = 0; j < Q; ++j) att[j][t + k] = hsum8(acc[k][j]) * scale;
}
#endif

// att[j][t] = scale * dot(q[j], key t) for j < Q, t < n_keys, key t's head at element `off` of its row (hd
// elements). Each score is one fixed sequence of operations (8-lane FMAs over the head in order, then a fixed
// horizontal sum), whatever n_keys and however queries and keys are grouped, so a query scores the same in a
// 1-token step and in a prefill chunk. K keys at a time keep Q * K independent FMA chains in flight (at most 12
// accumulators, so that they and the loaded keys fit the 16 vector registers).
template <int Q, typename Rows>
void attention_scores(const float* const* q, const Rows& keys, int off, int hd, int n_keys, float scale,
                      float* const* att) {
#ifdef TANDEM_ATTENTION_SIMD
    if (hd % 8 == 0 && off % 8 == 0) {
        constexpr int K = Q <= 2 ? 4 : Q == 3 ? 3 : 2;
        int t = 0;
        for (; t + K <= n_keys; t += K) {
            if (t + K + kPrefetchAhead <= n_keys)
                for (int k = 0; k < K; ++k) prefetch_head(keys, t + k + kPrefetchAhead, off, hd);
            score_keys<Q, K>(q, keys, off, hd, t, scale, att);
        }
        for (; t < n_keys; ++t) score_keys<Q, 1>(q, keys, off, hd, t, scale, att);
        return;
    }
#endif
    for (int j = 0; j < Q; ++j)
        for (int t = 0; t < n_keys; ++t) {
            float s = 0.0f;
            for (int d = 0; d < hd; ++d) s += q[j][d] * keys.element(t, off + d);
            att[j][t] = s * scale;
        }
}

#ifdef TANDEM_ATTENTION_SIMD
// out[j][8c..8c+7] for j < Q, c < NJ: weighted_values' sums (below), Q * NJ eight-lane groups held in registers
// over all keys, each value group loaded once for the Q queries.
template <int Q, int NJ, typename Rows>
inline void weighted_value_lanes(const float* const* weights, const Rows& values, int off, int n_keys,
                                 float* const* out) {
    __m256 acc[Q][NJ];
#pragma GCC unroll 4
    for (int j = 0; j < Q; ++j)
#pragma GCC unroll 8
        for (int c = 0; c < NJ; ++c) acc[j][c] = _mm256_setzero_ps();
    for (int t = 0; t < n_keys; ++t) {
        if (t + kPrefetchAhead < n_keys) prefetch_head(values, t + kPrefetchAhead, off, 8 * NJ);
        __m256 a[Q];
#pragma GCC unroll 4
        for (int j = 0; j < Q; ++j) a[j] = _mm256_set1_ps(weights[j][t]);
#pragma GCC unroll 8
        for (int c = 0; c < NJ; ++c) {
            const __m256 v = values.load8(t, off + 8 * c);
#pragma GCC unroll 4
            for (int j = 0; j < Q; ++j) acc[j][c] = _mm256_fmadd_ps(a[j], v, acc[j][c]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < Q; ++j)
#pragma GCC unroll 8
        for (int c = 0; c < NJ; ++c) _mm256_storeu_ps(out[j] + 8 * c, acc[j][c]);
}
#endif

// out[j][d] = sum over t < n_keys of weights[j][t] * value t[off + d] for j < Q, d < hd: one fused multiply-add per
// key in key order, from 0, for every d. The vector path keeps 64, 32, 32 or 16 dims per query (Q = 1..4) in
// registers across the keys (8, 8, 12 or 8 accumulators: each is a chain of dependent FMAs, and two FMA pipes of
// 4 cycles' latency need 8 chains in flight; Q = 3 with 16 dims had 6, and a prefill after 2,048 tokens of context
// ran 5-8% slower on the 1.5B and SmolLM2); the scalar loop, which the compiler contracts to the same FMAs, serves
// heads that are not whole 8-lane groups. Either way a position's output does not depend on how many tokens or
// heads share the call.
template <int Q, typename Rows>
void weighted_values(const float* const* weights, const Rows& values, int off, int hd, int n_keys, float* const* out) {
#ifdef TANDEM_ATTENTION_SIMD
    if (hd % 8 == 0 && off % 8 == 0) {
        constexpr int NJ = Q == 1 ? 8 : Q <= 3 ? 4 : 2;
        float* o[Q];
        int d = 0;
        for (; d + 8 * NJ <= hd; d += 8 * NJ) {
            for (int j = 0; j < Q; ++j) o[j] = out[j] + d;
            weighted_value_lanes<Q, NJ>(weights, values, off + d, n_keys, o);
        }
        for (; d < hd; d += 8) {
            for (int j = 0; j < Q; ++j) o[j] = out[j] + d;
            weighted_value_lanes<Q, 1>(weights, values, off + d, n_keys, o);
        }
        return;
    }
#endif
    for (int j = 0; j < Q; ++j) {
        std::fill(out[j], out[j] + hd, 0.0f);
        for (int t = 0; t < n_keys; ++t) {
            const float a = weights[j][t];
            for (int d = 0; d < hd; ++d) out[j][d] += a * values.element(t, off + d);
        }
    }
}

// Q query heads of one KV group at one position over the keys and values 0..n_keys-1: scores (soft-capped where
// softcap > 0: cap * tanh(s * (1 / cap)), as llama.cpp scales, tanhs and scales back), softmax (the weights
// att[j][t] * (1 / sum), stored back into att), weighted sum of the values.
template <int Q, typename Rows>
void attend(const float* const* q, const Rows& keys, const Rows& values, int off, int hd, int n_keys, float scale,
            float softcap, float* const* att, float* const* out) {
    attention_scores<Q>(q, keys, off, hd, n_keys, scale, att);
    if (softcap > 0.0f)
        for (int j = 0; j < Q; ++j) cpu::soft_cap(att[j], n_keys, softcap);
    for (int j = 0; j < Q; ++j) {
        float max_score = -INFINITY;
        for (int t = 0; t < n_keys; ++t) max_score = std::max(max_score, att[j][t]);
        const float inv_sum = 1.0f / cpu::exp_shifted_sum(att[j], n_keys, max_score);
        for (int t = 0; t < n_keys; ++t) att[j][t] *= inv_sum;
    }
    weighted_values<Q>(att, values, off, hd, n_keys, out);
}

// Heads per work item: the group is cut into the fewest tiles of at most kMaxQueryTile heads, and into more while
// the step would otherwise have fewer than two items per thread (a decode step has only n_kv_heads groups).
int query_tile(int n_tokens, int n_kv_heads, int group, int threads) {
    int tiles = (group + kMaxQueryTile - 1) / kMaxQueryTile;
    while (tiles < group && static_cast<int64_t>(n_tokens) * n_kv_heads * tiles < 2 * static_cast<int64_t>(threads))
        ++tiles;
    return (group + tiles - 1) / tiles;
}

}  // namespace

// A step's per-token work (norms, RoPE and the cache writes): prefill chunks split it over the pool, where it
// would otherwise run on one thread while the others wait (perf of SmolLM2's pp512: forward_step's own time, these
// loops, 4.9% of the samples; split, pp512 rose 5-7%). Each token's arithmetic is the same either way.
template <class Fn>
void CpuBackend::for_tokens(int n, Fn&& fn) {
    if (n < 2 || pool_.size() == 1) {
        for (int i = 0; i < n; ++i) fn(i, 0);
        return;
    }
    pool_.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
        for (int64_t i = begin; i < end; ++i) fn(static_cast<int>(i), thread);
    });
}

// gate_ = act(gate_) * up_ over the first `count` elements (SwiGLU or GeGLU, the model's activation), split over the
// pool when there are many, at multiples of 8: every element takes the same (vector or tail) path as in one call
// over the whole array.
void CpuBackend::gated_activation(int64_t count) {
    const auto apply = model_.config.activation == FfnActivation::GeluTanh ? cpu::geglu : cpu::swiglu;
    constexpr int64_t kMinParallel = 1 << 16;  // below this a split costs more than it saves (decode steps)
    if (count < kMinParallel || pool_.size() == 1) return apply(gate_.data(), up_.data(), count);
    pool_.parallel_for((count + 7) / 8, [&](int64_t begin, int64_t end, int) {
        const int64_t first = 8 * begin, last = std::min(count, 8 * end);
        apply(gate_.data() + first, up_.data() + first, last - first);
    });
}

void CpuBackend::forward_step(std::span<const int> tokens, std::span<StepSegment> segments) {
    const ModelConfig& c = model_.config;
    const Weights& w = model_.weights;
    const int n = static_cast<int>(tokens.size());
    const int dim = c.dim, kv_dim = c.kv_dim(), q_dim = c.q_dim(), hidden = c.hidden_dim;
    token_segment_.resize(static_cast<size_t>(n));
    for (size_t s = 0; s < segments.size(); ++s) {
        StepSegment& seg = segments[s];
        seg.start_pos = seg.cache->n_committed();
        seg.cache->rings().check_reach(seg.start_pos);
        for (int i = seg.first; i < seg.first + seg.n; ++i)
            token_segment_[static_cast<size_t>(i)] = static_cast<int>(s);
    }

    for (int i = 0; i < n; ++i) {
        const int tok = tokens[i];
        if (tok < 0 || tok >= c.n_vocab) throw Error("token id " + std::to_string(tok) + " is out of range");
        float* x = x_.data() + static_cast<size_t>(i) * dim;
        cpu::dequantize_row(w.token_embd.type, w.token_embd.row(tok), x, dim);
        if (c.embedding_scale != 1.0f)
            for (int j = 0; j < dim; ++j) x[j] *= c.embedding_scale;
    }

    auto mm = [&](const WeightView& W, const float* in, float* out) { matmul(W, in, n, out); };

    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& L = w.layers[l];
        const float* attn_norm = static_cast<const float*>(L.attn_norm.data);
        for_tokens(n, [&](int i, int) {
            rms_norm(&xb_[static_cast<size_t>(i) * dim], &x_[static_cast<size_t>(i) * dim], attn_norm, dim, c.rms_eps);
        });
        mm(L.wq, xb_.data(), q_.data());
        mm(L.wk, xb_.data(), k_.data());
        mm(L.wv, xb_.data(), v_.data());
        if (c.qkv_bias) {
            add_bias(q_.data(), static_cast<const float*>(L.bq.data), n, q_dim);
            add_bias(k_.data(), static_cast<const float*>(L.bk.data), n, kv_dim);
            add_bias(v_.data(), static_cast<const float*>(L.bv.data), n, kv_dim);
        }
        for_tokens(n, [&](int i, int thread) {  // each thread its own angles; each token its own cache position
            const StepSegment& seg = segments[static_cast<size_t>(token_segment_[static_cast<size_t>(i)])];
            const int pos = seg.start_pos + (i - seg.first);
            const int rope_table = c.rope_table(l, seg.cache->capacity());
            float* q = &q_[static_cast<size_t>(i) * q_dim];
            float* k = &k_[static_cast<size_t>(i) * kv_dim];
            if (c.qk_norm) {  // every head normed on its own, before RoPE
                for (int h = 0; h < c.n_heads; ++h)
                    rms_norm(q + h * c.head_dim, q + h * c.head_dim, static_cast<const float*>(L.q_norm.data),
                             c.head_dim, c.rms_eps);
                for (int h = 0; h < c.n_kv_heads; ++h)
                    rms_norm(k + h * c.head_dim, k + h * c.head_dim, static_cast<const float*>(L.k_norm.data),
                             c.head_dim, c.rms_eps);
            }
            if (rope_table >= 0) {
                const int n_pairs = c.rope_dim / 2;
                float* cos_a = rope_cs_.data() + static_cast<size_t>(thread) * c.rope_dim;
                float* sin_a = cos_a + n_pairs;
                rope_angles(pos, c.rope_inv_freq[static_cast<size_t>(rope_table)].data(), n_pairs, c.rope_amplitude,
                            cos_a, sin_a);
                rope(q, c.n_heads, c.head_dim, c.rope_dim, c.rope_style, cos_a, sin_a);
                rope(k, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_style, cos_a, sin_a);
            }
            seg.cache->store(l, pos, k, &v_[static_cast<size_t>(i) * kv_dim]);
        });
        attention(l, n, segments);
        mm(L.wo, att_out_.data(), proj_.data());

        const float* ffn_norm = static_cast<const float*>(L.ffn_norm.data);
        for_tokens(n, [&](int i, int) {  // the residual add (of the normed output, with post-norms), then the norm
            float* x = &x_[static_cast<size_t>(i) * dim];
            float* p = &proj_[static_cast<size_t>(i) * dim];
            if (c.post_norms) rms_norm(p, p, static_cast<const float*>(L.post_attn_norm.data), dim, c.rms_eps);
            for (int j = 0; j < dim; ++j) x[j] += p[j];
            rms_norm(&xb_[static_cast<size_t>(i) * dim], x, ffn_norm, dim, c.rms_eps);
        });
        mm(L.w_gate, xb_.data(), gate_.data());
        mm(L.w_up, xb_.data(), up_.data());
        gated_activation(static_cast<int64_t>(n) * hidden);
        mm(L.w_down, gate_.data(), proj_.data());
        if (c.post_norms)
            for_tokens(n, [&](int i, int) {
                float* p = &proj_[static_cast<size_t>(i) * dim];
                rms_norm(p, p, static_cast<const float*>(L.post_ffn_norm.data), dim, c.rms_eps);
            });
        for (size_t j = 0; j < static_cast<size_t>(n) * dim; ++j) x_[j] += proj_[j];
    }
    for (const StepSegment& seg : segments) {
        seg.cache->commit_appended(seg.n);
        seg.cache->rings().note_written(seg.start_pos + seg.n);
    }

    // Logits: each segment's last n_logits rows, normed and gathered, in one matmul; written in place when a single
    // segment asks for them (forward's case), else through step_logits_.
    int n_logits = 0, with_logits = 0;
    const StepSegment* only = nullptr;
    for (const StepSegment& seg : segments)
        if (seg.n_logits > 0) {
            n_logits += seg.n_logits;
            ++with_logits;
            only = &seg;
        }
    if (n_logits == 0) return;
    const float* out_norm = static_cast<const float*>(w.output_norm.data);
    int row = 0;
    for (const StepSegment& seg : segments)
        for (int i = seg.first + seg.n - seg.n_logits; i < seg.first + seg.n; ++i, ++row)
            rms_norm(&xb_[static_cast<size_t>(row) * dim], &x_[static_cast<size_t>(i) * dim], out_norm, dim, c.rms_eps);
    const size_t n_vocab = static_cast<size_t>(c.n_vocab);
    float* logits = only->logits;
    if (with_logits > 1) {
        step_logits_.resize(static_cast<size_t>(n_logits) * n_vocab);
        logits = step_logits_.data();
    }
    if (logit_first_ >= c.n_vocab)
        matmul(w.output, xb_.data(), n_logits, logits);
    else
        restricted_logits(xb_.data(), n_logits, logits);
    if (c.logit_softcap > 0.0f)  // (the -inf of ids a restriction leaves out stay -inf)
        cpu::soft_cap(logits, static_cast<int64_t>(n_logits) * c.n_vocab, c.logit_softcap);
    if (with_logits > 1) {
        row = 0;
        for (const StepSegment& seg : segments) {
            if (seg.n_logits == 0) continue;
            std::memcpy(seg.logits, logits + static_cast<size_t>(row) * n_vocab,
                        static_cast<size_t>(seg.n_logits) * n_vocab * sizeof(float));
            row += seg.n_logits;
        }
    }
}

bool CpuBackend::restrict_logits(int n_first, std::span<const int> extra) {
    const int n_vocab = model_.config.n_vocab;
    const WeightView& W = model_.weights.output;
    logit_first_ = std::clamp(n_first, 0, n_vocab);
    logit_extra_ids_.clear();
    for (int id : extra)
        if (id >= logit_first_ && id < n_vocab) logit_extra_ids_.push_back(id);
    std::sort(logit_extra_ids_.begin(), logit_extra_ids_.end());
    logit_extra_ids_.erase(std::unique(logit_extra_ids_.begin(), logit_extra_ids_.end()), logit_extra_ids_.end());
    // A requantized output's extra rows are requantized alike, so that every id's logit comes from the same weights.
    logit_extra_type_ = repacked_ ? repacked_->copy_type(W.data).value_or(W.type) : W.type;
    const size_t row_bytes = ggml_row_bytes(logit_extra_type_, static_cast<uint64_t>(W.cols));
    logit_extra_rows_.resize(logit_extra_ids_.size() * row_bytes);
    std::vector<float> decoded(logit_extra_type_ != W.type ? static_cast<size_t>(W.cols) : 0);
    for (size_t j = 0; j < logit_extra_ids_.size(); ++j) {
        uint8_t* dst = &logit_extra_rows_[j * row_bytes];
        if (logit_extra_type_ == W.type)
            std::memcpy(dst, W.row(logit_extra_ids_[j]), row_bytes);
        else
            cpu::requantize_row(W.type, W.row(logit_extra_ids_[j]), logit_extra_type_, dst, W.cols, decoded.data());
    }
    return true;
}

void CpuBackend::restricted_logits(const float* x, int n, float* logits) {
    const WeightView& W = model_.weights.output;
    const int64_t V = model_.config.n_vocab;
    const cpu::RepackedMatrix* R = repacked_ ? repacked_->find(W.data) : nullptr;
    if (R && R->rows() >= logit_first_)
        cpu::matmul_first_rows(*R, logit_first_, x, n, logits, V, pool_);
    else
        cpu::matmul_first_rows(W.type, W.data, W.cols, logit_first_, x, n, logits, V, pool_, activations_);
    for (int t = 0; t < n; ++t)
        std::fill(logits + t * V + logit_first_, logits + (t + 1) * V, -std::numeric_limits<float>::infinity());
    const int64_t n_extra = static_cast<int64_t>(logit_extra_ids_.size());
    if (n_extra == 0) return;
    logit_extra_out_.resize(static_cast<size_t>(n * n_extra));
    // The file's layout, whatever serves the rest: the same bits as the copy's (repack.h).
    cpu::matmul(logit_extra_type_, logit_extra_rows_.data(), W.cols, n_extra, x, n, logit_extra_out_.data(), pool_,
                activations_);
    for (int t = 0; t < n; ++t)
        for (int64_t j = 0; j < n_extra; ++j)
            logits[t * V + logit_extra_ids_[static_cast<size_t>(j)]] =
                logit_extra_out_[static_cast<size_t>(t * n_extra + j)];
}

// Causal grouped-query attention of the step's n tokens, each over its own sequence's cache (which already holds
// their keys and values). Parallel over (token, tile of a KV group's query heads), every sequence's tokens in one
// pass; each (token, head) is computed the same way whatever n is, whatever heads share its tile and whatever other
// sequences share the step.
void CpuBackend::attention(int layer, int n, std::span<const StepSegment> segments) {
    // Each KV head's rows: its slab of the cache (head-major), or its part of the one slab that holds whole rows.
    // The caches of one backend share the type and layout (new_cache).
    const CpuKvCache& first = *segments.front().cache;
    const int n_kv_heads = model_.config.n_kv_heads, heads_per_slab = n_kv_heads / first.slabs();
    const size_t width = static_cast<size_t>(first.slab_width());
    std::vector<int> offsets(static_cast<size_t>(n_kv_heads));
    for (int h = 0; h < n_kv_heads; ++h)
        offsets[static_cast<size_t>(h)] = (h % heads_per_slab) * model_.config.head_dim;
    auto heads = [&](auto make_rows) {
        using Rows = decltype(make_rows(first.key_slab(layer, 0)));
        std::vector<Rows> keys, values;
        for (const StepSegment& seg : segments) {
            assert(seg.cache->type() == first.type() && seg.cache->slabs() == first.slabs());
            for (int h = 0; h < n_kv_heads; ++h) {
                keys.push_back(make_rows(seg.cache->key_slab(layer, h / heads_per_slab)));
                values.push_back(make_rows(seg.cache->value_slab(layer, h / heads_per_slab)));
            }
        }
        // A window's keys are one run of slots from its first position's (CpuKvCache's mirrored ring).
        attention_over(keys.data(), values.data(), offsets.data(), n, segments, model_.config.layers[layer].window,
                       [&](int s, int pos) { return segments[static_cast<size_t>(s)].cache->slot(layer, pos); });
    };
    switch (first.type()) {
        case CpuKvType::F32:
            return heads([&](const uint8_t* p) { return F32Rows{reinterpret_cast<const float*>(p), width}; });
        case CpuKvType::F16:
            return heads([&](const uint8_t* p) { return F16Rows{reinterpret_cast<const uint16_t*>(p), width}; });
        case CpuKvType::Q8_0: return heads([&](const uint8_t* p) { return Q8_0Rows{p, first.slab_row_bytes()}; });
    }
}

template <typename Rows, typename FirstSlot>
void CpuBackend::attention_over(const Rows* keys, const Rows* values, const int* offsets, int n,
                                std::span<const StepSegment> segments, int window, FirstSlot first_slot) {
    const ModelConfig& c = model_.config;
    const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
    const float scale = c.attention_scale, softcap = c.attention_softcap;
    const int tile = query_tile(n, c.n_kv_heads, group, pool_.size());
    const int tiles_per_group = (group + tile - 1) / tile;
    const int items_per_token = c.n_kv_heads * tiles_per_group;
    pool_.parallel_for(static_cast<int64_t>(n) * items_per_token, [&](int64_t begin, int64_t end, int thread) {
        float* scratch = &scores_[static_cast<size_t>(thread) * kMaxQueryTile * scores_stride_];
        for (int64_t item = begin; item < end; ++item) {
            // The pool hands out contiguous ranges of items; tokens are visited folded (0, n-1, 1, n-2, ...) so
            // that each range mixes early positions, with few keys, and late ones, with many.
            const int j = static_cast<int>(item / items_per_token), r = static_cast<int>(item % items_per_token);
            const int i = j % 2 == 0 ? j / 2 : n - 1 - j / 2;
            const int s = token_segment_[static_cast<size_t>(i)];
            const StepSegment& seg = segments[static_cast<size_t>(s)];
            const int kv_head = r / tiles_per_group, first = kv_head * group + (r % tiles_per_group) * tile;
            const int count = std::min(tile, (kv_head + 1) * group - first);
            const float* q[kMaxQueryTile];
            float* att[kMaxQueryTile];
            float* out[kMaxQueryTile];
            for (int h = 0; h < count; ++h) {
                q[h] = &q_[static_cast<size_t>(i) * c.q_dim() + static_cast<size_t>(first + h) * hd];
                att[h] = scratch + static_cast<size_t>(h) * scores_stride_;
                out[h] = &att_out_[static_cast<size_t>(i) * c.q_dim() + static_cast<size_t>(first + h) * hd];
            }
            // The keys the query sees: all up to its own position, or the last `window` of them. Only those are read.
            const int pos = seg.start_pos + (i - seg.first);
            const int first_key = window > 0 ? std::max(0, pos - window + 1) : 0;
            const int n_keys = pos + 1 - first_key, off = offsets[kv_head];
            const size_t head =
                static_cast<size_t>(s) * static_cast<size_t>(c.n_kv_heads) + static_cast<size_t>(kv_head);
            const Rows k = keys[head].from(first_slot(s, first_key));
            const Rows v = values[head].from(first_slot(s, first_key));
            switch (count) {
                case 1: attend<1>(q, k, v, off, hd, n_keys, scale, softcap, att, out); break;
                case 2: attend<2>(q, k, v, off, hd, n_keys, scale, softcap, att, out); break;
                case 3: attend<3>(q, k, v, off, hd, n_keys, scale, softcap, att, out); break;
                default: attend<4>(q, k, v, off, hd, n_keys, scale, softcap, att, out); break;
            }
        }
    });
}

}  // namespace tandem
