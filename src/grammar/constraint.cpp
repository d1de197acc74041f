// TokenConstraint (constraint.h).
#include "grammar/constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "error.h"
#include "grammar/answer_after.h"

namespace tandem::grammar {

TokenConstraint::TokenConstraint(const Grammar& grammar, std::vector<std::string> token_bytes, std::vector<int> end_ids)
    : TokenConstraint(std::make_shared<Shared>(std::move(token_bytes), std::move(end_ids)),
                      std::make_shared<const Grammar>(grammar)) {}

TokenConstraint::TokenConstraint(std::shared_ptr<Shared> shared, std::shared_ptr<const Grammar> grammar)
    : shared_(std::move(shared)), grammar_(std::move(grammar)), matcher_(*grammar_) {}

TokenConstraint TokenConstraint::answer_after(std::string_view marker) const {
    return TokenConstraint(shared_, std::make_shared<const Grammar>(grammar::answer_after(*grammar_, marker)));
}

bool TokenConstraint::is_end(int token) const {
    return std::find(shared_->end_ids.begin(), shared_->end_ids.end(), token) != shared_->end_ids.end();
}

void TokenConstraint::mask(float* logits, int n_vocab) {
    if (!try_mask(logits, n_vocab))
        throw Error(
            "grammar: no token of the vocabulary can continue the output here (the grammar needs a character "
            "no token spells, or cannot end)");
}

bool TokenConstraint::try_mask(float* logits, int n_vocab) {
    const auto start = std::chrono::steady_clock::now();
    Shared& s = *shared_;
    const std::shared_ptr<const TokenBitset> allowed = s.masker.allowed(matcher_);
    const bool can_end = matcher_.accepts();
    // The end ids' logits, kept where the grammar may end (they spell nothing, so the bitset never allows them).
    s.end_logits.clear();
    for (int id : s.end_ids)
        if (can_end && id >= 0 && id < n_vocab) s.end_logits.push_back(logits[id]);
    // Word by word: a word of 64 allowed ids is skipped, one with none is filled.
    const size_t n = std::min(static_cast<size_t>(n_vocab), allowed->size);
    bool any = !s.end_logits.empty();
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
    for (int id : s.end_ids)
        if (can_end && id >= 0 && id < n_vocab) logits[id] = s.end_logits[k++];
    s.mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++s.mask_calls;
    return any;
}

bool TokenConstraint::allows(int token) const {
    if (is_end(token)) return matcher_.accepts();
    const std::vector<std::string>& bytes = shared_->token_bytes;
    if (token < 0 || static_cast<size_t>(token) >= bytes.size() || bytes[static_cast<size_t>(token)].empty())
        return false;
    GrammarMatcher probe = matcher_;
    return probe.advance(bytes[static_cast<size_t>(token)]);
}

void TokenConstraint::accept(int token) {
    if (is_end(token)) {
        if (!matcher_.accepts()) throw Error("grammar: generation ended where the grammar cannot end");
        return;
    }
    const std::vector<std::string>& bytes = shared_->token_bytes;
    if (token < 0 || static_cast<size_t>(token) >= bytes.size() || bytes[static_cast<size_t>(token)].empty() ||
        !matcher_.advance(bytes[static_cast<size_t>(token)]))
        throw Error("grammar: token " + std::to_string(token) + " is not allowed here");
}

}  // namespace tandem::grammar
