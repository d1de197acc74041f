// The compute interface every backend (cpu/, cuda/) implements, and the per-model KV cache it owns.
//
// One forward call serves chunked prefill (n = chunk), decode (n = 1) and speculative verification (n = k + 1):
// only the number of tokens changes. The cache is its own object, one per model; rolling back rejected draft
// tokens is a truncate.
#pragma once
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sample/candidates.h"

namespace tandem {

class KvCache {
public:
    virtual ~KvCache() = default;
    // Positions 0..n_committed()-1 hold valid keys and values.
    int n_committed() const { return n_committed_; }
    int capacity() const { return capacity_; }
    // Forgets every position from n on (no-op when n >= n_committed()). A cache that cannot resume at n forgets more
    // (a sliding-window ring that no longer holds the window before n starts over from 0): callers that cut back far,
    // such as a chat that re-renders its conversation, read n_committed() afterwards. Cutting back by at most a step
    // and a speculative rollback always keeps n.
    void truncate(int n) {
        assert(n >= 0);
        if (n < n_committed_) n_committed_ = resumable(n);
    }
    // Called by the backend after it wrote `n` more positions.
    void commit_appended(int n) {
        assert(n_committed_ + n <= capacity_);
        n_committed_ += n;
    }
    // Makes this cache hold positions 0..n-1 of `from` (0 < n <= from.n_committed(), n <= capacity()), bit for bit,
    // in place of what it held: a prompt that starts with tokens another sequence has run starts from their keys and
    // values instead of computing them again (the keys and values of a position depend only on the tokens up to it).
    // Returns false, leaving this cache as it was, where the caches cannot copy (caches of other row formats, a
    // source whose sliding-window rings no longer hold what position n needs); the caller then prefills. This default
    // goes through read_rows / write_rows (a CUDA cache: through the host); the CPU's copies its storage directly.
    virtual bool copy_prefix(const KvCache& from, int n);

    // ---- Stored rows: the bytes of positions, to save a prompt's keys and values and load them in a later run ----
    // (the on-disk prompt cache, prompt_cache/). A position's key (and its value) of one layer is handed out as one
    // row of row_format().row_bytes: the whole key/value width, KV heads in order, in the cache's storage type, as
    // cuda::kv_row_bytes describes it (f32: floats; f16: IEEE binary16; q8_0: ggml Q8_0 blocks along the row), so a
    // CPU and a CUDA cache of one type agree on the format (not on the values: the backends' sums differ in the
    // last bits). The caller makes sure no forward on the cache is in flight (Backend::collect_outputs).
    struct RowFormat {
        std::string type;  // "f32", "f16", "q8_0"; "": this cache cannot hand out its rows
        int n_layers = 0;
        size_t row_bytes = 0;  // of one position's key (or value) in one layer
    };
    virtual RowFormat row_format() const { return {}; }
    // The first position `layer` still holds: it holds positions [held_from(layer), n_committed()). 0 but for a
    // sliding-window ring, which holds the last positions only.
    virtual int held_from(int layer) const {
        (void)layer;
        return 0;
    }
    // The first position `layer` must hold for the cache to go on at position n (a step there reads only these): 0
    // for a layer that reads every position before n, n - window + 1 (at least 0) for a sliding-window ring's.
    virtual int needed_from(int layer, int n) const {
        (void)layer;
        (void)n;
        return 0;
    }
    // Copies `layer`'s keys and values at positions [first, first + n), which it holds, to `keys` and `values`: n
    // rows each, position after position.
    virtual void read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const {
        (void)layer, (void)first, (void)n, (void)keys, (void)values;
        assert(false && "read_rows on a cache without row_format()");
    }
    // Loading into an empty cache: write_rows() each layer's positions [first, first + n) (first >= needed_from(layer,
    // m), first + n <= m, no more than a step reads), then finish_load(m, firsts) with each layer's first position
    // written. The cache then holds m positions, as if a forward had computed them, and resumes at m.
    virtual void write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) {
        (void)layer, (void)first, (void)n, (void)keys, (void)values;
        assert(false && "write_rows on a cache without row_format()");
    }
    void finish_load(int m, std::span<const int> firsts) {
        assert(n_committed_ == 0 && m >= 0 && m <= capacity_);
        n_committed_ = m;
        loaded(m, firsts);
    }

protected:
    explicit KvCache(int capacity) : capacity_(capacity) {}
    // The position a cut back to n < n_committed() resumes at (n, or less where n cannot be kept); the cache may
    // update what it tracks of its contents.
    virtual int resumable(int n) { return n; }
    // finish_load's part for what the cache tracks of its contents (a ring: which positions it holds intact).
    virtual void loaded(int m, std::span<const int> firsts) {
        (void)m;
        (void)firsts;
    }

private:
    int n_committed_ = 0;
    int capacity_ = 0;
};

