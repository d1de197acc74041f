// A one-shot run: the prompt (as one user turn where the model has a chat template) answered once, streamed to
// stdout, with --stats on stderr. A reasoning model's thinking (templates with a thinking switch) is split off the
// answer and goes to stderr, or to stdout with --show-thinking. The answering itself is prompt_answer.h's, which
// --batch shares.
#pragma once
#include <optional>
#include <string>

#include "app/session.h"
#include "generate/generator.h"
#include "grammar/gbnf.h"

namespace tandem {

struct OneShotOptions {
    std::string prompt;
    std::string system;          // --system: a system turn before the prompt (instruct models)
    bool echo = false;           // print the prompt before the answer
    bool stats = false;          // timing and throughput on stderr
    bool show_thinking = false;  // a reasoning model's thinking on stdout (default: stderr; reasoning_output.h)
    GenerationParams params;     // n_predict, chunk, sampler, speculative, stops
    // --grammar / --json-schema: the answer follows it (plain decoding; a reasoning model needs --think off).
    std::optional<grammar::Grammar> grammar;
    // --output-format jsonl: stdout gets one answer_record (answer_record.h) instead of the streamed text.
    bool jsonl = false;
};

// Opens the session's backends once the prompt is known to fit, then generates. Returns the process's exit status
// (0; a closed stdout ends the run quietly). Throws Error for a prompt longer than the context, before any backend
// is made.
int run_one_shot(Session& session, const OneShotOptions& options);

}  // namespace tandem
