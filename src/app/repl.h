// The interactive chat loop (`tandem` with a terminal on stdin and no prompt, or `--chat` over a pipe): reads
// user turns and commands, streams answers to stdout, and reports on stderr. Conversation bookkeeping lives in
// repl_session.h, terminal line editing in line_editor.h.
#pragma once
#include <optional>
#include <string>

#include "generate/generator.h"
#include "text/chat_template.h"

namespace tandem {

struct Model;
class KvCache;

struct ReplConfig {
    std::optional<ChatTemplate> chat_template;  // nullopt or raw: each user turn is plain continuation
    std::string system;                         // --system
    GenerationParams params;                    // per answer (n_predict, sampler, stops, speculative)
    bool interactive = true;                    // stdin is a terminal: line editing, history, Ctrl-C stops an answer
    std::string model_name;                     // for the banner
    std::string history_path;                   // "" = environment().history_path
    bool show_thinking = false;                 // reasoning on stdout instead of stderr (reasoning_output.h)
};

// Runs the chat until /quit, Ctrl-D or the end of input; returns the exit status. `cache` (and the draft's)
// start empty and belong to the loop from here on.
int run_repl(const Model& model, Generator& generator, KvCache& cache, DraftModel draft, const ReplConfig& config);

}  // namespace tandem
