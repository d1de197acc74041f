// How the CLI shows a reasoning model's thinking, for the one-shot run and the chat alike: by default on stderr, so
// that stdout carries only the answer (a script reads the answer; `2>/dev/null` hides the reasoning); with
// --show-thinking on stdout, before the answer, as the "<think>\n…\n</think>\n\n" block Qwen3's template writes a
// turn with. Dimmed (ANSI faint) when that stream is a terminal. A turn without reasoning writes nothing here.
#pragma once
#include <string_view>

namespace tandem {

class ReasoningPrinter {
public:
    // `to_stdout`: --show-thinking.
    explicit ReasoningPrinter(bool to_stdout);

    // A piece of a turn's reasoning (ReasoningSplitter's Part::Reasoning); the first one opens the block. Returns
    // false when stdout is gone (a failed write to stderr is not the reader's concern and is ignored).
    bool reasoning(std::string_view text);
    // Ends the open block, if any: before the answer's first text, and at the end of the turn. `closed` is false
    // when the turn stopped inside its reasoning: the block then ends with a newline but no "</think>", which the
    // model never wrote. Returns false when stdout is gone.
    bool end(bool closed = true);
    bool open() const { return open_; }

private:
    bool write(std::string_view text) const;

    int fd_;
    bool dim_;   // fd_ is a terminal
    bool tags_;  // on stdout: the block is wrapped in <think> tags so a reader can tell it from the answer
    bool open_ = false;
};

}  // namespace tandem
