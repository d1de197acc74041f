// Candidate rows: the plan of what a sampler needs from each row, and the host selection of a row's best logits.
#include "sample/candidates.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "sample/sampler.h"

namespace tandem {

int plan_candidates(const SamplerParams& params, int n_vocab, std::span<const int> window,
                    std::vector<int>& extra_ids) {
    extra_ids.clear();
    int best;
    if (params.temperature == 0.0f)
        best = 1;  // greedy: the argmax after the penalty
    else if (params.top_k > 0 && params.top_k < n_vocab)
        best = params.top_k;
    else
        return 0;  // the softmax, top-p and min-p would see every id
    // Deduplicating a window costs a sort per step; past this length it is not worth it, whatever the distinct count.
    constexpr size_t kLongestWindow = 4096;
    if (params.repeat_penalty != 1.0f && params.repeat_last_n > 0) {
        if (window.size() > kLongestWindow) return 0;
        extra_ids.assign(window.begin(), window.end());
        std::sort(extra_ids.begin(), extra_ids.end());
        extra_ids.erase(std::unique(extra_ids.begin(), extra_ids.end()), extra_ids.end());
    }
    const long need = static_cast<long>(best) + static_cast<long>(extra_ids.size());
    if (need > kMaxCandidates || need > n_vocab) {
        extra_ids.clear();
        return 0;
    }
    return static_cast<int>(need);
}

void select_top_candidates(const float* row, size_t n, int k, float* logits, int* ids) {
    assert(k >= 1 && static_cast<size_t>(k) <= n);
    struct Entry {
        float logit;
        int id;
    };
    // Sampler's order: a before b when its logit is larger, or equal with a lower id.
    auto before = [](const Entry& a, const Entry& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    // A heap of the k best so far with the worst on top. Ids only grow along the scan, so a later logit enters the
    // heap only if it is strictly larger than the worst one's; once the heap is full, blocks whose largest logit is
    // not are skipped after a max that the compiler vectorises (nearly every block of a 150k row).
    std::vector<Entry> heap;
    heap.reserve(static_cast<size_t>(k));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto offer = [&](size_t i) {
        const Entry e{std::isnan(row[i]) ? neg_inf : row[i], static_cast<int>(i)};
        if (heap.size() < static_cast<size_t>(k)) {
            heap.push_back(e);
            std::push_heap(heap.begin(), heap.end(), before);
        } else if (before(e, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), before);
            heap.back() = e;
            std::push_heap(heap.begin(), heap.end(), before);
        }
    };
    constexpr size_t kBlock = 64;
    size_t i = 0;
    for (; i < n && heap.size() < static_cast<size_t>(k); ++i) offer(i);
    for (; i + kBlock <= n; i += kBlock) {
        float m = neg_inf;  // NaN never compares greater, so it is skipped here as the heap would
        for (size_t j = 0; j < kBlock; ++j) m = row[i + j] > m ? row[i + j] : m;
        if (!(m > heap.front().logit)) continue;
        for (size_t j = 0; j < kBlock; ++j) offer(i + j);
    }
    for (; i < n; ++i) offer(i);
    std::sort_heap(heap.begin(), heap.end(), before);  // ascending by `before`: best first
    for (int j = 0; j < k; ++j) {
        logits[j] = heap[static_cast<size_t>(j)].logit;
        ids[j] = heap[static_cast<size_t>(j)].id;
    }
}

}  // namespace tandem
