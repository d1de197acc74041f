// TokenConstraint (constraint.h).
#include "grammar/constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "error.h"

namespace tandem::grammar {

TokenConstraint::TokenConstraint(const Grammar& grammar, const std::vector<std::string>& token_bytes,
                                 std::vector<int> end_ids)
    : token_bytes_(token_bytes), end_ids_(std::move(end_ids)), matcher_(grammar), masker_(token_bytes_) {}

void TokenConstraint::mask(float* logits, int n_vocab) {
    const auto start = std::chrono::steady_clock::now();
    const std::shared_ptr<const TokenBitset> allowed = masker_.allowed(matcher_);
    const bool can_end = matcher_.accepts();
    // The end ids' logits, kept where the grammar may end (they spell nothing, so the bitset never allows them).
    end_logits_.clear();
    for (int id : end_ids_)
        if (can_end && id >= 0 && id < n_vocab) end_logits_.push_back(logits[id]);
    // Word by word: a word of 64 allowed ids is skipped, one with none is filled.
    const size_t n = std::min(static_cast<size_t>(n_vocab), allowed->size);
    bool any = can_end && !end_logits_.empty();
    for (size_t w = 0; w * 64 < n; ++w) {
        const uint64_t bits = allowed->words[w];
        any = any || bits != 0;
        if (bits == ~uint64_t{0} && (w + 1) * 64 <= n) continue;
        const size_t last = std::min(n, (w + 1) * 64);
        for (size_t id = w * 64; id < last; ++id)
            if (!((bits >> (id - w * 64)) & 1)) logits[id] = -INFINITY;
    }
    for (size_t id = n; id < static_cast<size_t>(n_vocab); ++id) logits[id] = -INFINITY;
    size_t k = 0;
    for (int id : end_ids_)
        if (can_end && id >= 0 && id < n_vocab) logits[id] = end_logits_[k++];
    mask_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++mask_calls_;
    if (!any)
        throw Error("grammar: no token of the vocabulary can continue the output here (the grammar needs a character "
                    "no token spells, or cannot end)");
}

void TokenConstraint::accept(int token) {
    if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) {
        if (!matcher_.accepts()) throw Error("grammar: generation ended where the grammar cannot end");
        return;
    }
    if (token < 0 || static_cast<size_t>(token) >= token_bytes_.size() ||
        token_bytes_[static_cast<size_t>(token)].empty() || !matcher_.advance(token_bytes_[static_cast<size_t>(token)]))
        throw Error("grammar: token " + std::to_string(token) + " is not allowed here");
}

}  // namespace tandem::grammar
