// Backend's default implementations that need more than the interface header should carry.
#include "backend.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/vec_math.h"

namespace tandem {

bool KvCache::copy_prefix(const KvCache& from, int n) {
    const RowFormat format = row_format(), source = from.row_format();
    if (&from == this || format.type.empty() || format.type != source.type || format.n_layers != source.n_layers ||
        format.row_bytes != source.row_bytes || n <= 0 || n > from.n_committed() || n > capacity())
        return false;
    // Each layer's positions a step at n reads; the source must still hold them (a ring holds its last ones only).
    std::vector<int> firsts(static_cast<size_t>(format.n_layers));
    for (int l = 0; l < format.n_layers; ++l) {
        firsts[static_cast<size_t>(l)] = needed_from(l, n);
        if (from.held_from(l) > firsts[static_cast<size_t>(l)]) return false;
    }
    truncate(0);
    if (n_committed() != 0) return false;
    std::vector<uint8_t> keys, values;
    for (int l = 0; l < format.n_layers; ++l) {
        const int first = firsts[static_cast<size_t>(l)], count = n - first;
        keys.resize(static_cast<size_t>(count) * format.row_bytes);
        values.resize(keys.size());
        from.read_rows(l, first, count, keys.data(), values.data());
        write_rows(l, first, count, keys.data(), values.data());
    }
    finish_load(n, firsts);
    return true;
}

void Backend::forward_argmax_confidence(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                                        float* top_probs, std::span<float> scratch) {
    assert(n_rows >= 0 && static_cast<size_t>(n_rows) <= tokens.size());
    forward(tokens, cache, n_rows, scratch.data());
    if (n_rows == 0) return;
    const size_t n_vocab = scratch.size() / static_cast<size_t>(n_rows);
    for (int r = 0; r < n_rows; ++r) {
        float* row = scratch.data() + r * n_vocab;
        ids[r] = argmax_row(row, n_vocab);
        // exp_shifted_sum overwrites the row with its terms: the id was read first.
        top_probs[r] = ids[r] < 0 ? std::numeric_limits<float>::quiet_NaN()
                                  : 1.0f / cpu::exp_shifted_sum(row, static_cast<int>(n_vocab), row[ids[r]]);
    }
}

void Backend::forward_candidates(std::span<const int> tokens, KvCache& cache, int n_rows, int k,
                                 std::span<const int> extra, float* top_logits, int* top_ids, float* extra_logits,
                                 std::span<float> scratch) {
    assert(n_rows >= 0 && static_cast<size_t>(n_rows) <= tokens.size());
    forward(tokens, cache, n_rows, scratch.data());
    if (n_rows == 0) return;
    const size_t n_vocab = scratch.size() / static_cast<size_t>(n_rows);
    assert(k >= 1 && static_cast<size_t>(k) <= n_vocab);
    for (int r = 0; r < n_rows; ++r) {
        const float* row = scratch.data() + r * n_vocab;
        select_top_candidates(row, n_vocab, k, top_logits + static_cast<size_t>(r) * k,
                              top_ids + static_cast<size_t>(r) * k);
        for (size_t j = 0; j < extra.size(); ++j)  // NaN for an id outside the vocabulary, as on the device
            extra_logits[r * extra.size() + j] = extra[j] >= 0 && static_cast<size_t>(extra[j]) < n_vocab
                                                     ? row[static_cast<size_t>(extra[j])]
                                                     : std::numeric_limits<float>::quiet_NaN();
    }
}

}  // namespace tandem
