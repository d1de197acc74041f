// TokenMasker: which vocabulary tokens a GrammarMatcher state allows next (constrained decoding's logit mask).
//
// A token is allowed when the matcher, fed the token's bytes from the given state, is not dead afterwards (it may
// end mid-character: the rest of the character comes with the next token). Tokens with empty byte strings
// (special and control tokens) are never allowed; EOS is the caller's: allow it where matcher.accepts().
//
// The vocabulary is put in a byte trie once, laid out in depth-first order; a mask is one walk of it from the
// state, advancing one copy of the state per depth and skipping each subtree whose prefix kills the state. Masks
// are memoised per state (its stacks and partial character, and the grammar instance), up to kMaxCachedMasks.
// Like the matcher, a masker must stay on one thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_matcher.h"

namespace tandem::grammar {

// A set of token ids as bits: id i is bit i % 64 of words[i / 64].
struct TokenBitset {
    std::vector<uint64_t> words;
    size_t size = 0;  // the vocabulary size

    bool test(size_t id) const { return id < size && ((words[id >> 6] >> (id & 63)) & 1); }
    size_t count() const;
    std::vector<int32_t> ids() const;  // ascending
};

class TokenMasker {
public:
    static constexpr size_t kMaxCachedMasks = 256;  // the memo is emptied when it would grow past this

    // token_bytes[id]: the bytes token id decodes to (byte-level pieces already mapped back to raw bytes).
    explicit TokenMasker(const std::vector<std::string>& token_bytes);

    // The tokens the state allows (memoised: the same state returns the same object).
    std::shared_ptr<const TokenBitset> allowed(const GrammarMatcher& state);
    // The same as ascending ids.
    std::vector<int32_t> allowed_ids(const GrammarMatcher& state) { return allowed(state)->ids(); }

    size_t vocab_size() const { return vocab_size_; }
    size_t trie_nodes() const { return nodes_.size(); }
    size_t cached_masks() const { return cache_.size(); }
    uint64_t walks() const { return walks_; }  // masks computed, not memoised (for tests)

private:
    struct TrieNode {
        uint32_t depth;         // bytes from the root (the root is 0)
        uint32_t subtree_end;   // one past the last node of this node's subtree (depth-first order)
        uint32_t tokens_begin;  // the tokens ending here: token_ids_[tokens_begin, tokens_end)
        uint32_t tokens_end;
        uint8_t byte;  // the edge from the parent
    };
    size_t vocab_size_;
    std::vector<TrieNode> nodes_;
    std::vector<int32_t> token_ids_;
    std::vector<detail::StackSet> levels_;  // walk scratch: the state after each depth of the current path
    std::unordered_map<std::string, std::shared_ptr<const TokenBitset>> cache_;
    uint64_t walks_ = 0;

    std::shared_ptr<const TokenBitset> walk(const GrammarMatcher& state);
};

}  // namespace tandem::grammar
