// tokenize_chat: render with sentinels in place of the contents, split, tokenize markup and contents apart.
#include "text/chat_prompt.h"

#include <algorithm>
#include <string>

#include "error.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

// Control bytes that neither templates nor tokenizers give meaning to, around the message index; an 'r' before the
// index marks the message's reasoning rather than its content.
std::string sentinel(size_t i) { return "\x01" + std::to_string(i) + "\x02"; }
std::string reasoning_sentinel(size_t i) { return "\x01r" + std::to_string(i) + "\x02"; }

}  // namespace

std::vector<int> tokenize_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                               const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
    // The template's own edits to contents (trimming, dropping empty or reasoning parts) happen first, so that
    // putting the contents back in place of the sentinels gives exactly what render() would.
    const ChatTemplate t = tmpl.for_messages(messages);  // (smollm3's mode is in the system message's text)
    const std::vector<ChatMessage> contents = t.normalized(messages);
    std::vector<ChatMessage> marked = contents;
    for (size_t i = 0; i < marked.size(); ++i) {
        marked[i].content = sentinel(i);
        // Only a non-empty reasoning gets a marker: the template decides on its emptiness (ChatTemplate::normalized).
        if (!marked[i].reasoning.empty()) marked[i].reasoning = reasoning_sentinel(i);
    }
    const std::string rendered = t.render(marked, add_generation_prompt);

    // Special tokens by text, longest first so that e.g. "<|im_start|>" wins over a shorter prefix.
    std::vector<std::pair<std::string, int>> specials;
    const auto& texts = tokenizer.token_texts();
    const auto& types = tokenizer.token_types();
    for (size_t id = 0; id < texts.size(); ++id)
        if ((types[id] == 3 || types[id] == 4) && !texts[id].empty())
            specials.emplace_back(texts[id], static_cast<int>(id));
    std::sort(specials.begin(), specials.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

    std::vector<int> ids;
    std::string plain;  // text waiting to be tokenized as one run
    auto flush_plain = [&] {
        if (plain.empty()) return;
        const std::vector<int> part = tokenizer.encode(plain, /*add_bos=*/false, /*parse_special=*/false);
        ids.insert(ids.end(), part.begin(), part.end());
        plain.clear();
    };
    for (size_t pos = 0; pos < rendered.size();) {
        if (rendered[pos] == '\x01') {
            const size_t end = rendered.find('\x02', pos);
            if (end == std::string::npos) throw Error("chat template: a message marker was cut by the template");
            const bool reasoning = rendered[pos + 1] == 'r';
            const size_t begin = pos + (reasoning ? 2 : 1);
            const ChatMessage& m = contents.at(std::stoul(rendered.substr(begin, end - begin)));
            plain += reasoning ? m.reasoning : m.content;
            pos = end + 1;
            continue;
        }
        const auto match = std::find_if(specials.begin(), specials.end(), [&](const auto& s) {
            return rendered.compare(pos, s.first.size(), s.first) == 0;
        });
        if (match != specials.end()) {
            flush_plain();
            ids.push_back(match->second);
            pos += match->first.size();
        } else {
            plain += rendered[pos++];
        }
    }
    flush_plain();
    return ids;
}

}  // namespace tandem
