// KvRings: the sliding-window bookkeeping both backends' KV caches share. A layer with a window of W positions keeps
// a ring of R = W + margin slots instead of every position (position p in slot p % R), where that is smaller than
// the cache; the margin covers what is written between two reads of a window (one step's tokens, and a speculative
// rollback). The rings also track from which position their contents are intact, so that a cut back resumes only
// where every ring still holds the window before it (else at 0), and a step that would read an overwritten position
// is refused.
#pragma once
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "error.h"

namespace tandem {

class KvRings {
public:
    // The margin's part for truncates: more than any speculative rollback (a verification of at most 64 drafted
    // tokens, or a draft's own run). A cache adds its longest step.
    static constexpr int kRollbackMargin = 128;

    KvRings() = default;
    // windows[l]: layer l's window (0: none). A ring has window + margin slots rounded up to a multiple of `align`
    // (the CUDA kernels' split and tile: attention_ring_multiple). A layer keeps a ring only where it is smaller than
    // `capacity`, counting `mirrored` (the CPU cache's copy of the first window's slots after the ring) when set.
    KvRings(const std::vector<int>& windows, int margin, int capacity, bool mirrored, int align = 1) {
        for (int window : windows) {
            const long a = std::max(align, 1);
            const long ring = window > 0 ? (static_cast<long>(window) + std::max(margin, 1) + a - 1) / a * a : 0;
            const bool keep_ring = window > 0 && ring + static_cast<long>(mirrored ? window : 0) < capacity;
            window_.push_back(keep_ring ? window : 0);
            ring_.push_back(keep_ring ? static_cast<int>(ring) : 0);
            intact_from_.push_back(0);
        }
    }
    // R for `layer`'s ring, or 0 where the layer keeps every position.
    int ring(int layer) const { return layer < static_cast<int>(ring_.size()) ? ring_[static_cast<size_t>(layer)] : 0; }
    int window(int layer) const {
        return layer < static_cast<int>(window_.size()) ? window_[static_cast<size_t>(layer)] : 0;
    }
    // The first position `layer`'s ring holds intact (0 for a layer without one).
    int intact_from(int layer) const {
        return layer < static_cast<int>(intact_from_.size()) ? intact_from_[static_cast<size_t>(layer)] : 0;
    }
    // KvCache::held_from and needed_from for a cache that keeps these rings: the first position `layer` holds, and
    // the first a step at n reads (every position for a layer without a ring).
    int held_from(int layer) const { return ring(layer) > 0 ? intact_from(layer) : 0; }
    int needed_from(int layer, int n) const { return ring(layer) > 0 ? std::max(0, n - window(layer) + 1) : 0; }
    // Keys and values were loaded (KvCache::finish_load): each ring holds positions firsts[layer] on, and no earlier
    // ones (what its slots held before is not the context's).
    void note_loaded(std::span<const int> firsts) {
        for (size_t l = 0; l < ring_.size() && l < firsts.size(); ++l)
            if (ring_[l] > 0) intact_from_[l] = firsts[l];
    }
    // Positions up to end - 1 were written: each overwrote the slot of the position R before it.
    void note_written(int end) {
        for (size_t l = 0; l < ring_.size(); ++l)
            if (ring_[l] > 0) intact_from_[l] = std::max(intact_from_[l], end - ring_[l]);
    }
    // The position a cut back to n resumes at: n where every ring holds the window before n, else 0 (every ring then
    // counts as empty and intact).
    int resumable(int n) {
        bool keeps = true;
        for (size_t l = 0; l < ring_.size(); ++l) {
            if (ring_[l] == 0) continue;
            intact_from_[l] = std::min(intact_from_[l], n);  // nothing from n on counts any more
            if (n > 0 && intact_from_[l] > std::max(0, n - window_[l] + 1)) keeps = false;
        }
        if (keeps) return n;
        std::fill(intact_from_.begin(), intact_from_.end(), 0);
        return 0;
    }
    // Throws tandem::Error where a step from `start` would need a position a ring no longer holds (truncate resumes
    // at 0 instead, so this is a guard).
    void check_reach(int start) const {
        for (size_t l = 0; l < ring_.size(); ++l)
            if (ring_[l] > 0 && start > 0 && intact_from_[l] > std::max(0, start - window_[l] + 1))
                throw Error("the KV cache resumes at position " + std::to_string(start) + ", but layer " +
                            std::to_string(l) + "'s sliding-window ring holds positions from " +
                            std::to_string(intact_from_[l]) + " on only");
    }

private:
    std::vector<int> window_;       // [layer]: the window of a layer that keeps a ring, else 0
    std::vector<int> ring_;         // [layer]: R, or 0
    std::vector<int> intact_from_;  // [layer]: positions intact_from_ .. n_committed - 1 are all in the ring
};

}  // namespace tandem
