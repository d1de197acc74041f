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
    bool any = false;
    for (int id = 0; id < n_vocab; ++id) {
        const bool end = std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
        if (end ? can_end : allowed->test(static_cast<size_t>(id)))
            any = true;
        else
            logits[id] = -INFINITY;
    }
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
