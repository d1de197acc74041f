// One prompt answered once, from an empty KV cache: the core that a one-shot run and each line of --batch share.
// Two steps, so that what belongs to the prompt is refused before anything runs: prepare_prompt() renders the prompt
// through the chat template (a system and a user turn), checks it against the context, validates the sampler and
// gives the answer its grammar's constraint; answer_prompt() generates, splits a reasoning model's thinking off the
// answer, and either streams the answer to stdout or collects it for a record (answer_record.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "app/reasoning_output.h"
#include "app/session.h"
#include "generate/generator.h"
#include "grammar/constraint.h"
#include "text/chat_template.h"
#include "text/reasoning_split.h"

namespace tandem {

// What one answer is made from.
struct PromptRequest {
    std::string prompt;
    std::string system;       // a system turn before the prompt ("": none; instruct models only)
    GenerationParams params;  // n_predict, chunk, sampler, speculative, stops; `constraint` is ignored (below)
    // The grammar the answer follows: its constraint at the grammar's start, built by answer_constraint() over the
    // session's chat template (answer_grammar.h); never advanced itself, each answer takes its own copy. Not owned;
    // null: free text.
    const grammar::TokenConstraint* grammar = nullptr;
};

// A request made ready to generate.
struct PreparedPrompt {
    std::vector<int> tokens;           // the prompt as the model reads it (the template rendered, or the raw text)
    std::optional<ChatTemplate> turn;  // the template as this turn renders it; nullopt: raw
    GenerationParams params;           // the request's, with the template's end-of-turn ids as stop tokens
    // This answer's own constraint, at its start: after the think block for a reasoning turn (the prompt then opens
    // it: grammar/answer_after.h), from the first token otherwise. nullopt: free text.
    std::optional<grammar::TokenConstraint> constraint;
};

// Renders and checks `request` for `session` (no backend needed). Throws tandem::Error for a prompt that renders to
// no tokens or is longer than the context (naming both sizes), and for sampler settings out of range.
PreparedPrompt prepare_prompt(const Session& session, const PromptRequest& request);

// Where the answer goes.
struct AnswerOutput {
    // true: the answer streams to stdout as it is generated (a one-shot run's text output); false: it is collected
    // in PromptAnswer::text and nothing of it is written.
    bool stream = true;
    std::string echo;            // streamed only: written to stdout before the answer (--echo: the prompt)
    bool show_thinking = false;  // a reasoning model's thinking on stdout (streamed) or in the record (collected);
                                 // otherwise it goes to stderr (reasoning_output.h)
};

// What answer_prompt() produced.
struct PromptAnswer {
    std::string text;                      // collected output only: the answer
    std::optional<std::string> reasoning;  // collected output with show_thinking, for a reasoning template
    GenerationStats stats;                 // stats.stop == OutputClosed: stdout went away (end quietly)
    PromptReuse prompt_reuse;              // what the prompt cache loaded (stats.n_cached) and saved
    int mask_calls = 0;                    // under a grammar: masks computed or looked up, for --stats
    double mask_seconds = 0;               // and their time
    bool output_closed() const { return stats.stop == StopReason::OutputClosed; }
};

// Where one answer's text goes while it is generated: a reasoning model's thinking split off the answer (to stderr,
// to stdout with show_thinking, or into the record), the answer streamed to stdout or collected. The generator's
// emit is push(); finish() flushes what is held back and gives the answer. Not movable: the splitter's sink refers
// to it.
class AnswerSink {
public:
    AnswerSink(const PreparedPrompt& prepared, const AnswerOutput& output);
    AnswerSink(const AnswerSink&) = delete;
    AnswerSink& operator=(const AnswerSink&) = delete;
    // Generated text; false when stdout is gone.
    bool push(std::string_view text);
    // After generation (`stats`: what it did; `constraint`: the answer's, for its mask counts, or null): flushes
    // what the splitter holds, notes on stderr a model that stopped while thinking, and returns the answer.
    PromptAnswer finish(GenerationStats stats, const grammar::TokenConstraint* constraint);

private:
    bool answer(std::string_view text);
    AnswerOutput output_;
    PromptAnswer answer_;
    std::string reasoning_;
    std::optional<ReasoningPrinter> printer_;    // a reasoning template's turn only
    std::optional<ReasoningSplitter> splitter_;  // likewise
};

// Opens the session's backends (once), cuts both KV caches back to empty, loads what the prompt cache holds of the
// prompt (Session::prompts), generates the answer to `prepared`, and saves the prompt's keys and values.
// Notes on stderr: a model that stopped while thinking. Throws tandem::Error only for what goes wrong in the engine
// (the prompt's own errors were prepare_prompt's).
PromptAnswer answer_prompt(Session& session, const PreparedPrompt& prepared, const AnswerOutput& output);

}  // namespace tandem
