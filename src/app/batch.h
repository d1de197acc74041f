// tandem --batch FILE (or - for stdin): one request per line (batch_request.h), read from a file or stdin
// (batch_input.h), one JSONL record per line on stdout (batch_output.h). Each line is answered as a one-shot run of
// its prompt would be (prompt_answer.h: the chat template's system and user turn, the session's draft or prompt
// lookup, an empty KV cache), so a line with a seed gives the text of `tandem -p PROMPT --seed SEED`. Several lines
// are in flight at once (--parallel, continuous batching: generate/continuous_batcher.h), their records written as
// they finish, in any order; with --parallel 1 the lines run one after another, in input order.
#pragma once
#include <optional>
#include <string>

#include "app/batch_input.h"
#include "app/session.h"
#include "generate/generator.h"
#include "grammar/gbnf.h"

namespace tandem {

// The command line's defaults for every line.
struct BatchOptions {
    std::string system;       // --system
    GenerationParams params;  // -n, --chunk, the sampler's flags, --stop, the speculative flags
    // --seed was given: a line without "seed" uses params.sampler.seed, as `tandem -p` with that --seed would.
    // Otherwise each such line draws a seed of its own, as separate runs would.
    bool seed_given = false;
    // --grammar, --grammar-file or --json-schema: the grammar of every line without a "json_schema".
    std::optional<grammar::Grammar> grammar;
    bool show_thinking = false;  // a reasoning model's thinking in the record's "reasoning" (else on stderr)
    // --parallel: sequences in flight at most (0: the default, batch.cpp's default_parallel). 1 runs the lines one
    // after another with the session's draft or prompt lookup; more runs them by continuous batching
    // (generate/continuous_batcher.h), plain decoding, each slot with the session's context.
    bool stats = false;  // a summary on stderr at the end
    int parallel = 0;
};

// Answers every line of `input`. Returns the exit status: 0 when every line succeeded (or stdout went away: the run
// then ends quietly), 1 when any line's record is an error. Throws tandem::Error for what is not a line's fault (a
// command-line grammar the matcher refuses, an engine failure); the records written until then stay written.
int run_batch(Session& session, BatchInput& input, const BatchOptions& options);

}  // namespace tandem
