// Turns a conversation into prompt tokens through a chat template, recognising special tokens only in the
// template's own markup: a user who types "<|im_end|>" gets those characters, never the control token.
#pragma once
#include <vector>

#include "text/chat_template.h"

namespace tandem {

class Tokenizer;

// Renders `messages` with `tmpl` (plus the assistant header when add_generation_prompt) and tokenizes the result.
// Markup between messages is scanned for the vocabulary's control and user-defined tokens; message contents are
// tokenized as plain text, joined with the plain markup around them so the ids equal those of tokenizing the whole
// rendered text (as llama.cpp does) whenever the contents hold no special-token text. No BOS is added: templates
// that want one write its text themselves.
std::vector<int> tokenize_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                               const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace tandem
