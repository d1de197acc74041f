// Chat templates: turns a conversation (system/user/assistant messages) into the prompt text a chat model expects,
// for the known template families, recognised from a GGUF's `tokenizer.chat_template` (Jinja source) by marker
// strings rather than by interpreting the Jinja.
//
// The rendered text contains the special-token *text* (BOS included) exactly where the model's own template writes
// it, so the caller tokenizes it with special tokens recognised and without adding another BOS.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

class ChatTemplate {
public:
    // Recognises the family from the Jinja source: <|im_start|> → chatml (with the default system prompt found in
    // the source), <|start_header_id|> → llama3, <start_of_turn> → gemma, <|user|> + <|end|> → phi3,
    // <｜User｜> → deepseek-r1, <|user|> + </s>/eos_token → zephyr, [INST] + <<SYS>> → llama2, [INST] → mistral.
    // An empty source → "raw"; an unrecognised one → the ChatML default, with `warning` set to a sentence for stderr.
    static ChatTemplate detect(const std::string& jinja_source, std::string* warning = nullptr);
    // By name (for --chat-template): one of names(); nullopt when unknown.
    static std::optional<ChatTemplate> by_name(const std::string& name);
    static std::vector<std::string> names();

    const std::string& name() const { return name_; }

    // The text of the conversation; add_generation_prompt appends the assistant header (families whose template has
    // none, such as mistral and llama2, append nothing). Throws tandem::Error for what the family's template refuses
    // (a system message for gemma, roles that do not alternate where the template checks it).
    //
    // Prefix stability: rendering messages[0..k] without the generation prompt is a prefix of rendering
    // messages[0..k+1] for raw, chatml, llama2, llama3, gemma and zephyr. Exceptions, which follow the templates:
    //  - phi3 ends a rendering without generation prompt with "<|endoftext|>", so the prefix property holds only
    //    up to that final token;
    //  - mistral folds the system message into the *last* user turn, so with a system message every turn must be
    //    re-rendered;
    //  - deepseek-r1 puts the (last) system message right after BOS, so a system message added later changes the
    //    head; and its generation prompt "<｜Assistant｜><think>\n</think>" is not repeated when the assistant
    //    message is rendered as history (the template drops the think block from past turns).
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

    // The messages with the template's own content transforms applied: contents trimmed where the template trims
    // them (llama3, gemma, llama2), reasoning before the last "</think>" dropped from assistant turns
    // (deepseek-r1), empty system messages removed (phi3). render(m) == render(normalized(m)), and render copies
    // each normalized content verbatim into the text, so a caller may render placeholder contents (any text that
    // has no leading/trailing whitespace and no "</think>") and substitute normalized(m)[i].content for
    // placeholder i — e.g. to tokenize contents apart from the markup. One exception: llama2 with a system message
    // and an all-blank first user message (the template's strip then also eats the "\n\n" before it).
    std::vector<ChatMessage> normalized(const std::vector<ChatMessage>& messages) const;

    // Strings that end an assistant turn (e.g. "<|im_end|>", "<|eot_id|>"); the caller maps those that are single
    // tokens to ids and stops generation there. Empty for raw (the model's EOS is the only stop).
    std::vector<std::string> end_of_turn() const;

    // The system prompt the template inserts when the conversation has none ("" if none). For chatml it is
    // extracted from the Jinja source (Qwen and SmolLM2 each have their own).
    const std::string& default_system() const { return default_system_; }

    // raw: no markup; each message's content is appended as plain continuation (base models).
    bool is_raw() const { return name_ == "raw"; }

private:
    ChatTemplate(std::string name, std::string default_system)
        : name_(std::move(name)), default_system_(std::move(default_system)) {}

    std::string name_;
    std::string default_system_;
};

}  // namespace tandem
