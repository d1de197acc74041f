// check_draft_vocabulary.
#include "text/vocab_check.h"

#include <cstdio>

#include "error.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

// Quotes a token's text for an error message, escaping control bytes.
std::string quoted(const std::string& s) {
    std::string out = "'";
    for (unsigned char ch : s) {
        if (ch < 0x20 || ch == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", ch);
            out += buf;
        } else {
            out += static_cast<char>(ch);
        }
    }
    return out + "'";
}

}  // namespace

VocabCheck check_draft_vocabulary(const Tokenizer& target, const Tokenizer& draft) {
    if (target.model_type() != draft.model_type())
        throw Error("the draft's tokenizer type '" + draft.model_type() + "' differs from the target's '" +
                    target.model_type() + "'");
    auto special = [](const char* name, int t, int d) {
        if (t != d)
            throw Error(std::string("the draft's ") + name + " token id " + std::to_string(d) +
                        " differs from the target's " + std::to_string(t));
    };
    special("BOS", target.bos(), draft.bos());
    special("EOS", target.eos(), draft.eos());
    special("unknown", target.unk(), draft.unk());
    const auto& tt = target.token_texts();
    const auto& dt = draft.token_texts();
    if (dt.size() > tt.size())
        throw Error("the draft's vocabulary has " + std::to_string(dt.size()) + " tokens, more than the target's " +
                    std::to_string(tt.size()) + ": it could propose tokens the target does not have");
    for (size_t id = 0; id < dt.size(); ++id) {
        if (dt[id] != tt[id] || draft.token_types()[id] != target.token_types()[id])
            throw Error("the draft's vocabulary differs from the target's at id " + std::to_string(id) + ": draft " +
                        quoted(dt[id]) + ", target " + quoted(tt[id]));
    }
    VocabCheck result;
    if (dt.size() < tt.size()) {
        result.draft_is_prefix = true;
        result.note = "the draft's vocabulary (" + std::to_string(dt.size()) +
                      " tokens) is a prefix of the target's (" + std::to_string(tt.size()) +
                      "); the target's extra tokens are never proposed";
    }
    return result;
}

}  // namespace tandem
