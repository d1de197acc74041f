// answer_after: a grammar for output that is free text up to a marker, then an answer that follows a given grammar
// (a reasoning model's turn: its think block, closed by "</think>", then the constrained answer). The reasoning is
// not constrained — peers that constrain from the first token break these models — but it cannot end the turn, and
// the answer after it is exactly the given grammar's (after the newlines the reasoning splitter drops, see
// text/reasoning_split.h).
//
// Built in the grammar IR, so the matcher, the token masks and speculative decoding need nothing new: the free part
// is the automaton of "any text not containing the marker" (Knuth-Morris-Pratt states: how much of the marker the
// text ends with), one rule per state, each alternative a character then the next state's rule, so the matcher's
// stack does not grow with the reasoning. A token that closes the marker and begins the answer is allowed exactly
// when its rest fits the answer's grammar.
#pragma once
#include <string_view>

#include "grammar/gbnf.h"

namespace tandem::grammar {

// Text without `marker` (UTF-8, not empty), then `marker`, then any number of "\n", then a sentence of `answer`.
// The result's root is the free text's start; the answer's rules keep their names and meaning.
Grammar answer_after(const Grammar& answer, std::string_view marker);

}  // namespace tandem::grammar