// One sequence's part of a batched forward (Backend::forward_batch): what forward(tokens, *cache, n_logits, logits)
// takes for it alone.
struct SequenceSlice {
    std::span<const int> tokens;
    KvCache* cache = nullptr;
    int n_logits = 0;         // logits of the last n_logits tokens (0 <= n_logits <= tokens.size())
    float* logits = nullptr;  // n_logits × n_vocab, row after row
};

// A slice's run of tokens within one internal step of forward_batch: step tokens first..first+n-1 are the slice's
// tokens offset..offset+n-1; the logits of the run's last n_logits tokens go to `logits` (rows of the slice's).
struct StepPart {
    const SequenceSlice* slice = nullptr;
    int first = 0, offset = 0, n = 0;
    int n_logits = 0;
    float* logits = nullptr;
};

// How the backends cut forward_batch's slices into internal steps of at most max_tokens tokens: in order, a slice
// that does not fit in what is left of a step continuing in the next, its logits rows produced by the steps that
// hold its last n_logits tokens. Calls step(tokens, parts) for each step (`tokens`: its tokens, reused between
// steps).
template <class Step>
void for_each_step(std::span<const SequenceSlice> slices, int max_tokens, size_t n_vocab, std::vector<int>& tokens,
                   std::vector<StepPart>& parts, Step&& step) {
    tokens.clear();
    parts.clear();
    for (const SequenceSlice& s : slices) {
        const int size = static_cast<int>(s.tokens.size());
        const int first_logit_token = size - s.n_logits;  // tokens from here on need logits
        for (int offset = 0; offset < size;) {
            StepPart part;
            part.slice = &s;
            part.first = static_cast<int>(tokens.size());
            part.offset = offset;
            part.n = std::min(max_tokens - part.first, size - offset);
            part.n_logits = std::max(0, offset + part.n - std::max(offset, first_logit_token));
            part.logits = s.logits && part.n_logits > 0
                              ? s.logits + static_cast<size_t>(std::max(0, offset - first_logit_token)) * n_vocab
                              : nullptr;
            tokens.insert(tokens.end(), s.tokens.begin() + offset, s.tokens.begin() + offset + part.n);
            parts.push_back(part);
            offset += part.n;
            if (static_cast<int>(tokens.size()) == max_tokens) {
                step(std::span<const int>(tokens), std::span<const StepPart>(parts));
                tokens.clear();
                parts.clear();
            }
        }
    }
    if (!tokens.empty()) step(std::span<const int>(tokens), std::span<const StepPart>(parts));
}

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // A cache for `n_ctx` positions.
    virtual std::unique_ptr<KvCache> new_cache(int n_ctx) = 0;
    // Runs `tokens` at positions cache.n_committed() onward, appends their keys and values to the cache, and
    // writes the logits of the last `n_logits` tokens (0 <= n_logits <= tokens.size()) to `logits`, row after
    // row (n_logits × n_vocab). The caller checks that the tokens fit in the cache.
    // Batch invariance: the logits of a position are bitwise identical whatever the number of tokens in the call,
    // for the CPU backend always; for the CUDA backend among calls of up to CudaPrefillOptions::matvec_max_call
    // tokens (64 by default: decode, speculative verification), while longer (prefill) calls take GEMM kernels and
    // agree with the short-call path within floating-point tolerance only. Nothing may rely on more: greedy
    // speculative decoding compares verification calls with decode calls, both short.
    virtual void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) = 0;

    // Several sequences in one step (continuous batching): each slice's tokens run after what its cache holds, as
    // forward(slice.tokens, *slice.cache, slice.n_logits, slice.logits) would run them, with the same logits bit for
    // bit where the backend's forward is batch-invariant (the CPU's always; see forward). A backend that batches
    // reads every weight once for all the slices' tokens, which is what makes decoding N sequences at once cheaper
    // than N decodes: decode is bound by reading the weights. Each slice has its own cache (no two share one); the
    // caller checks that every slice fits its cache. This default runs the slices one after another.
    virtual void forward_batch(std::span<const SequenceSlice> slices) {
        for (const SequenceSlice& s : slices) forward(s.tokens, *s.cache, s.n_logits, s.logits);
    }

    // Greedy picks instead of logits: runs `tokens` as forward does and writes, for each of the last n_rows tokens,
    // the id of its largest logit to ids[0..n_rows) (Sampler's greedy rule: NaN counts as -inf, the lower id wins a
    // tie; -1 when no logit of the row is above -inf, where Sampler throws). For greedy decoding with a sampler
    // that reads nothing else of the logits: a GPU backend then copies n_rows ints back instead of n_rows rows.
    // `scratch` is n_rows × n_vocab floats: this default implementation runs forward into it and picks on the
    // host; a backend that picks on the device (CudaBackend) leaves it alone.
    virtual void forward_argmax(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                                std::span<float> scratch) {
        assert(n_rows >= 0 && static_cast<size_t>(n_rows) <= tokens.size());
        forward(tokens, cache, n_rows, scratch.data());
        if (n_rows == 0) return;
        const size_t n_vocab = scratch.size() / static_cast<size_t>(n_rows);
        for (int r = 0; r < n_rows; ++r) ids[r] = argmax_row(scratch.data() + r * n_vocab, n_vocab);
    }

    // forward_argmax, and each row's largest probability under a plain softmax of the whole row (temperature 1):
    // top_probs[r] = 1 / sum(exp(l - max)) (NaN where the id is -1). A greedy draft's confidence, which decides
    // how far it drafts: on a GPU two numbers per row come back instead of the row. The default computes it on the
    // host from forward's rows in `scratch` (backend.cpp); CudaBackend sums on the device, in double, so the two
    // agree to rounding, not bitwise (only the draft length can depend on it, never the output).
    virtual void forward_argmax_confidence(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                                           float* top_probs, std::span<float> scratch);

    // Candidates instead of rows (candidates.h): runs `tokens` as forward does and writes, for each of the last n_rows
    // tokens, its k best logits by Sampler's order (NaN as -inf) and their ids to top_logits / top_ids ([n_rows][k],
    // best first), and the logits of the `extra` ids to extra_logits ([n_rows][extra.size()]). For a sampler that
    // reads nothing else (plan_candidates): a GPU backend then copies a few hundred numbers back per row instead of
    // n_vocab. 1 <= k <= min(max_candidates(), n_vocab). `scratch` is n_rows × n_vocab floats: this default runs
    // forward into it and selects on the host (backend.cpp); a backend that selects on the device (CudaBackend)
    // leaves it alone.
    virtual void forward_candidates(std::span<const int> tokens, KvCache& cache, int n_rows, int k,
                                    std::span<const int> extra, float* top_logits, int* top_ids, float* extra_logits,
                                    std::span<float> scratch);
    // The most best logits forward_candidates selects per row; 0 when a backend would rather hand out whole rows.
    virtual int max_candidates() const { return kMaxCandidates; }

    // Restricts the logits of later forward calls to ids [0, n_first) and the ids in `extra` (any order, repeats and
    // ids below n_first allowed); every other logit is written as -inf. Those computed are bitwise the unrestricted
    // ones. For a draft model, whose proposals the target verifies anyway: the output matrix is the largest single
    // read of a small model's step (Qwen2.5-0.5B: 145 of its 486 MB), and a byte-level BPE vocabulary is ordered by
    // merge rank, so its first ids are the frequent ones. n_first >= n_vocab lifts the restriction. Returns false,
    // changing nothing, where the backend cannot restrict (it keeps computing every logit).
    virtual bool restrict_logits(int n_first, std::span<const int> extra) {
        (void)n_first;
        (void)extra;
        return false;
    }

    // ---- Deferred outputs: the host works on while the backend computes ----
    // After defer_outputs(), forward calls (every variant above) may return before their outputs are written: a GPU
    // backend queues the work and copies the outputs back behind it. collect_outputs() waits for that work and
    // writes every output; until then the caller must not read an output nor move or free what it points to, and
    // the caches passed in are in use. outputs_ready() says, without blocking, whether collect_outputs() would
    // return at once. A backend that computes in the call (the CPU's) writes the outputs in the call: these are
    // no-ops and computes_in_background() is false. The speculative loop drafts ahead while the target verifies
    // (generator.cpp) where the target computes in the background.
    virtual bool computes_in_background() const { return false; }
    virtual void defer_outputs() {}
    virtual bool outputs_ready() { return true; }
    virtual void collect_outputs() {}

    // Blocks until work the backend does in the background after loading (the CPU backend's repacked weights) is
    // done, so that later calls run at their steady-state speed. The results are the same bits either way.
    virtual void wait_for_repacking() const {}

    // ---- For the on-disk prompt cache (prompt_cache/): when saved keys and values are the ones it would compute ----
    // What decides the bits of the keys and values this backend computes, besides the model file and the tokens: a
    // saved prompt is loaded only by a backend of the same signature, so that a run with a hit gives the output a run
    // without one gives. "cpu" (its kernels give the same bits whatever the instruction set, threads and chunking),
    // with what changes them (fp32 activations, a draft's requantized copies); "cuda" with its device and prefill
    // routes.
    virtual std::string kv_signature() const { return name(); }
    // Positions from which a run resumed on loaded keys and values computes the same bits as a run from position 0:
    // multiples of this. 1 for a batch-invariant backend (the CPU's); the CUDA backend's prefill chunk, as its longer
    // calls agree with shorter ones only within floating-point tolerance, so a resumed prefill must cut the prompt
    // into the calls a run from 0 makes.
    virtual int resume_multiple() const { return 1; }

    // Sampler's greedy pick of one row (see forward_argmax): a NaN never compares greater, a tie keeps the first.
    static int argmax_row(const float* row, size_t n) {
        int best = -1;
        float best_logit = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < n; ++i)
            if (row[i] > best_logit) {
                best_logit = row[i];
                best = static_cast<int>(i);
            }
        return best;
    }
};

}  // namespace tandem
