// The chat REPL's conversation bookkeeping, free of any terminal: the messages, their rendering to tokens through
// the chat template, which of those tokens the KV caches (target and draft) hold, rollback for /undo and /regen,
// dropping the oldest turns when the context fills, and the JSON form of /save and /load.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "app/prompt_reuse.h"
#include "generate/generator.h"
#include "text/chat_template.h"

namespace tandem {

struct Model;
class KvCache;

// What one answer cost and how it ended.
struct TurnReport {
    GenerationStats stats;  // stats.n_prompt: tokens prefilled this turn
    std::string answer;     // the answer shown on stdout and kept in the conversation (without the reasoning)
    std::string reasoning;  // a reasoning model's thinking, split off the answer (never kept in the conversation)
    bool reasoning_unfinished = false;  // the turn stopped inside its reasoning: no answer
    int n_reused = 0;                   // tokens of the rendered conversation already in the cache
    int n_conversation = 0;             // tokens of the rendered conversation, generation prompt included
    int n_dropped = 0;                  // oldest messages dropped to fit the context
    PromptReuse prompt_reuse;           // a turn from empty caches: what the prompt cache loaded (stats.n_cached)
    bool interrupted = false;           // the consumer stopped it (Ctrl-C); the partial answer is kept
};

class ChatSession {
public:
    using Emit = std::function<bool(std::string_view)>;
    // `tmpl` raw: every message is plain continuation (base models). The stop tokens of the template's end of
    // turn are added to the generation parameters of every answer. `draft` (optional): its cache keeps a prefix of
    // what the target's holds, and the Generator catches it up from the conversation only when it drafts.
    ChatSession(const Model& model, Generator& generator, KvCache& cache, DraftModel draft, ChatTemplate tmpl,
                std::string system = "");

    // Appends the user's message and generates the answer (streamed through `emit`, which returns false to stop
    // it). The answer, complete or not, joins the conversation. With a template that has a thinking switch the
    // turn's reasoning is split off (ReasoningSplitter): it streams through `on_reasoning` and stays out of the
    // conversation, as the templates drop it from past turns; the answer kept is the text after "</think>"
    // without its leading newlines. `params.constraint` (a grammar), when set, applies to this answer from its
    // first token: give each answer its own copy at the grammar's start, with the template's end-of-turn ids among
    // its ends (answer_grammar.h builds it so). Throws tandem::Error (conversation unchanged)
    // when the template refuses the conversation or the message alone does not fit the context.
    TurnReport send(const std::string& user, const GenerationParams& params, const Emit& emit);
    // Drops the last answer and answers the last user message again. Throws tandem::Error when there is none.
    TurnReport regenerate(const GenerationParams& params, const Emit& emit);
    // Drops the last exchange (the last user message and what follows it); false when there is none.
    bool undo();
    // Forgets the conversation (the system prompt stays) and empties the caches.
    void reset();
    void set_system(std::string system);
    // Replaces the conversation; the caches keep whatever prefix still matches.
    void replace(std::string system, std::vector<ChatMessage> messages);

    const std::string& system() const { return system_; }
    const std::vector<ChatMessage>& messages() const { return messages_; }
    const ChatTemplate& chat_template() const { return tmpl_; }
    // The token ids the target cache holds (always cache.n_committed() of them).
    const std::vector<int>& cached() const { return cached_; }
    // The conversation as the model sees it, with the assistant header when `generation_prompt`, rendered by `turn`
    // (this turn's form of the template: for_messages, the think block opened) or else the session's template.
    std::vector<int> render_tokens(bool generation_prompt, const ChatTemplate* turn = nullptr) const;
    // Where notices for the user go (dropped turns); stderr in the REPL.
    std::function<void(const std::string&)> notice;
    // Where a turn's reasoning streams (null: nowhere); returns false to stop the turn, like `emit`.
    Emit on_reasoning;
    // The on-disk prompt cache (not owned; null: none). A turn that starts from empty caches (the first, or one after
    // /reset) loads the longest saved prefix of its prompt into them, and saves its prompt after the answer.
    PromptReuser* prompts = nullptr;

    std::string to_json() const;

private:
    std::vector<ChatMessage> full_messages() const;  // system (when set) + messages
    TurnReport answer(const GenerationParams& params, const Emit& emit);
    // Fits the conversation and its answer into the context by dropping the oldest exchanges.
    int fit_context(int reserve);
    // Rolls both caches back to the longest common prefix with `target`; returns the tokens to prefill.
    std::vector<int> sync_caches(const std::vector<int>& target, int* n_reused);
    void rollback_to_conversation();
    // Cuts both caches back to the first n tokens of cached_ (or fewer, where a cache cannot resume at n); returns
    // the count both kept, to which cached_ is cut too.
    size_t cut_caches_back(size_t n);

    const Model& model_;
    Generator& generator_;
    KvCache& cache_;
    DraftModel draft_;
    ChatTemplate tmpl_;
    std::vector<int> stop_tokens_;
    std::string system_;
    std::vector<ChatMessage> messages_;
    std::vector<int> cached_;
};

// The JSON of /save: {"system": "...", "messages": [{"role": "...", "content": "..."}, ...]}, its strings written by
// json_quote (json/json_value.h).
std::string conversation_to_json(const std::string& system, const std::vector<ChatMessage>& messages);
// Parses it back with parse_json (strict JSON): any JSON value may sit in unknown keys, of the file or of a message;
// "system" may be absent or null; a system message first in "messages" becomes the system prompt (when "system"
// gives none) and one anywhere else is an error. Throws tandem::Error "conversation JSON: ..." naming what is wrong
// (the line and column of a syntax error, the path of a wrong value: "messages[2].role is not a string"), leaving
// *system and *messages as they were.
void conversation_from_json(std::string_view json, std::string* system, std::vector<ChatMessage>* messages);

}  // namespace tandem
