// The interactive chat loop (`tandem` with a terminal on stdin and no prompt, or `--chat` over a pipe): reads
// user turns and commands, streams answers to stdout, and reports on stderr. Conversation bookkeeping lives in
// repl_session.h, terminal line editing in line_editor.h.
#pragma once
#include <optional>
#include <string>

#include "app/answer_grammar.h"
#include "generate/generator.h"
#include "text/chat_template.h"

namespace tandem {

struct Model;
class KvCache;
class PromptReuser;

struct ReplConfig {
    std::optional<ChatTemplate> chat_template;  // nullopt or raw: each user turn is plain continuation
    std::string system;                         // --system
    GenerationParams params;                    // per answer (n_predict, sampler, stops, speculative)
    bool interactive = true;                    // stdin is a terminal: line editing, history, Ctrl-C stops an answer
    std::string model_name;                     // for the banner
    std::string history_path;                   // "" = environment().history_path
    bool show_thinking = false;                 // reasoning on stdout instead of stderr (reasoning_output.h)
    // --grammar / --grammar-file / --json-schema: every answer follows it from its first token, until /grammar
    // changes it. Under a grammar answers decode without the draft (the Generator does not draft under one yet).
    std::optional<AnswerGrammar> grammar;
    // --output-format jsonl: stdout gets one answer_record (answer_record.h) per answer instead of the answer's
    // line. Meant for --chat over a pipe; the CLI refuses it for a terminal.
    bool jsonl = false;
    // The on-disk prompt cache for the first turn (and any after /reset); not owned, null: none.
    PromptReuser* prompts = nullptr;
};

// A line of input split into a command and its argument: `word` is the first word when the input starts with '/'
// (after blanks), else empty; `arg` is the rest, without the blanks and newlines at its ends (newlines inside stay,
// so a multi-line input gives a multi-line argument).
struct CommandLine {
    std::string word;
    std::string arg;
};
CommandLine split_command(const std::string& input);

// Runs the chat until /quit, Ctrl-D or the end of input; returns the exit status. `cache` (and the draft's)
// start empty and belong to the loop from here on.
int run_repl(const Model& model, Generator& generator, KvCache& cache, DraftModel draft, const ReplConfig& config);

}  // namespace tandem
