// GrammarMatcher: the incremental matcher of a Grammar (gbnf.h) over bytes, the state constrained decoding keeps.
//
// The grammar's terminals are Unicode code points; the matcher takes UTF-8 bytes and decodes them itself, keeping a
// partial character between calls, so a token ending mid-character leaves the matcher waiting for the rest (its
// prefix already checked against what the grammar allows there). Invalid UTF-8 (bad lead or continuation byte,
// overlong form, surrogate, beyond U+10FFFF) kills the state.
//
// The state is a set of pushdown stacks, one per way the input so far can be parsed (as llama.cpp's), deduplicated;
// a state over kMaxStacks (matcher_core.h) is an error. Copies are cheap (a vector of ids) and independent, which is
// what speculative decoding's rollback needs: keep a copy, advance the other, go back to the copy. Copies share the
// compiled grammar and the stack arena, so they must stay on one thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>

#include "grammar/gbnf.h"
#include "grammar/matcher_core.h"

namespace tandem::grammar {

class TokenMasker;

class GrammarMatcher {
public:
    // Throws tandem::Error if a rule is left recursive (e.g. `expr ::= expr "+" term`), as llama.cpp does.
    explicit GrammarMatcher(const Grammar& grammar);
    // parse_gbnf(text), then the above.
    static GrammarMatcher from_gbnf(std::string_view text);

    // Consumes one byte; returns !dead(). A dead matcher stays dead.
    bool advance(uint8_t byte);
    // Consumes the bytes in order, stopping at the first that kills the state; returns !dead().
    bool advance(std::string_view bytes);

    // The input so far is a whole sentence of the grammar (no partial character pending).
    bool accepts() const;
    // No stack is left: no continuation of the input can match.
    bool dead() const { return state_.stacks.empty(); }
    // A multi-byte character has begun and not ended.
    bool mid_character() const { return state_.partial.remaining > 0; }
    // The number of parse stacks alive (for tests and diagnostics).
    size_t stack_count() const { return state_.stacks.size(); }

    // Back to the state before any input.
    void reset();

    // A hash of the state; equal states (operator==) of matchers of the same grammar instance hash equally.
    uint64_t state_hash() const;
    // Same grammar instance (a copy of one another) and same state.
    bool operator==(const GrammarMatcher& other) const { return core_ == other.core_ && state_ == other.state_; }

private:
    friend class TokenMasker;
    std::shared_ptr<detail::MatcherCore> core_;
    detail::StackSet state_;
};

}  // namespace tandem::grammar
