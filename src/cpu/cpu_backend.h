// The CPU backend: the whole llama forward pass over weights used in place from the mapping (fp32 activations
// between operations, quantized to 8 bits inside the quantized matmuls), multithreaded through one ThreadPool per
// backend instance. The one exception to "in place": matrices of a type with a row-lane kernel on this CPU (Q4_K,
// Q6_K, Q4_0, Q5_0, Q8_0 with AVX-512 VNNI) are repacked on a background thread at idle priority (cpu/repack.h) and their file pages
// released; until a matrix's copy is ready, forward passes read the file's layout.
#pragma once
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/matmul.h"
#include "cpu/repack.h"
#include "cpu/thread_pool.h"
#include "kv_rings.h"

namespace tandem {

struct Model;
struct WeightView;

// How a CpuKvCache stores keys and values: fp32 (CpuBackendOptions' default: the reference precision, which the
// tests compare with llama2.c), or fp16 (the CLI's default, as llama.cpp's: half the memory, and the values the CUDA
// backend's fp16 cache holds, the same rounding of the same fp32 numbers, so that the two backends give the same
// results to the last bits of their sums), or Q8_0 (ggml's blocks of 32 codes and an fp16 scale, 34 bytes: about half
// of fp16's memory, the bytes the CUDA backend's q8_0 cache holds; the key/value width must be a multiple of 32).
enum class CpuKvType { F32, F16, Q8_0 };
// "f32" / "f16" / "q8_0" (the --kv-type values); nullopt for anything else.
std::optional<CpuKvType> parse_cpu_kv_type(const std::string& name);
// parse_cpu_kv_type's value, or a tandem::Error naming the accepted ones (the tools' --kv-type).
CpuKvType require_cpu_kv_type(const std::string& name);

class CpuKvCache : public KvCache {
public:
    // `n_kv_heads` heads of kv_dim / n_kv_heads elements make up each key and value (1: the layout treats the row as
    // one piece).
    //
    // Sliding-window layers (`windows[l]` > 0; empty: none) keep only the positions their window can still need: a
    // ring of R = window + ring_margin slots, position p in slot p % R, and the first `window` slots mirrored after
    // the ring (R + window slots in all), so that any window's positions are one contiguous run of slots and
    // attention reads them as it reads a full layer's. ring_margin must cover the positions written between two
    // reads of a window: the tokens of one forward step and the deepest truncate (speculative rollback) before the
    // next; check_window_reach refuses a step whose window would need an overwritten position. A layer whose ring
    // would not be smaller than the capacity keeps every position.
    CpuKvCache(int n_layers, int capacity, int kv_dim, CpuKvType type = CpuKvType::F32, int n_kv_heads = 1,
               const std::vector<int>& windows = {}, int ring_margin = 0);
    CpuKvType type() const { return type_; }
    // Stores the key and the value of `layer` at `pos` (kv_dim floats each, heads one after another), rounded to the
    // cache's type.
    void store(int layer, int pos, const float* key, const float* value);

