// ChatSession: conversation → tokens → KV caches, with rollback and context trimming; the /save JSON format.
#include "app/repl_session.h"

#include <algorithm>
#include <optional>
#include <span>

#include "app/answer_grammar.h"
#include "backend.h"
#include "error.h"
#include "json/json_value.h"
#include "model/model.h"
#include "text/chat_prompt.h"
#include "text/reasoning_split.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Raw mode: the conversation is one running text. Answers continue the text exactly as generated; a user turn
// (or the system text) that would otherwise glue onto a word gets one space, so "…park." + "She" reads
// "…park. She" — a pure function of the messages, so every turn renders the same prefix.
std::string raw_text(const std::vector<ChatMessage>& messages) {
    std::string out;
    for (const ChatMessage& m : messages) {
        if (m.role != "assistant" && !out.empty() && !m.content.empty() && !is_space(out.back()) &&
            !is_space(m.content.front()))
            out += ' ';
        out += m.content;
    }
    return out;
}

}  // namespace

ChatSession::ChatSession(const Model& model, Generator& generator, KvCache& cache, DraftModel draft, ChatTemplate tmpl,
                         std::string system)
    : model_(model),
      generator_(generator),
      cache_(cache),
      draft_(draft),
      tmpl_(std::move(tmpl)),
      stop_tokens_(end_of_turn_ids(*model.tokenizer, tmpl_)),
      system_(std::move(system)) {
    // Whatever a caller left in the caches is not ours to trust.
    cache_.truncate(0);
    if (draft_.cache) draft_.cache->truncate(0);
}

std::vector<ChatMessage> ChatSession::full_messages() const {
    std::vector<ChatMessage> all;
    all.reserve(messages_.size() + 1);
    if (!system_.empty()) all.push_back({"system", system_});
    all.insert(all.end(), messages_.begin(), messages_.end());
    return all;
}

std::vector<int> ChatSession::render_tokens(bool generation_prompt, const ChatTemplate* turn) const {
    const Tokenizer& tok = *model_.tokenizer;
    if (tmpl_.is_raw()) return tok.encode(raw_text(full_messages()), tok.add_bos());
    return tokenize_chat(tok, turn ? *turn : tmpl_, full_messages(), generation_prompt);
}

int ChatSession::fit_context(int reserve) {
    const size_t cap = static_cast<size_t>(cache_.capacity());
    int dropped = 0;
    for (;;) {
        if (render_tokens(true).size() + static_cast<size_t>(reserve) <= cap) break;
        // The exchanges before the last user message may go, oldest first, one whole exchange at a time so the
        // conversation still opens with a user message.
        size_t last_user = messages_.size();
        for (size_t i = messages_.size(); i-- > 0;)
            if (messages_[i].role == "user") {
                last_user = i;
                break;
            }
        if (last_user == 0 || last_user == messages_.size()) break;
        size_t end = 1;
        while (end < last_user && messages_[end].role != "user") ++end;
        messages_.erase(messages_.begin(), messages_.begin() + static_cast<std::ptrdiff_t>(end));
        dropped += static_cast<int>(end);
    }
    return dropped;
}

std::vector<int> ChatSession::sync_caches(const std::vector<int>& target, int* n_reused) {
    size_t common = 0;
    while (common < cached_.size() && common < target.size() && cached_[common] == target[common]) ++common;
    // The Generator needs at least one token to prefill: that forward gives the logits of the first answer token.
    if (common == target.size()) --common;
    // The draft's cache keeps the prefix it shares; the Generator catches it up from cached_ only if it drafts.
    common = cut_caches_back(common);
    *n_reused = static_cast<int>(common);
    return std::vector<int>(target.begin() + static_cast<std::ptrdiff_t>(common), target.end());
}

void ChatSession::rollback_to_conversation() {
    std::vector<int> target;
    try {
        target = render_tokens(false);
    } catch (const Error&) {
        // A conversation the template refuses keeps nothing; the next turn reports the problem.
    }
    size_t common = 0;
    while (common < cached_.size() && common < target.size() && cached_[common] == target[common]) ++common;
    cut_caches_back(common);
}

