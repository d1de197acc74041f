// How the decode loops (Generator's plain and speculative loops, DraftRunner) read a forward's rows from a Backend:
// the greedy id where the argmax is all the sampler needs, the candidates where it reads only those, the whole row
// otherwise; the penalty window a row is sampled with; and a scope whose outputs a backend may deliver later.
#pragma once
#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "backend.h"
#include "error.h"
#include "sample/candidates.h"
#include "sample/sampler.h"

namespace tandem {

// Greedy with nothing else that reads the logits (a repeat penalty does, even with an empty window): the argmax is
// all the sampler would take from them, so the backend may pick it (Backend::forward_argmax; a GPU then copies one
// int per row back instead of the row).
inline bool argmax_is_enough(const SamplerParams& p) { return p.temperature == 0.0f && p.repeat_penalty == 1.0f; }

// A greedy id from forward_argmax; -1 is the row where Sampler would have thrown.
inline int greedy_pick(int id) {
    if (id < 0) throw Error("sampler: every logit is -inf or NaN");
    return id;
}

// The tokens a repeat penalty can see from a row whose history is `history` followed by `drafted` (any prefix of
// them): the history's last repeat_last_n and the drafts.
inline std::span<const int> penalty_window(const SamplerParams& p, const std::vector<int>& history,
                                           std::span<const int> drafted, std::vector<int>& buffer) {
    const size_t n = std::min(history.size(), static_cast<size_t>(std::max(0, p.repeat_last_n)));
    if (drafted.empty()) return std::span<const int>(history).last(n);
    buffer.assign(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    buffer.insert(buffer.end(), drafted.begin(), drafted.end());
    return buffer;
}

// Rows (the target's or the draft's) as candidates (Backend::forward_candidates) where the sampler reads nothing
// else of them (plan_candidates): a GPU backend then copies back a few hundred numbers per row instead of the row,
// and the sampler's work per row no longer grows with the vocabulary. The picks are the whole rows' picks, bit for
// bit. `whole_rows` (GenerationParams) turns it off.
class CandidateRows {
public:
    explicit CandidateRows(bool whole_rows) : whole_rows_(whole_rows) {}
    // For rows sampled with `params` whose penalty windows lie within `window`; false where whole rows are needed.
    bool plan(const SamplerParams& params, int n_vocab, const Backend& backend, std::span<const int> window) {
        if (whole_rows_) return false;
        k_ = plan_candidates(params, n_vocab, window, extra_);
        if (k_ > backend.max_candidates()) k_ = 0;
        return k_ > 0;
    }
    // Runs `tokens` and keeps the candidates of the last n_rows (`scratch`: n_rows whole rows, for the default).
    void forward(Backend& backend, std::span<const int> tokens, KvCache& cache, int n_rows, std::span<float> scratch) {
        const size_t rows = static_cast<size_t>(n_rows);
        top_logits_.resize(rows * static_cast<size_t>(k_));
        top_ids_.resize(top_logits_.size());
        extra_logits_.resize(rows * extra_.size());
        backend.forward_candidates(tokens, cache, n_rows, k_, extra_, top_logits_.data(), top_ids_.data(),
                                   extra_logits_.data(), scratch);
    }
    CandidateRow row(int r) const {
        const size_t k = static_cast<size_t>(k_), e = extra_.size(), i = static_cast<size_t>(r);
        return {std::span<const float>(top_logits_).subspan(i * k, k), std::span<const int>(top_ids_).subspan(i * k, k),
                extra_, std::span<const float>(extra_logits_).subspan(i * e, e)};
    }

private:
    bool whole_rows_;
    int k_ = 0;
    std::vector<int> extra_, top_ids_;
    std::vector<float> top_logits_, extra_logits_;
};

// A backend's deferred outputs (Backend::defer_outputs) for a scope: collect() delivers them; leaving the scope by an
// exception still lets the queued work land before the outputs' buffers go, and the backend stops deferring (its
// later calls write their outputs again). Does nothing for a null backend.
class DeferredOutputs {
public:
    explicit DeferredOutputs(Backend* backend) : backend_(backend) {
        if (backend_) backend_->defer_outputs();
    }
    ~DeferredOutputs() {
        if (!backend_) return;
        try {
            backend_->collect_outputs();
        } catch (...) {  // the error that unwound the scope is the one reported
        }
    }
    DeferredOutputs(const DeferredOutputs&) = delete;
    DeferredOutputs& operator=(const DeferredOutputs&) = delete;
    bool ready() const { return !backend_ || backend_->outputs_ready(); }
    void collect() {
        if (backend_) std::exchange(backend_, nullptr)->collect_outputs();
    }

private:
    Backend* backend_;
};

}  // namespace tandem