    // Layout: a layer's keys (and its values) are `slabs()` runs of positions. Slab s holds elements
    // [s * slab_width(), (s + 1) * slab_width()) of every position's key, position after position,
    // slab_row_bytes() apart: one slab per KV head (head-major), so that attention reads a head's positions as one
    // contiguous stream the hardware prefetchers follow, or a single slab of whole rows where a head cannot be its
    // own run of Q8_0 blocks (a head width that is not a multiple of 32).
    int slabs() const { return slabs_; }
    // The slot of `layer` that holds position `pos` (pos itself for a layer that keeps every position).
    int slot(int layer, int pos) const {
        const int ring = rings_.ring(layer);
        return ring > 0 ? pos % ring : pos;
    }
    // The rings' bookkeeping (kv_rings.h): forward_step checks a step's reach and records what it wrote.
    KvRings& rings() { return rings_; }
    // Bytes of keys and values allocated (both), rings included.
    size_t allocated_bytes() const { return 2 * total_slots_ * static_cast<size_t>(slabs_) * slab_row_bytes(); }
    int slab_width() const { return kv_dim_ / slabs_; }
    size_t slab_row_bytes() const { return row_bytes(slab_width(), type_); }
    // Slab `slab` of `layer`, from slot 0 (position 0, or a windowed layer's ring; see slot()).
    const uint8_t* key_slab(int layer, int slab) const { return k_.get() + offset(layer, slab, 0); }
    const uint8_t* value_slab(int layer, int slab) const { return v_.get() + offset(layer, slab, 0); }
    // The stored bytes of `layer`'s key (or value) at `pos`, heads in order: row_bytes() bytes, kv_dim elements of
    // the cache's type (float, IEEE binary16 bits, or ggml Q8_0 blocks: a slab is whole blocks), as one row of the
    // whole width would hold them.
    std::vector<uint8_t> position_bytes(int layer, int pos, bool key) const;
    size_t row_bytes() const { return row_bytes(kv_dim_, type_); }
    // KvCache::copy_prefix: between CPU caches of the same type and layout without sliding-window rings, one copy of
    // each layer's and slab's first n rows; with rings, the default's rows.
    bool copy_prefix(const KvCache& from, int n) override;
    // Whether `layer`'s key and value at `pos` hold the same bytes here and in `other` (a cache of the same shape).
    bool same_position(const CpuKvCache& other, int layer, int pos) const;

    // Stored rows (KvCache): rows as position_bytes() gives them; a ring's positions from what it holds intact.
    RowFormat row_format() const override;
    int held_from(int layer) const override { return rings_.held_from(layer); }
    int needed_from(int layer, int n) const override { return rings_.needed_from(layer, n); }
    void read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const override;
    void write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) override;

    static size_t bytes_needed(int n_layers, int capacity, int kv_dim, CpuKvType type = CpuKvType::F32) {
        return 2 * row_bytes(kv_dim, type) * static_cast<size_t>(n_layers) * capacity;
    }

private:
    static size_t row_bytes(int kv_dim, CpuKvType type) {
        const size_t n = static_cast<size_t>(kv_dim);
        return type == CpuKvType::Q8_0 ? n / 32 * 34 : type == CpuKvType::F16 ? 2 * n : 4 * n;
    }
    // kv_dim, or an Error where the type cannot hold rows of that width (Q8_0: whole 32-element blocks).
    static int check_kv_width(int kv_dim, CpuKvType type);
    // Bytes from the start of the storage to `layer`'s slab `slab`, slot `slot`.
    size_t offset(int layer, int slab, int slot) const {
        const size_t l = static_cast<size_t>(layer);
        return (layer_first_[l] + static_cast<size_t>(slab) * layer_slots_[l] + static_cast<size_t>(slot)) *
               slab_row_bytes();
    }
    // Stores one slab's row (slab_width() floats) at a slot, rounded to the cache's type.
    void store_row(uint8_t* dst, const float* src) const;
    int kv_dim_;
    CpuKvType type_;
    int slabs_;
    KvRings rings_;
    std::vector<size_t> layer_slots_;  // [layer]: slots per slab (capacity, or R + window)
    std::vector<size_t> layer_first_;  // [layer]: rows (of one slab) before the layer's first
    size_t total_slots_ = 0;           // rows of one slab over all layers and slabs, / slabs
    int resumable(int n) override { return rings_.resumable(n); }
    void loaded(int m, std::span<const int> firsts) override {
        (void)m;
        rings_.note_loaded(firsts);
    }
    // [layer][slab][pos] rows of slab_row_bytes(), left uninitialized: a position is written before it is read, and
    // untouched pages of a large context cost no memory (the resident size grows with the tokens actually held).
    std::unique_ptr<uint8_t[]> k_, v_;
};

// The value of --draft-requant (tandem-bench: also --requant): "none", or the type a draft's copies are
// requantized to (see CpuBackendOptions::requantize_to). nullopt for "none".
std::optional<GgmlType> parse_requant(const std::string& name);