size_t ChatSession::cut_caches_back(size_t n) {
    // A cache may keep less than asked (a sliding-window ring that no longer holds the window before n starts over):
    // both caches and cached_ end at what both kept.
    size_t kept = n;
    for (bool agreed = false; !agreed;) {
        cache_.truncate(static_cast<int>(kept));
        if (draft_.cache) draft_.cache->truncate(static_cast<int>(kept));
        size_t now = std::min(kept, static_cast<size_t>(cache_.n_committed()));
        if (draft_.cache) now = std::min(now, static_cast<size_t>(draft_.cache->n_committed()));
        agreed = now == kept;
        kept = now;
    }
    cached_.resize(std::min(cached_.size(), kept));
    return kept;
}

TurnReport ChatSession::answer(const GenerationParams& params, const Emit& emit) {
    TurnReport report;
    const int cap = cache_.capacity();
    const int reserve = params.n_predict > 0 ? std::min(params.n_predict, cap / 2) : cap / 4;
    report.n_dropped = fit_context(reserve);
    if (report.n_dropped > 0 && notice)
        notice("the context of " + std::to_string(cap) + " tokens is full: dropped the " +
               std::to_string(report.n_dropped) + " oldest message" + (report.n_dropped == 1 ? "" : "s") +
               (system_.empty() ? "" : " (the system prompt stays)"));
    // Under a grammar a reasoning turn's think block is opened by the prompt and the grammar applies after it
    // (answer_grammar.h): the constraint must know where the reasoning starts.
    ChatTemplate turn = tmpl_.for_messages(full_messages());
    const bool constrain_after_reasoning = open_reasoning_for_grammar(turn, params.constraint != nullptr);
    const std::vector<int> target = render_tokens(true, &turn);
    if (target.empty()) throw Error("nothing to answer: the conversation renders to no tokens");
    if (static_cast<int>(target.size()) >= cap)
        throw Error("the conversation needs " + std::to_string(target.size()) + " tokens but the context holds " +
                    std::to_string(cap) + " (raise --ctx)");
    // From empty caches the prompt cache may hold a prefix of the prompt: loaded, the whole prompt is the turn's
    // (its history for the penalty, as without a hit), and only the rest is prefilled.
    const bool fresh = cached_.empty() && cache_.n_committed() == 0;
    if (fresh && prompts) report.prompt_reuse = prompts->load(target);
    const int cached = report.prompt_reuse.n_loaded;
    const std::vector<int> prompt = cached > 0 ? target : sync_caches(target, &report.n_reused);
    report.n_conversation = static_cast<int>(target.size());

    GenerationParams p = params;
    p.stop_tokens.insert(p.stop_tokens.end(), stop_tokens_.begin(), stop_tokens_.end());
    std::optional<grammar::TokenConstraint> after_reasoning;
    if (constrain_after_reasoning)
        p.constraint = &after_reasoning.emplace(constraint_for_turn(*params.constraint, /*after_reasoning=*/true));
    std::string text;
    auto answer_piece = [&](std::string_view piece) {
        if (!emit(piece)) return false;
        text += piece;
        return true;
    };
    ReasoningSplitter splitter(turn.generation_opens_reasoning(),
                               [&](ReasoningSplitter::Part part, std::string_view piece) {
                                   if (part == ReasoningSplitter::Part::Answer) return answer_piece(piece);
                                   report.reasoning += piece;
                                   return !on_reasoning || on_reasoning(piece);
                               });
    const bool split = tmpl_.supports_thinking();
    report.stats = generator_.generate(
        prompt, p, [&](std::string_view piece) { return split ? splitter.push(piece) : answer_piece(piece); }, cached_,
        cached);
    report.stats.ttft_s += report.prompt_reuse.seconds;  // the lookup and load come before the first token too
    if (fresh && prompts) prompts->save(target, report.prompt_reuse);
    if (split) {
        if (report.stats.stop != StopReason::OutputClosed && !splitter.finish())
            report.stats.stop = StopReason::OutputClosed;
        report.reasoning_unfinished = splitter.in_reasoning();  // also when Ctrl-C stopped it there
    }

    // The cache holds the prompt and the generated tokens that were fed back (never the last sampled one, and
    // with speculation possibly accepted drafts past the stop): keep exactly the known prefix.
    std::vector<int> full = target;
    full.insert(full.end(), report.stats.generated.begin(), report.stats.generated.end());
    const int held = std::min(cache_.n_committed(), static_cast<int>(full.size()));
    cached_ = std::move(full);
    cut_caches_back(static_cast<size_t>(held));

    report.interrupted = report.stats.stop == StopReason::OutputClosed;
    report.answer = text;
    messages_.push_back({"assistant", std::move(text)});
    return report;
}

