// Chat templates: family detection from the Jinja source, and one hand-written renderer per family that reproduces
// what Python jinja2 produces from the family's reference template (tests/data/chat-templates.json and
// chat-templates-families.json), error messages included. No Jinja interpreter: the templates in the wild are a handful of families, and their
// renderings are short and stable.
#include "text/chat_template.h"

#include <algorithm>
#include <cstring>

#include "error.h"

namespace tandem {

namespace {

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// Jinja's `trim` (Python str.strip()): ASCII whitespace plus the C0 separators Python counts as whitespace.
// Unicode spaces (U+00A0, U+2000…) are left alone; no reference template relies on them.
std::string trim(const std::string& s) {
    auto space = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); };
    size_t b = 0, e = s.size();
    while (b < e && space(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && space(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
}

// Python's s.lstrip('\n') / s.rstrip('\n'), as the Qwen3 template applies them to reasoning and answers.
std::string lstrip_newlines(const std::string& s) {
    const size_t b = s.find_first_not_of('\n');
    return b == std::string::npos ? std::string() : s.substr(b);
}
std::string rstrip_newlines(const std::string& s) {
    const size_t e = s.find_last_not_of('\n');
    return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}

// Undoes the escapes of a Jinja (Python-style) string literal that can appear in a system prompt.
std::string unescape_literal(const std::string& raw) {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] != '\\' || i + 1 == raw.size()) {
            out += raw[i];
            continue;
        }
        const char e = raw[++i];
        switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\':
            case '\'':
            case '"': out += e; break;
            default:
                out += '\\';
                out += e;
                break;  // Python keeps unknown escapes verbatim
        }
    }
    return out;
}

// The default system prompt of a ChatML template: the literal text between "<|im_start|>system" + newline and
// "<|im_end|>" *inside one string literal*. Qwen writes "<|im_start|>system\n' + messages[0]['content'] + ..." in the
// branch with a system message (the literal closes before <|im_end|>, so it is skipped) and the whole default in
// one literal in the branch without one; SmolLM2 does the same with a real newline instead of "\n".
std::string chatml_default_system(const std::string& src) {
    static const std::string marker = "<|im_start|>system";
    static const std::string end = "<|im_end|>";
    for (size_t pos = src.find(marker); pos != std::string::npos; pos = src.find(marker, pos + 1)) {
        // The literal normally opens right before the marker; otherwise either quote closes it.
        const char quote = pos > 0 && (src[pos - 1] == '\'' || src[pos - 1] == '"') ? src[pos - 1] : 0;
        size_t i = pos + marker.size();
        if (src.compare(i, 2, "\\n") == 0) {
            i += 2;
        } else if (i < src.size() && src[i] == '\n') {
            i += 1;
        } else {
            continue;
        }
        std::string raw;
        bool found = false;
        while (i < src.size()) {
            if (src.compare(i, end.size(), end) == 0) {
                found = true;
                break;
            }
            const char c = src[i];
            if (c == '\\' && i + 1 < src.size()) {  // an escaped character never closes the literal
                raw += src.substr(i, 2);
                i += 2;
                continue;
            }
            if (quote ? c == quote : (c == '\'' || c == '"')) break;
            raw += c;
            ++i;
        }
        if (found && !raw.empty()) return unescape_literal(raw);
    }
    return "";
}

[[noreturn]] void refuse(const std::string& family, const std::string& what) {
    throw Error("chat template '" + family + "': " + what);
}

const char* const kAlternate = "Conversation roles must alternate user/assistant/user/assistant/...";

