// TokenConstraint: a grammar enforced over a model's vocabulary while generating: which tokens may come next (a mask
// on the logits, applied before the sampler's transforms so that top-k/top-p/min-p see only allowed tokens) and the
// state advanced by each token chosen. End ids (EOS, a chat template's end of turn) are allowed exactly where the
// grammar accepts what was generated so far. Built on GrammarMatcher and TokenMasker (grammar_matcher.h,
// token_mask.h); one thread, like them.
#pragma once
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"

namespace tandem::grammar {

class TokenConstraint {
public:
    // token_bytes[id]: what token id decodes to, as bytes (empty for control tokens: never allowed); end_ids: the
    // tokens that end generation. Throws tandem::Error for a grammar the matcher refuses (left recursion).
    TokenConstraint(const Grammar& grammar, const std::vector<std::string>& token_bytes, std::vector<int> end_ids);

    // Sets logits[id] = -inf for every id of [0, n_vocab) the state does not allow. Throws tandem::Error when the
    // state allows nothing at all (the grammar needs a character no token spells, or is stuck).
    void mask(float* logits, int n_vocab);
    // Advances the state by `token` (an end id leaves it as it is). Throws tandem::Error for a token the state does
    // not allow (a caller that did not mask).
    void accept(int token);
    // The text so far is a whole sentence of the grammar.
    bool accepts() const { return matcher_.accepts(); }

    // Time spent in mask() and the number of calls, for --stats.
    double mask_seconds() const { return mask_seconds_; }
    int mask_calls() const { return mask_calls_; }

private:
    std::vector<std::string> token_bytes_;  // for accept(); the masker keeps its own trie of them
    std::vector<int> end_ids_;
    std::vector<float> end_logits_;  // mask()'s scratch
    GrammarMatcher matcher_;
    TokenMasker masker_;
    double mask_seconds_ = 0;
    int mask_calls_ = 0;
};

}  // namespace tandem::grammar
