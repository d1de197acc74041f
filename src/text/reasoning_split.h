// ReasoningSplitter: separates a reasoning model's streamed turn into its reasoning (the "<think>…</think>" block
// at the start of the turn, or from the very start when the generation prompt already opened the block, as
// DeepSeek-R1's does) and the answer proper, while the text arrives in pieces cut anywhere (a tag may be split
// across tokens, even byte by byte). The CLI sends the reasoning to stderr (or stdout with --show-thinking) and
// only the answer to stdout; the chat keeps only the answer in its history. A later constraint on the answer
// (a JSON schema) starts where answer text starts.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace tandem {

class ReasoningSplitter {
public:
    enum class Part { Reasoning, Answer };
    // Receives final text of one part; returns false when the consumer is gone, which stops the splitter.
    using Sink = std::function<bool(Part, std::string_view)>;

    // `opened`: the generation prompt ended inside an open think block (ChatTemplate::generation_opens_reasoning()),
    // so the turn starts with reasoning and its first "</think>" ends it.
    ReasoningSplitter(bool opened, Sink sink);

    // Feeds generated text. What is already certain goes to the sink now; a possible tag or the newlines around
    // one are held back until later text decides. Returns false once the sink has returned false (further input
    // is then ignored).
    //
    // The split, which gives the reasoning and the answer exactly as the Qwen3 template separates a stored turn
    // into reasoning_content and content when the turn has one think block:
    //  - without `opened`, a turn that starts with "<think>" (after any whitespace, which is dropped with it) has a
    //    think block; any other turn is all answer, passed on byte for byte, whitespace included. A "<think>" later
    //    in the text is answer text.
    //  - the reasoning is the text up to the first "</think>", without the newlines that follow "<think>" or
    //    precede "</think>" (the template's strip('\n')); the answer is everything after that "</think>", without
    //    its leading newlines (lstrip('\n')). Streaming cannot take back text, so unlike the template (which keeps
    //    the text after the *last* "</think>") a second "</think>" is answer text.
    bool push(std::string_view text);
    // The end of the turn: hands out what was held back (a trailing partial tag is text of its part; trailing
    // newlines of an unfinished reasoning are dropped). Returns the sink's verdict.
    bool finish();

    // A think block was opened (by the generation prompt or the text).
    bool saw_reasoning() const { return saw_reasoning_; }
    // Inside the think block: its "</think>" has not come (after finish(): the turn ended inside its reasoning).
    bool in_reasoning() const { return state_ == State::ReasoningStart || state_ == State::Reasoning; }

private:
    enum class State { Start, ReasoningStart, Reasoning, AfterClose, Answer };
    bool drain(bool end);
    bool emit(Part part, std::string_view text);

    Sink sink_;
    State state_;
    std::string held_;  // text not yet handed out
    bool saw_reasoning_ = false;
    bool stopped_ = false;  // the sink returned false
};

}  // namespace tandem