// Qwen3's `ns.last_query_index`: the last user message that is not a tool result wrapped in <tool_response> tags
// (the template's multi-step tool check), or the last message when there is none.
size_t qwen3_last_query(const std::vector<ChatMessage>& m) {
    static const std::string open = "<tool_response>", close = "</tool_response>";
    for (size_t i = m.size(); i-- > 0;) {
        const std::string& c = m[i].content;
        const bool tool_result = c.compare(0, open.size(), open) == 0 && c.size() >= close.size() &&
                                 c.compare(c.size() - close.size(), close.size(), close) == 0;
        if (m[i].role == "user" && !tool_result) return i;
    }
    return m.empty() ? 0 : m.size() - 1;
}

// ---- renderers: each mirrors its reference template line by line, with the contents as normalized() left them
// (so a renderer only copies contents verbatim: a caller may render placeholders and substitute them) ----------

// Qwen2.5 / SmolLM2 / plain ChatML: a leading system message, or the default one when there is a default.
std::string render_chatml(const std::vector<ChatMessage>& m, bool gen, const std::string& default_system) {
    std::string out;
    const bool has_system = !m.empty() && m[0].role == "system";
    if (!has_system && !default_system.empty()) out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    for (const auto& msg : m) out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    if (gen) out += "<|im_start|>assistant\n";
    return out;
}

// Qwen3 (Qwen-Qwen3-0.6B.jinja, without tools): ChatML without a default system prompt; an assistant turn after
// the last user message carries its think block (normalized() put the reasoning apart and decided which turns keep
// it: a non-empty `reasoning`, or the conversation's last message); thinking off appends the empty think block to
// the generation prompt (enable_thinking=false). Roles other than system/user/assistant are skipped (tandem sends
// no tool messages).
std::string render_qwen3(const std::vector<ChatMessage>& m, bool gen, bool thinking) {
    std::string out;
    if (!m.empty() && m[0].role == "system") out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
    const size_t query = qwen3_last_query(m);
    for (size_t i = 0; i < m.size(); ++i) {
        const ChatMessage& msg = m[i];
        if (msg.role == "user" || (msg.role == "system" && i > 0)) {
            out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
        } else if (msg.role == "assistant") {
            out += "<|im_start|>assistant\n";
            if (i > query && (i + 1 == m.size() || !msg.reasoning.empty()))
                out += "<think>\n" + msg.reasoning + "\n</think>\n\n";
            out += msg.content + "<|im_end|>\n";
        }
    }
    if (gen) out += thinking ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    return out;
}

// Phi-4 (microsoft/phi-4): ChatML markers with <|im_sep|> after the role and no newlines; other roles skipped.
std::string render_phi4(const std::vector<ChatMessage>& m, bool gen) {
    std::string out;
    for (const auto& msg : m)
        if (msg.role == "system" || msg.role == "user" || msg.role == "assistant")
            out += "<|im_start|>" + msg.role + "<|im_sep|>" + msg.content + "<|im_end|>";
    if (gen) out += "<|im_start|>assistant<|im_sep|>";
    return out;
}