// How a CpuBackend computes and what it keeps (its constructor's options).
struct CpuBackendOptions {
    // How quantized weights meet the activations (see cpu/matmul.h); Int8 is the fast default.
    cpu::Activations activations = cpu::Activations::Int8;
    // Repack the matrices that have a row-lane kernel (Int8 only; the results are the same bits either way).
    bool repack = true;
    // A speculative draft's copies are requantized to this type where that makes them smaller
    // (RepackedMatrix::requantized_type): fewer bytes per draft step, and lossy, so never for a model whose output
    // is shown. The logits differ from the file's once the copies are in use (the Generator waits for them before
    // the draft's first round, so drafting always sees the requantized weights).
    std::optional<GgmlType> requantize_to;
    // The copies on transparent huge pages. A step that reads them is faster (interleaved tg runs here: the 0.5B's
    // draft step 5 of 5 pairs faster, median +10%; the 1.5B's decode +3%), but fresh huge pages can be slow to fault
    // in: on this project's VM (Firecracker, whose host takes freed guest memory back) 1 GB costs ~2.2 s against
    // ~0.4 s on small pages, which held a one-shot run's first draft round up 1.5 s. So ask for them where the copies
    // are read long enough to repay that: a draft's (read k times per target step) and a long-lived process's (the
    // chat REPL, the benchmarks), not a one-shot run's target. (Copies in a repack_cache_dir file ignore it.)
    bool huge_pages = false;
    // Keep the copies in a cache file in this directory between runs (cpu/repack_cache.h): a run then maps the
    // copies an earlier run made instead of making them (the CLI's runs, one-shot and chat). Empty: in memory only,
    // made by every process (the benchmarks, whose figures are of copies in memory on huge pages). A cache file's
    // pages are the page cache's, mapped with huge pages for the most part where the kernel holds the file in
    // large folios (6.18 with ext4 here), so huge_pages matters only without one.
    std::string repack_cache_dir;
    // > 0: copy only the first head_rows rows of the output matrix, for a draft whose logits restrict_logits limits
    // to them (the 0.5B's 151,936-row head is 76.6 MB as Q4_0 copies, of which the first 32,768 rows, 16.5 MB, are
    // read). Logits of rows beyond come from the file's layout, so lifting the restriction stays correct, only
    // slower. 0: every row.
    int64_t head_rows = 0;
    // The storage of the caches new_cache makes (--kv-type; the CLI's default is F16).
    CpuKvType kv_type = CpuKvType::F32;
};

