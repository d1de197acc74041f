// The check that a draft model may propose tokens for a target: same tokenizer type and special tokens, and the
// same text for every id the two share. A draft vocabulary that is a strict prefix of the target's is accepted
// (the target's extra ids are simply never proposed). Anything else is a tandem::Error naming the first
// difference — a mismatched draft would otherwise run silently and waste every proposal.
#pragma once
#include <string>

namespace tandem {

class Tokenizer;

struct VocabCheck {
    bool draft_is_prefix = false;  // the draft has fewer tokens than the target (all shared ones identical)
    std::string note;              // what to tell the user on stderr, empty when nothing to say
};

VocabCheck check_draft_vocabulary(const Tokenizer& target, const Tokenizer& draft);

}  // namespace tandem
