// TokenConstraint: a grammar enforced over a model's vocabulary while generating: which tokens may come next (a mask
// on the logits, applied before the sampler's transforms so that top-k/top-p/min-p see only allowed tokens) and the
// state advanced by each token chosen. End ids (EOS, a chat template's end of turn) are allowed exactly where the
// grammar accepts what was generated so far. Built on GrammarMatcher and TokenMasker (grammar_matcher.h,
// token_mask.h).
//
// Copies are cheap and share what does not change with the state: the vocabulary's trie, the memo of masks and the
// timing. Speculative decoding leans on that: the draft proposes on a copy advanced along its proposals, the
// verification checks each position on another, and a rejected draft is rolled back by dropping the copy (the
// memoised masks the draft computed are the ones verification then reads). Copies must stay on one thread.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"

namespace tandem::grammar {

class TokenConstraint {
public:
    // token_bytes[id]: what token id decodes to, as bytes (empty for control tokens: never allowed); end_ids: the
    // tokens that end generation. Throws tandem::Error for a grammar the matcher refuses (left recursion).
    TokenConstraint(const Grammar& grammar, std::vector<std::string> token_bytes, std::vector<int> end_ids);

    // Sets logits[id] = -inf for every id of [0, n_vocab) the state does not allow. Throws tandem::Error when the
    // state allows nothing at all (the grammar needs a character no token spells, or is stuck).
    void mask(float* logits, int n_vocab);
    // The same, returning false instead of throwing (every logit is then -inf): for a draft, which may simply stop.
    bool try_mask(float* logits, int n_vocab);
    // Whether the state allows `token` next (an end id: where the grammar accepts). Walks the token's bytes only.
    bool allows(int token) const;
    // Advances the state by `token` (an end id leaves it as it is). Throws tandem::Error for a token the state does
    // not allow (a caller that did not mask).
    void accept(int token);
    // The text so far is a whole sentence of the grammar.
    bool accepts() const { return matcher_.accepts(); }
    // Back to the state before any output (a new answer under the same grammar).
    void reset() { matcher_.reset(); }
    // A constraint at the start of grammar::answer_after(this grammar, marker) (free text up to `marker`, then this
    // grammar: a reasoning model's answer after its think block), sharing this one's vocabulary trie and timing.
    TokenConstraint answer_after(std::string_view marker) const;

    // Time spent in mask() and the number of calls, summed over this constraint and its copies, for --stats; the
    // masks computed (not memoised) among them.
    double mask_seconds() const { return shared_->mask_seconds; }
    int mask_calls() const { return shared_->mask_calls; }
    uint64_t mask_walks() const { return shared_->masker.walks(); }

private:
    struct Shared {
        Shared(std::vector<std::string> bytes, std::vector<int> ends)
            : token_bytes(std::move(bytes)), end_ids(std::move(ends)), masker(token_bytes) {}
        std::vector<std::string> token_bytes;  // for accept(); the masker keeps its own trie of them
        std::vector<int> end_ids;
        TokenMasker masker;
        std::vector<float> end_logits;  // mask()'s scratch
        double mask_seconds = 0;
        int mask_calls = 0;
    };
    TokenConstraint(std::shared_ptr<Shared> shared, std::shared_ptr<const Grammar> grammar);
    bool is_end(int token) const;
    std::shared_ptr<Shared> shared_;
    std::shared_ptr<const Grammar> grammar_;  // what matcher_ was built from (for answer_after)
    GrammarMatcher matcher_;
};

}  // namespace tandem::grammar