class CpuBackend : public Backend {
public:
    // `max_batch`: the most tokens one internal step processes (longer calls are split); sizes the scratch.
    CpuBackend(const Model& model, int n_threads, int max_batch, const CpuBackendOptions& options = {});
    std::string name() const override { return "cpu"; }
    std::string kv_signature() const override { return kv_signature_; }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override;
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override;
    // The slices' tokens in steps of at most max_batch tokens (a slice may be cut between two steps): every
    // projection is one matmul over all of a step's tokens, while norms, RoPE, cache writes and attention are per
    // token against its own sequence's cache. The logits are forward's bits, whatever else shares the step.
    void forward_batch(std::span<const SequenceSlice> slices) override;
    bool restrict_logits(int n_first, std::span<const int> extra) override;
    int n_threads() const { return pool_.size(); }
    // Bytes of weights repacked, or being repacked in the background (0 when nothing is: another type, a CPU
    // without the kernels, Float activations, or TANDEM_NO_REPACK=1). Results are the same bits before and after,
    // unless requantize_to was given.
    size_t repacked_bytes() const;
    // Where the copies are (cpu::RepackedWeights::describe), for -v.
    std::string describe_repacking() const;
    // Blocks until the background repacking is done (benchmarks measure the steady state; speculative decoding
    // before its first verification).
    void wait_for_repacking() const override;

private:
    // A sequence's run of tokens within one step: step tokens first..first+n-1, at positions start_pos.. of `cache`;
    // the logits of its last n_logits go to `logits`.
    struct StepSegment {
        int first = 0, n = 0;
        CpuKvCache* cache = nullptr;
        int start_pos = 0;
        int n_logits = 0;
        float* logits = nullptr;
    };
    // One step: `tokens` (at most max_batch) made of `segments`, in order, covering them all; sets each segment's
    // start_pos (what its cache holds).
    void forward_step(std::span<const int> tokens, std::span<StepSegment> segments);
    void repack_weights(std::optional<GgmlType> requantize_to, bool huge_pages, int64_t head_rows,
                        const std::string& cache_dir);
    // y = W x for the n tokens of a step: through W's repacked copy when it has one.
    void matmul(const tandem::WeightView& W, const float* x, int n, float* y);
    template <class Fn>
    void for_tokens(int n, Fn&& fn);       // fn(token, thread) for each of a step's n tokens
    void gated_activation(int64_t count);  // gate_ = act(gate_) * up_, the first count elements
    void attention(int layer, int n, std::span<const StepSegment> segments);
    // Rows: a reader of the cache's storage (cpu_backend.cpp: F32Rows, F16Rows, Q8_0Rows). keys[s * n_kv_heads + h]
    // / values[...]: segment s's KV head h, its rows from slot 0, its elements from offsets[h] on; window: the
    // layer's sliding window (0: none); first_slot(s, p): the slot of position p in segment s's cache, from which the
    // window's keys run contiguously.
    template <typename Rows, typename FirstSlot>
    void attention_over(const Rows* keys, const Rows* values, const int* offsets, int n,
                        std::span<const StepSegment> segments, int window, FirstSlot first_slot);
    // The logits of n normed rows x under restrict_logits.
    void restricted_logits(const float* x, int n, float* logits);

    const Model& model_;
    std::string kv_signature_;
    cpu::ThreadPool pool_;
    int max_batch_;
    cpu::Activations activations_;
    CpuKvType kv_type_;
    // Scratch, sized once (nothing is allocated per token). Row i belongs to the i-th token of the step.
    std::vector<float> x_;        // [max_batch][dim] residual stream
    std::vector<float> xb_;       // [max_batch][dim] normed input of a sublayer
    std::vector<float> q_;        // [max_batch][q_dim]
    std::vector<float> k_;        // [max_batch][kv_dim]
    std::vector<float> v_;        // [max_batch][kv_dim]
    std::vector<float> att_out_;  // [max_batch][q_dim]
    std::vector<float> proj_;     // [max_batch][dim] output of attn_output / ffn_down
    std::vector<float> gate_;     // [max_batch][hidden_dim]
    std::vector<float> up_;       // [max_batch][hidden_dim]
    std::vector<float> scores_;   // [n_threads][kMaxQueryTile][max context]: scores of one tile's heads
    int scores_stride_ = 0;
    std::vector<float> rope_cs_;        // [threads][rope_dim]: cos then sin of one token's angles
    std::vector<int> step_tokens_;      // [max_batch]: the tokens of one step of forward_batch
    std::vector<StepPart> step_parts_;  // and its slices' parts
    std::vector<int> token_segment_;    // [max_batch]: the step segment of each token of a step
    std::vector<float> step_logits_;    // [max_batch][n_vocab]: a step's logits rows of several segments, gathered
    // The part of the output matrix that is copied (all of it unless head_rows): declared before repacked_, which
    // holds a pointer to it until its background thread has stopped.
    WeightView output_copied_;
    std::unique_ptr<cpu::RepackedWeights> repacked_;  // null: nothing repacked
    // restrict_logits: ids below logit_first_ (n_vocab: no restriction), and the extra ids, whose output rows are
    // copied together (the file's layout, in the type of the output's copy) so that one matmul computes them.
    int logit_first_;
    std::vector<int> logit_extra_ids_;
    GgmlType logit_extra_type_ = GgmlType::F32;
    std::vector<uint8_t> logit_extra_rows_;
    std::vector<float> logit_extra_out_;  // [tokens][extra ids]
};

}  // namespace tandem
