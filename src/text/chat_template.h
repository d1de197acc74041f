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
    // The reasoning of an assistant turn, apart from its content, as templates with a `reasoning_content` field
    // take it (qwen3). Callers normally leave it empty and store the answer alone (or a whole "<think>…</think>"
    // turn) in `content`; normalized() fills it where the template writes the reasoning back.
    std::string reasoning;
};

class ChatTemplate {
public:
    // Recognises the family from the Jinja source, most specific marker first: <|im_start|> with <|im_sep|> → phi4;
    // <|im_start|> with SmolLM3's "Reasoning Mode: " and /no_think → smollm3;
    // <|im_start|> with Qwen3's thinking switch (enable_thinking and the empty '<think>\n\n</think>\n\n' block,
    // and no generation prompt that opens <think> by itself) → qwen3; other <|im_start|> → chatml (with the default
    // system prompt found in the source); <|start_header_id|> with "Cutting Knowledge Date" → llama3, without →
    // llama3.0; <start_of_turn> with first_user_prefix
    // → gemma3, without → gemma; <｜User｜> → deepseek-r1; <|end|> + <|assistant|> without a literal <|user|>
    // (the role is spliced in) → phi4-mini; <|user|> + <|end|> → phi3; <|user|> + </s>/eos_token → zephyr;
    // [INST] + <<SYS>> → llama2; [INST] → mistral. An empty source → "raw"; an unrecognised one → the ChatML
    // default, with `warning` set to a sentence for stderr. `warning` is also set for a ChatML template with <think>
    // handling that is not Qwen3's (Qwen3.5, QwQ): it is rendered as plain ChatML, without that handling.
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
    // messages[0..k+1] for raw, chatml, phi4, llama2, llama3, llama3.0, gemma, gemma3 and zephyr. Exceptions, which
    // follow the templates:
    //  - phi3 and phi4-mini end a rendering without generation prompt with "<|endoftext|>", so the prefix property
    //    holds only up to that final token;
    //  - mistral folds the system message into the *last* user turn, so with a system message every turn must be
    //    re-rendered;
    //  - deepseek-r1 puts the (last) system message right after BOS, so a system message added later changes the
    //    head; and its generation prompt ("<｜Assistant｜><think>\n", "<｜Assistant｜><think>\n</think>" with
    //    thinking off) is not repeated when the assistant message is rendered as history (the template drops the
    //    think block from past turns);
    //  - qwen3 writes a think block ("<think>\n\n</think>\n\n" when there is no reasoning) into an assistant turn
    //    that comes after the last user message, and drops it once a user message follows; so a rendering that ends
    //    with a user message is a prefix of the later ones, one that ends with the assistant is not.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

    // Thinking control (--think) for the families whose templates have it; the others ignore the setting.
    //  - qwen3: on (the default, enable_thinking undefined or true) leaves the generation prompt
    //    "<|im_start|>assistant\n" and the model opens its own <think> block; off (enable_thinking=false) appends
    //    the empty block "<think>\n\n</think>\n\n", which Qwen3 was trained to read as "answer directly".
    //  - deepseek-r1: on renders "<｜Assistant｜><think>\n", as DeepSeek's own template always does (and
    //    llama.cpp's copy with enable_thinking=true): the generation prompt opens the think block and the model
    //    continues inside it. Off renders "<｜Assistant｜><think>\n</think>", the think block closed at once, as
    //    llama.cpp's copy does with enable_thinking false or undefined. The R1 distills were not trained on that
    //    form, so they may still reason in the answer.
    //  - smollm3: on (enable_thinking undefined or true) writes "Reasoning Mode: /think" and the generation prompt
    //    "<|im_start|>assistant\n"; off writes /no_think and the empty block "<think>\n\n</think>\n" into the
    //    generation prompt and every assistant turn. A "/no_think" or "/think" in the system message overrides it.
    bool supports_thinking() const { return name_ == "qwen3" || name_ == "deepseek-r1" || name_ == "smollm3"; }
    void set_thinking(bool on) { thinking_ = on; }
    bool thinking() const { return thinking_; }
    // The generation prompt leaves a think block open (deepseek-r1 with thinking on, and qwen3 and smollm3 with
    // thinking on and set_reasoning_opened): the generated text starts inside the reasoning, and its first
    // "</think>" ends it.
    bool generation_opens_reasoning() const {
        return thinking_ && (name_ == "deepseek-r1" || (opens_reasoning_ && (name_ == "qwen3" || name_ == "smollm3")));
    }
    // qwen3 and smollm3 with thinking on: the generation prompt also writes the "<think>\n" the model would begin its
    // turn with. For a grammar on the answer (grammar/answer_after.h), which must know where the reasoning starts.
    void set_reasoning_opened(bool on) { opens_reasoning_ = on; }

    // The messages with the template's own content transforms applied: contents trimmed where the template trims
    // them (llama3, gemma, gemma3, llama2), reasoning before the last "</think>" dropped from assistant turns
    // (deepseek-r1), empty system messages removed (phi3); qwen3 splits an assistant turn at "</think>" into
    // `reasoning` and `content` as its template does, keeps the reasoning only where the template writes it back
    // (a turn after the last user message) and strips the newlines the template strips. render(m) ==
    // render(normalized(m)), and render copies each normalized content and reasoning verbatim into the text, so a
    // caller may render placeholders (any text that has no leading/trailing whitespace, no "<think>"/"</think>"
    // and is empty exactly when the original is) and substitute normalized(m)[i].content (.reasoning) for them —
    // e.g. to tokenize contents apart from the markup. Exceptions: llama2 with a system message and an all-blank
    // first user message (the template's strip then also eats the "\n\n" before it); qwen3 with a user message
    // wrapped in "<tool_response>…</tool_response>" (the template takes it for a tool result when it looks for the
    // last user query).
    std::vector<ChatMessage> normalized(const std::vector<ChatMessage>& messages) const;
    // The template as it renders `messages`: smollm3 takes its reasoning mode from a /think or /no_think in the
    // system message, which normalized() removes; render placeholders with for_messages(m), not with *this. Every
    // other family: *this.
    ChatTemplate for_messages(const std::vector<ChatMessage>& messages) const;

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
    bool thinking_ = true;  // --think; the template's default form
    bool opens_reasoning_ = false;
};

}  // namespace tandem