TurnReport ChatSession::send(const std::string& user, const GenerationParams& params, const Emit& emit) {
    const std::vector<ChatMessage> before = messages_;
    messages_.push_back({"user", user});
    try {
        return answer(params, emit);
    } catch (...) {
        messages_ = before;
        throw;
    }
}

TurnReport ChatSession::regenerate(const GenerationParams& params, const Emit& emit) {
    const std::vector<ChatMessage> before = messages_;
    if (!messages_.empty() && messages_.back().role == "assistant") messages_.pop_back();
    if (messages_.empty() || messages_.back().role != "user") {
        messages_ = before;
        throw Error("there is no answer to regenerate");
    }
    try {
        return answer(params, emit);
    } catch (...) {
        messages_ = before;
        throw;
    }
}

bool ChatSession::undo() {
    size_t last_user = messages_.size();
    for (size_t i = messages_.size(); i-- > 0;)
        if (messages_[i].role == "user") {
            last_user = i;
            break;
        }
    if (last_user == messages_.size()) return false;
    messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(last_user), messages_.end());
    rollback_to_conversation();
    return true;
}

void ChatSession::reset() {
    messages_.clear();
    cached_.clear();
    cache_.truncate(0);
    if (draft_.cache) draft_.cache->truncate(0);
}

void ChatSession::set_system(std::string system) {
    system_ = std::move(system);
    rollback_to_conversation();
}

void ChatSession::replace(std::string system, std::vector<ChatMessage> messages) {
    system_ = std::move(system);
    messages_ = std::move(messages);
    rollback_to_conversation();
}

std::string ChatSession::to_json() const { return conversation_to_json(system_, messages_); }

// ---- JSON ------------------------------------------------------------------------------------------------

std::string conversation_to_json(const std::string& system, const std::vector<ChatMessage>& messages) {
    std::string out = "{\n  \"system\": " + json_quote(system) + ",\n  \"messages\": [";
    for (size_t i = 0; i < messages.size(); ++i) {
        out += i ? ",\n    " : "\n    ";
        out += "{\"role\": " + json_quote(messages[i].role) + ", \"content\": " + json_quote(messages[i].content) + "}";
    }
    out += messages.empty() ? "]\n}\n" : "\n  ]\n}\n";
    return out;
}

namespace {

[[noreturn]] void conversation_error(const std::string& what) { throw Error("conversation JSON: " + what); }

// The string member `key` of a message, which must be there.
std::string message_string(const JsonValue& message, const char* key, const std::string& where) {
    const JsonValue* v = message.find(key);
    if (!v) conversation_error(where + " needs \"role\" and \"content\"");
    if (!v->is_string()) conversation_error(where + "." + key + " is not a string");
    return v->text;
}

}  // namespace

void conversation_from_json(std::string_view json, std::string* system, std::vector<ChatMessage>* messages) {
    JsonValue doc;
    try {
        doc = parse_json(json);  // strict JSON; nesting bounded, so a deep unknown value cannot overflow the stack
    } catch (const Error& e) {
        throw Error(std::string("conversation ") + e.what());  // "conversation JSON: line L, column C: ..."
    }
    if (!doc.is_object()) conversation_error("not an object");
    std::string sys;
    if (const JsonValue* v = doc.find("system"); v && !v->is_null()) {
        if (!v->is_string()) conversation_error("\"system\" is not a string or null");
        sys = v->text;
    }
    const JsonValue* list = doc.find("messages");
    if (!list) conversation_error("no \"messages\" array");
    if (!list->is_array()) conversation_error("\"messages\" is not an array");
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < list->items.size(); ++i) {
        const JsonValue& item = list->items[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!item.is_object()) conversation_error(where + " is not an object");
        // Other members of a message are ignored, as unknown keys of the file are.
        ChatMessage m;
        m.role = message_string(item, "role", where);
        m.content = message_string(item, "content", where);
        if (m.role != "user" && m.role != "assistant" && m.role != "system")
            conversation_error(where + ": unknown role \"" + m.role + "\"");
        if (m.role == "system" && i != 0) conversation_error(where + ": a system message is allowed only first");
        msgs.push_back(std::move(m));
    }
    // A system message first in the list (as other tools write it) becomes the system prompt.
    if (!msgs.empty() && msgs.front().role == "system") {
        if (sys.empty()) sys = msgs.front().content;
        msgs.erase(msgs.begin());
    }
    *system = std::move(sys);
    *messages = std::move(msgs);
}

}  // namespace tandem