// Llama 3.x: the system header is always written, with the template's default date (the reference is rendered
// without strftime_now, so a live date would not match it and would break the KV-cache prefix across days).
std::string render_llama3(const std::vector<ChatMessage>& m, bool gen) {
    std::string out = "<|begin_of_text|>";
    size_t first = 0;
    std::string system;
    if (!m.empty() && m[0].role == "system") {
        system = m[0].content;
        first = 1;
    }
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
    out += system + "<|eot_id|>";
    for (size_t i = first; i < m.size(); ++i) {
        if (m[i].role == "tool" || m[i].role == "ipython") {
            out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + m[i].content + "<|eot_id|>";
        } else {
            out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + m[i].content + "<|eot_id|>";
        }
    }
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// SmolLM3 (llama.cpp's copy of the template, with Unsloth's fixes): a system block of metadata with the reasoning
// mode and the custom instructions (the system message without its /think, /no_think flags; the template's own text
// when there are none), then ChatML turns; with thinking off every assistant turn and the generation prompt carry
// the empty think block. Other system messages are not rendered; tool results go in as user turns.
constexpr const char* kSmolLM3Thinking =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves "
    "thoroughly exploring questions through a systematic thinking process before providing the final precise and "
    "accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, "
    "reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please "
    "structure your response into two main sections: Thought and Solution using the specified format: <think> "
    "Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each "
    "step should include detailed considerations such as analysing questions, summarizing relevant findings, "
    "brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting "
    "previous steps. In the Solution section, based on various attempts, explorations, and reflections from the "
    "Thought section, systematically present the final solution that you deem correct. The Solution section should "
    "be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.";
constexpr const char* kSmolLM3Plain = "You are a helpful AI assistant named SmolLM, trained by Hugging Face.";

std::string render_smollm3(const std::vector<ChatMessage>& m, bool gen, bool thinking) {
    std::string out = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: ";
    out += thinking ? "/think" : "/no_think";
    out += "\n\n## Custom Instructions\n\n";
    const bool custom = !m.empty() && m[0].role == "system" && !m[0].content.empty();
    out += custom ? m[0].content : (thinking ? kSmolLM3Thinking : kSmolLM3Plain);
    out += "\n\n<|im_end|>\n";
    const std::string empty_think = thinking ? "" : "<think>\n\n</think>\n";
    for (const auto& msg : m) {
        if (msg.role == "user" || msg.role == "tool")
            out += "<|im_start|>user\n" + msg.content + "<|im_end|>\n";
        else if (msg.role == "assistant")
            out += "<|im_start|>assistant\n" + empty_think + msg.content + "<|im_end|>\n";
    }
    if (gen) out += "<|im_start|>assistant\n" + empty_think;
    return out;
}

// The reasoning mode SmolLM3's template takes: a "/no_think" in the first (system) message turns it off, else a
// "/think" on, else the --think setting (enable_thinking).
bool smollm3_thinking(const std::vector<ChatMessage>& m, bool thinking) {
    if (m.empty() || m[0].role != "system") return thinking;
    if (contains(m[0].content, "/no_think")) return false;
    if (contains(m[0].content, "/think")) return true;
    return thinking;
}

// Llama 3.0 (Meta-Llama-3-*-Instruct): each message under its role's header, trimmed, no default system header or
// date (those came with 3.1).
std::string render_llama3_0(const std::vector<ChatMessage>& m, bool gen) {
    std::string out = "<|begin_of_text|>";
    for (const auto& msg : m)
        out += "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n" + msg.content + "<|eot_id|>";
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// Gemma 2: no system role, strict user/model alternation.
std::string render_gemma(const std::vector<ChatMessage>& m, bool gen) {
    if (!m.empty() && m[0].role == "system") refuse("gemma", "System role not supported");
    std::string out = "<bos>";
    for (size_t i = 0; i < m.size(); ++i) {
        if ((m[i].role == "user") != (i % 2 == 0)) refuse("gemma", kAlternate);
        const std::string role = m[i].role == "assistant" ? "model" : m[i].role;
        out += "<start_of_turn>" + role + "\n" + m[i].content + "<end_of_turn>\n";
    }
    if (gen) out += "<start_of_turn>model\n";
    return out;
}

// Gemma 3: a leading system message is folded into the first turn (its text verbatim, then "\n\n", then the
// trimmed first message); after it, strict user/model alternation, as Gemma 2.
std::string render_gemma3(const std::vector<ChatMessage>& m, bool gen) {
    std::string out = "<bos>";
    const bool has_system = !m.empty() && m[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    for (size_t i = first; i < m.size(); ++i) {
        const size_t n = i - first;
        if ((m[i].role == "user") != (n % 2 == 0)) refuse("gemma3", kAlternate);
        const std::string role = m[i].role == "assistant" ? "model" : m[i].role;
        out += "<start_of_turn>" + role + "\n";
        if (n == 0 && has_system) out += m[0].content + "\n\n";
        out += m[i].content + "<end_of_turn>\n";
    }
    if (gen) out += "<start_of_turn>model\n";
    return out;
}

// Phi-4-mini: "<|role|>" + content + "<|end|>" for every message, whatever its role, without newlines; without a
// generation prompt the template ends with the EOS text.
std::string render_phi4_mini(const std::vector<ChatMessage>& m, bool gen) {
    std::string out;
    for (const auto& msg : m) out += "<|" + msg.role + "|>" + msg.content + "<|end|>";
    out += gen ? "<|assistant|>" : "<|endoftext|>";
    return out;
}

// Phi-3 / 3.5 (Phi-3-mini's template is the same but for an empty system message, which it writes and 3.5 skips;
// tandem never sends one): unknown roles are skipped (empty system messages too, by normalized()); without a generation prompt
// the template ends with the EOS text.
std::string render_phi3(const std::vector<ChatMessage>& m, bool gen) {
    std::string out;
    for (const auto& msg : m) {
        if (msg.role == "system") {
            out += "<|system|>\n" + msg.content + "<|end|>\n";
        } else if (msg.role == "user") {
            out += "<|user|>\n" + msg.content + "<|end|>\n";
        } else if (msg.role == "assistant") {
            out += "<|assistant|>\n" + msg.content + "<|end|>\n";
        }
    }
    out += gen ? "<|assistant|>\n" : "<|endoftext|>";
    return out;
}

// Mistral (Nemo / v3-tekken style, no spaces around [INST]): the system text goes into the LAST user turn (and is
// dropped when the last message is not a user turn); "[/INST]" is already the generation prompt.
std::string render_mistral(const std::vector<ChatMessage>& m, bool /*gen*/) {
    const bool has_system = !m.empty() && m[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    for (size_t i = first, n = 0; i < m.size(); ++i, ++n) {
        if ((m[i].role == "user") != (n % 2 == 0))
            refuse("mistral",
                   "After the optional system message, conversation roles must alternate "
                   "user/assistant/user/assistant/...");
    }
    std::string out = "<s>";
    for (size_t i = first; i < m.size(); ++i) {
        if (m[i].role == "user") {
            if (i + 1 == m.size() && has_system) {
                out += "[INST]" + m[0].content + "\n\n" + m[i].content + "[/INST]";
            } else {
                out += "[INST]" + m[i].content + "[/INST]";
            }
        } else if (m[i].role == "assistant") {
            out += m[i].content + "</s>";
        } else {
            refuse("mistral",
                   "Only user and assistant roles are supported, with the exception of an initial "
                   "optional system message!");
        }
    }
    return out;
}

// DeepSeek-R1 (distills): the last system message right after BOS, past assistant turns without their think block
// (dropped by normalized()), and a generation prompt that opens the think block ("<think>\n", DeepSeek's template,
// and llama.cpp's with enable_thinking=true) or, thinking off, closes it at once ("<think>\n</think>", llama.cpp's
// with enable_thinking false or undefined).
std::string render_deepseek_r1(const std::vector<ChatMessage>& m, bool gen, bool thinking) {
    std::string system;
    for (const auto& msg : m)
        if (msg.role == "system") system = msg.content;
    std::string out = "<｜begin▁of▁sentence｜>" + system;
    for (const auto& msg : m) {
        if (msg.role == "user") {
            out += "<｜User｜>" + msg.content;
        } else if (msg.role == "assistant") {
            out += "<｜Assistant｜>" + msg.content + "<｜end▁of▁sentence｜>";
        }
    }
    if (gen) out += thinking ? "<｜Assistant｜><think>\n" : "<｜Assistant｜><think>\n</think>";
    return out;
}

// Llama 2 chat, from meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json: every user turn opens with BOS, the
// system message is wrapped in <<SYS>> into the first user turn, contents are stripped; no generation prompt.
std::string render_llama2(const std::vector<ChatMessage>& m, bool /*gen*/) {
    const bool has_system = !m.empty() && m[0].role == "system";
    const size_t first = has_system ? 1 : 0;
    std::string out;
    for (size_t i = first; i < m.size(); ++i) {
        const size_t n = i - first;
        if ((m[i].role == "user") != (n % 2 == 0)) refuse("llama2", kAlternate);
        std::string content = m[i].content;
        // The template strips "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content as a whole; normalized() has
        // right-stripped the content, and an all-blank content also loses the "\n\n".
        if (n == 0 && has_system)
            content = "<<SYS>>\n" + m[0].content + "\n<</SYS>>" + (content.empty() ? "" : "\n\n") + content;
        if (m[i].role == "user") {
            out += "<s>[INST] " + content + " [/INST]";
        } else if (m[i].role == "assistant") {
            out += " " + content + " </s>";
        }
    }
    return out;
}

// Zephyr, from HuggingFaceH4/zephyr-7b-beta's tokenizer_config.json: every turn ends with EOS and a newline; the
// generation prompt is "<|assistant|>\n" (written inside the loop, so not for an empty conversation).
std::string render_zephyr(const std::vector<ChatMessage>& m, bool gen) {
    std::string out;
    for (const auto& msg : m) {
        if (msg.role == "user" || msg.role == "system" || msg.role == "assistant")
            out += "<|" + msg.role + "|>\n" + msg.content + "</s>\n";
    }
    if (gen && !m.empty()) out += "<|assistant|>\n";
    return out;
}

std::string render_raw(const std::vector<ChatMessage>& m) {
    std::string out;
    for (const auto& msg : m) out += msg.content;
    return out;
}

}  // namespace

std::vector<std::string> ChatTemplate::names() {
    return {"raw",    "chatml", "qwen3",  "smollm3", "llama2",    "llama3",     "llama3.0", "mistral",
            "gemma",  "gemma3", "zephyr", "phi3",    "phi4",      "phi4-mini",  "deepseek-r1"};
}

std::optional<ChatTemplate> ChatTemplate::by_name(const std::string& name) {
    const auto all = names();
    if (std::find(all.begin(), all.end(), name) == all.end()) return std::nullopt;
    return ChatTemplate(name, "");
}

ChatTemplate ChatTemplate::detect(const std::string& src, std::string* warning) {
    if (warning) warning->clear();
    if (trim(src).empty()) return ChatTemplate("raw", "");
    // Most specific markers first: Phi-4, Qwen3 and plain ChatML share <|im_start|>; Gemma 2 and 3 share
    // <start_of_turn>; Phi-3, Phi-4-mini and Zephyr <|user|>-style tags; Llama 2 and Mistral [INST].
    if (contains(src, "<|im_start|>")) {
        if (contains(src, "<|im_sep|>")) return ChatTemplate("phi4", "");
        if (contains(src, "Reasoning Mode: ") && contains(src, "/no_think")) return ChatTemplate("smollm3", "");
        // Qwen3's switch writes the empty think block when enable_thinking is false; Qwen3.5 and MiniCPM5 share
        // it but also open "<think>\n" in the generation prompt by default, which qwen3 does not render.
        const bool think_markup = contains(src, "<think>");
        if (contains(src, "enable_thinking") && contains(src, "'<think>\\n\\n</think>\\n\\n'") &&
            !contains(src, "'<think>\\n' }}"))
            return ChatTemplate("qwen3", "");
        if (think_markup && warning)
            *warning =
                "the model's chat template handles <think> blocks in a way tandem does not reproduce; rendering it "
                "as plain ChatML (reasoning, if any, stays in the answer; --chat-template chooses another family)";
        return ChatTemplate("chatml", chatml_default_system(src));
    }
    // Llama 3.1+ write a system header with a knowledge cutoff and a date; 3.0's template has neither.
    if (contains(src, "<|start_header_id|>"))
        return ChatTemplate(contains(src, "Cutting Knowledge Date") ? "llama3" : "llama3.0", "");
    if (contains(src, "<start_of_turn>"))
        return ChatTemplate(contains(src, "first_user_prefix") ? "gemma3" : "gemma", "");
    if (contains(src, "<｜User｜>")) return ChatTemplate("deepseek-r1", "");
    // Phi-4-mini splices the role into "<|" + role + "|>", so its source has <|assistant|> (the generation prompt)
    // but no literal <|user|>.
    if (contains(src, "<|end|>") && contains(src, "<|assistant|>") && !contains(src, "<|user|>"))
        return ChatTemplate("phi4-mini", "");
    if (contains(src, "<|user|>") && contains(src, "<|end|>")) return ChatTemplate("phi3", "");
    if (contains(src, "<|user|>") && (contains(src, "</s>") || contains(src, "eos_token")))
        return ChatTemplate("zephyr", "");
    if (contains(src, "[INST]")) return ChatTemplate(contains(src, "<<SYS>>") ? "llama2" : "mistral", "");
    if (warning) {
        std::string list;
        for (const auto& n : names()) list += (list.empty() ? "" : ", ") + n;
        *warning =
            "unrecognised chat template in the model; using ChatML (choose another with --chat-template: " + list + ")";
    }
    return ChatTemplate("chatml", "");
}

std::vector<ChatMessage> ChatTemplate::normalized(const std::vector<ChatMessage>& messages) const {
    std::vector<ChatMessage> out;
    out.reserve(messages.size());
    const bool llama2_system = name_ == "llama2" && !messages.empty() && messages[0].role == "system";
    const size_t qwen3_query = name_ == "qwen3" ? qwen3_last_query(messages) : 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        ChatMessage msg = messages[i];
        if (name_ != "qwen3") msg.reasoning.clear();  // only qwen3's template has a place for it
        if (name_ == "qwen3") {
            if (msg.role == "assistant") {
                // The template's split: the reasoning is what precedes the first "</think>" (after the last
                // "<think>" in it), the answer what follows the last one, each without the newlines at the seam.
                // A reasoning given apart (reasoning_content) is taken as it is, and the content is not split.
                if (msg.reasoning.empty()) {
                    const size_t first_end = msg.content.find("</think>");
                    if (first_end != std::string::npos) {
                        const std::string head = rstrip_newlines(msg.content.substr(0, first_end));
                        const size_t open = head.rfind("<think>");
                        msg.reasoning = lstrip_newlines(open == std::string::npos ? head : head.substr(open + 7));
                        msg.content = lstrip_newlines(msg.content.substr(msg.content.rfind("</think>") + 8));
                    }
                }
                const bool think_block = i > qwen3_query && (i + 1 == messages.size() || !msg.reasoning.empty());
                if (think_block) {
                    msg.reasoning = lstrip_newlines(rstrip_newlines(msg.reasoning));  // .strip('\n')
                    msg.content = lstrip_newlines(msg.content);
                } else {
                    msg.reasoning.clear();  // past turns lose their reasoning
                }
            } else {
                msg.reasoning.clear();
            }
        } else if (name_ == "gemma3") {
            if (!(i == 0 && msg.role == "system")) msg.content = trim(msg.content);  // the system text is verbatim
        } else if (name_ == "llama3") {
            if (msg.role != "tool" && msg.role != "ipython") msg.content = trim(msg.content);  // `| trim`
        } else if (name_ == "smollm3") {
            if (i == 0 && msg.role == "system") {
                // The flags set the mode (for_messages); the template renders the rest, right-stripped. Emptied,
                // the message is as if absent: the template then writes its own instructions.
                for (const char* flag : {"/no_think", "/think"})
                    for (size_t at; (at = msg.content.find(flag)) != std::string::npos;)
                        msg.content.erase(at, std::strlen(flag));
                msg.content = trim("x" + msg.content).substr(1);  // right strip only
                if (msg.content.empty()) continue;
            } else if (msg.role == "system") {
                continue;  // not rendered
            } else if (msg.role == "assistant") {
                msg.content = lstrip_newlines(msg.content);
            }
        } else if (name_ == "llama3.0") {
            msg.content = trim(msg.content);  // `message['content'] | trim`
        } else if (name_ == "gemma") {
            msg.content = trim(msg.content);
        } else if (name_ == "llama2") {
            if (llama2_system && i == 0) {
                // kept verbatim: it sits between "<<SYS>>\n" and "\n<</SYS>>", out of reach of the strip
            } else if (llama2_system && i == 1) {
                msg.content = trim("x" + msg.content).substr(1);  // right strip only: "<<SYS>>…" precedes it
            } else {
                msg.content = trim(msg.content);  // content.strip()
            }
        } else if (name_ == "phi3") {
            if (msg.role == "system" && msg.content.empty()) continue;  // `message['content']` is falsy
        } else if (name_ == "deepseek-r1") {
            if (msg.role == "assistant") {
                const size_t think_end = msg.content.rfind("</think>");
                if (think_end != std::string::npos) msg.content = msg.content.substr(think_end + 8);
            }
        }
        out.push_back(std::move(msg));
    }
    return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    const bool gen = add_generation_prompt;
    const std::vector<ChatMessage> m = normalized(messages);
    if (name_ == "raw") return render_raw(m);
    if (name_ == "chatml") return render_chatml(m, gen, default_system_);
    if (name_ == "qwen3" || name_ == "smollm3") {
        const bool thinking = name_ == "qwen3" ? thinking_ : smollm3_thinking(messages, thinking_);
        std::string out = name_ == "qwen3" ? render_qwen3(m, gen, thinking) : render_smollm3(m, gen, thinking);
        if (gen && thinking && opens_reasoning_) out += "<think>\n";
        return out;
    }
    if (name_ == "phi4") return render_phi4(m, gen);
    if (name_ == "gemma3") return render_gemma3(m, gen);
    if (name_ == "phi4-mini") return render_phi4_mini(m, gen);
    if (name_ == "llama3") return render_llama3(m, gen);
    if (name_ == "llama3.0") return render_llama3_0(m, gen);
    if (name_ == "gemma") return render_gemma(m, gen);
    if (name_ == "phi3") return render_phi3(m, gen);
    if (name_ == "mistral") return render_mistral(m, gen);
    if (name_ == "deepseek-r1") return render_deepseek_r1(m, gen, thinking_);
    if (name_ == "llama2") return render_llama2(m, gen);
    if (name_ == "zephyr") return render_zephyr(m, gen);
    refuse(name_, "unknown family");  // unreachable: names are only made by detect/by_name
}

ChatTemplate ChatTemplate::for_messages(const std::vector<ChatMessage>& messages) const {
    ChatTemplate t = *this;
    if (name_ == "smollm3") t.thinking_ = smollm3_thinking(messages, thinking_);
    return t;
}

std::vector<std::string> ChatTemplate::end_of_turn() const {
    if (name_ == "chatml" || name_ == "qwen3" || name_ == "smollm3" || name_ == "phi4") return {"<|im_end|>"};
    if (name_ == "llama3" || name_ == "llama3.0") return {"<|eot_id|>"};
    if (name_ == "gemma" || name_ == "gemma3") return {"<end_of_turn>"};
    // Phi-3's and Phi-4-mini's turns end with <|end|>; their templates also end the conversation with <|endoftext|>.
    if (name_ == "phi3" || name_ == "phi4-mini") return {"<|end|>", "<|endoftext|>"};
    if (name_ == "deepseek-r1") return {"<｜end▁of▁sentence｜>"};
    if (name_ == "mistral" || name_ == "llama2" || name_ == "zephyr") return {"</s>"};
    return {};
}

}  // namespace tandem
